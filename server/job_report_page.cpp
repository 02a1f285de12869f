#include "server/job_report_page.h"

#include "common/report/report_html.h"
#include "common/report/run_record.h"
#include "common/storage/s3_uri.h"
#if ZENFLOW_HAVE_S3
#include "common/report/bucket_record.h"
#include "common/storage/s3.h"
#endif

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
#if ZENFLOW_HAVE_S3
  if (storage::is_s3_uri(st.checkpoint_dir())) {
    // The bucket, with this coordinator's own AWS credentials (its environment); a page
    // request does not wait out long retries.
    try {
      storage::S3Settings settings = storage::s3_settings_from_environment();
      settings.max_attempts = 2;
      settings.connect_timeout_s = 5;
      settings.stall_timeout_s = 10;
      storage::S3Client client(settings);
      return {200, "text/html; charset=utf-8",
              report::render_report_html(report::read_bucket_run_record(st.checkpoint_dir(), client))};
    } catch (const report::RunRecordError& e) {
      return text(404, "job " + id + ": " + e.what());
    } catch (const std::runtime_error& e) {  // S3Error, or the environment's AWS settings
      return text(503, "job " + id + ": cannot read its records in " + st.checkpoint_dir() + ": " + e.what() +
                           ". This coordinator reads the bucket with the AWS credentials of its own environment "
                           "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a web identity, ~/.aws, or the container "
                           "endpoint); or run `zenflow report " + st.checkpoint_dir() + " --out FILE` where they are.");
    }
  }
#else
  if (storage::is_s3_uri(st.checkpoint_dir()))
    return text(503, "job " + id + ": its records are in " + st.checkpoint_dir() +
                         " and this coordinator was built without s3:// support");
#endif
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
