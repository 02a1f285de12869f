// The engine's view of a data-parallel group (engine::Collectives) on a c10d Communicator.
//
// Maps the engine's traffic classes onto the Communicator's byte counters (selection
// scores, gradients, parameters), so `selection bytes vs gradient bytes` is read from
// Communicator::stats(). The Communicator must outlive this object.
#pragma once

#include "worker/distributed/communicator.h"
#include "worker/engine/collectives.h"

namespace zenflow::distributed {

class EngineCollectives : public engine::Collectives {
 public:
  explicit EngineCollectives(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  void allreduce_sum_(at::Tensor& t, engine::CollectiveTraffic traffic) override;
  at::Tensor reduce_scatter_mean(const at::Tensor& flat, const std::vector<int64_t>& shard_sizes,
                                 engine::CollectiveTraffic traffic) override;
  at::Tensor all_gather(const at::Tensor& shard, const std::vector<int64_t>& shard_sizes,
                        engine::CollectiveTraffic traffic) override;

 private:
  Communicator& comm_;
};

}  // namespace zenflow::distributed
