// The verbs that talk to a coordinator: submit, jobs, status, watch, logs, cancel, workers.
//
// Where: --coordinator HOST:PORT or ZENFLOW_COORDINATOR (default 127.0.0.1:7070); the admin
// token from --token-file or ZENFLOW_TOKEN_FILE; TLS with --tls-ca or ZENFLOW_TLS_CA.
// Human tables by default, --json for one JSON document (the proto's JSON mapping).
// Exit codes: 0 ok, 2 bad input, 3 not found, 4 unauthenticated or denied, 5 unavailable;
// `submit --wait` exits 0 when the job SUCCEEDED and 1 when it FAILED or was CANCELLED.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "client/commands.h"
#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/model/model_shapes.h"
#include "common/model/spec_model_config.h"
#include "common/rpc/rpc.h"
#include "common/terminal_text.h"
#include "zenflow/v1/jobs.grpc.pb.h"

namespace zenflow::cli {
namespace {

constexpr int kExitNotFound = 3;
constexpr int kExitDenied = 4;
constexpr int kExitUnavailable = 5;
constexpr std::chrono::milliseconds kCallDeadline{10'000};

struct Remote : CoordinatorFlags {
  bool json = false;
  std::string token;
  std::unique_ptr<v1::JobService::Stub> stub;
};

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

void add_remote_flags(CLI::App* cmd, Remote& r) {
  add_coordinator_flags(cmd, r);
  cmd->add_flag("--json", r.json, "Print JSON instead of a table");
}

// How long a verb waits for its first connection before it says the coordinator cannot be
// reached (exit 5). A call on a connection that breaks later is retried longer (unary()).
constexpr std::chrono::milliseconds kConnectWait{1500};

// Connects; on a bad flag, or a coordinator that cannot be reached within kConnectWait,
// prints why and returns the exit code (else 0).
int connect(Remote& r) {
  std::shared_ptr<grpc::Channel> channel;
  try {
    rpc::parse_host_port(r.coordinator, "--coordinator");
    if (!r.token_file.empty()) r.token = rpc::read_token_file(r.token_file);
    rpc::ChannelOptions co;
    co.ca_file = r.tls_ca;
    co.tls_server_name = r.tls_server_name;
    channel = rpc::make_channel(r.coordinator, co);
  } catch (const std::invalid_argument& e) {
    std::cerr << "zenflow: " << e.what() << "\n";
    return kExitBadInput;
  }
  r.stub = v1::JobService::NewStub(channel);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + kConnectWait)) {
    // Why, in gRPC's words (refused, TLS, name resolution): one call that fails at once.
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, r.token, std::chrono::milliseconds(200));
    v1::JobStatus ignored;
    const grpc::Status s = r.stub->GetJob(&ctx, v1::GetJobRequest(), &ignored);
    const std::string why = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                ? "no answer within " + std::to_string(kConnectWait.count()) + " ms"
                                : terminal_safe(rpc::describe(s));
    std::cerr << "zenflow: cannot reach a coordinator at " << r.coordinator << ": " << why
              << " (--coordinator or ZENFLOW_COORDINATOR)\n";
    return kExitUnavailable;
  }
  return 0;
}

int exit_code_of(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK: return kExitOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return kExitBadInput;
    case grpc::StatusCode::NOT_FOUND: return kExitNotFound;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return kExitDenied;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return kExitUnavailable;
    default: return kExitFailure;
  }
}

int fail(const Remote& r, const grpc::Status& s) {
  std::string hint;
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) hint = " (is a coordinator running at " + r.coordinator + "?)";
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && r.token.empty())
    hint = " (pass --token-file or set ZENFLOW_TOKEN_FILE)";
  std::cerr << "zenflow: " << terminal_safe(rpc::describe(s)) << hint << "\n";
  return exit_code_of(s);
}

std::string to_json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string state_name(v1::JobState s) { return v1::JobState_Name(s); }
bool finished(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

std::string duration_text(double seconds) {
  if (seconds < 0) return "-";
  char buf[32];
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  return buf;
}

std::string age_text(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  return duration_text(double(now - unix_ms) / 1000.0);
}

// Names a worker or the coordinator chose, joined and made safe to print.
std::string join(const google::protobuf::RepeatedPtrField<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "-" : terminal_safe(out);
}

void print_status(const v1::JobStatus& j) {
  // Every value may come from a job's spec, a worker or a rank: printed terminal-safe.
  auto row = [](const char* k, const std::string& v) { std::printf("%-15s %s\n", k, terminal_safe(v).c_str()); };
  char buf[64];
  row("id:", j.id());
  row("name:", j.name());
  row("state:", state_name(j.state()));
  std::snprintf(buf, sizeof(buf), "%lld/%lld (%.1f%%)", static_cast<long long>(j.step()),
                static_cast<long long>(j.total_steps()), j.progress_percent());
  row("step:", buf);
  if (j.resumed_from_step() > 0) row("resumed from:", "step " + std::to_string(j.resumed_from_step()));
  std::snprintf(buf, sizeof(buf), "%.4f", j.last_loss());
  if (j.step() > 0) row("loss:", buf);
  // Running: now; ended: as its last attempt last reported them.
  if (j.state() == v1::RUNNING || (finished(j.state()) && j.tokens_per_second() > 0)) {
    std::snprintf(buf, sizeof(buf), "%.0f", j.tokens_per_second());
    row("tokens/s:", buf);
    std::snprintf(buf, sizeof(buf), "%.1f%%", 100 * j.stall_share());
    row("stall share:", buf);
  }
  if (j.state() == v1::RUNNING) row("eta:", duration_text(j.eta_seconds()));
  row("placement:", join(j.placement()));
  row("attempt:", std::to_string(j.attempt()));
  row("restarts:", std::to_string(j.restarts()));
  if (j.preemptions() > 0) row("preemptions:", std::to_string(j.preemptions()));
  row("priority:", std::to_string(j.priority()));
  row("submitted:", age_text(j.submit_time_ms()) + " ago");
  if (j.usd_per_hour() > 0) {
    std::snprintf(buf, sizeof(buf), "$%.4f at $%.4f/h", j.cost_usd(), j.usd_per_hour());
    row("cost so far:", buf);
    std::snprintf(buf, sizeof(buf), "$%.4f to stalls, $%.4f to restarts", j.usd_lost_to_stalls(),
                  j.usd_lost_to_restarts());
    row("lost:", buf);
    if (j.usd_per_1m_tokens() > 0) {
      std::snprintf(buf, sizeof(buf), "$%.4f (%lld tokens)", j.usd_per_1m_tokens(), static_cast<long long>(j.tokens()));
      row("per 1M tokens:", buf);
    }
    row("price:", j.price_source());
  } else {
    row("cost so far:", "not priced (set cost.instance_type or cost.usd_per_hour)");
  }
  row("checkpoints:", j.checkpoint_dir());
  if (!j.waiting_reason().empty()) row("waiting:", j.waiting_reason());
  if (!j.last_error().empty()) row("last error:", j.last_error());
}

// --- model size for resources.host_memory_gb: auto ---

void fill_model_facts(const JobSpec& spec, v1::SubmitJobRequest* req) {
  // Best effort: without it the coordinator places by GPUs and cores (and says so).
  try {
    const int64_t vocab = spec.data.tokenizer == "byte" ? 256 : 0;
    if (vocab == 0 && spec.model.from.empty()) return;
    // The parameters' shapes from the config alone (as the preflight counts), no LibTorch.
    const nlohmann::json config = model::hf_config_from_spec(spec.model, vocab);
    int64_t total = 0, split = 0;
    for (const model::ParameterShape& p : model::hf_parameter_shapes(config)) {
      const int64_t numel = p.numel();
      total += numel;
      if (spec.optimizer.mode == "offload" ||
          (spec.optimizer.mode == "zenflow" && p.shape.size() == 2 && numel >= spec.optimizer.zenflow.min_split_numel))
        split += numel;
    }
    req->set_total_params(total);
    req->set_split_params(split);
    req->set_weight_bytes(spec.train.dtype == "bfloat16" || spec.train.dtype == "float16" ? 2 : 4);
  } catch (const std::exception&) {
  }
}

// --- verbs ---

struct SubmitArgs {
  Remote r;
  std::string job;
  std::vector<std::string> sets;
  std::string request_id;
  bool wait = false;
};

std::string random_request_id() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(g()),
                static_cast<unsigned long long>(g()));
  return buf;
}

int follow_logs(Remote& r, const std::string& id, bool follow, bool quiet_json, bool raw = false);

int submit(SubmitArgs& a) {
  JobSpec spec;
  try {
    spec = load_job_spec(a.job, a.sets);  // the local checks (paths exist) before sending
  } catch (const SpecError& e) {
    std::cerr << "zenflow: invalid job spec: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    std::cerr << "zenflow: invalid job spec: " << e.what() << "\n";
    return kExitBadInput;
  }
  if (int rc = connect(a.r)) return rc;
  v1::SubmitJobRequest req;
  // The resolved spec: absolute paths, every default written out.
  req.set_spec_yaml(to_yaml(spec));
  req.set_checkpoint_dir_default(spec.checkpoint.dir_defaulted);
  req.set_request_id(a.request_id.empty() ? random_request_id() : a.request_id);
  fill_model_facts(spec, &req);
  v1::SubmitJobResponse resp;
  grpc::Status s;
  // A retry with the same request_id can never create a second job: retry what may not
  // have arrived (UNAVAILABLE, DEADLINE_EXCEEDED) for up to ~20 s.
  for (int i = 0; i < 40; ++i) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, a.r.token, kCallDeadline);
    s = a.r.stub->SubmitJob(&ctx, req, &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!s.ok()) return fail(a.r, s);
  const v1::JobStatus& j = resp.job();
  if (!a.wait) {
    if (a.r.json) {
      std::cout << to_json(resp) << std::endl;
    } else {
      std::cout << j.id() << "\n";
      std::cerr << "zenflow: job " << j.id() << " (" << j.name() << ") " << (resp.created() ? "submitted" : "already submitted")
                << "; zenflow status " << j.id() << ", zenflow logs " << j.id() << " -f\n";
    }
    return kExitOk;
  }
  std::cerr << "zenflow: job " << j.id() << " (" << j.name() << ") submitted; following its logs\n";
  if (int rc = follow_logs(a.r, j.id(), true, a.r.json); rc != kExitOk) return rc;
  v1::JobStatus final;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, a.r.token, kCallDeadline);
    v1::GetJobRequest g;
    g.set_id(j.id());
    s = a.r.stub->GetJob(&ctx, g, &final);
    if (s.ok() && finished(final.state())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!s.ok()) return fail(a.r, s);
  if (a.r.json) std::cout << to_json(final) << std::endl;
  std::cerr << "zenflow: job " << final.id() << " " << state_name(final.state())
            << (final.last_error().empty() ? "" : ": " + final.last_error()) << "\n";
  return final.state() == v1::SUCCEEDED ? kExitOk : kExitFailure;
}

// Streams the job's log to stdout from offset 0, reconnecting (from the offset reached)
// when the coordinator restarts, until the job ends (follow) or the log's end (not follow).
int follow_logs(Remote& r, const std::string& id, bool follow, bool quiet_json, bool raw) {
  int64_t offset = 0;
  TerminalSafeStream safe;  // the job's bytes, escaped as they come (unless --raw)
  const auto print = [&](std::string_view bytes) {
    if (quiet_json) return;
    if (raw) {
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    } else {
      const std::string text = safe.feed(bytes);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    std::fflush(stdout);
  };
  const auto done = [&](int code) {
    if (!raw && !quiet_json) {
      const std::string rest = safe.finish();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fflush(stdout);
    }
    return code;
  };
  auto last_ok = std::chrono::steady_clock::now();
  for (;;) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, r.token, follow ? std::chrono::hours(24 * 365) : kCallDeadline);
    v1::StreamLogsRequest req;
    req.set_id(id);
    req.set_follow(follow);
    req.set_offset(offset);
    auto reader = r.stub->StreamLogs(&ctx, req);
    v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
      print(chunk.data());
      offset = chunk.offset() + static_cast<int64_t>(chunk.data().size());
      last_ok = std::chrono::steady_clock::now();
    }
    const grpc::Status s = reader->Finish();
    if (s.ok()) return done(kExitOk);
    const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::CANCELLED;
    if (!follow || !transient || std::chrono::steady_clock::now() - last_ok > std::chrono::seconds(60))
      return done(fail(r, s));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // coordinator restarting
  }
}

// Reads and cancel are safe to repeat: a call that meets a connection the coordinator
// dropped (a restart: UNAVAILABLE at once) is retried, waiting for the server to be back.
template <class Req, class Resp, class Fn>
grpc::Status unary(Remote& r, Fn fn, const Req& req, Resp* resp) {
  grpc::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, r.token, kCallDeadline);
    if (attempt > 0) ctx.set_wait_for_ready(true);
    s = (r.stub.get()->*fn)(&ctx, req, resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  return s;
}

int jobs_verb(Remote& r, const std::vector<std::string>& states, int limit) {
  if (int rc = connect(r)) return rc;
  v1::ListJobsRequest req;
  for (const std::string& s : states) {
    v1::JobState e;
    std::string upper = s;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!v1::JobState_Parse(upper, &e) || e == v1::JOB_STATE_UNSPECIFIED) {
      std::cerr << "zenflow: --state: unknown state \"" << s
                << "\" (QUEUED, STARTING, RUNNING, PREEMPTED, SUCCEEDED, FAILED, CANCELLED)\n";
      return kExitBadInput;
    }
    req.add_states(e);
  }
  req.set_page_size(limit);
  v1::ListJobsResponse resp;
  if (grpc::Status s = unary(r, &v1::JobService::Stub::ListJobs, req, &resp); !s.ok()) return fail(r, s);
  if (r.json) {
    std::cout << to_json(resp) << std::endl;
    return kExitOk;
  }
  std::printf("%-10s %-20s %-10s %6s %-13s %8s %9s %7s %-16s %4s %10s %8s %10s %8s\n", "ID", "NAME", "STATE", "PROG",
              "STEP", "LOSS", "TOK/S", "ETA", "WORKERS", "RST", "COST", "$/1M-TOK", "$-STALLS", "AGE");
  for (const v1::JobStatus& j : resp.jobs()) {
    char step[32], loss[16], prog[16], tps[16], cost[24], per_m[24], stalls[24];
    if (j.usd_per_hour() > 0) {
      std::snprintf(cost, sizeof(cost), "$%.2f", j.cost_usd());
      std::snprintf(stalls, sizeof(stalls), "$%.2f", j.usd_lost_to_stalls());
    } else {
      std::snprintf(cost, sizeof(cost), "-");
      std::snprintf(stalls, sizeof(stalls), "-");
    }
    if (j.usd_per_1m_tokens() > 0) std::snprintf(per_m, sizeof(per_m), "$%.3f", j.usd_per_1m_tokens());
    else std::snprintf(per_m, sizeof(per_m), "-");
    std::snprintf(step, sizeof(step), "%lld/%lld", static_cast<long long>(j.step()), static_cast<long long>(j.total_steps()));
    std::snprintf(prog, sizeof(prog), "%.0f%%", j.progress_percent());
    if (j.step() > 0) std::snprintf(loss, sizeof(loss), "%.4f", j.last_loss());
    else std::snprintf(loss, sizeof(loss), "-");
    if (j.state() == v1::RUNNING || (finished(j.state()) && j.tokens_per_second() > 0))
      std::snprintf(tps, sizeof(tps), "%.0f", j.tokens_per_second());
    else std::snprintf(tps, sizeof(tps), "-");
    std::printf("%-10s %-20s %-10s %6s %-13s %8s %9s %7s %-16s %4lld %10s %8s %10s %8s\n", terminal_safe(j.id()).c_str(),
                terminal_safe(j.name().substr(0, 20)).c_str(), state_name(j.state()).c_str(), prog, step, loss, tps,
                j.state() == v1::RUNNING ? duration_text(j.eta_seconds()).c_str() : "-", join(j.placement()).c_str(),
                static_cast<long long>(j.restarts()), cost, per_m, stalls, age_text(j.submit_time_ms()).c_str());
  }
  if (!resp.next_page_token().empty()) std::printf("(more: --limit %d shows more)\n", limit * 2);
  return kExitOk;
}

int status_verb(Remote& r, const std::string& id) {
  if (int rc = connect(r)) return rc;
  v1::GetJobRequest req;
  req.set_id(id);
  v1::JobStatus j;
  if (grpc::Status s = unary(r, &v1::JobService::Stub::GetJob, req, &j); !s.ok()) return fail(r, s);
  if (r.json) std::cout << to_json(j) << std::endl;
  else print_status(j);
  return kExitOk;
}

int watch_verb(Remote& r, const std::string& id) {
  if (int rc = connect(r)) return rc;
  int64_t after = 0;
  auto last_ok = std::chrono::steady_clock::now();
  for (;;) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, r.token, std::chrono::hours(24 * 365));
    v1::WatchJobRequest req;
    req.set_id(id);
    req.set_after_revision(after);
    auto reader = r.stub->WatchJob(&ctx, req);
    v1::JobEvent ev;
    while (reader->Read(&ev)) {
      after = ev.revision();
      last_ok = std::chrono::steady_clock::now();
      const v1::JobStatus& j = ev.job();
      if (r.json) {
        std::cout << to_json(ev) << std::endl;
      } else {
        std::printf("%s %-10s step %lld/%lld  loss %.4f  %.0f tok/s  eta %s%s\n", j.id().c_str(),
                    state_name(j.state()).c_str(), static_cast<long long>(j.step()),
                    static_cast<long long>(j.total_steps()), j.last_loss(), j.tokens_per_second(),
                    duration_text(j.eta_seconds()).c_str(),
                    j.last_error().empty() ? "" : ("  (" + terminal_safe(j.last_error()) + ")").c_str());
        std::fflush(stdout);
      }
    }
    const grpc::Status s = reader->Finish();
    if (s.ok()) return kExitOk;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() - last_ok > std::chrono::seconds(60))
      return fail(r, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

int cancel_verb(Remote& r, const std::string& id) {
  if (int rc = connect(r)) return rc;
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::CancelJobResponse resp;
  if (grpc::Status s = unary(r, &v1::JobService::Stub::CancelJob, req, &resp); !s.ok()) return fail(r, s);
  if (r.json) std::cout << to_json(resp) << std::endl;
  else std::cout << id << " " << (resp.job().state() == v1::CANCELLED ? "cancelled" : "cancelling: checkpointing and stopping") << "\n";
  return kExitOk;
}

int workers_verb(Remote& r) {
  if (int rc = connect(r)) return rc;
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  if (grpc::Status s = unary(r, &v1::JobService::Stub::ListWorkers, req, &resp); !s.ok()) return fail(r, s);
  if (r.json) {
    std::cout << to_json(resp) << std::endl;
    return kExitOk;
  }
  std::printf("%-16s %-9s %-7s %-22s %9s %6s %-20s %9s\n", "NAME", "ROLE", "STATE", "SLOTS", "HOST-RAM", "CORES", "JOBS",
              "HEARTBEAT");
  for (const v1::WorkerStatus& w : resp.workers()) {
    const v1::WorkerResources& res = w.resources();
    const std::string slots = res.gpus_size() > 0 ? std::to_string(res.gpus_size()) + "x " + terminal_safe(res.gpus(0).model())
                                                  : std::to_string(res.cpu_slots()) + " cpu";
    char ram[32];
    std::snprintf(ram, sizeof(ram), "%.1f GiB", double(res.host_memory_bytes()) / double(1LL << 30));
    std::printf("%-16s %-9s %-7s %-22s %9s %6lld %-20s %9s\n", terminal_safe(w.name()).c_str(), v1::WorkerRole_Name(w.role()).c_str(),
                v1::WorkerState_Name(w.state()).c_str(), slots.c_str(), ram,
                static_cast<long long>(res.physical_cores()), join(w.jobs()).c_str(),
                (age_text(w.last_heartbeat_ms()) + " ago").c_str());
  }
  return kExitOk;
}

CommandRegistrar reg(20, [](CommandContext& ctx) {
  {
    auto a = std::make_shared<SubmitArgs>();
    CLI::App* cmd = ctx.root->add_subcommand("submit", "Submit a job to a coordinator");
    cmd->add_option("job", a->job, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
    cmd->add_option("--set", a->sets, "Override a spec key: --set train.steps=50 (repeatable)");
    cmd->add_option("--request-id", a->request_id,
                    "Idempotency key: a retry with the same id returns the original job (default: random)");
    cmd->add_flag("--wait", a->wait, "Follow the logs and exit with the job's result (0 SUCCEEDED, 1 otherwise)");
    add_remote_flags(cmd, a->r);
    cmd->callback([a, &ctx] { ctx.exit_code = submit(*a); });
  }
  {
    auto r = std::make_shared<Remote>();
    auto states = std::make_shared<std::vector<std::string>>();
    auto limit = std::make_shared<int>(100);
    CLI::App* cmd = ctx.root->add_subcommand("jobs", "List jobs, newest first");
    cmd->add_option("--state", *states, "Only jobs in these states (repeatable)");
    cmd->add_option("--limit", *limit, "At most this many")->check(CLI::Range(1, 1000));
    add_remote_flags(cmd, *r);
    cmd->callback([r, states, limit, &ctx] { ctx.exit_code = jobs_verb(*r, *states, *limit); });
  }
  auto with_id = [&ctx](const char* name, const char* help, auto fn) {
    auto r = std::make_shared<Remote>();
    auto id = std::make_shared<std::string>();
    CLI::App* cmd = ctx.root->add_subcommand(name, help);
    cmd->add_option("id", *id, "Job id")->required();
    add_remote_flags(cmd, *r);
    cmd->callback([r, id, fn, &ctx] { ctx.exit_code = fn(*r, *id); });
    return cmd;
  };
  with_id("status", "Show a job's state, progress, placement and last error", status_verb);
  with_id("watch", "Print a job's state and progress as they change, until it ends", watch_verb);
  with_id("cancel", "Cancel a job (a running one checkpoints and stops)", cancel_verb);
  {
    auto r = std::make_shared<Remote>();
    auto id = std::make_shared<std::string>();
    auto follow = std::make_shared<bool>(false);
    auto raw = std::make_shared<bool>(false);
    CLI::App* cmd = ctx.root->add_subcommand("logs", "Print a job's output (every attempt)");
    cmd->add_option("id", *id, "Job id")->required();
    cmd->add_flag("-f,--follow", *follow, "Keep printing until the job ends");
    cmd->add_flag("--raw", *raw,
                  "Print the bytes as the ranks wrote them (by default control characters, escape "
                  "sequences, bidi overrides and invalid UTF-8 are shown escaped, e.g. \\x1b)");
    add_remote_flags(cmd, *r);
    cmd->callback([r, id, follow, raw, &ctx] {
      ctx.exit_code = connect(*r);
      if (ctx.exit_code == 0) ctx.exit_code = follow_logs(*r, *id, *follow, false, *raw);
    });
  }
  {
    auto r = std::make_shared<Remote>();
    CLI::App* cmd = ctx.root->add_subcommand("workers", "List the workers a coordinator knows");
    add_remote_flags(cmd, *r);
    cmd->callback([r, &ctx] { ctx.exit_code = workers_verb(*r); });
  }
});

}  // namespace

void add_coordinator_flags(CLI::App* cmd, CoordinatorFlags& f) {
  f.coordinator = env_or("ZENFLOW_COORDINATOR", "127.0.0.1:7070");
  f.token_file = env_or("ZENFLOW_TOKEN_FILE", "");
  f.tls_ca = env_or("ZENFLOW_TLS_CA", "");
  cmd->add_option("--coordinator", f.coordinator, "Coordinator HOST:PORT (env ZENFLOW_COORDINATOR)");
  cmd->add_option("--token-file", f.token_file, "File holding the admin token (env ZENFLOW_TOKEN_FILE)");
  cmd->add_option("--tls-ca", f.tls_ca, "PEM CA of the coordinator's TLS certificate (env ZENFLOW_TLS_CA)");
  cmd->add_option("--tls-server-name", f.tls_server_name, "Name to check in the coordinator's certificate");
}

int fetch_job_profile(const CoordinatorFlags& f, const std::string& id, std::string* yaml) {
  Remote r;
  static_cast<CoordinatorFlags&>(r) = f;
  if (int rc = connect(r)) return rc;
  v1::GetJobProfileRequest req;
  req.set_id(id);
  v1::JobProfile resp;
  if (grpc::Status s = unary(r, &v1::JobService::Stub::GetJobProfile, req, &resp); !s.ok()) return fail(r, s);
  *yaml = std::move(*resp.mutable_profile_yaml());
  return kExitOk;
}

}  // namespace zenflow::cli
