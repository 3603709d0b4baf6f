#include "proto/spec_conversion.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ringattn {

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::FP32:
      return DType::kFloat32;
    case v1::FP16:
      return DType::kFloat16;
    case v1::BF16:
      return DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'wire_dtype' must be FP32, FP16 or BF16, got ",
          v1::DType_Name(dtype).empty() ? absl::StrCat(static_cast<int>(dtype))
                                        : v1::DType_Name(dtype)));
  }
}

absl::StatusOr<DType> OutputDType(const v1::AttentionSpec& spec) {
  if (spec.output_dtype() == v1::DTYPE_UNSPECIFIED) return DType::kFloat32;
  absl::StatusOr<DType> dtype = DTypeFromProto(spec.output_dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'output_dtype' must be unset, FP32, FP16 or BF16, got ",
        static_cast<int>(spec.output_dtype())));
  }
  return dtype;
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return v1::FP16;
    case DType::kBFloat16:
      return v1::BF16;
    case DType::kFloat32:
      break;
  }
  return v1::FP32;
}

absl::StatusOr<AttentionSpec> SpecFromProto(const v1::AttentionSpec& proto) {
  AttentionSpec spec;
  spec.batch = proto.batch();
  spec.q_len = proto.q_len();
  spec.kv_len = proto.kv_len();
  spec.q_heads = proto.q_heads();
  spec.kv_heads = proto.kv_heads();
  spec.head_dim = proto.head_dim();
  if (proto.has_scale()) spec.scale = proto.scale();
  spec.causal = proto.causal();
  for (const v1::DilatedBranch& branch : proto.dilated()) {
    spec.dilated.push_back({branch.segment_length(), branch.dilation()});
  }
  switch (proto.dilated_combine()) {
    case v1::COMBINE_LSE:
      spec.combine = DilatedCombine::kLse;
      break;
    case v1::COMBINE_HEAD_GROUPS:
      spec.combine = DilatedCombine::kHeadGroups;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("field 'dilated_combine' has unknown value ",
                       static_cast<int>(proto.dilated_combine())));
  }
  if (proto.has_block_sparse()) {
    const v1::BlockSparse& bs = proto.block_sparse();
    BlockSparseRules rules;
    rules.block_size = bs.block_size();
    rules.local = bs.has_local_blocks() ? bs.local_blocks() : -1;
    if (bs.has_local_blocks() && bs.local_blocks() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("field 'block_sparse.local_blocks' must be >= 0, got ",
                       bs.local_blocks()));
    }
    rules.global = bs.global_blocks();
    rules.dilated = bs.dilated_blocks();
    rules.random = bs.random_blocks();
    rules.seed = bs.seed();
    for (const v1::BlockPair& pair : bs.pairs()) {
      rules.pairs.emplace_back(pair.query_block(), pair.key_block());
    }
    spec.block_sparse = rules;
  }
  if (proto.has_hilbert()) {
    spec.hilbert =
        HilbertGrid{proto.hilbert().height(), proto.hilbert().width()};
  }
  RINGATTN_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

v1::AttentionSpec SpecToProto(const AttentionSpec& spec) {
  v1::AttentionSpec proto;
  proto.set_batch(spec.batch);
  proto.set_q_len(spec.q_len);
  proto.set_kv_len(spec.kv_len);
  proto.set_q_heads(spec.q_heads);
  proto.set_kv_heads(spec.kv_heads);
  proto.set_head_dim(spec.head_dim);
  if (spec.scale.has_value()) proto.set_scale(*spec.scale);
  proto.set_causal(spec.causal);
  for (const DilatedBranch& branch : spec.dilated) {
    v1::DilatedBranch* out = proto.add_dilated();
    out->set_segment_length(branch.segment_length);
    out->set_dilation(branch.dilation);
  }
  proto.set_dilated_combine(spec.combine == DilatedCombine::kHeadGroups
                                ? v1::COMBINE_HEAD_GROUPS
                                : v1::COMBINE_LSE);
  if (spec.block_sparse.has_value()) {
    const BlockSparseRules& rules = *spec.block_sparse;
    v1::BlockSparse* bs = proto.mutable_block_sparse();
    bs->set_block_size(rules.block_size);
    if (rules.local >= 0) bs->set_local_blocks(rules.local);
    bs->set_global_blocks(rules.global);
    bs->set_dilated_blocks(rules.dilated);
    bs->set_random_blocks(rules.random);
    bs->set_seed(rules.seed);
    for (const auto& [q, k] : rules.pairs) {
      v1::BlockPair* pair = bs->add_pairs();
      pair->set_query_block(q);
      pair->set_key_block(k);
    }
  }
  if (spec.hilbert.has_value()) {
    proto.mutable_hilbert()->set_height(spec.hilbert->height);
    proto.mutable_hilbert()->set_width(spec.hilbert->width);
  }
  return proto;
}

}  // namespace ringattn
