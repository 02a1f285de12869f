// The contract between a rank process (`zenflow run` under an agent), the worker agent and
// the coordinator: what a rank's exit status means, and how long a worker cut off from the
// coordinator may keep running an attempt. The three include this header; none spells a
// code or a bound again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace zenflow::attempt {

// Exit statuses of a rank process (and of an attempt, as its first failing rank's).
inline constexpr int kExitOk = 0;
// A training error (divergence, an exception in the loop): the same attempt would fail the
// same way again, so the job fails.
inline constexpr int kExitFailed = 1;
// Bad input (the spec, its files, a checkpoint that cannot be resumed, a model that cannot
// fit, an optimizer node that cannot be reached at start): final.
inline constexpr int kExitBadInput = 2;
// The worker cannot run this attempt (its work dir cannot be written, the checkpoint
// directory's lock is still held by a predecessor that has not stopped yet): not the job's
// fault; the coordinator requeues it, counted against resources.max_restarts.
inline constexpr int kExitWorkerFault = 74;
// The agent's lease on the rank ended (the agent is gone, paused or fenced): nothing more
// was committed; requeued.
inline constexpr int kExitLeaseLost = 75;
// An optimizer node the coordinator assigned was lost: requeued onto a spare.
inline constexpr int kExitNodeLost = 76;
// Interrupted (Ctrl-C, SIGTERM, the agent's STOP): checkpointed and stopped.
inline constexpr int kExitInterrupted = 130;

// "exited with status N" or "killed by signal N" (a status of 128 + N).
inline std::string exit_text(int code) {
  if (code > 128 && code < 128 + 65) return "killed by signal " + std::to_string(code - 128);
  return "exited with status " + std::to_string(code);
}

// An attempt that ended with `code` (not stopped by its agent) fails the job for good: the
// job's own fault, which another attempt would repeat. Anything else is requeued while
// resources.max_restarts allows.
inline bool exit_fails_the_job(int code) {
  return code == kExitFailed || code == kExitBadInput || code == kExitInterrupted;
}

// The lease an agent gives each rank (`zenflow run --lease-timeout`): its coordinator lease
// less two heartbeat intervals, at least 1 s.
inline std::chrono::milliseconds rank_lease(std::chrono::milliseconds coordinator_lease,
                                            std::chrono::milliseconds heartbeat_interval) {
  return std::max(std::chrono::milliseconds(1000), coordinator_lease - 2 * heartbeat_interval);
}

// Self-fencing. An agent that has had no heartbeat accepted for `disconnected_grace` (from
// the moment it sent the last accepted one) asks its ranks to checkpoint and stop; after
// `drain` more it kills them and stops renewing their leases, so that no rank of it
// commits anything once fence_after() has passed since that send. The coordinator, which
// received that heartbeat later than it was sent, may start another attempt of a job that
// ran on a silent worker only fence_after() (plus a margin) after the last heartbeat it
// received: the agent reports the bound at registration (RegisterWorkerRequest.fence_ms).
inline std::chrono::milliseconds fence_after(std::chrono::milliseconds disconnected_grace,
                                             std::chrono::milliseconds drain,
                                             std::chrono::milliseconds rank_lease_timeout) {
  return disconnected_grace + drain + rank_lease_timeout;
}

// The environment an agent gives a rank of an attempt placed with optimizer nodes: the
// attempt's node credential (Assignment.node_secret) and the key it is proved under
// ("JOB_ID/ATTEMPT"). The rank proves it in the nodes' handshake instead of a token of its
// spec's; only the nodes the coordinator placed with the attempt hold it.
inline constexpr char kNodeKeyEnv[] = "ZENFLOW_NODE_KEY";
inline constexpr char kNodeSecretEnv[] = "ZENFLOW_NODE_SECRET";
inline std::string node_key(const std::string& job_id, int64_t attempt) {
  return job_id + "/" + std::to_string(attempt);
}

}  // namespace zenflow::attempt
