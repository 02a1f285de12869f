#include "common/report/bucket_record.h"

namespace zenflow::report {

RunRecord read_bucket_run_record(const std::string& uri, storage::S3Client& client) {
  storage::S3Uri prefix;
  try {
    prefix = storage::parse_s3_uri(uri).trimmed();
  } catch (const std::invalid_argument& e) {
    throw RunRecordError(e.what());
  }
  const storage::S3Uri log = prefix.child("steps.jsonl");
  std::string text;
  try {
    text = client.get(log, 256 << 20);
  } catch (const storage::S3Error& e) {
    if (e.http_status == 404)
      throw RunRecordError(log.text() + ": not in the bucket (a run writes it with its first checkpoint)");
    throw;
  }
  RunRecord r = parse_step_log(text, log.text());
  r.source = log.text();
  return r;
}

}  // namespace zenflow::report
