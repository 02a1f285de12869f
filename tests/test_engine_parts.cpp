// The engine's pure parts (worker/engine/): the shard layout, with concrete numbers and
// no tensors. ZenFlowOptimizer's own tests pin what they do inside the engine.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "worker/engine/shard_layout.h"

namespace zenflow::engine {
namespace {

using Cols = std::vector<int64_t>;

TEST(ShardLayout, UnevenWidthGivesTheFirstRanksOneColumnMore) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{2, 10}}, 3);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].lo, (Cols{0, 4, 7}));
  EXPECT_EQ(r[0].hi, (Cols{4, 7, 10}));
  EXPECT_EQ(r[0].width(0), 4);
  EXPECT_EQ(r[0].width(2), 3);
}

TEST(ShardLayout, EvenWidthSplitsEqually) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{5, 12}, {1, 4}}, 4);
  EXPECT_EQ(r[0].lo, (Cols{0, 3, 6, 9}));
  EXPECT_EQ(r[0].hi, (Cols{3, 6, 9, 12}));
  EXPECT_EQ(r[1].lo, (Cols{0, 1, 2, 3}));  // exactly W columns: one each
  EXPECT_EQ(r[1].hi, (Cols{1, 2, 3, 4}));
}

TEST(ShardLayout, NarrowMatricesGoWholeToTheLeastLoadedRank) {
  // After the 8x8 matrix every rank holds 16 elements; the ties go to the lowest rank,
  // and each narrow matrix raises its rank's load, so they spread over ranks 0, 1, 2.
  const std::vector<ColumnRanges> r = assign_column_ranges({{8, 8}, {1, 1}, {3, 1}, {5, 2}, {1, 1}}, 4);
  EXPECT_EQ(r[1].lo, (Cols{0, 0, 0, 0}));
  EXPECT_EQ(r[1].hi, (Cols{1, 0, 0, 0}));
  EXPECT_EQ(r[2].hi, (Cols{0, 1, 0, 0}));
  EXPECT_EQ(r[3].hi, (Cols{0, 0, 2, 0}));
  // Loads now 17, 19, 26, 16: rank 3.
  EXPECT_EQ(r[4].hi, (Cols{0, 0, 0, 1}));
  EXPECT_EQ(r[3].owner(1), 2);
}

TEST(ShardLayout, OneRankOwnsEverything) {
  const std::vector<ColumnRanges> r = assign_column_ranges({{4, 6}, {2, 1}}, 1);
  EXPECT_EQ(r[0].lo, (Cols{0}));
  EXPECT_EQ(r[0].hi, (Cols{6}));
  EXPECT_EQ(r[1].hi, (Cols{1}));
}

TEST(ShardLayout, SplitKeepsEachRanksColumnsInTheGivenOrder) {
  const ColumnRanges r = assign_column_ranges({{2, 10}}, 3)[0];  // [0,4) [4,7) [7,10)
  EXPECT_EQ(r.owner(3), 0);
  EXPECT_EQ(r.owner(4), 1);
  EXPECT_EQ(r.owner(6), 1);
  EXPECT_EQ(r.owner(7), 2);
  EXPECT_TRUE(r.holds(1, 6));
  EXPECT_FALSE(r.holds(1, 7));
  const std::vector<Cols> parts = r.split({9, 1, 5, 4, 0, 8});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], (Cols{1, 0}));
  EXPECT_EQ(parts[1], (Cols{5, 4}));
  EXPECT_EQ(parts[2], (Cols{9, 8}));
}

TEST(ShardLayout, StagingIsRankByRankThenMatrixByMatrix) {
  // Matrix 0: 2 rows, ranks hold 2 and 1 columns; matrix 1: 3 rows, 0 and 4 columns.
  const StagingLayout l = pack_staging({2, 3}, {{2, 1}, {0, 4}}, 2);
  EXPECT_EQ(l.offset[0], (Cols{0, 4}));
  EXPECT_EQ(l.offset[1], (Cols{4, 6}));
  EXPECT_EQ(l.shard_begin, (Cols{0, 4}));
  EXPECT_EQ(l.shard_size, (Cols{4, 14}));
  EXPECT_EQ(l.total, 18);
  EXPECT_EQ(l.local_offset(0, 1), 0);
  EXPECT_EQ(l.local_offset(1, 1), 2);
  EXPECT_EQ(l.local_offset(1, 0), 4);
}

TEST(ShardLayout, OneRankStagingIsTheMatricesBackToBack) {
  const StagingLayout l = pack_staging({4, 2, 3}, {{5}, {1}, {0}}, 1);
  EXPECT_EQ(l.offset[0], (Cols{0}));
  EXPECT_EQ(l.offset[1], (Cols{20}));
  EXPECT_EQ(l.offset[2], (Cols{22}));
  EXPECT_EQ(l.shard_size, (Cols{22}));
  EXPECT_EQ(l.total, 22);
  EXPECT_EQ(l.local_offset(1, 0), 20);
}

TEST(ShardLayout, NothingSplitIsAnEmptyLayout) {
  const StagingLayout l = pack_staging({}, {}, 3);
  EXPECT_EQ(l.shard_size, (Cols{0, 0, 0}));
  EXPECT_EQ(l.total, 0);
}

}  // namespace
}  // namespace zenflow::engine
