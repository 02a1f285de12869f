#include "server/job_report_page.h"

#include "common/report/report_html.h"
#include "common/report/run_record.h"

namespace zenflow::server {

namespace {
metrics::MetricsServer::Page text(int status, const std::string& body) {
  return {status, "text/plain; charset=utf-8", body + "\n"};
}
}  // namespace

metrics::MetricsServer::Page job_page(Coordinator& coordinator, const std::string& rest) {
  const std::string suffix = "/report";
  if (rest.size() <= suffix.size() || rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) != 0)
    return text(404, "not found: the job pages are /jobs/ID/report");
  const std::string id = rest.substr(0, rest.size() - suffix.size());
  v1::JobStatus st;
  if (const grpc::Status s = coordinator.get(id, &st); !s.ok()) return text(404, s.error_message());
  try {
    return {200, "text/html; charset=utf-8", report::render_report_html(report::read_run_record(st.checkpoint_dir()))};
  } catch (const report::RunRecordError& e) {
    return text(404, "job " + id + ": " + e.what() +
                         ". The page is made from the job's checkpoint.dir/steps.jsonl, which this coordinator "
                         "reads itself (one machine, or a shared filesystem); on the worker, run `zenflow report " +
                         st.checkpoint_dir() + "`.");
  }
}

}  // namespace zenflow::server
