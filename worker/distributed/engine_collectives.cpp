// engine::Collectives over the c10d Communicator (see engine_collectives.h).
#include "worker/distributed/engine_collectives.h"

namespace zenflow::distributed {
namespace {

Traffic traffic_of(engine::CollectiveTraffic t) {
  switch (t) {
    case engine::CollectiveTraffic::kGradients:
      return Traffic::kGradients;
    case engine::CollectiveTraffic::kSelection:
      return Traffic::kSelection;
    case engine::CollectiveTraffic::kParameters:
      return Traffic::kParameters;
  }
  return Traffic::kOther;
}

}  // namespace

void EngineCollectives::allreduce_sum_(at::Tensor& t, engine::CollectiveTraffic traffic) {
  comm_.allreduce_sum_(t, traffic_of(traffic));
}

at::Tensor EngineCollectives::reduce_scatter_mean(const at::Tensor& flat,
                                                  const std::vector<int64_t>& shard_sizes,
                                                  engine::CollectiveTraffic traffic) {
  return comm_.reduce_scatter(flat, shard_sizes, Reduction::kMean, traffic_of(traffic));
}

at::Tensor EngineCollectives::all_gather(const at::Tensor& shard, const std::vector<int64_t>& shard_sizes,
                                         engine::CollectiveTraffic traffic) {
  return comm_.all_gather(shard, shard_sizes, traffic_of(traffic));
}

}  // namespace zenflow::distributed
