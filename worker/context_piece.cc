#include "worker/context_piece.h"

#include <array>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention_spec.h"
#include "core/status_macros.h"
#include "proto/spec_conversion.h"
#include "spdlog/spdlog.h"
#include "worker/pinned_host_regions.h"

namespace ringattn {

ContextPiece::~ContextPiece() {
  if (intake_ != nullptr) intake_->Close();
}

absl::Status ContextPiece::Start(const v1::StoreContextHeader& header) {
  if (started_) return absl::InvalidArgumentError("a second header arrived");
  if (header.name().empty() || header.batch() < 1 || header.kv_heads() < 1 ||
      header.head_dim() < 1 || header.head_dim() > kMaxHeadDim ||
      header.first_position() < 0 || header.count() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context header needs a name, batch/kv_heads >= 1, head_dim in [1, ",
        kMaxHeadDim, "] and a non-negative position range"));
  }
  absl::StatusOr<DType> dtype = DTypeFromProto(header.wire_dtype());
  if (!dtype.ok()) return dtype.status();
  dtype_ = *dtype;
  header_ = header;
  header_.clear_rows();  // placed into k_ and v_ below
  started_ = true;
  positions_ =
      Range{header.first_position(), header.first_position() + header.count()};
  layout_ = ShardLayout::FromChunks(positions_.end, {{positions_}});
  const Shape shape{header.batch(), header.count(), header.kv_heads(),
                    header.head_dim()};
  k_ = TypedTensor(dtype_, shape);
  v_ = TypedTensor(dtype_, shape);
  intake_ = std::make_shared<ShardIntake>(
      std::array<ShardRowsTarget, 3>{
          ShardRowsTarget(), ShardRowsTarget("K", k_.view(), &layout_, 0),
          ShardRowsTarget("V", v_.view(), &layout_, 0)},
      dtype_);
  const int64_t bytes = 2 * k_.view().bytes();
  if (bytes >= kBackgroundPageFaultBytes) {
    BackgroundPageFaults::Then pin;
    if (pin_device_ >= 0 && bytes <= most_pinned_bytes_) {
      // Each tensor unlocks its pages before it frees them.
      auto k_pins = std::make_shared<PinnedHostRegions>(pin_device_);
      auto v_pins = std::make_shared<PinnedHostRegions>(pin_device_);
      k_.ReleaseBeforeFree(k_pins);
      v_.ReleaseBeforeFree(v_pins);
      pin = [k = k_.view().data(), k_pins, v_pins](absl::Span<char> region) {
        PinnedHostRegions& pins = region.data() == k ? *k_pins : *v_pins;
        if (absl::Status status = pins.Pin(region); !status.ok()) {
          spdlog::debug("context piece stays pageable: {}", status.ToString());
        }
      };
    }
    page_faults_.emplace(
        std::vector<absl::Span<char>>{
            {k_.view().data(), static_cast<size_t>(k_.view().bytes())},
            {v_.view().data(), static_cast<size_t>(v_.view().bytes())}},
        std::move(pin));
  }
  for (const v1::ShardRows& rows : header.rows()) {
    RINGATTN_RETURN_IF_ERROR(Place(rows));
  }
  return absl::OkStatus();
}

absl::Status ContextPiece::Place(const v1::ShardRows& rows) {
  if (!started_) {
    return absl::InvalidArgumentError(
        "rows before the header: send the header first");
  }
  // The intake refuses rows of any tensor but K and V.
  return intake_->Place(rows).status();
}

absl::StatusOr<int64_t> ContextPiece::Commit(ResidentContexts& contexts) {
  page_faults_.reset();
  if (!started_) {
    return absl::InvalidArgumentError("the stream ended before the header");
  }
  intake_->Close();
  RINGATTN_RETURN_IF_ERROR(intake_->CheckComplete());
  return contexts.AddUnlessUndone(
      header_.name(), header_.create(),
      ResidentContexts::Layout{header_.batch(), header_.kv_heads(),
                               header_.head_dim()},
      positions_, std::move(k_), std::move(v_), header_.undone_appends());
}

}  // namespace ringattn
