// What the CLI prints that came from elsewhere (a job's output, a worker's fields, a server's
// errors) reaches the admin's terminal escaped: no byte a job or a worker chose can drive the
// terminal (clear it, retitle it, write the clipboard, reorder text). `zenflow logs --raw`
// prints the bytes as they are.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/rpc/rpc.h"
#include "common/terminal_text.h"
#include "tests/support/service_cluster.h"
#include "tests/support/tiny_job.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using test_support::Cluster;

// What hostile output looks like: clear the screen, retitle the window, write the clipboard,
// a C1 CSI, a bidi override, a carriage return that overwrites the line, and a stray byte.
const std::string kHostile =
    "before\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07 c1:\xc2\x9b" "31m bidi:\xe2\x80\xae" "fed\rover \xff end\n";

TEST(TerminalText, EscapesWhatDrivesATerminalAndKeepsTheRest) {
  EXPECT_EQ(terminal_safe(kHostile),
            "before\\x1b[2J\\x1b]0;pwned\\x07\\x1b]52;c;cm0gLXJmIH4=\\x07 c1:\\u009b31m bidi:\\u202efed\\x0dover "
            "\\xff end\n");
  const std::string fine = "tabs\tand newlines\n, caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87, \xf0\x9f\x98\x80";
  EXPECT_EQ(terminal_safe(fine), fine);
  EXPECT_EQ(terminal_safe(std::string("nul\0!", 5)), "nul\\x00!");
  EXPECT_EQ(terminal_safe("\x7f"), "\\x7f");
  EXPECT_EQ(terminal_safe("\xe2\x81\xa6isolate\xe2\x81\xa9"), "\\u2066isolate\\u2069");
}

TEST(TerminalText, AStreamHoldsASequenceCutBetweenChunks) {
  TerminalSafeStream s;
  // The euro sign (e2 82 ac) cut after its first byte, then a C1 control cut in two.
  std::string out = s.feed("price: \xe2");
  out += s.feed("\x82\xac, then \xc2");
  out += s.feed("\x9b" "end");
  out += s.finish();
  EXPECT_EQ(out, "price: \xe2\x82\xac, then \\u009bend");
  TerminalSafeStream cut;
  std::string tail = cut.feed("ends inside \xf0\x9f");
  tail += cut.finish();
  EXPECT_EQ(tail, "ends inside \\xf0\\x9f");
}

// Runs `argv` on a pseudo-terminal (as an admin's shell would) and returns all it printed.
std::string on_a_terminal(const std::vector<std::string>& argv) {
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) return "forkpty failed";
  if (pid == 0) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child closed the terminal
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

TEST(CliTerminal, LogsAndWorkersPrintNoRawEscapeFromAJobOrAWorker) {
  Cluster c("cli-terminal");
  c.start_coordinator();
  // A worker (this test, speaking WorkerService) whose GPU model is hostile.
  auto stub = v1::WorkerService::NewStub(rpc::make_channel(c.address(), rpc::ChannelOptions{}));
  std::string session;  // RegisterWorker's, for every later call
  auto call = [&](auto fn, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), std::chrono::seconds(10), session);
    return (stub.get()->*fn)(&ctx, req, resp);
  };
  v1::RegisterWorkerRequest reg;
  reg.set_name("w1");
  reg.set_role(v1::TRAINER);
  reg.mutable_resources()->set_cpu_slots(1);
  reg.mutable_resources()->set_host_memory_bytes(int64_t{8} << 30);
  reg.mutable_resources()->set_physical_cores(2);
  v1::GpuInfo* gpu = reg.mutable_resources()->add_gpus();
  // Printable enough for the coordinator (it refuses control characters at registration),
  // not for a terminal: a bidi override reorders what follows it.
  gpu->set_model("H100\xe2\x80\xae" "evil");
  gpu->set_memory_bytes(int64_t{80} << 30);
  reg.add_rendezvous_ports(29500);
  v1::RegisterWorkerResponse regd;
  ASSERT_TRUE(call(&v1::WorkerService::Stub::RegisterWorker, reg, &regd).ok());
  session = regd.session();

  const fs::path spec = c.dir() / "job.yaml";
  test_support::write_file(spec, test_support::tiny_job_spec("hostile"));
  const std::string id = c.submit(spec, "--set train.device=auto");  // placed on the GPU it offers
  ASSERT_FALSE(id.empty());
  v1::FetchAssignmentsRequest fetch;
  fetch.set_name("w1");
  fetch.set_incarnation(regd.incarnation());
  fetch.set_wait_ms(5000);
  v1::FetchAssignmentsResponse assigned;
  ASSERT_TRUE(test_support::wait_until(
      [&] {
        return call(&v1::WorkerService::Stub::FetchAssignments, fetch, &assigned).ok() &&
               assigned.assignments_size() > 0;
      },
      std::chrono::seconds(20)));
  v1::UploadLogsRequest up;
  up.set_name("w1");
  up.set_incarnation(regd.incarnation());
  up.mutable_attempt()->set_job_id(id);
  up.mutable_attempt()->set_attempt(assigned.assignments(0).attempt());
  up.set_offset(0);
  up.set_data(kHostile);
  v1::UploadLogsResponse upd;
  ASSERT_TRUE(call(&v1::WorkerService::Stub::UploadLogs, up, &upd).ok());

  const std::vector<std::string> remote = {"--coordinator", c.address(), "--token-file", c.admin_token_file().string()};
  auto verb = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {Cluster::bin("zenflow")};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), remote.begin(), remote.end());
    return on_a_terminal(argv);
  };
  const std::string logs = verb({"logs", id});
  EXPECT_NE(logs.find("before\\x1b[2J\\x1b]0;pwned"), std::string::npos) << logs;
  EXPECT_EQ(logs.find('\x1b'), std::string::npos) << "a raw ESC reached the terminal";
  EXPECT_EQ(logs.find("\xc2\x9b"), std::string::npos) << "a raw C1 control reached the terminal";
  EXPECT_EQ(logs.find("\xe2\x80\xae"), std::string::npos) << "a raw bidi override reached the terminal";
  const std::string workers = verb({"workers"});
  EXPECT_NE(workers.find("H100\\u202eevil"), std::string::npos) << workers;
  EXPECT_EQ(workers.find("\xe2\x80\xae"), std::string::npos) << "a raw bidi override reached the terminal";
  // Asked for, the bytes come as they are.
  const std::string raw = verb({"logs", id, "--raw"});
  EXPECT_NE(raw.find("before\x1b[2J"), std::string::npos) << raw;
}

}  // namespace
}  // namespace zenflow
