// `zenflow run JOB.yaml`: its flags; what it does is the rank's (worker/rank/rank_main.h):
// train a job in this process (the embedded default), or one rank of it for the worker agent
// (--report-fd, --lease-fd, --lock-wait).
#include <memory>

#include "client/commands.h"
#include "client/verbs.h"
#include "worker/rank/rank_main.h"

namespace zenflow::cli {
namespace {

CommandRegistrar reg(train_verb("run")->order, [](CommandContext& ctx) {
  auto args = std::make_shared<RankArgs>();
  CLI::App* cmd = ctx.root->add_subcommand("run", train_verb("run")->help);
  cmd->add_option("job", args->job, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a spec key: --set train.steps=50 (repeatable)");
  cmd->add_flag("--json", args->json, "Print one JSON object with the results at the end (stdout)");
  cmd->add_flag("--fresh,--no-resume", args->fresh,
                "Start over from step 0: what earlier runs wrote in checkpoint.dir (its step-* checkpoints, "
                "damaged and unfinished ones included, steps.jsonl and profile.yaml) is first moved into "
                "checkpoint.dir/superseded-YYYYmmdd-HHMMSS/; nothing is deleted, nothing else is touched. "
                "Without it a run resumes from its newest checkpoint, and one already at train.steps does "
                "nothing. Also the way past a directory whose every checkpoint is damaged");
  cmd->add_option("--allow-spec-change", args->allow_spec_change,
                  "Resume although these keys changed since the checkpoint (comma-separated, e.g. "
                  "optimizer.mode,train.seq_len)");
  cmd->add_option("--pricing", args->pricing,
                  "Pricing catalog merged by instance name over the shipped deploy/pricing.yaml (its rows "
                  "replace or add; repeatable); cost.instance_type is looked up there")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--profile", args->profile,
                "After training, write checkpoint.dir/profile.yaml: the steady step by cause, bytes, and probes of "
                "this host on the job's cores (GEMM, AdamW, copies, host AdamW by core count), for zenflow advise");
  cmd->add_flag("--profile-if-possible", args->profile_if_possible,
                "Like --profile, but a run too short to profile only says so (the worker agent asks this of every "
                "attempt: the coordinator keeps the profile for zenflow advise JOB_ID)");
  cmd->add_flag("--quiet", args->quiet, "No progress lines");
  cmd->add_flag("--verbose", args->verbose, "Show LibTorch's stack trace with an error");
  cmd->add_option("--nproc", args->nproc, "Data-parallel rank processes on this machine (Gloo on CPU, NCCL on GPU); "
                  "default: resources.gpus_per_worker")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--metrics-port", args->metrics_port,
                  "Serve Prometheus /metrics and /healthz on this port while training (0: off, unless "
                  "--metrics-port-file; with --nproc, rank 0's metrics only)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-host", args->metrics_host,
                  "Address the metrics port listens on (default 127.0.0.1; 0.0.0.0 for every interface)");
  cmd->add_option("--metrics-port-file", args->metrics_port_file,
                  "Serve /metrics from every rank, on --metrics-port or (0) a free port the kernel picks, and "
                  "write the port to this file once it listens; for the worker agent, which merges its ranks' "
                  "metrics into its own /metrics. A rank that cannot serve trains without metrics");
  cmd->add_option("--job-id", args->job_id,
                  "The job_id label of the metrics (default: the spec's name); the worker agent passes the "
                  "coordinator's job id");
  cmd->add_option("--report-fd", args->report_fd,
                  "Write the run's events to this open file descriptor, one JSON object per line (start, "
                  "step at most 4 a second and the last one, checkpoint, log, finish); for the worker agent")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* lease_fd =
      cmd->add_option(
             "--lease-fd", args->lease_fd,
             "Run under the worker agent's lease: every byte read from this open file descriptor renews "
             "it; at EOF, or after --lease-timeout without a byte, exit 75 at once without writing a "
             "checkpoint")
          ->check(CLI::NonNegativeNumber);
  cmd->add_option("--lease-timeout", args->lease_timeout,
                  "Seconds without a byte on --lease-fd before the lease expires (default 3)")
      ->needs(lease_fd)
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--lock-wait", args->lock_wait,
                  "Seconds to wait for another process to release checkpoint.dir's lock before failing "
                  "(default 0: fail at once)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--staging-dir", args->staging_dir,
                  "With checkpoint.dir: s3://BUCKET/PREFIX, where checkpoints are written before their upload "
                  "and downloaded to for a resume: DIR/BUCKET/PREFIX (default: $ZENFLOW_STAGING_DIR, else "
                  "~/.cache/zenflow/checkpoints)");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "Where model.from, data.* and data.tokenizer given as s3:// URIs are downloaded, once, and "
                  "shared by runs (default: $ZENFLOW_CACHE_DIR, else ~/.cache/zenflow/objects; at most "
                  "$ZENFLOW_CACHE_MAX_GB, default 200, least recently used entries evicted first)");
  cmd->callback([args, &ctx] {
    args->argv = ctx.argv;
    ctx.exit_code = run_rank(*args);
  });
});

}  // namespace
}  // namespace zenflow::cli
