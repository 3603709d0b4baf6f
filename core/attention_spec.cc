#include "core/attention_spec.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

absl::Status Invalid(const std::string& field, const std::string& rule,
                     const std::string& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("field '", field, "' ", rule, ", got ", got));
}

absl::Status CheckAtLeast(const std::string& field, int64_t value,
                          int64_t minimum) {
  if (value >= minimum) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be >= ", minimum),
                 absl::StrCat(value));
}

// OK if a tensor of batch x len x heads x head_dim elements holds at most
// kMaxTensorElements; `len_field` names its length.
absl::Status CheckTensorSize(const std::string& len_field,
                             const std::string& tensor, int64_t batch,
                             int64_t len, int64_t heads, int64_t head_dim) {
  int64_t elements;
  if (!__builtin_mul_overflow(batch, len, &elements) &&
      !__builtin_mul_overflow(elements, heads, &elements) &&
      !__builtin_mul_overflow(elements, head_dim, &elements) &&
      elements <= kMaxTensorElements) {
    return absl::OkStatus();
  }
  return Invalid(
      len_field,
      absl::StrCat("must keep ", tensor, " (batch x ", len_field,
                   " x heads x head_dim) within ", kMaxTensorElements,
                   " elements"),
      absl::StrCat(batch, " x ", len, " x ", heads, " x ", head_dim));
}

// a / b rounded up, for a >= 0 and b >= 1 (a + b - 1 could overflow).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

absl::Status ValidateBlockSparse(const BlockSparseRules& rules,
                                 int64_t seq_len) {
  RINGATTN_RETURN_IF_ERROR(
      CheckAtLeast("block_sparse.block_size", rules.block_size, 1));
  RINGATTN_RETURN_IF_ERROR(
      CheckAtLeast("block_sparse.global", rules.global, 0));
  RINGATTN_RETURN_IF_ERROR(
      CheckAtLeast("block_sparse.dilated", rules.dilated, 0));
  RINGATTN_RETURN_IF_ERROR(
      CheckAtLeast("block_sparse.random", rules.random, 0));
  if (rules.local < 0 && rules.global == 0 && rules.dilated == 0 &&
      rules.random == 0 && rules.pairs.empty()) {
    return Invalid("block_sparse",
                   "must enable at least one rule (local, "
                   "global, dilated, random or pairs)",
                   "none");
  }
  const int64_t num_blocks = CeilDiv(seq_len, rules.block_size);
  for (size_t i = 0; i < rules.pairs.size(); ++i) {
    const auto& [q, k] = rules.pairs[i];
    if (q < 0 || q >= num_blocks || k < 0 || k >= num_blocks) {
      return Invalid(
          absl::StrCat("block_sparse.pairs[", i, "]"),
          absl::StrCat("must name blocks in [0, ", num_blocks, ") for ",
                       seq_len, " positions in blocks of ", rules.block_size),
          absl::StrCat("(", q, ", ", k, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionSpec::Validate() const {
  RINGATTN_RETURN_IF_ERROR(CheckAtLeast("batch", batch, 1));
  RINGATTN_RETURN_IF_ERROR(CheckAtLeast("q_len", q_len, 1));
  RINGATTN_RETURN_IF_ERROR(CheckAtLeast("kv_len", kv_len, 1));
  RINGATTN_RETURN_IF_ERROR(CheckAtLeast("q_heads", q_heads, 1));
  RINGATTN_RETURN_IF_ERROR(CheckAtLeast("kv_heads", kv_heads, 1));
  if (q_heads % kv_heads != 0) {
    return Invalid(
        "q_heads",
        absl::StrCat("must be a multiple of kv_heads (", kv_heads, ")"),
        absl::StrCat(q_heads));
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    return Invalid("head_dim",
                   absl::StrCat("must be in [1, ", kMaxHeadDim, "]"),
                   absl::StrCat(head_dim));
  }
  RINGATTN_RETURN_IF_ERROR(
      CheckTensorSize("q_len", "Q", batch, q_len, q_heads, head_dim));
  RINGATTN_RETURN_IF_ERROR(
      CheckTensorSize("kv_len", "K and V", batch, kv_len, kv_heads, head_dim));
  if (scale.has_value() && !(std::isfinite(*scale) && *scale > 0)) {
    return Invalid("scale", "must be finite and > 0", absl::StrCat(*scale));
  }
  const bool has_pattern =
      !dilated.empty() || block_sparse.has_value() || hilbert.has_value();
  if (has_pattern && q_len != kv_len) {
    return Invalid(
        "q_len",
        absl::StrCat("must equal kv_len (", kv_len,
                     ") when dilated, block_sparse or hilbert is set"),
        absl::StrCat(q_len));
  }
  if (!dilated.empty() && block_sparse.has_value()) {
    return Invalid("block_sparse", "cannot be combined with dilated branches",
                   "both set");
  }
  for (size_t i = 0; i < dilated.size(); ++i) {
    const std::string prefix = absl::StrCat("dilated[", i, "].");
    RINGATTN_RETURN_IF_ERROR(
        CheckAtLeast(prefix + "segment_length", dilated[i].segment_length, 1));
    RINGATTN_RETURN_IF_ERROR(
        CheckAtLeast(prefix + "dilation", dilated[i].dilation, 1));
    if (dilated[i].dilation > dilated[i].segment_length) {
      return Invalid(prefix + "dilation",
                     absl::StrCat("must be <= segment_length (",
                                  dilated[i].segment_length, ")"),
                     absl::StrCat(dilated[i].dilation));
    }
  }
  if (combine == DilatedCombine::kHeadGroups &&
      static_cast<int64_t>(dilated.size()) > q_heads) {
    return Invalid("dilated",
                   absl::StrCat("HEAD_GROUPS needs at most q_heads (", q_heads,
                                ") branches"),
                   absl::StrCat(dilated.size(), " branches"));
  }
  if (block_sparse.has_value()) {
    RINGATTN_RETURN_IF_ERROR(ValidateBlockSparse(*block_sparse, kv_len));
  }
  if (hilbert.has_value()) {
    RINGATTN_RETURN_IF_ERROR(
        CheckAtLeast("hilbert.height", hilbert->height, 1));
    RINGATTN_RETURN_IF_ERROR(CheckAtLeast("hilbert.width", hilbert->width, 1));
    int64_t area;
    if (__builtin_mul_overflow(hilbert->height, hilbert->width, &area) ||
        area != q_len) {
      return Invalid("hilbert",
                     absl::StrCat("height x width must equal the sequence "
                                  "length (",
                                  q_len, ")"),
                     absl::StrCat(hilbert->height, " x ", hilbert->width));
    }
  }
  return absl::OkStatus();
}

float AttentionSpec::EffectiveScale() const {
  return scale.has_value() ? *scale
                           : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace ringattn
