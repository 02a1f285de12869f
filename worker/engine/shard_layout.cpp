// Shard layout: column ranges per rank and the packed staging offsets.
#include "worker/engine/shard_layout.h"

#include <algorithm>

namespace zenflow::engine {

int ColumnRanges::owner(int64_t col) const {
  int r = 0;
  while (!holds(r, col)) ++r;
  return r;
}

std::vector<std::vector<int64_t>> ColumnRanges::split(const std::vector<int64_t>& cols) const {
  std::vector<std::vector<int64_t>> out(lo.size());
  for (int64_t c : cols) out[static_cast<size_t>(owner(c))].push_back(c);
  return out;
}

std::vector<ColumnRanges> assign_column_ranges(const std::vector<MatrixShape>& shapes, int world) {
  const size_t w = static_cast<size_t>(world);
  std::vector<int64_t> load(w, 0);  // elements assigned to each rank so far
  std::vector<ColumnRanges> out;
  out.reserve(shapes.size());
  for (const MatrixShape& m : shapes) {
    ColumnRanges c;
    c.lo.assign(w, 0);
    c.hi.assign(w, 0);
    if (m.in >= world) {
      int64_t lo = 0;
      for (size_t r = 0; r < w; ++r) {
        const int64_t n = m.in / world + (static_cast<int64_t>(r) < m.in % world ? 1 : 0);
        c.lo[r] = lo;
        c.hi[r] = lo + n;
        load[r] += n * m.out;
        lo += n;
      }
    } else {
      const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      c.hi[r] = m.in;
      load[r] += m.in * m.out;
    }
    out.push_back(std::move(c));
  }
  return out;
}

StagingLayout pack_staging(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& widths,
                           int world) {
  const size_t w = static_cast<size_t>(world);
  StagingLayout l;
  l.offset.assign(rows.size(), std::vector<int64_t>(w, 0));
  l.shard_begin.assign(w, 0);
  l.shard_size.assign(w, 0);
  for (size_t r = 0; r < w; ++r) {
    l.shard_begin[r] = l.total;
    for (size_t m = 0; m < rows.size(); ++m) {
      l.offset[m][r] = l.total;
      l.total += widths[m][r] * rows[m];
    }
    l.shard_size[r] = l.total - l.shard_begin[r];
  }
  return l;
}

int64_t staging_chunk_elems(const std::vector<int64_t>& widths, int64_t chunk_elems) {
  int64_t widest = 1;
  for (int64_t w : widths) widest = std::max(widest, w);
  return std::max(chunk_elems, widest);
}

int64_t device_staging_chunk_elems(int64_t budget_bytes, int64_t element_bytes, int64_t split_elements,
                                   int64_t widest_row) {
  const int64_t quarter = budget_bytes / kStagingChunks / element_bytes;
  return std::max(widest_row, std::min(quarter, (split_elements + kStagingChunks - 1) / kStagingChunks));
}

std::string device_staging_needs_one_rank(int64_t world) {
  return "optimizer.host.device_staging_mib needs one rank's engine: with " + std::to_string(world) +
         " data-parallel ranks and train.shard none every rank stages the whole model's gradients for the "
         "reduce-scatter; set train.shard to gradients or parameters, or device_staging_mib to 0";
}

std::vector<StagingChunk> plan_staging_chunks(const std::vector<int64_t>& rows, const std::vector<int64_t>& widths,
                                              int64_t chunk_elems) {
  const int64_t size = staging_chunk_elems(widths, chunk_elems);
  std::vector<StagingChunk> chunks;
  int64_t offset = 0;
  for (size_t m = 0; m < rows.size(); ++m) {
    const int64_t width = widths[m];
    if (width == 0) continue;
    for (int64_t row = 0; row < rows[m];) {
      if (chunks.empty() || chunks.back().elems + width > size) {
        StagingChunk c;
        c.offset = offset;
        chunks.push_back(std::move(c));
      }
      StagingChunk& c = chunks.back();
      const int64_t n = std::min(rows[m] - row, (size - c.elems) / width);
      c.pieces.push_back({m, row, n, c.elems});
      c.elems += n * width;
      offset += n * width;
      row += n;
    }
  }
  return chunks;
}

}  // namespace zenflow::engine
