#include "core/shard_layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {

std::vector<Range> SplitEvenly(int64_t n, int64_t parts) {
  std::vector<Range> runs;
  runs.reserve(static_cast<size_t>(parts));
  const int64_t base = n / parts;
  const int64_t larger = n % parts;
  int64_t begin = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t size = base + (i < larger ? 1 : 0);
    runs.push_back(Range{begin, begin + size});
    begin += size;
  }
  return runs;
}

ShardLayout ShardLayout::Make(ShardKind kind, int64_t seq_len,
                              int64_t workers) {
  ShardLayout layout;
  layout.kind_ = kind;
  layout.seq_len_ = seq_len;
  layout.chunks_.resize(static_cast<size_t>(workers));
  if (kind == ShardKind::kContiguous) {
    const std::vector<Range> runs = SplitEvenly(seq_len, workers);
    for (int64_t i = 0; i < workers; ++i) layout.chunks_[i] = {runs[i]};
  } else {
    const std::vector<Range> runs = SplitEvenly(seq_len, 2 * workers);
    for (int64_t i = 0; i < workers; ++i) {
      layout.chunks_[i] = {runs[i], runs[2 * workers - 1 - i]};
    }
  }
  return layout;
}

ShardLayout ShardLayout::FromChunks(int64_t seq_len,
                                    std::vector<std::vector<Range>> chunks) {
  ShardLayout layout;
  layout.kind_ = ShardKind::kExplicit;
  layout.seq_len_ = seq_len;
  layout.chunks_ = std::move(chunks);
  return layout;
}

absl::Status ShardLayout::Validate() const {
  std::vector<int64_t> owner(static_cast<size_t>(seq_len_), -1);
  for (int64_t w = 0; w < num_workers(); ++w) {
    for (const Range& chunk : chunks_[w]) {
      if (chunk.begin < 0 || chunk.end > seq_len_ || chunk.begin > chunk.end) {
        return absl::InvalidArgumentError(
            absl::StrCat("worker ", w, " holds [", chunk.begin, ", ", chunk.end,
                         ") outside [0, ", seq_len_, ")"));
      }
      for (int64_t p = chunk.begin; p < chunk.end; ++p) {
        if (owner[p] >= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "position ", p, " is held by workers ", owner[p], " and ", w));
        }
        owner[p] = w;
      }
    }
  }
  for (int64_t p = 0; p < seq_len_; ++p) {
    if (owner[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", p, " is held by no worker"));
    }
  }
  return absl::OkStatus();
}

int64_t ShardLayout::ShardLength(int64_t worker) const {
  int64_t length = 0;
  for (const Range& chunk : chunks_[worker]) length += chunk.size();
  return length;
}

int64_t ShardLayout::LargestShard() const {
  int64_t largest = 0;
  for (int64_t w = 0; w < num_workers(); ++w) {
    largest = std::max(largest, ShardLength(w));
  }
  return largest;
}

ShardLayout::Location ShardLayout::Locate(int64_t position) const {
  for (int64_t w = 0; w < num_workers(); ++w) {
    int64_t row = 0;
    for (const Range& chunk : chunks_[w]) {
      if (position >= chunk.begin && position < chunk.end) {
        return Location{w, row + position - chunk.begin};
      }
      row += chunk.size();
    }
  }
  return Location{-1, -1};
}

}  // namespace ringattn
