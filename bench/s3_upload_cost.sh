#!/usr/bin/env bash
# What a background checkpoint upload costs training: the same job run twice, checkpoints
# every E steps to a local directory, then to s3://BUCKET/PREFIX (the AWS_* settings of the
# environment: AWS_ENDPOINT_URL, keys), and each run's median and p90 step time, its
# checkpoint and checkpoint_upload stalls; then the same job stopped by SIGTERM in the middle
# of the bucket run, and the seconds from the signal to the process's exit with its last
# checkpoint durable. Prints one JSON object.
#
#   bench/s3_upload_cost.sh s3://BUCKET/PREFIX [STEPS] [EVERY]
#
# The model (~13 M parameters, ~150 MB a checkpoint) is made so that an upload to a local
# S3 server covers most of the steps between two checkpoints without making the next one
# wait. The bucket's prefix gets a fresh sub-prefix per run; nothing is deleted.
set -euo pipefail
uri=${1:?usage: bench/s3_upload_cost.sh s3://BUCKET/PREFIX [STEPS] [EVERY]}
steps=${2:-200}
every=${3:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
zenflow=${ZENFLOW:-$here/build/bin/zenflow}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/job.yaml" <<YAML
name: s3-upload-cost
model:
  arch: llama
  config: {hidden_size: 512, num_hidden_layers: 4, num_attention_heads: 8, intermediate_size: 1376,
           max_position_embeddings: 128}
data: {train: /usr/share/common-licenses, format: text, tokenizer: byte, val_fraction: 0}
train: {steps: $steps, micro_batch: 4, grad_accum: 1, seq_len: 128, lr: 1.0e-3, warmup_steps: 5, seed: 1}
optimizer:
  mode: zenflow
  zenflow: {topk_ratio: 0.1, update_interval: 4, overlap_step: true}
checkpoint: {every_steps: $every, keep: 2}
YAML
field() { grep -o "\"$1\":[-0-9.e][-0-9.e]*" "$2" | head -1 | cut -d: -f2; }
run() {  # DIR OUT
  "$zenflow" run "$work/job.yaml" --quiet --json --fresh --set "checkpoint.dir=$1" --staging-dir "$work/stage" \
    > "$2" 2> "$2.err" || { cat "$2.err" >&2; exit 1; }
}
stamp=$(date +%s)
run "$work/local" "$work/local.json"
run "$uri/cost-$stamp" "$work/s3.json"
local_median=$(field step_seconds_median "$work/local.json")
s3_median=$(field step_seconds_median "$work/s3.json")

# SIGTERM in the middle of a long run: seconds until it exits with its checkpoint durable.
"$zenflow" run "$work/job.yaml" --quiet --set train.steps=1000000 --set "checkpoint.every_steps=1000000" \
  --set "checkpoint.dir=$uri/term-$stamp" --staging-dir "$work/stage" 2> "$work/term.err" > /dev/null &
pid=$!
for _ in $(seq 600); do grep -q '"step":20,' "$work/stage/"*/*/"term-$stamp/steps.jsonl" 2>/dev/null && break; sleep 0.1; done
t0=$(date +%s.%N)
kill -TERM $pid
wait $pid || true
t1=$(date +%s.%N)
durable=$(grep -o 'durable in [^ ]* ([0-9.]* s after' "$work/term.err" | grep -o '([0-9.]*' | tr -d '(')
ckpt_bytes=$(du -sb "$work/stage/"*/*/"term-$stamp/"step-* | sort -n | tail -1 | cut -f1)
cat <<JSON
{"bench": "s3_upload_cost", "uri": "$uri", "steps": $steps, "every_steps": $every,
 "local": {"step_seconds_median": $local_median, "step_seconds_p90": $(field step_seconds_p90 "$work/local.json"),
           "checkpoint_stall_seconds": $(field checkpoint "$work/local.json")},
 "s3": {"step_seconds_median": $s3_median, "step_seconds_p90": $(field step_seconds_p90 "$work/s3.json"),
        "checkpoint_stall_seconds": $(field checkpoint "$work/s3.json"),
        "checkpoint_upload_stall_seconds": $(field checkpoint_upload "$work/s3.json")},
 "step_time_cost_of_uploads": $(awk "BEGIN{print $s3_median / $local_median - 1}"),
 "sigterm": {"checkpoint_bytes": ${ckpt_bytes:-0}, "signal_to_exit_seconds": $(awk "BEGIN{print $t1 - $t0}"),
             "written_to_durable_seconds": ${durable:-null}}}
JSON
