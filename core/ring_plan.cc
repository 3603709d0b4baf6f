#include "core/ring_plan.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/dilated.h"
#include "core/status_macros.h"

namespace ringattn {
namespace {

// Causal visibility of a whole chunk pair: key kp visible from query qp iff
// kp <= qp + shift.
bool CausalNoneVisible(const Range& q, const Range& k, int64_t shift) {
  return k.begin > q.end - 1 + shift;
}
bool CausalAllVisible(const Range& q, const Range& k, int64_t shift) {
  return k.end - 1 <= q.begin + shift;
}

// Whether some head that takes `branch` keeps a query in `q` and a key in `k`
// of one segment, with the key visible under causality.
bool DilatedPairVisible(const AttentionSpec& spec, int64_t branch,
                        const Range& q, const Range& k) {
  const DilatedBranch& b = spec.dilated[branch];
  for (const Range& segment : SegmentsIn(b, spec.q_len, q)) {
    if (segment.Intersect(k).empty()) continue;
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      if (!HeadTakesBranch(spec, branch, h)) continue;
      const int64_t offset = DilatedOffset(spec, branch, h);
      const KeptPositions kq = KeptIn(segment, b.dilation, offset, q);
      const KeptPositions kk = KeptIn(segment, b.dilation, offset, k);
      if (kq.count == 0 || kk.count == 0) continue;
      if (!spec.causal || kk.first <= kq.first + (kq.count - 1) * kq.stride) {
        return true;
      }
    }
  }
  return false;
}

// The tasks of one (query chunk, key chunk) pair, none if fully masked.
void AddTasks(const AttentionSpec& spec, const BlockMask* blocks,
              const Range& q, int64_t q_row, const Range& k, int64_t k_row,
              std::vector<AttentionTask>& tasks) {
  if (q.empty() || k.empty()) return;
  const int64_t shift = spec.kv_len - spec.q_len;
  if (spec.causal && CausalNoneVisible(q, k, shift)) return;
  AttentionTask task{q, q_row, k, k_row};
  if (!spec.dilated.empty()) {
    task.kind = TaskKind::kDilated;
    for (int64_t b = 0; b < static_cast<int64_t>(spec.dilated.size()); ++b) {
      if (!DilatedPairVisible(spec, b, q, k)) continue;
      task.branch = b;
      tasks.push_back(task);
    }
    return;
  }
  if (blocks != nullptr) {
    if (!blocks->AnyAllowed(q.begin, q.end, k.begin, k.end)) return;
    task.kind = TaskKind::kBlockSparse;
  } else if (spec.causal && !CausalAllVisible(q, k, shift)) {
    task.kind = TaskKind::kCausal;
  }
  tasks.push_back(task);
}

// Workers split into rings of consecutive workers: dilated segments never reach
// past their ring (a segment spanning k shards rings only among those k); other
// patterns use one ring of all workers. ring_of[i] is the first worker of
// worker i's ring.
std::vector<Range> Rings(const AttentionSpec& spec,
                         const ShardLayout& kv_layout) {
  const int64_t p = kv_layout.num_workers();
  if (spec.dilated.empty()) return {Range{0, p}};
  // reach[w]: the last worker any segment starting in worker w's shard touches.
  std::vector<int64_t> reach(static_cast<size_t>(p));
  for (int64_t w = 0; w < p; ++w) reach[w] = w;
  for (const DilatedBranch& branch : spec.dilated) {
    for (const Range& segment :
         SegmentsIn(branch, spec.kv_len, Range{0, spec.kv_len})) {
      const int64_t first = kv_layout.Locate(segment.begin).worker;
      const int64_t last = kv_layout.Locate(segment.end - 1).worker;
      reach[first] = std::max(reach[first], last);
    }
  }
  std::vector<Range> rings;
  for (int64_t w = 0; w < p;) {
    int64_t end = reach[w] + 1;
    for (int64_t x = w; x < end; ++x) end = std::max(end, reach[x] + 1);
    rings.push_back(Range{w, end});
    w = end;
  }
  return rings;
}

}  // namespace

ShardKind ChooseShardKind(const AttentionSpec& spec) {
  return spec.causal && spec.dilated.empty() ? ShardKind::kZigzag
                                             : ShardKind::kContiguous;
}

absl::Status CheckRank(int64_t rank, int64_t world_size) {
  if (world_size >= 1 && rank >= 0 && rank < world_size) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, " is not a rank of a world of size ",
                   world_size, ": need 0 <= rank < world size"));
}

ShardLayout LayoutFor(const AttentionSpec& spec, int64_t seq_len,
                      int64_t workers) {
  return ShardLayout::Make(ChooseShardKind(spec), seq_len, workers);
}

ShardLayout QueryLayoutFor(const AttentionSpec& spec, int64_t workers) {
  if (spec.q_len * kShortQueryRatio <= spec.kv_len) {
    return ShardLayout::Make(ShardKind::kContiguous, spec.q_len, workers);
  }
  return LayoutFor(spec, spec.q_len, workers);
}

absl::StatusOr<ShardLayout> KvLayoutFor(
    const AttentionSpec& spec, int64_t workers,
    std::optional<ShardLayout> explicit_layout) {
  if (!explicit_layout.has_value()) {
    return LayoutFor(spec, spec.kv_len, workers);
  }
  if (explicit_layout->num_workers() != workers ||
      explicit_layout->seq_len() != spec.kv_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("the K/V layout covers ", explicit_layout->seq_len(),
                     " positions over ", explicit_layout->num_workers(),
                     " workers; the request has kv_len ", spec.kv_len, " and ",
                     workers, " workers"));
  }
  RINGATTN_RETURN_IF_ERROR(explicit_layout->Validate());
  return std::move(*explicit_layout);
}

RingPlan RingPlan::Build(const AttentionSpec& spec, const ShardLayout& q_layout,
                         const ShardLayout& kv_layout,
                         const BlockMask* blocks) {
  const int64_t p = q_layout.num_workers();
  RingPlan plan;
  plan.steps_.assign(static_cast<size_t>(p), {});
  plan.next_.assign(static_cast<size_t>(p), 0);
  plan.previous_.assign(static_cast<size_t>(p), 0);
  plan.num_steps_ = 1;
  for (const Range& ring : Rings(spec, kv_layout)) {
    const int64_t size = ring.size();
    auto member = [&](int64_t x) {
      return ring.begin + ((x % size) + size) % size;
    };
    // needed[owner - ring.begin][s]: the block of `owner` is computed on at
    // step s.
    std::vector<std::vector<bool>> needed(size, std::vector<bool>(size, false));
    for (int64_t i = ring.begin; i < ring.end; ++i) {
      plan.next_[i] = member(i - ring.begin + 1);
      plan.previous_[i] = member(i - ring.begin - 1);
      plan.steps_[i].resize(static_cast<size_t>(size));
      for (int64_t s = 0; s < size; ++s) {
        RingStep& step = plan.steps_[i][s];
        step.kv_owner = member(i - ring.begin - s);
        int64_t q_row = 0;
        for (const Range& q : q_layout.Chunks(i)) {
          int64_t k_row = 0;
          for (const Range& k : kv_layout.Chunks(step.kv_owner)) {
            AddTasks(spec, blocks, q, q_row, k, k_row, step.tasks);
            k_row += k.size();
          }
          q_row += q.size();
        }
        needed[step.kv_owner - ring.begin][s] = !step.tasks.empty();
      }
    }
    // A block is forwarded at step s iff a later step needs it; the ring runs
    // until the last step anybody needs.
    for (int64_t owner = 0; owner < size; ++owner) {
      int64_t last = -1;
      for (int64_t s = 0; s < size; ++s) {
        if (needed[owner][s]) last = s;
      }
      plan.num_steps_ = std::max(plan.num_steps_, last + 1);
      for (int64_t s = 0; s < last; ++s) {
        const int64_t holder = member(owner + s);
        plan.steps_[holder][s].send = true;
        plan.steps_[plan.next_[holder]][s].receive = true;
      }
    }
  }
  for (int64_t i = 0; i < p; ++i) {
    plan.steps_[i].resize(static_cast<size_t>(plan.num_steps_));
    // Steps past the end of a short ring hold nothing.
    for (RingStep& step : plan.steps_[i]) {
      if (step.tasks.empty() && !step.send && !step.receive) step.kv_owner = -1;
    }
  }
  return plan;
}

int64_t RingPlan::NumTransfers() const {
  int64_t transfers = 0;
  for (const auto& worker_steps : steps_) {
    for (const RingStep& step : worker_steps) transfers += step.send ? 1 : 0;
  }
  return transfers;
}

int64_t RingPlan::NumTasks() const {
  int64_t tasks = 0;
  for (const auto& worker_steps : steps_) {
    for (const RingStep& step : worker_steps) tasks += step.tasks.size();
  }
  return tasks;
}

std::vector<std::vector<AttentionTask>> RingPlan::TasksAgainstBlock(
    int64_t kv_owner) const {
  std::vector<std::vector<AttentionTask>> tasks(steps_.size());
  for (size_t worker = 0; worker < steps_.size(); ++worker) {
    for (const RingStep& step : steps_[worker]) {
      if (step.kv_owner != kv_owner) continue;
      tasks[worker].insert(tasks[worker].end(), step.tasks.begin(),
                           step.tasks.end());
    }
  }
  return tasks;
}

ShardLayout WorldOfOne(const ShardLayout& layout, int rank) {
  return ShardLayout::FromChunks(layout.seq_len(), {layout.Chunks(rank)});
}

}  // namespace ringattn
