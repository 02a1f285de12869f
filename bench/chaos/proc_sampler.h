// Rank processes as /proc shows them: what the chaos harness samples every ~50 ms.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/chaos/attempt_invariants.h"

namespace zenflow::chaos {

// A rank of (job, attempt) from a process's environment block (NUL-separated KEY=VALUE,
// as /proc/PID/environ), or nullopt when ZENFLOW_JOB_ID or ZENFLOW_ATTEMPT is missing or
// the attempt is not a number.
std::optional<RankProcess> rank_from_environ(int pid, std::string_view environ_block);

// The state letter of a /proc/PID/stat line ("123 (zenflow run) S 1 ..."), '?' when the
// line cannot be parsed. The command name may hold spaces and parentheses: the state
// follows the last ')'.
char state_from_stat(std::string_view stat_line);

// Every process whose command line holds `cmdline_marker` (the run's directory: ranks
// run specs from their agent's work dir, which lies under it, so other runs on the host —
// other tests beside this one — are not counted) and whose environment names a rank.
// Processes that vanish mid-read are skipped.
std::vector<RankProcess> sample_rank_processes(const std::string& cmdline_marker);

}  // namespace zenflow::chaos
