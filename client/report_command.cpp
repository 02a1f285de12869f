// `zenflow report RUN_DIR [--out FILE]`: the run's page, one self-contained HTML file.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "client/commands.h"
#if ZENFLOW_HAVE_REPORT
#include "common/input_file.h"
#include "common/report/report_html.h"
#include "common/report/run_record.h"
#include "common/storage/s3_uri.h"
#endif
#if ZENFLOW_HAVE_S3
#include "common/report/bucket_record.h"
#include "common/storage/s3.h"
#endif

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;

struct ReportArgs {
  std::string run_dir;
  std::string out;  // "" : RUN_DIR/report.html
};

#if ZENFLOW_HAVE_REPORT

// Writes `text` to `path` atomically: a temporary file beside it, fsynced, renamed over it.
// "" on success, else what failed.
std::string write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return tmp + ": " + std::strerror(errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = tmp + ": " + std::strerror(n < 0 ? errno : EIO);
      ::close(fd);
      ::unlink(tmp.c_str());
      return why;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = tmp + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return why;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = path + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return why;
  }
  return "";
}

int run_report(const ReportArgs& a) {
  report::RunRecord record;
  const bool bucket = storage::is_s3_uri(a.run_dir);
  if (bucket && a.out.empty()) {
    std::cerr << "zenflow report: --out is required for a run in a bucket (" << a.run_dir << ")\n";
    return kExitBadInput;
  }
  try {
    if (bucket) {
#if ZENFLOW_HAVE_S3
      storage::S3Client client(storage::s3_settings_from_environment());
      record = report::read_bucket_run_record(a.run_dir, client);
#else
      throw report::RunRecordError(a.run_dir + ": this build has no s3:// support (libcurl4-openssl-dev and "
                                               "libexpat1-dev were not found when it was built)");
#endif
    } else {
      record = report::read_run_record(a.run_dir);
    }
#if ZENFLOW_HAVE_S3
  } catch (const storage::S3Error& e) {
    std::cerr << "zenflow report: " << e.what() << "\n";
    return kExitFailure;
#endif
  } catch (const report::RunRecordError& e) {
    std::cerr << "zenflow report: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    std::cerr << "zenflow report: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::runtime_error& e) {  // the environment's AWS settings
    std::cerr << "zenflow report: " << a.run_dir << ": " << e.what() << "\n";
    return kExitBadInput;
  }
  for (const std::string& w : record.warnings) std::cerr << "zenflow report: warning: " << w << "\n";
  const std::string out = a.out.empty() ? (fs::path(a.run_dir) / "report.html").string() : a.out;
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    std::cerr << "zenflow report: --out " << out << ": is a directory\n";
    return kExitBadInput;
  }
  if (const std::string failed = write_atomically(out, report::render_report_html(record)); !failed.empty()) {
    std::cerr << "zenflow report: cannot write the report: " << failed << "\n";
    return kExitBadInput;
  }
  std::cerr << "zenflow report: " << record.steps.size() << " steps of " << record.source << "\n";
  std::cout << out << "\n";
  return kExitOk;
}
#else
int run_report(const ReportArgs&) {
  std::cerr << "zenflow report: this build has no report page (configured with -DZENFLOW_REPORT=OFF)\n";
  return kExitBadInput;
}
#endif

const CommandRegistrar kReportCommand(35, [](CommandContext& ctx) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = ctx.root->add_subcommand(
      "report",
      "Write a run's page: loss, step time, stalls, PCIe bytes, host memory and cost (one HTML file)");
  cmd->add_option("run_dir", args->run_dir, "The run's checkpoint.dir (its steps.jsonl), a directory or s3://BUCKET/PREFIX")
      ->required();
  cmd->add_option("--out", args->out, "The HTML file to write (default: RUN_DIR/report.html)");
  cmd->footer(
      "The page is self-contained (charts included): open it in a browser, offline too.\n"
      "Example: zenflow report runs/tiny-demo --out tiny-demo.html");
  CommandContext* context = &ctx;
  cmd->callback([args, context] { context->exit_code = run_report(*args); });
});

}  // namespace
}  // namespace zenflow::cli
