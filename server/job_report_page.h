// The coordinator's page of a job, on its metrics port: GET /jobs/ID/report is the page
// `zenflow report` makes (common/report), from the job's checkpoint.dir/steps.jsonl. The
// coordinator reads that directory itself, so it must see the workers' paths (one machine,
// or the shared volume the Helm chart mounts; README "Paths"); when it cannot, the answer
// is a 404 that says so and how to make the page on the worker.
#pragma once

#include <string>

#include "common/metrics/http_server.h"
#include "server/coordinator.h"

namespace zenflow::server {

// `rest`: what follows "/jobs/" in the request path.
metrics::MetricsServer::Page job_page(Coordinator& coordinator, const std::string& rest);

}  // namespace zenflow::server
