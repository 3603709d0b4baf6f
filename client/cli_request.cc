#include "client/cli_request.h"

#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

// The pieces of `text` between occurrences of `separator`.
std::vector<std::string> Split(std::string_view text, char separator) {
  std::vector<std::string> pieces;
  size_t start = 0;
  for (size_t end; (end = text.find(separator, start)) != text.npos;
       start = end + 1) {
    pieces.emplace_back(text.substr(start, end - start));
  }
  pieces.emplace_back(text.substr(start));
  return pieces;
}

// `text` as an integer >= 1, or nullopt.
std::optional<int64_t> PositiveInt(const std::string& text) {
  int64_t value;
  if (!absl::SimpleAtoi(text, &value) || value < 1) return std::nullopt;
  return value;
}

// The value of flag `name` (an integer >= `minimum`), through `set`, if given.
template <typename Setter>
absl::Status SetIntFlag(const Flags& flags, const std::string& name,
                        int64_t minimum, Setter set) {
  if (!flags.Has(name)) return absl::OkStatus();
  absl::StatusOr<int64_t> value = flags.GetInt(name, 0);
  if (!value.ok()) return value.status();
  if (*value < minimum) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --", name, " must be >= ", minimum, ", got ", *value));
  }
  set(*value);
  return absl::OkStatus();
}

// Flag `name`'s value, which must be one of the keys of `choices`, through
// `set`, if given.
template <typename Value, typename Setter>
absl::Status SetChoiceFlag(
    const Flags& flags, const std::string& name,
    const std::vector<std::pair<std::string, Value>>& choices, Setter set) {
  std::optional<std::string> text = flags.Get(name);
  if (!text.has_value()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const auto& [choice, value] : choices) {
    if (*text == choice) {
      set(value);
      return absl::OkStatus();
    }
    names.push_back(choice);
  }
  return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes ",
                                                 absl::StrJoin(names, "|"),
                                                 ", got '", *text, "'"));
}

const std::vector<std::pair<std::string, v1::DType>>& WireDTypes() {
  static const auto* const kChoices =
      new std::vector<std::pair<std::string, v1::DType>>{
          {"fp32", v1::FP32}, {"fp16", v1::FP16}, {"bf16", v1::BF16}};
  return *kChoices;
}

}  // namespace

absl::StatusOr<Shape> AttentionShape(const NpyArray& array,
                                     const std::string& path) {
  const std::vector<int64_t>& s = array.shape;
  if (s.size() == 3) return Shape{1, s[0], s[1], s[2]};
  if (s.size() == 4) return Shape{s[0], s[1], s[2], s[3]};
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": expected an array [N, H, D] or [B, N, H, D], got "
                   "shape (",
                   absl::StrJoin(s, ", "), ")"));
}

std::vector<int64_t> LseFileShape(const std::vector<int64_t>& q_shape) {
  const size_t n = q_shape.size();
  std::vector<int64_t> shape(q_shape.begin(), q_shape.end() - 3);
  shape.push_back(q_shape[n - 2]);
  shape.push_back(q_shape[n - 3]);
  return shape;
}

absl::StatusOr<std::vector<v1::DilatedBranch>> ParseDilated(
    const std::string& text) {
  std::vector<v1::DilatedBranch> branches;
  for (const std::string& item : Split(text, ',')) {
    const std::vector<std::string> parts = Split(item, ':');
    std::optional<int64_t> length, dilation;
    if (parts.size() == 2) {
      length = PositiveInt(parts[0]);
      dilation = PositiveInt(parts[1]);
    }
    if (!length.has_value() || !dilation.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --dilated takes W:R,W:R,... with positive integers, got '",
          text, "'"));
    }
    v1::DilatedBranch& branch = branches.emplace_back();
    branch.set_segment_length(*length);
    branch.set_dilation(*dilation);
  }
  return branches;
}

absl::StatusOr<v1::Hilbert> ParseHilbert(const std::string& text) {
  const std::vector<std::string> parts = Split(text, 'x');
  std::optional<int64_t> height, width;
  if (parts.size() == 2) {
    height = PositiveInt(parts[0]);
    width = PositiveInt(parts[1]);
  }
  if (!height.has_value() || !width.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --hilbert takes HxW with positive integers, got '", text, "'"));
  }
  v1::Hilbert grid;
  grid.set_height(*height);
  grid.set_width(*width);
  return grid;
}

absl::StatusOr<v1::DType> ParseWireDType(const std::string& text) {
  for (const auto& [name, dtype] : WireDTypes()) {
    if (text == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("flag --wire_dtype takes fp32|fp16|bf16, got '", text, "'"));
}

const std::set<std::string>& SpecFlagNames() {
  static const auto* const kNames = new std::set<std::string>{
      "scale",         "wire_dtype",   "dilated",       "dilated_combine",
      "block_size",    "local_blocks", "global_blocks", "dilated_blocks",
      "random_blocks", "seed",         "hilbert",       "strategy",
      "merge"};
  return *kNames;
}

const std::set<std::string>& SpecSwitchNames() {
  static const auto* const kNames = new std::set<std::string>{"causal"};
  return *kNames;
}

absl::Status ApplySpecFlags(const Flags& flags, v1::AttentionSpec* spec) {
  spec->set_causal(flags.GetSwitch("causal"));
  if (flags.Has("scale")) {
    absl::StatusOr<double> scale = flags.GetDouble("scale", 0);
    if (!scale.ok()) return scale.status();
    spec->set_scale(static_cast<float>(*scale));
  }
  if (std::optional<std::string> text = flags.Get("wire_dtype")) {
    absl::StatusOr<v1::DType> dtype = ParseWireDType(*text);
    if (!dtype.ok()) return dtype.status();
    spec->set_wire_dtype(*dtype);
  }
  if (std::optional<std::string> text = flags.Get("dilated")) {
    absl::StatusOr<std::vector<v1::DilatedBranch>> branches =
        ParseDilated(*text);
    if (!branches.ok()) return branches.status();
    spec->mutable_dilated()->Assign(branches->begin(), branches->end());
  }
  RINGATTN_RETURN_IF_ERROR(SetChoiceFlag<v1::DilatedCombine>(
      flags, "dilated_combine",
      {{"lse", v1::COMBINE_LSE}, {"head_groups", v1::COMBINE_HEAD_GROUPS}},
      [spec](v1::DilatedCombine combine) {
        spec->set_dilated_combine(combine);
      }));
  RINGATTN_RETURN_IF_ERROR(SetChoiceFlag<v1::Strategy>(
      flags, "strategy",
      {{"auto", v1::STRATEGY_AUTO},
       {"pass_kv", v1::PASS_KV},
       {"pass_q", v1::PASS_Q},
       {"broadcast_q", v1::BROADCAST_Q}},
      [spec](v1::Strategy strategy) { spec->set_strategy(strategy); }));
  RINGATTN_RETURN_IF_ERROR(SetChoiceFlag<v1::PartialMerge>(
      flags, "merge",
      {{"auto", v1::MERGE_AUTO},
       {"coordinator", v1::MERGE_AT_COORDINATOR},
       {"workers", v1::MERGE_ON_WORKERS}},
      [spec](v1::PartialMerge merge) { spec->set_partial_merge(merge); }));

  for (const char* rule : {"local_blocks", "global_blocks", "dilated_blocks",
                           "random_blocks", "seed"}) {
    if (flags.Has(rule) && !flags.Has("block_size")) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", rule, " needs --block_size"));
    }
  }
  if (flags.Has("seed") && !flags.Has("random_blocks")) {
    return absl::InvalidArgumentError("flag --seed needs --random_blocks");
  }
  if (flags.Has("block_size")) {
    v1::BlockSparse* sparse = spec->mutable_block_sparse();
    RINGATTN_RETURN_IF_ERROR(
        SetIntFlag(flags, "block_size", 1,
                   [sparse](int64_t value) { sparse->set_block_size(value); }));
    RINGATTN_RETURN_IF_ERROR(SetIntFlag(
        flags, "local_blocks", 0,
        [sparse](int64_t value) { sparse->set_local_blocks(value); }));
    RINGATTN_RETURN_IF_ERROR(SetIntFlag(
        flags, "global_blocks", 0,
        [sparse](int64_t value) { sparse->set_global_blocks(value); }));
    RINGATTN_RETURN_IF_ERROR(SetIntFlag(
        flags, "dilated_blocks", 0,
        [sparse](int64_t value) { sparse->set_dilated_blocks(value); }));
    RINGATTN_RETURN_IF_ERROR(SetIntFlag(
        flags, "random_blocks", 0,
        [sparse](int64_t value) { sparse->set_random_blocks(value); }));
    RINGATTN_RETURN_IF_ERROR(
        SetIntFlag(flags, "seed", 0,
                   [sparse](int64_t value) { sparse->set_seed(value); }));
  }
  if (std::optional<std::string> text = flags.Get("hilbert")) {
    absl::StatusOr<v1::Hilbert> grid = ParseHilbert(*text);
    if (!grid.ok()) return grid.status();
    *spec->mutable_hilbert() = *grid;
  }
  return absl::OkStatus();
}

}  // namespace ringattn
