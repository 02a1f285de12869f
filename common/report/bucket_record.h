// A run whose checkpoint.dir is s3://BUCKET/PREFIX (common/storage/checkpoint_mirror.h): its
// record read from the bucket, where the run keeps steps.jsonl beside its checkpoints.
// `zenflow report s3://…` and the coordinator's /jobs/ID/report use it.
#pragma once

#include <string>

#include "common/report/run_record.h"
#include "common/storage/s3.h"

namespace zenflow::report {

// Throws RunRecordError when the prefix holds no steps.jsonl, storage::S3Error when the
// bucket cannot be read (no credentials, no connection: its message says which).
RunRecord read_bucket_run_record(const std::string& uri, storage::S3Client& client);

}  // namespace zenflow::report
