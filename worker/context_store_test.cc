#include "worker/context_store.h"

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Rows [first, first + n) whose values are their positions.
TypedTensor Rows(int64_t first, int64_t n) {
  Tensor<float> t({1, n, 1, 2});
  for (int64_t i = 0; i < n; ++i) {
    t.view().At(0, i, 0, 0) = static_cast<float>(first + i);
    t.view().At(0, i, 0, 1) = -static_cast<float>(first + i);
  }
  return TypedTensor(std::move(t));
}

const ContextStore::Layout kLayout{1, 1, 2};

TEST(ContextStore, CopiesRowsAcrossAppendedPieces) {
  ContextStore store(1 << 20);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 3}, Rows(0, 3), Rows(0, 3)).ok());
  ASSERT_TRUE(
      store.Add("c", false, kLayout, {7, 9}, Rows(7, 2), Rows(7, 2)).ok());
  Tensor<float> k({1, 4, 1, 2}), v({1, 4, 1, 2});
  ASSERT_TRUE(
      store
          .Copy("c", {{1, 3}, {7, 9}}, TypedView(k.view()), TypedView(v.view()))
          .ok());
  EXPECT_EQ(k.view().At(0, 0, 0, 0), 1);
  EXPECT_EQ(k.view().At(0, 2, 0, 0), 7);
  EXPECT_EQ(v.view().At(0, 3, 0, 1), -8);
  EXPECT_EQ(store.Copy("c", {{3, 5}}, TypedView(k.view()), TypedView(v.view()))
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      store.Copy("other", {{0, 1}}, TypedView(k.view()), TypedView(v.view()))
          .code(),
      absl::StatusCode::kNotFound);
}

// Pieces longer than one run of the parallel copy (256 rows), two batches, a
// query that starts inside a piece: every row lands where it belongs.
TEST(ContextStore, CopiesLongPiecesOfEveryBatchRowByRow) {
  const ContextStore::Layout layout{2, 1, 2};
  auto rows = [](int64_t first, int64_t n) {
    Tensor<float> t({2, n, 1, 2});
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        t.view().At(b, i, 0, 0) = static_cast<float>(first + i);
        t.view().At(b, i, 0, 1) = static_cast<float>(1000 * b);
      }
    }
    return TypedTensor(std::move(t));
  };
  ContextStore store(1 << 20);
  ASSERT_TRUE(
      store.Add("c", true, layout, {0, 700}, rows(0, 700), rows(0, 700)).ok());
  ASSERT_TRUE(
      store.Add("c", false, layout, {700, 1001}, rows(700, 301), rows(700, 301))
          .ok());
  Tensor<float> k({2, 995, 1, 2}), v({2, 995, 1, 2});
  ASSERT_TRUE(
      store.Copy("c", {{6, 1001}}, TypedView(k.view()), TypedView(v.view()))
          .ok());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 995; ++i) {
      ASSERT_EQ(k.view().At(b, i, 0, 0), 6 + i)
          << "batch " << b << " row " << i;
      ASSERT_EQ(v.view().At(b, i, 0, 1), 1000 * b)
          << "batch " << b << " row " << i;
    }
  }
}

TEST(ContextStore, RefusesWrongCreateLayoutOverlapAndOverflow) {
  ContextStore store(100);
  EXPECT_EQ(store.Add("c", false, kLayout, {0, 1}, Rows(0, 1), Rows(0, 1))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 2}, Rows(0, 2), Rows(0, 2)).ok());
  EXPECT_EQ(store.Add("c", true, kLayout, {2, 3}, Rows(2, 1), Rows(2, 1))
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.Add("c", false, {1, 2, 2}, {2, 3}, Rows(2, 1), Rows(2, 1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Add("c", false, kLayout, {1, 3}, Rows(1, 2), Rows(1, 2))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int64_t> full =
      store.Add("c", false, kLayout, {2, 12}, Rows(2, 10), Rows(2, 10));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.bytes_in_use(), 32);
  ASSERT_TRUE(
      store.Add("c", false, kLayout, {2, 3}, Rows(2, 1), Rows(2, 1)).ok());
  EXPECT_EQ(store.bytes_in_use(), 48);
  store.Drop("c", 2);  // undo the last append; the buffers keep their room
  EXPECT_EQ(store.bytes_in_use(), 48);
  store.Drop("c");
  EXPECT_EQ(store.bytes_in_use(), 0);
}

// Rows of an undone append that arrive after their undo do not stay: the
// next append's rows take their positions.
TEST(ContextStore, RowsOfAnAppendUndoneBeforeTheyArrivedAreRefused) {
  ContextStore store(1 << 20);
  ASSERT_TRUE(store
                  .AddUnlessUndone("c", true, kLayout, {0, 2}, Rows(0, 2),
                                   Rows(0, 2), /*undone_appends=*/0)
                  .ok());
  store.Undo("c", 2, /*undone_appends=*/1);
  EXPECT_EQ(store
                .AddUnlessUndone("c", false, kLayout, {2, 3}, Rows(2, 1),
                                 Rows(2, 1), /*undone_appends=*/0)
                .status()
                .code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<int64_t> next =
      store.AddUnlessUndone("c", false, kLayout, {2, 3}, Rows(2, 1), Rows(2, 1),
                            /*undone_appends=*/1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 3 * 2 * 2 * 4);
  // A context created again under the name starts with no undone appends.
  store.Undo("c", 0, 0);
  ASSERT_TRUE(store
                  .AddUnlessUndone("c", true, kLayout, {0, 1}, Rows(0, 1),
                                   Rows(0, 1), /*undone_appends=*/0)
                  .ok());
  EXPECT_TRUE(store
                  .AddUnlessUndone("c", false, kLayout, {1, 2}, Rows(1, 1),
                                   Rows(1, 1), /*undone_appends=*/0)
                  .ok());
}

// Find gives the rows where they lie; a reader keeps them alive through a
// growth of the buffers and a Drop, and sees the rows it found.
TEST(ContextStore, FindsRowsInPlaceAndKeepsThemForItsReader) {
  ContextStore store(1 << 20);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 3}, Rows(0, 3), Rows(0, 3)).ok());
  ASSERT_TRUE(
      store.Add("c", false, kLayout, {5, 7}, Rows(5, 2), Rows(5, 2)).ok());
  absl::StatusOr<ResidentRows> rows = store.Find("c", {{1, 3}, {5, 7}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_FALSE(rows->k.is_bf16());
  ASSERT_EQ(rows->k.shape().seq, 4);
  EXPECT_EQ(rows->k.f32().At(0, 0, 0, 0), 1);
  EXPECT_EQ(rows->k.f32().At(0, 2, 0, 0), 5);
  EXPECT_EQ(rows->v.f32().At(0, 3, 0, 1), -6);
  // Growth moves the context to new buffers and Drop forgets it; the reader's
  // rows stay as they were.
  ASSERT_TRUE(
      store.Add("c", false, kLayout, {7, 107}, Rows(7, 100), Rows(7, 100))
          .ok());
  store.Drop("c");
  EXPECT_EQ(rows->k.f32().At(0, 1, 0, 0), 2);
  EXPECT_EQ(rows->v.f32().At(0, 2, 0, 1), -5);
  EXPECT_EQ(store.bytes_in_use(), 0);
}

TEST(ContextStore, FindRefusesRowsNotHeldOrNotOneRun) {
  ContextStore store(1 << 20);
  ASSERT_TRUE(
      store.Add("c", true, kLayout, {0, 3}, Rows(0, 3), Rows(0, 3)).ok());
  ASSERT_TRUE(
      store.Add("c", false, kLayout, {5, 7}, Rows(5, 2), Rows(5, 2)).ok());
  EXPECT_EQ(store.Find("c", {{2, 6}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Find("c", {{0, 1}, {2, 3}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Find("other", {{0, 1}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Add("c", false, kLayout, {4, 5}, Rows(4, 1), Rows(4, 1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A context created in bf16 is held and found in bf16; fp32 rows appended to
// it are rounded to bf16. One created in fp16 is held in fp32 (exactly).
TEST(ContextStore, HoldsBf16ContextsInBf16AndOthersInFp32) {
  ContextStore store(1 << 20);
  TypedTensor k(DType::kBFloat16, {1, 1, 1, 2});
  TypedTensor v(DType::kBFloat16, {1, 1, 1, 2});
  const float values[2] = {1.5f, -2.0f};
  ConvertFromFloat(DType::kBFloat16, values, k.view().data(), 2);
  ConvertFromFloat(DType::kBFloat16, values, v.view().data(), 2);
  ASSERT_TRUE(
      store.Add("b", true, kLayout, {0, 1}, std::move(k), std::move(v)).ok());
  Tensor<float> fine({1, 1, 1, 2});
  fine.view().At(0, 0, 0, 0) = 1.0f + 1.0f / 1024;  // not a bf16 value
  ASSERT_TRUE(store
                  .Add("b", false, kLayout, {1, 2}, TypedTensor(fine),
                       TypedTensor(Tensor<float>({1, 1, 1, 2})))
                  .ok());
  EXPECT_EQ(*store.HeldDType("b"), DType::kBFloat16);
  absl::StatusOr<ResidentRows> rows = store.Find("b", {{0, 2}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_TRUE(rows->k.is_bf16());
  EXPECT_EQ(Widen(rows->k.bf16().At(0, 0, 0, 0)), 1.5f);
  EXPECT_EQ(Widen(rows->v.bf16().At(0, 0, 0, 1)), -2.0f);
  EXPECT_EQ(Widen(rows->k.bf16().At(0, 1, 0, 0)), 1.0f);

  TypedTensor h(DType::kFloat16, {1, 1, 1, 2});
  ConvertFromFloat(DType::kFloat16, values, h.view().data(), 2);
  TypedTensor h2(DType::kFloat16, {1, 1, 1, 2});
  ConvertFromFloat(DType::kFloat16, values, h2.view().data(), 2);
  ASSERT_TRUE(
      store.Add("h", true, kLayout, {0, 1}, std::move(h), std::move(h2)).ok());
  EXPECT_EQ(*store.HeldDType("h"), DType::kFloat32);
  EXPECT_EQ(store.Find("h", {{0, 1}})->k.f32().At(0, 0, 0, 1), -2.0f);
  EXPECT_EQ(store.HeldDType("other").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ContextStore, HoldsRowsInTheirDTypeAndConvertsOnCopy) {
  ContextStore store(1 << 20);
  TypedTensor k(DType::kBFloat16, {1, 2, 1, 2});
  TypedTensor v(DType::kBFloat16, {1, 2, 1, 2});
  const float values[4] = {1.5f, -2.0f, 0.25f, 3.0f};
  ConvertFromFloat(DType::kBFloat16, values, k.view().data(), 4);
  ConvertFromFloat(DType::kBFloat16, values, v.view().data(), 4);
  absl::StatusOr<int64_t> bytes =
      store.Add("c", true, kLayout, {0, 2}, std::move(k), std::move(v));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 2 * 4 * 2);  // K and V, 4 bf16 values each
  Tensor<float> k_out({1, 1, 1, 2}), v_out({1, 1, 1, 2});
  ASSERT_TRUE(
      store
          .Copy("c", {{1, 2}}, TypedView(k_out.view()), TypedView(v_out.view()))
          .ok());
  EXPECT_EQ(k_out.view().At(0, 0, 0, 0), 0.25f);
  EXPECT_EQ(v_out.view().At(0, 0, 0, 1), 3.0f);
}

}  // namespace
}  // namespace ringattn
