#!/usr/bin/env bash
# Tests of the Helm chart helm/zenflow, one check per argument (CTest registers each, tests/CMakeLists.txt):
#
#   lint        helm lint --strict with the default values and with each tests/chart/values/*.yaml
#   template    helm template renders with each, and each file renders what it is for
#   validate    every rendered object against the Kubernetes / Prometheus Operator / cert-manager
#               OpenAPI schemas, plus unknown fields and labels (validate.mjs)
#   schema      wrong values are rejected by values.schema.json with the key's path, and
#               contradictory ones by the chart's own checks
#   rules       the PrometheusRules' rules, extracted from the rendered objects, pass promtool check rules
#   identity    the dashboards and rules in the rendered objects, and in the packaged chart, are
#               byte-identical to deploy/grafana/dashboards and deploy/prometheus/rules
#   secrets     tokens never appear outside the Secret (pod specs, NOTES), generated ones are well formed
#
# Exit 0 passed, 1 failed, 77 skipped (a tool is missing: bash scripts/install-deps.sh --test-tools).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
chart="$root/helm/zenflow"
validate_dir=${ZENFLOW_CHART_VALIDATE_DIR:-/usr/local/share/zenflow/npm/chart-validate}
export ZENFLOW_CHART_VALIDATE_DIR="$validate_dir"

skip() { echo "SKIPPED: $* (bash scripts/install-deps.sh --test-tools)"; exit 77; }
command -v helm >/dev/null 2>&1 || skip "helm not installed"
need_node() {
  command -v node >/dev/null 2>&1 || skip "node not installed"
  [ -d "$validate_dir/node_modules/kubernetes-models" ] || skip "chart validators not installed in $validate_dir"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# helm warns on stderr that files/dashboards and files/rules are symbolic links (into deploy/),
# whose contents it includes: expected, so not shown.
helm_() { helm "$@" 2> >(grep -v 'found symbolic link in path' >&2); }

# The values files under test: "defaults" (none) and tests/chart/values/*.yaml.
cases=(defaults)
for f in "$here"/values/*.yaml; do cases+=("$(basename "$f" .yaml)"); done
values_args() { [ "$1" = defaults ] || echo "-f $here/values/$1.yaml"; }
render() {  # render CASE → $work/CASE.yaml
  # shellcheck disable=SC2046
  helm_ template zf "$chart" --namespace ml $(values_args "$1") > "$work/$1.yaml"
}

check_lint() {
  for c in "${cases[@]}"; do
    # shellcheck disable=SC2046
    if out=$(helm_ lint --strict "$chart" $(values_args "$c") 2>&1); then pass "helm lint --strict ($c)"
    else fail "helm lint --strict ($c)"; echo "$out"; fi
  done
}

# Renders each case and checks a few facts that say the values file did what it is for.
expect() {  # CASE DESCRIPTION REGEX [absent]
  if [ "${4:-}" = absent ]; then
    if grep -Eq -- "$3" "$work/$1.yaml"; then fail "$1: $2"; else pass "$1: $2"; fi
  else
    if grep -Eq -- "$3" "$work/$1.yaml"; then pass "$1: $2"; else fail "$1: $2 (no match for /$3/)"; fi
  fi
}
check_template() {
  for c in "${cases[@]}"; do
    if render "$c"; then pass "helm template ($c): $(grep -c '^kind:' "$work/$c.yaml") objects"
    else fail "helm template ($c)"; fi
  done
  expect defaults "CPU workers offer their slot" '- --cpu-slots=1'
  expect defaults "plaintext only with --insecure-plaintext" '- --insecure-plaintext'
  expect defaults "gRPC probes on the health port" '^ *grpc:$'
  expect defaults "no GPU requested" 'nvidia.com/gpu:' absent
  expect defaults "job specs confined to the shared volume (and the work dir)" '- --allowed-root=/shared$'
  expect gpu-workers "8 GPUs per worker" '^ *nvidia.com/gpu: 8$'
  expect gpu-workers "workers are a DaemonSet" '^kind: DaemonSet$'
  expect gpu-workers "96 physical cores offered, 192 hardware threads requested" '--physical-cores=96'
  expect gpu-workers "192 CPUs requested" '^ *cpu: "192"$'
  expect gpu-workers "8 x 96 GiB + 32 GiB overhead + 64 GiB /dev/shm requested" '^ *memory: 864Gi$'
  expect gpu-workers "768 GiB offered to the scheduler" '--host-memory-gb=768'
  expect gpu-workers "EFA devices requested" 'vpc.amazonaws.com/efa: "32"'
  expect gpu-workers "GPU product affinity" 'nvidia.com/gpu.product'
  expect gpu-workers "IPC_LOCK" 'IPC_LOCK'
  expect gpu-workers "/dev/shm in memory" 'medium: Memory'
  expect gpu-workers "pricing rows passed with --pricing" '--pricing=/etc/zenflow/pricing/pricing.yaml'
  expect tls "a cert-manager Certificate" '^kind: Certificate$'
  expect tls "the coordinator serves TLS" '--tls-cert=/etc/zenflow/tls/tls.crt'
  expect tls "workers verify it" '--tls-ca=/etc/zenflow/tls/ca.crt'
  expect tls "no plaintext" 'insecure-plaintext' absent
  expect tls "the CLI namespace may reach gRPC" 'kubernetes.io/metadata.name: ml-team'
  expect optimizer-nodes "the optimizer Deployment" 'command: \[zenflow-optimizer\]'
  expect optimizer-nodes "its UCX port" '--listen=\$\(POD_IP\):7080'
  expect optimizer-nodes "pinned cores" '--cores=0-31'
  expect s3-storage "the bucket's endpoint" 'name: AWS_ENDPOINT_URL_S3'
  expect s3-storage "its region" 'value: "eu-west-1"'
  expect s3-storage "the credentials Secret" 'name: zenflow-s3$'
  expect s3-storage "IRSA's role on the service account" 'eks.amazonaws.com/role-arn: arn:aws:iam::123456789012:role/zenflow'
  expect s3-storage "no shared volume" 'PersistentVolumeClaim' absent
  expect s3-storage "no shared allowed root" '--allowed-root=/shared' absent
  expect s3-storage "jobs without a checkpoint.dir go to the bucket" '--checkpoint-root=s3://zenflow-ckpt/team-a$'
  expect defaults "no checkpoint root by default" '--checkpoint-root' absent
  expect defaults "no bucket settings by default" 'AWS_ENDPOINT_URL_S3' absent
  expect monitoring-off "no Prometheus Operator objects" 'monitoring.coreos.com' absent
  expect monitoring-off "no dashboards" 'grafana_dashboard' absent
}

check_validate() {
  need_node
  for c in "${cases[@]}"; do
    render "$c" || { fail "helm template ($c)"; continue; }
    if node "$here/validate.mjs" "$c" "$work/$c.yaml"; then pass "schemas ($c)"; else fail "schemas ($c)"; fi
  done
}

reject() {  # DESCRIPTION EXPECTED-TEXT HELM-ARGS...
  local what=$1 want=$2; shift 2
  local out
  if out=$(helm_ template zf "$chart" "$@" 2>&1 >/dev/null); then
    fail "$what: accepted"
  elif grep -Fq -- "$want" <<<"$out"; then
    pass "$what: rejected ($(grep -F -- "$want" <<<"$out" | head -n1 | sed 's/^ *//'))"
  else
    fail "$what: rejected without naming $want"; echo "$out"
  fi
}
check_schema() {
  reject "coordinator.port: \"abc\"" "coordinator.port: Invalid type" --set-string coordinator.port=abc
  reject "workers.gpus: -1" "workers.gpus: Must be greater than or equal to 0" --set workers.gpus=-1
  reject "a misspelt key workers.gpu" "workers: Additional property gpu is not allowed" --set workers.gpu=1
  reject "a misspelt top-level key" "Additional property coordinater is not allowed" --set coordinater.port=1
  reject "a 70000 health port" "coordinator.healthPort: Must be less than or equal to 65535" --set coordinator.healthPort=70000
  reject "workers.kind: Job" "workers.kind: workers.kind must be one of the following" --set workers.kind=Job
  reject "a relative allowed root" "workers.allowedRoots.0: Does not match pattern" --set 'workers.allowedRoots={data}'
  reject "a short admin token" "auth.adminToken: Does not match pattern" --set auth.adminToken=short
  reject "an unknown dashboard switch" "grafanaDashboards.dashboards: Additional property zenflow-cots is not allowed" \
    --set grafanaDashboards.dashboards.zenflow-cots=false
  reject "a string where a bool goes, in a values file" "serviceMonitor.enabled: Invalid type" \
    -f <(printf 'serviceMonitor:\n  enabled: "yes"\n')
  reject "TLS without a certificate source" "tls.enabled needs tls.existingSecret" --set tls.enabled=true
  reject "plaintext refused" "coordinator.insecurePlaintext" --set coordinator.insecurePlaintext=false
  reject "an endpoint with a path" "storage.s3.endpoint: Does not match pattern" --set storage.s3.endpoint=http://minio:9000/bucket
  reject "a role that is not an IAM role ARN" "storage.s3.roleArn: Does not match pattern" --set storage.s3.roleArn=zenflow
  reject "a bucket name S3 refuses" "storage.s3.bucket: Does not match pattern" --set storage.s3.bucket=My_Bucket
  reject "IRSA's role without the chart's service account" "storage.s3.roleArn annotates the chart's service account" \
    --set storage.s3.enabled=true --set storage.s3.roleArn=arn:aws:iam::123456789012:role/r --set serviceAccount.create=false
  reject "cert-manager without an issuer" "tls.certManager.issuerRef.name" \
    --set tls.enabled=true --set tls.certManager.enabled=true
}

check_rules() {
  need_node
  command -v promtool >/dev/null 2>&1 || skip "promtool not installed"
  render defaults || { fail "helm template (defaults)"; return; }
  node "$here/validate.mjs" --rules-out "$work/rules" rules "$work/defaults.yaml" >/dev/null ||
    fail "extracting the PrometheusRules"
  local files=("$work"/rules/*.yml)
  [ -e "${files[0]}" ] || { fail "no PrometheusRule rendered"; return; }
  if promtool check rules "${files[@]}"; then pass "promtool check rules on ${#files[@]} rendered PrometheusRule(s)"
  else fail "promtool check rules"; fi
}

check_identity() {
  need_node
  for c in defaults gpu-workers; do
    render "$c" || { fail "helm template ($c)"; continue; }
    local out
    if out=$(node "$here/validate.mjs" --deploy-dir "$root/deploy" "$c" "$work/$c.yaml"); then
      pass "rendered dashboards and rules = deploy/ ($c): $(grep -o '[0-9]* dashboard.*compared' <<<"$out")"
    else
      grep FAIL <<<"$out"; fail "rendered dashboards and rules differ from deploy/ ($c)"
    fi
  done
  # Every dashboard of deploy/ is rendered, one ConfigMap each, and has its switch in the schema.
  local n_deploy n_rendered
  n_deploy=$(find "$root/deploy/grafana/dashboards" -name '*.json' | wc -l)
  n_rendered=$(grep -c 'zenflow.io/source: deploy/grafana/dashboards/' "$work/defaults.yaml")
  if [ "$n_deploy" = "$n_rendered" ]; then pass "$n_rendered of $n_deploy dashboards rendered"
  else fail "$n_rendered of $n_deploy dashboards rendered"; fi
  for f in "$root"/deploy/grafana/dashboards/*.json; do
    grep -q "\"$(basename "$f" .json)\"" "$chart/values.schema.json" ||
      fail "values.schema.json has no grafanaDashboards.dashboards switch for $(basename "$f" .json)"
  done
  # The packaged chart holds the files themselves (helm follows the links into deploy/).
  if helm_ package "$chart" -d "$work/pkg" >/dev/null; then
    mkdir -p "$work/unpacked" && tar -m -xzf "$work"/pkg/zenflow-*.tgz -C "$work/unpacked"
    if diff -r "$root/deploy/grafana/dashboards" "$work/unpacked/zenflow/files/dashboards" &&
       diff -r "$root/deploy/prometheus/rules" "$work/unpacked/zenflow/files/rules"; then
      pass "the packaged chart's files/ are byte-identical to deploy/"
    else
      fail "the packaged chart's files/ differ from deploy/"
    fi
  else
    fail "helm package"
  fi
}

check_secrets() {
  local admin=0123456789abcdef0123456789abcdef worker=fedcba9876543210fedcba9876543210  # tls.yaml's
  render tls || { fail "helm template (tls)"; return; }
  # Outside the Secret the token values appear nowhere, in clear or in base64.
  local b64a b64w
  b64a=$(printf %s "$admin" | base64 -w0); b64w=$(printf %s "$worker" | base64 -w0)
  if grep -Fq -e "$admin" -e "$worker" "$work/tls.yaml"; then fail "a token appears in clear in the rendered objects"
  else pass "no token in clear in the rendered objects"; fi
  local hits
  hits=$(grep -Fc -e "$b64a" -e "$b64w" "$work/tls.yaml")
  if [ "$hits" = 2 ]; then pass "the tokens appear once each, base64, in the Secret"
  else fail "base64 tokens found $hits times (want 2)"; fi
  # NOTES.txt (helm template does not render it: a copy of the chart renders it as a ConfigMap).
  cp -rL "$chart" "$work/notes-chart"
  cp "$chart/templates/NOTES.txt" "$work/notes-chart/files/notes.txt"
  cat > "$work/notes-chart/templates/zz-notes.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
data:
  notes: {{ tpl (.Files.Get "files/notes.txt") . | toJson }}
EOF
  local notes
  if notes=$(helm template zf "$work/notes-chart" -f "$here/values/tls.yaml" --show-only templates/zz-notes.yaml 2>/dev/null); then
    if grep -Fq -e "$admin" -e "$worker" -e "$b64a" -e "$b64w" <<<"$notes"; then fail "NOTES.txt prints a token"
    else pass "NOTES.txt prints no token"; fi
    if grep -q 'port-forward svc/zf-zenflow-coordinator 7070' <<<"$notes"; then pass "NOTES.txt says how to port-forward"
    else fail "NOTES.txt has no port-forward"; fi
    if grep -q 'zenflow submit' <<<"$notes"; then pass "NOTES.txt says how to submit a job"
    else fail "NOTES.txt has no submit"; fi
  else
    fail "rendering NOTES.txt"
  fi
  # Generated tokens: 48 alphanumerics, different for admin and worker.
  render defaults || { fail "helm template (defaults)"; return; }
  local toks
  toks=$(awk '/^kind: Secret$/{s=1} s && /^  (admin|worker)-token: /{print $2}' "$work/defaults.yaml" | while read -r t; do
    printf %s "$t" | base64 -d; echo; done)
  if [ "$(grep -Ec '^[A-Za-z0-9]{48}$' <<<"$toks")" = 2 ] && [ "$(sort -u <<<"$toks" | wc -l)" = 2 ]; then
    pass "generated tokens: two distinct 48-character alphanumerics"
  else
    fail "generated tokens are not two distinct 48-character alphanumerics"
  fi
}

[ $# -ge 1 ] || { echo "usage: $0 lint|template|validate|schema|rules|identity|secrets..." >&2; exit 2; }
for check in "$@"; do
  case "$check" in
    lint|template|validate|schema|rules|identity|secrets) echo "== chart $check"; "check_$check" ;;
    *) echo "chart-test: unknown check $check" >&2; exit 2 ;;
  esac
done
if ((failures)); then echo "chart-test: $failures failure(s)"; exit 1; fi
echo "chart-test: passed"
