#ifndef RINGATTN_CLIENT_CLI_REQUEST_H_
#define RINGATTN_CLIENT_CLI_REQUEST_H_

// How the `ringattn` CLI turns its .npy inputs and flags into requests of the
// public API, and its results back into arrays. Pure functions; thread-safe.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/flags.h"
#include "client/npy.h"
#include "core/tensor.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// The [batch, seq, heads, dim] shape of `array`, read from `path`: an array
// [N, H, D] is batch 1. INVALID_ARGUMENT naming the file for other ranks.
absl::StatusOr<Shape> AttentionShape(const NpyArray& array,
                                     const std::string& path);

// The shape of the LSE file for a Q file of shape `q_shape` ([N, H, D] or
// [B, N, H, D]): [H, N] or [B, H, N].
std::vector<int64_t> LseFileShape(const std::vector<int64_t>& q_shape);

// "W:R,W:R,...": dilated branches of segment length W and dilation R, both
// positive integers.
absl::StatusOr<std::vector<v1::DilatedBranch>> ParseDilated(
    const std::string& text);

// "HxW": a Hilbert grid of positive height H and width W.
absl::StatusOr<v1::Hilbert> ParseHilbert(const std::string& text);

// "fp32", "fp16" or "bf16".
absl::StatusOr<v1::DType> ParseWireDType(const std::string& text);

// The names of the valued flags and switches that ApplySpecFlags reads.
const std::set<std::string>& SpecFlagNames();
const std::set<std::string>& SpecSwitchNames();

// Sets the options of `spec` that `flags` give: --causal, --scale,
// --wire_dtype, --dilated, --dilated_combine, --block_size with its rules
// (--local_blocks, --global_blocks, --dilated_blocks, --random_blocks,
// --seed), --hilbert, --strategy and --merge. INVALID_ARGUMENT naming the flag
// for a bad value, for block rules without --block_size, or for --seed without
// --random_blocks.
absl::Status ApplySpecFlags(const Flags& flags, v1::AttentionSpec* spec);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_CLI_REQUEST_H_
