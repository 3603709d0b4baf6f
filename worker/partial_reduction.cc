#include "worker/partial_reduction.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cpu/merge_with_lse.h"

namespace ringattn {
namespace {

// Moves one buffer to or from `peer` and waits for it, at most the step
// timeout. On failure the communicator is aborted with nothing in flight.
absl::Status Transfer(RingCommunicator& communicator, bool send, void* data,
                      int64_t bytes, int peer, const RingOptions& options,
                      ReductionStats& stats) {
  if (options.cancelled != nullptr && options.cancelled->load()) {
    AbortRing(communicator, /*in_flight=*/false);
    return absl::CancelledError("the request was cancelled");
  }
  absl::Status status = send ? communicator.StartSend(data, bytes, peer)
                             : communicator.StartReceive(data, bytes, peer);
  if (!status.ok()) {
    AbortRing(communicator, /*in_flight=*/false);
    return status;
  }
  const absl::Time start = absl::Now();
  status = communicator.Wait(
      std::min(options.deadline, start + options.step_timeout));
  stats.wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) {
    AbortRing(communicator, /*in_flight=*/true);
    return absl::Status(status.code(),
                        absl::StrCat("reducing broadcast-Q partials, ",
                                     send ? "sending to" : "receiving from",
                                     " rank ", peer, ": ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReductionStats> ReduceToRankZero(RingCommunicator& communicator,
                                                PartialBuffers& partials,
                                                const RingOptions& options) {
  const int rank = communicator.rank();
  const int world_size = communicator.world_size();
  ReductionStats stats;
  for (int step = 1; step < world_size; step *= 2) {
    ++stats.rounds;
    if (rank % (2 * step) != 0) {
      // This rank's lowest set bit: hand the partial down and leave.
      const int to = rank - step;
      for (const auto& [data, bytes] :
           {std::pair{partials.o(), partials.o_bytes()},
            std::pair{partials.lse(), partials.lse_bytes()}}) {
        absl::Status sent = Transfer(communicator, /*send=*/true, data, bytes,
                                     to, options, stats);
        if (!sent.ok()) return sent;
        stats.bytes_sent += bytes;
      }
      ++stats.transfers;
      return stats;
    }
    const int from = rank + step;
    if (from >= world_size) continue;
    if (absl::Status room = partials.MakeReceiveRoom(); !room.ok()) {
      AbortRing(communicator, /*in_flight=*/false);
      return room;
    }
    for (const auto& [data, bytes] :
         {std::pair{partials.received_o(), partials.o_bytes()},
          std::pair{partials.received_lse(), partials.lse_bytes()}}) {
      absl::Status received = Transfer(communicator, /*send=*/false, data,
                                       bytes, from, options, stats);
      if (!received.ok()) return received;
    }
    if (absl::Status merged = partials.MergeReceived(); !merged.ok()) {
      AbortRing(communicator, /*in_flight=*/false);
      return merged;
    }
  }
  return stats;
}

int64_t PartialReductionScratchBytes(const AttentionSpec& spec) {
  return spec.batch * spec.q_len * spec.q_heads * (spec.head_dim + 1) *
         static_cast<int64_t>(sizeof(float));
}

HostPartials::HostPartials(View<float> o, View<float> lse) : o_(o), lse_(lse) {}

absl::Status HostPartials::MakeReceiveRoom() {
  if (received_o_.values().empty()) {
    received_o_ = Tensor<float>(o_.shape());
    received_lse_ = Tensor<float>(lse_.shape());
  }
  return absl::OkStatus();
}

int64_t HostPartials::o_bytes() const {
  return o_.shape().NumElements() * static_cast<int64_t>(sizeof(float));
}

int64_t HostPartials::lse_bytes() const {
  return lse_.shape().NumElements() * static_cast<int64_t>(sizeof(float));
}

absl::Status HostPartials::MergeReceived() {
  MergeWithLse(o_, lse_, received_o_.view(), received_lse_.view());
  return absl::OkStatus();
}

}  // namespace ringattn
