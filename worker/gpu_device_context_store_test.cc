// DeviceContextStore on a CUDA device: rows come back from Find as they were
// added (converted to the context's dtype, bit-exact for bf16 input), across
// appends that outgrow the spare capacity, after a partial Drop, for a large
// page-locked piece, and with the errors its contract names. Skips, saying why,
// without a GPU.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/typed_tensor.h"
#include "gtest/gtest.h"
#include "worker/device.h"
#include "worker/device_context_store.h"
#include "worker/pinned_host_regions.h"

namespace ringattn {
namespace {

constexpr int64_t kHeads = 2;
constexpr int64_t kDim = 8;
const ResidentContexts::Layout kLayout{1, kHeads, kDim};

// Rows of positions [first, first + n) in bf16, each value made from its
// position, its head and its index (`sign` tells K from V).
TypedTensor Rows(int64_t first, int64_t n, float sign) {
  TypedTensor t(DType::kBFloat16, Shape{1, n, kHeads, kDim});
  std::vector<float> row(kHeads * kDim);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t x = 0; x < kHeads * kDim; ++x) {
      row[x] = sign * static_cast<float>((first + i) % 200 + x / 32.0f);
    }
    ConvertFromFloat(DType::kBFloat16, row.data(), t.view().Row(0, i),
                     kHeads * kDim);
  }
  return t;
}

// The `kv.rows` rows of K (or V) that Find returned, brought to the host.
std::vector<uint16_t> Download(const ResidentKv& kv, bool values) {
  std::vector<uint16_t> host(kv.rows * kHeads * kDim);
  if (kv.rows > 0) {
    EXPECT_EQ(
        cudaMemcpy(host.data(), values ? kv.v : kv.k,
                   host.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
        cudaSuccess);
  }
  return host;
}

// The bf16 bits Rows() makes for `positions`, in order.
std::vector<uint16_t> Expected(const std::vector<Range>& positions,
                               float sign) {
  std::vector<uint16_t> bits;
  for (const Range& r : positions) {
    const TypedTensor t = Rows(r.begin, r.size(), sign);
    const uint16_t* data = reinterpret_cast<const uint16_t*>(t.view().data());
    bits.insert(bits.end(), data, data + r.size() * kHeads * kDim);
  }
  return bits;
}

TEST(DeviceContextStoreTest, FindReturnsAppendedRowsAcrossGrowthAndDrop) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  DeviceContextStore store(0, int64_t{1} << 30);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 300}, Rows(0, 300, 1), Rows(0, 300, -1))
          .ok());
  // Appends of odd sizes, enough to outgrow the spare rows of the first
  // piece, with gaps (positions other workers hold).
  std::vector<Range> held = {{0, 300}};
  int64_t at = 300;
  for (int64_t n : {1, 7, 1, 613, 1, 2}) {
    at += 5;
    const Range piece{at, at + n};
    const absl::StatusOr<int64_t> bytes =
        store.Add("c", false, kLayout, piece, Rows(at, n, 1), Rows(at, n, -1));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, store.bytes_in_use());
    held.push_back(piece);
    at += n;
  }
  absl::StatusOr<ResidentKv> kv = store.Find("c", held);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->rows, 925);
  EXPECT_EQ(kv->dtype, DeviceDType::kBFloat16);
  EXPECT_EQ(Download(*kv, false), Expected(held, 1));
  EXPECT_EQ(Download(*kv, true), Expected(held, -1));

  // A query of a later part only: the rows from its first position on.
  const std::vector<Range> tail(held.begin() + 4, held.end());
  kv = store.Find("c", tail);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(Download(*kv, false), Expected(tail, 1));

  // Undoing the last two appends, then appending again over their rows.
  store.Drop("c", held[held.size() - 2].begin);
  held.resize(held.size() - 2);
  const Range again{at + 10, at + 13};
  ASSERT_TRUE(store
                  .Add("c", false, kLayout, again, Rows(again.begin, 3, 1),
                       Rows(again.begin, 3, -1))
                  .ok());
  held.push_back(again);
  kv = store.Find("c", held);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(Download(*kv, true), Expected(held, -1));
}

// A page-locked piece over 256 MiB, locked in 256 MiB pieces as a context
// piece is, crosses in parts that each lie within one lock (rows of 48 bytes
// straddle their bounds), two batches.
TEST(DeviceContextStoreTest, LargePinnedPieceComesBackExactly) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  const ResidentContexts::Layout layout{2, 3, 8};
  const int64_t n = 3'000'017;
  const Shape shape{2, n, 3, 8};
  TypedTensor k(DType::kBFloat16, shape), v(DType::kBFloat16, shape);
  std::vector<std::vector<uint16_t>> expected;
  for (TypedTensor* t : {&k, &v}) {
    uint16_t* bits = reinterpret_cast<uint16_t*>(t->view().data());
    const int64_t values = shape.NumElements();
    for (int64_t i = 0; i < values; ++i) {
      // Finite bf16 values that differ from row to row.
      bits[i] = static_cast<uint16_t>(0x3f00 + (i * 2654435761u >> 24) % 128 +
                                      (t == &v ? 0x4000 : 0));
    }
    expected.emplace_back(bits, bits + values);
    auto pins = std::make_shared<PinnedHostRegions>(0);
    ASSERT_TRUE(
        pins->Pin({t->view().data(), static_cast<size_t>(t->view().bytes())})
            .ok());
    t->ReleaseBeforeFree(pins);
  }
  DeviceContextStore store(0, int64_t{4} << 30);
  const absl::StatusOr<int64_t> added =
      store.Add("big", true, layout, {0, n}, std::move(k), std::move(v));
  ASSERT_TRUE(added.ok()) << added.status();
  absl::StatusOr<ResidentKv> kv = store.Find("big", {{0, n}});
  ASSERT_TRUE(kv.ok()) << kv.status();
  for (int i = 0; i < 2; ++i) {
    const char* device = static_cast<const char*>(i == 0 ? kv->k : kv->v);
    std::vector<uint16_t> back(expected[i].size());
    const size_t batch_bytes = back.size() / 2 * sizeof(uint16_t);
    for (int64_t b = 0; b < 2; ++b) {
      ASSERT_EQ(
          cudaMemcpy(reinterpret_cast<char*>(back.data()) + b * batch_bytes,
                     device + b * kv->batch_stride * sizeof(uint16_t),
                     batch_bytes, cudaMemcpyDeviceToHost),
          cudaSuccess);
    }
    EXPECT_TRUE(back == expected[i]) << (i == 0 ? "K" : "V");
  }
}

TEST(DeviceContextStoreTest, ReadersKeepTheirRowsThroughGrowthAndDelete) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  DeviceContextStore store(0, int64_t{1} << 30);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 10}, Rows(0, 10, 1), Rows(0, 10, -1))
          .ok());
  absl::StatusOr<ResidentKv> kv = store.Find("c", {{0, 10}});
  ASSERT_TRUE(kv.ok());
  // Outgrows the buffers the reader holds, then deletes the context.
  ASSERT_TRUE(store
                  .Add("c", false, kLayout, {10, 5000}, Rows(10, 4990, 1),
                       Rows(10, 4990, -1))
                  .ok());
  store.Drop("c");
  EXPECT_EQ(store.bytes_in_use(), 0);
  EXPECT_EQ(Download(*kv, false), Expected({{0, 10}}, 1));
}

TEST(DeviceContextStoreTest, RefusesWhatItCannotHold) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  DeviceContextStore store(0, 100000);
  EXPECT_EQ(
      store.Add("c", false, kLayout, {0, 1}, Rows(0, 1, 1), Rows(0, 1, -1))
          .status()
          .code(),
      absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {10, 20}, Rows(10, 10, 1), Rows(10, 10, -1))
          .ok());
  // Positions before the last held ones: out of order for a GPU worker.
  EXPECT_EQ(
      store.Add("c", false, kLayout, {0, 5}, Rows(0, 5, 1), Rows(0, 5, -1))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      store
          .Add("c", false, {1, 4, 8}, {20, 21}, Rows(20, 1, 1), Rows(20, 1, -1))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store
                .Add("c", false, kLayout, {20, 2000}, Rows(20, 1980, 1),
                     Rows(20, 1980, -1))
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Find("c", {{5, 12}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Find("d", {{10, 12}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.DTypeOf("d").status().code(), absl::StatusCode::kNotFound);
  // What the worker reports to the coordinator's listing: the host dtype of
  // the same bits.
  EXPECT_EQ(*store.HeldDType("c"), DType::kBFloat16);
  EXPECT_EQ(store.HeldDType("d").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ringattn
