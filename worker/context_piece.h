#ifndef RINGATTN_WORKER_CONTEXT_PIECE_H_
#define RINGATTN_WORKER_CONTEXT_PIECE_H_

// ContextPiece: this worker's piece of an upload to a resident context as it
// arrives: a StoreContextHeader (perhaps carrying rows), then K and V rows,
// then Commit, which stores the piece only if every row is there, so a failed
// upload leaves the context as it was. Used by StoreContext streams (whose
// AttachRows streams place rows through intake() at the same time), and by
// Execute streams whose query appends the rows it attends to (a decode step).
// Neither copyable nor movable (its row targets point into it);
// thread-compatible, except that intake() is thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/range.h"
#include "core/shard_layout.h"
#include "core/typed_tensor.h"
#include "ringattn/v1/worker.pb.h"
#include "worker/background_page_faults.h"
#include "worker/resident_contexts.h"
#include "worker/shard_intake.h"

namespace ringattn {

class ContextPiece {
 public:
  ContextPiece() = default;
  // A piece whose rows are page-locked for CUDA device `device` as its pages
  // fault in, if K and V take at most `most_pinned_bytes`, so that storing it
  // on that device runs as DMA (PinnedHostRegions).
  ContextPiece(int device, int64_t most_pinned_bytes)
      : pin_device_(device), most_pinned_bytes_(most_pinned_bytes) {}
  // Closes intake(): streams that still hold it are refused from then on, and
  // those placing rows are waited for, since the rows' targets point into this.
  ~ContextPiece();
  ContextPiece(const ContextPiece&) = delete;
  ContextPiece& operator=(const ContextPiece&) = delete;

  // Checks `header` and places the rows it carries. INVALID_ARGUMENT for a
  // second header, a bad one or bad rows.
  absl::Status Start(const v1::StoreContextHeader& header);
  // Places K or V rows; INVALID_ARGUMENT before the header or for bad rows.
  absl::Status Place(const v1::ShardRows& rows);
  // Refuses further rows, waits for those being placed, and stores the piece
  // in `contexts` (AddUnlessUndone) if every row arrived; returns the bytes
  // the context then holds here. INVALID_ARGUMENT naming what is missing, or
  // the store's error.
  absl::StatusOr<int64_t> Commit(ResidentContexts& contexts);

  bool started() const { return started_; }
  const std::string& name() const { return header_.name(); }
  bool create() const { return header_.create(); }
  Range positions() const { return positions_; }
  // Where rows of the started piece land, for other streams too.
  const std::shared_ptr<ShardIntake>& intake() const { return intake_; }

 private:
  const int pin_device_ = -1;
  const int64_t most_pinned_bytes_ = 0;
  bool started_ = false;
  v1::StoreContextHeader header_;  // without its rows
  DType dtype_ = DType::kFloat32;
  Range positions_;
  ShardLayout layout_;
  TypedTensor k_;
  TypedTensor v_;
  std::shared_ptr<ShardIntake> intake_;
  // Faults in the pages of a large piece ahead of its rows.
  std::optional<BackgroundPageFaults> page_faults_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_CONTEXT_PIECE_H_
