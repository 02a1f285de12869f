// Shard layout: which rank's host updater holds which columns of each split matrix, and
// where every rank's host-owned columns sit in the packed gradient staging (semantics §9).
//
// Pure integers, no tensors: ZenFlowOptimizer keeps the device index tensors beside them.
// With one rank every column is rank 0's and the staging is the matrices back to back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zenflow::engine {

// The columns of one matrix whose host state each rank owns: [lo[r], hi[r]) for rank r.
// A column keeps its owner while it stays host-owned, whatever the selection does.
struct ColumnRanges {
  std::vector<int64_t> lo, hi;  // per rank

  bool holds(int rank, int64_t col) const {
    return col >= lo[static_cast<size_t>(rank)] && col < hi[static_cast<size_t>(rank)];
  }
  // The rank whose range holds `col` (a column of the matrix, so there is one).
  int owner(int64_t col) const;
  int64_t width(int rank) const { return hi[static_cast<size_t>(rank)] - lo[static_cast<size_t>(rank)]; }
  // `cols` by owner: per rank, its columns among them in the order given.
  std::vector<std::vector<int64_t>> split(const std::vector<int64_t>& cols) const;
};

struct MatrixShape {
  int64_t out = 0;  // rows
  int64_t in = 0;   // columns
};

// Per matrix, in order: with at least `world` columns, contiguous ranges as even as
// possible (the first in % world ranks get one column more); with fewer (offload mode's
// 1-D parameters are one column each), the whole matrix to the rank holding the fewest
// elements so far, the lowest such rank on a tie, so small matrices spread by bytes.
std::vector<ColumnRanges> assign_column_ranges(const std::vector<MatrixShape>& shapes, int world);

// The packed staging of host-owned columns: rank by rank (rank 0's columns of every
// matrix, then rank 1's, ...), so each rank's shard is one contiguous range for the
// reduce-scatter and the all-gather, and each transfer is one copy.
struct StagingLayout {
  std::vector<std::vector<int64_t>> offset;  // [matrix][rank]: start of rank r's columns of it
  std::vector<int64_t> shard_begin;          // per rank
  std::vector<int64_t> shard_size;           // per rank, elements
  int64_t total = 0;                         // elements of every rank's shards

  // Where rank r's columns of `matrix` start within r's own shard.
  int64_t local_offset(size_t matrix, int rank) const {
    return offset[matrix][static_cast<size_t>(rank)] - shard_begin[static_cast<size_t>(rank)];
  }
};

// rows[m]: matrix m's rows; widths[m][r]: how many host-owned columns of m rank r holds.
StagingLayout pack_staging(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& widths,
                           int world);

// Chunked device staging (EngineOptions::device_staging_bytes, one rank): the packed
// staging cut into consecutive chunks of at most `chunk_elems` elements at row
// boundaries, so that each chunk is gathered from (or scattered into) whole rows of its
// matrices and the device needs only a few chunk buffers instead of whole-gradient ones.
struct StagingPiece {
  size_t matrix = 0;
  int64_t row = 0, rows = 0;  // rows [row, row + rows) of the matrix's packed columns
  int64_t at = 0;             // where they start within the chunk
};
struct StagingChunk {
  int64_t offset = 0;  // into the packed staging
  int64_t elems = 0;
  std::vector<StagingPiece> pieces;
};
// rows[m], widths[m]: matrix m's rows and packed columns (one rank's layout: matrices back
// to back). A row never straddles two chunks, so a chunk may hold fewer than chunk_elems;
// chunk_elems is raised to the widest row when it is smaller. Matrices with no packed
// column take no piece.
std::vector<StagingChunk> plan_staging_chunks(const std::vector<int64_t>& rows, const std::vector<int64_t>& widths,
                                              int64_t chunk_elems);
// The chunk size plan_staging_chunks uses: chunk_elems, or the widest row when wider.
int64_t staging_chunk_elems(const std::vector<int64_t>& widths, int64_t chunk_elems);

// EngineOptions::device_staging_bytes > 0: the device chunk buffers, and the elements of
// each: a kStagingChunks-th of the budget, at most a kStagingChunks-th of the split elements
// (never more than one whole gradient), at least the widest row (what the engine allocates
// and the preflight counts).
constexpr int kStagingChunks = 4;
int64_t device_staging_chunk_elems(int64_t budget_bytes, int64_t element_bytes, int64_t split_elements,
                                   int64_t widest_row);
// Why chunked staging is refused with `world` unsharded data-parallel ranks (the engine and
// the preflight say the same).
std::string device_staging_needs_one_rank(int64_t world);

}  // namespace zenflow::engine
