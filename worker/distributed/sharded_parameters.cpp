// Row shards of a model's parameters across data-parallel ranks (see sharded_parameters.h).
#include "worker/distributed/sharded_parameters.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "worker/engine/device_ops.h"

namespace zenflow::distributed {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Engine state keys are "<split|dense>/<parameter name>/<field>"; the fields that hold one
// row per row of the parameter (2-D views [rows, columns]; a 1-D parameter is [n, 1]).
bool row_field(const std::string& key, std::string* param) {
  static const char* const kSplit[] = {"host_master", "host_m", "host_v", "acc", "dev_m", "dev_v", "dev_master"};
  static const char* const kDense[] = {"m", "v", "master"};
  const size_t slash = key.find('/'), last = key.rfind('/');
  if (slash == std::string::npos || last == slash) return false;
  const std::string kind = key.substr(0, slash), field = key.substr(last + 1);
  *param = key.substr(slash + 1, last - slash - 1);
  if (kind == "split") return std::find(std::begin(kSplit), std::end(kSplit), field) != std::end(kSplit);
  if (kind == "dense") return std::find(std::begin(kDense), std::end(kDense), field) != std::end(kDense);
  return false;
}

}  // namespace

ShardMode parse_shard_mode(const std::string& s) {
  if (s == "gradients") return ShardMode::kGradients;
  if (s == "parameters") return ShardMode::kParameters;
  throw std::invalid_argument("train.shard must be gradients or parameters here, got '" + s + "'");
}

ShardedParameters::ShardedParameters(Communicator& comm, model::CausalLM& model, ShardOptions options)
    : MaterializedUnits(model.parameters().size()),
      comm_(comm),
      model_(model),
      mode_(options.mode),
      options_(options),
      world_(comm.world_size()),
      rank_(comm.rank()) {
  std::vector<at::Tensor> shards;
  c10::NoGradGuard no_grad;
  for (auto& nt : model.parameters()) {
    const at::Tensor& t = nt.tensor;
    if (t.dim() == 0 || t.size(0) < world_)
      throw std::invalid_argument("train.shard: parameter '" + nt.name + "' has " +
                                  std::to_string(t.dim() == 0 ? 1 : t.size(0)) + " rows, fewer than the " +
                                  std::to_string(world_) + " ranks it would be cut across");
    Param p;
    p.name = nt.name;
    p.full_shape = t.sizes().vec();
    p.rows = Communicator::even_shards(t.size(0), world_);
    p.row_offset.assign(1, 0);
    for (int64_t rows : p.rows) p.row_offset.push_back(p.row_offset.back() + rows);
    p.row_numel = t.numel() / t.size(0);
    p.shard = t.detach().narrow(0, p.row_offset[static_cast<size_t>(rank_)], p.rows[static_cast<size_t>(rank_)])
                  .clone()
                  .requires_grad_(true);
    if (mode_ == ShardMode::kGradients) p.full = t.detach();
    if (options_.column_scores && t.dim() == 2)
      p.scores = at::zeros({t.size(1)}, at::TensorOptions().dtype(at::kFloat).device(t.device()));
    shards.push_back(p.shard);
    by_name_[p.name] = params_.size();
    params_.push_back(std::move(p));
  }
  register_leaves(shards, "ShardedParameters");
  model_.replace_parameters(shards);
  model_.set_unit_runner(this);
}

ShardedParameters::~ShardedParameters() {
  model_.set_unit_runner(nullptr);
  if (prefetched_ && prefetched_->work.valid()) {
    try {
      prefetched_->work.wait();
    } catch (const std::exception&) {  // the communicator failed: the run is ending anyway
    }
  }
}

std::vector<int64_t> ShardedParameters::rank_sizes(const std::vector<size_t>& idx) const {
  std::vector<int64_t> sizes(static_cast<size_t>(world_), 0);
  for (size_t i : idx)
    for (int r = 0; r < world_; ++r)
      sizes[static_cast<size_t>(r)] += params_[i].rows[static_cast<size_t>(r)] * params_[i].row_numel;
  return sizes;
}

std::vector<std::vector<at::Tensor>> ShardedParameters::unpack(const std::vector<size_t>& idx,
                                                               const at::Tensor& flat) const {
  std::vector<std::vector<at::Tensor>> pieces(idx.size());
  int64_t at_ = 0;
  for (int r = 0; r < world_; ++r)
    for (size_t k = 0; k < idx.size(); ++k) {
      const Param& p = params_[idx[k]];
      const int64_t rows = p.rows[static_cast<size_t>(r)];
      std::vector<int64_t> shape = p.full_shape;
      shape[0] = rows;
      pieces[k].push_back(flat.narrow(0, at_, rows * p.row_numel).view(shape));
      at_ += rows * p.row_numel;
    }
  return pieces;
}

std::vector<at::Tensor> ShardedParameters::materialize(const std::vector<size_t>& idx) {
  std::vector<at::Tensor> full;
  full.reserve(idx.size());
  if (mode_ == ShardMode::kGradients) {
    for (size_t i : idx) full.push_back(params_[i].full);
    return full;
  }
  Gather now;
  if (prefetched_ && prefetched_->idx == idx) {
    now = std::move(*prefetched_);
  } else {
    if (prefetched_) finish_gather(*prefetched_);  // launched on every rank: completed, unused
    now = launch_gather(idx);
  }
  prefetched_.reset();
  // Where the last micro-batch's sequence had this gather, the next one starts now.
  int64_t next_bytes = 0;
  if (const std::vector<size_t>* next = sequence_.record(idx)) {
    prefetched_ = std::make_unique<Gather>(launch_gather(*next));
    next_bytes = prefetched_->bytes;
  }
  const std::vector<std::vector<at::Tensor>> pieces = unpack(idx, finish_gather(now));
  int64_t bytes = now.bytes + next_bytes;
  for (size_t k = 0; k < idx.size(); ++k) {
    full.push_back(at::cat(pieces[k]));
    bytes += static_cast<int64_t>(full.back().nbytes());
  }
  gathered_peak_ = std::max(gathered_peak_, bytes);
  return full;
}

ShardedParameters::Gather ShardedParameters::launch_gather(const std::vector<size_t>& idx) {
  // One all-gather: every rank's shards of these weights, concatenated rank by rank.
  Gather g;
  g.idx = idx;
  const std::vector<int64_t> sizes = rank_sizes(idx);
  std::vector<at::Tensor> mine;
  for (size_t i : idx) mine.push_back(params_[i].shard.detach().reshape({-1}));
  g.flat = std::make_shared<at::Tensor>();
  const auto t0 = std::chrono::steady_clock::now();
  g.work = comm_.all_gather_async(at::cat(mine), sizes, Traffic::kParameters, g.flat);
  comm_seconds_ += seconds_since(t0);
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  g.bytes = total * static_cast<int64_t>(params_[idx.front()].shard.element_size());
  return g;
}

at::Tensor ShardedParameters::finish_gather(Gather& g) {
  if (g.work.valid()) {
    const auto t0 = std::chrono::steady_clock::now();
    g.work.wait();
    comm_seconds_ += seconds_since(t0);
  }
  return *g.flat;
}

std::vector<at::Tensor> ShardedParameters::reduce_scatter(const std::vector<size_t>& idx,
                                                          const std::vector<at::Tensor>& grads) {
  const std::vector<int64_t> sizes = rank_sizes(idx);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_; ++r)
    for (size_t k = 0; k < idx.size(); ++k) {
      const Param& p = params_[idx[k]];
      const at::Tensor g = grads[k].defined() ? grads[k] : at::zeros(p.full_shape, p.shard.options());
      parts.push_back(g.narrow(0, p.row_offset[static_cast<size_t>(r)], p.rows[static_cast<size_t>(r)]).reshape({-1}));
    }
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor flat = at::cat(parts);
  parts.clear();
  const at::Tensor mine = comm_.reduce_scatter(flat, sizes, Reduction::kMean, Traffic::kGradients);
  comm_seconds_ += seconds_since(t0);
  std::vector<at::Tensor> out;
  int64_t at_ = 0;
  for (size_t i : idx) {
    const Param& p = params_[i];
    const int64_t n = p.rows[static_cast<size_t>(rank_)] * p.row_numel;
    out.push_back(mine.narrow(0, at_, n).view(p.shard.sizes()).to(p.shard.scalar_type()));
    at_ += n;
  }
  return out;
}

void ShardedParameters::add_column_scores(const std::vector<size_t>& idx, const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> parts;
  std::vector<size_t> which;
  for (size_t k = 0; k < idx.size(); ++k) {
    const Param& p = params_[idx[k]];
    if (!p.scores.defined()) continue;
    which.push_back(idx[k]);
    parts.push_back(grads[k].defined()
                        ? engine::device_ops::column_scores(grads[k].view({p.full_shape[0], p.full_shape[1]}), options_.l1)
                        : at::zeros_like(p.scores));
  }
  if (parts.empty()) return;
  at::Tensor all = at::cat(parts);
  const auto t0 = std::chrono::steady_clock::now();
  comm_.allreduce_sum_(all, Traffic::kSelection);
  comm_seconds_ += seconds_since(t0);
  int64_t at_ = 0;
  for (size_t i : which) {
    Param& p = params_[i];
    p.scores.add_(all.narrow(0, at_, p.scores.numel()));
    at_ += p.scores.numel();
  }
}

void ShardedParameters::begin_step() {
  for (Param& p : params_)
    if (p.scores.defined()) p.scores.zero_();
  reset_uses();
}

std::vector<at::Tensor> ShardedParameters::gradients_ready(const std::vector<size_t>& idx,
                                                           const std::vector<at::Tensor>& grads) {
  add_column_scores(idx, grads);
  return reduce_scatter(idx, grads);
}

int64_t ShardedParameters::full_numel(size_t i) const {
  int64_t n = 1;
  for (int64_t d : params_[i].full_shape) n *= d;
  return n;
}

void ShardedParameters::all_gather_weights() {
  if (mode_ != ShardMode::kGradients) return;
  c10::NoGradGuard no_grad;
  // Buckets of consecutive parameters, at most kBucketBytes of full weights each (a larger
  // parameter alone): one collective each, all in flight at once, then copied out in order.
  constexpr int64_t kBucketBytes = int64_t{32} << 20;
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t b = static_cast<int64_t>(params_[i].full.nbytes());
    if (buckets.empty() || bytes + b > kBucketBytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += b;
  }
  std::vector<Gather> gathers;
  for (const auto& bucket : buckets) gathers.push_back(launch_gather(bucket));
  for (Gather& g : gathers) {
    const std::vector<std::vector<at::Tensor>> pieces = unpack(g.idx, finish_gather(g));
    for (size_t k = 0; k < g.idx.size(); ++k) {
      Param& p = params_[g.idx[k]];
      for (int r = 0; r < world_; ++r)
        p.full.narrow(0, p.row_offset[static_cast<size_t>(r)], p.rows[static_cast<size_t>(r)])
            .copy_(pieces[k][static_cast<size_t>(r)]);
    }
  }
}

at::Tensor ShardedParameters::full_tensor(size_t i) {
  if (mode_ == ShardMode::kGradients) return params_[i].full;
  c10::NoGradGuard no_grad;
  return materialize({i})[0];
}

at::Tensor ShardedParameters::slice_rows(size_t i, const at::Tensor& full) const {
  const Param& p = params_[i];
  return full.narrow(0, p.row_offset[static_cast<size_t>(rank_)], p.rows[static_cast<size_t>(rank_)]);
}

NamedTensors ShardedParameters::gather_engine_state(const NamedTensors& local) {
  NamedTensors out;
  const at::Device device = comm_.device_type() == at::kCUDA ? at::Device(at::kCUDA, c10::DeviceIndex(-1))
                                                              : at::Device(at::kCPU);
  for (const auto& [key, t] : local) {
    std::string param;
    if (key == "engine/partition") {
      out.emplace_back(key, at::tensor(std::vector<int64_t>{0, 1}, at::kLong));
      continue;
    }
    if (!row_field(key, &param) || !by_name_.count(param)) {
      out.emplace_back(key, t);  // replicated: every rank holds the same
      continue;
    }
    // Rows are contiguous whether the state is [rows, ...] or flat: per_row elements each.
    const Param& p = params_[by_name_.at(param)];
    const int64_t local_rows = p.rows[static_cast<size_t>(rank_)];
    if (t.numel() % local_rows != 0)
      throw std::runtime_error("engine state: '" + key + "' has " + std::to_string(t.numel()) +
                               " elements, not a whole number of the shard's " + std::to_string(local_rows) + " rows");
    const int64_t per_row = t.numel() / local_rows;
    std::vector<int64_t> sizes;
    for (int64_t rows : p.rows) sizes.push_back(rows * per_row);
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] = t.dim() == 1 ? p.full_shape[0] * per_row : p.full_shape[0];
    at::Tensor src = t.contiguous().reshape({-1});
    if (device.is_cuda()) src = src.to(at::Device(at::kCUDA));
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor all = comm_.all_gather(src, sizes, Traffic::kParameters);
    comm_seconds_ += seconds_since(t0);
    out.emplace_back(key, all.view(shape).to(at::kCPU));
  }
  return out;
}

NamedTensors ShardedParameters::slice_engine_state(const NamedTensors& full) const {
  NamedTensors out;
  for (const auto& [key, t] : full) {
    std::string param;
    if (!row_field(key, &param) || !by_name_.count(param)) {
      out.emplace_back(key, t);
      continue;
    }
    const Param& p = params_[by_name_.at(param)];
    const int64_t rows = p.full_shape[0];
    if (t.dim() == 0 || t.numel() % rows != 0 || (t.dim() > 1 && t.size(0) != rows))
      throw std::runtime_error("engine state: '" + key + "' (shape " + c10::str(t.sizes()) +
                               ") does not hold the rows of parameter '" + p.name + "' (" + std::to_string(rows) + ")");
    const int64_t per_row = t.dim() == 1 ? t.numel() / rows : 1;
    out.emplace_back(key, t.narrow(0, p.row_offset[static_cast<size_t>(rank_)] * per_row,
                                   p.rows[static_cast<size_t>(rank_)] * per_row)
                              .contiguous());
  }
  return out;
}

int64_t ShardedParameters::shard_bytes() const {
  int64_t n = 0;
  for (const Param& p : params_) n += static_cast<int64_t>(p.shard.nbytes());
  return n;
}

int64_t ShardedParameters::kept_full_bytes() const {
  int64_t n = 0;
  for (const Param& p : params_)
    if (p.full.defined()) n += static_cast<int64_t>(p.full.nbytes());
  return n;
}

NamedTensors merge_engine_shards(const std::vector<NamedTensors>& shards) {
  if (shards.empty()) throw std::runtime_error("engine state: no shards");
  if (shards.size() == 1) return shards[0];
  std::vector<std::map<std::string, at::Tensor>> maps;
  for (const auto& s : shards) maps.emplace_back(s.begin(), s.end());
  static const char* const kHostFields[] = {"host_master", "host_m", "host_v", "acc"};
  NamedTensors out;
  for (const auto& [key, t] : shards[0]) {
    const size_t last = key.rfind('/');
    const std::string field = last == std::string::npos ? key : key.substr(last + 1);
    const std::string prefix = key.substr(0, last + 1);
    if (key == "engine/partition") {
      out.emplace_back(key, at::tensor(std::vector<int64_t>{0, 1}, at::kLong));
      continue;
    }
    const bool host = key.rfind("split/", 0) == 0 &&
                      (field == "host_cols" || std::find(std::begin(kHostFields), std::end(kHostFields), field) !=
                                                   std::end(kHostFields));
    if (!host) {
      out.emplace_back(key, t);
      continue;
    }
    // Every shard's host columns, and where each lands among all of them (sorted).
    std::vector<std::vector<int64_t>> cols(shards.size());
    std::vector<int64_t> all;
    for (size_t r = 0; r < shards.size(); ++r) {
      auto it = maps[r].find(prefix + "host_cols");
      if (it == maps[r].end())
        throw std::runtime_error("engine state: '" + prefix + "host_cols' missing in the shard of rank " +
                                 std::to_string(r));
      const at::Tensor c = it->second.to(at::kLong).contiguous();
      cols[r].assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
      all.insert(all.end(), cols[r].begin(), cols[r].end());
    }
    std::sort(all.begin(), all.end());
    if (field == "host_cols") {
      out.emplace_back(key, at::tensor(all, at::kLong));
      continue;
    }
    std::vector<at::Tensor> parts;
    std::vector<int64_t> order;  // the position in `all` of each column, shard by shard
    for (size_t r = 0; r < shards.size(); ++r) {
      auto it = maps[r].find(key);
      if (it == maps[r].end())
        throw std::runtime_error("engine state: '" + key + "' missing in the shard of rank " + std::to_string(r));
      parts.push_back(it->second);
      for (int64_t c : cols[r])
        order.push_back(std::lower_bound(all.begin(), all.end(), c) - all.begin());
    }
    const at::Tensor cat = at::cat(parts, 1);
    at::Tensor merged = at::empty_like(cat);
    merged.index_copy_(1, at::tensor(order, at::kLong), cat);
    out.emplace_back(key, merged);
  }
  return out;
}

}  // namespace zenflow::distributed
