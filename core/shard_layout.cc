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
  // Zigzag over one worker would be two adjacent chunks: one run serves, and
  // spares a world of one (broadcast-Q's queries) a second pass over its keys.
  if (kind == ShardKind::kContiguous || workers == 1) {
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
  // Every non-empty chunk with its worker, in position order: they partition
  // [0, seq_len) iff each starts where the one before it ended.
  struct Held {
    Range chunk;
    int64_t worker;
  };
  std::vector<Held> held;
  for (int64_t w = 0; w < num_workers(); ++w) {
    for (const Range& chunk : chunks_[w]) {
      if (chunk.begin < 0 || chunk.end > seq_len_ || chunk.begin > chunk.end) {
        return absl::InvalidArgumentError(
            absl::StrCat("worker ", w, " holds [", chunk.begin, ", ", chunk.end,
                         ") outside [0, ", seq_len_, ")"));
      }
      if (!chunk.empty()) held.push_back(Held{chunk, w});
    }
  }
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) {
    return a.chunk.begin < b.chunk.begin;
  });
  int64_t covered = 0;  // positions [0, covered) are held exactly once
  for (size_t i = 0; i < held.size(); ++i) {
    const Range& chunk = held[i].chunk;
    if (chunk.begin > covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", covered, " is held by no worker"));
    }
    if (chunk.begin < covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", chunk.begin, " is held by workers ",
                       held[i - 1].worker, " and ", held[i].worker));
    }
    covered = chunk.end;
  }
  if (covered < seq_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("position ", covered, " is held by no worker"));
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
