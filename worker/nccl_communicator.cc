#include "worker/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/cancellable_store.h"

namespace ringattn {
namespace {

// How long a healthy communicator may take to finalize before it is aborted.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

// Paces a polling loop: yields for the first milliseconds, so that a transfer
// that ends soon is seen within microseconds (a 20 us sleep lasts about 70 us
// with Linux's default timer slack), then sleeps a little, then longer, so
// that a long wait costs little CPU.
class Poller {
 public:
  void Pause() {
    const absl::Duration waited = absl::Now() - start_;
    if (waited < kSpinning) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(waited < kShortSleeping
                                    ? std::chrono::microseconds(20)
                                    : std::chrono::microseconds(200));
  }

 private:
  static constexpr absl::Duration kSpinning = absl::Milliseconds(2);
  static constexpr absl::Duration kShortSleeping = absl::Milliseconds(50);
  const absl::Time start_ = absl::Now();
};

std::string NcclWords(ncclResult_t result, ncclComm_t comm) {
  std::string words = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&words, ": ", last);
  return words;
}

// Polls the communicator's asynchronous state until it is no longer
// ncclInProgress, `deadline` passes or `*cancelled` (null: never) turns true;
// returns the last state seen (ncclInProgress on timeout or cancel) or the
// failure of the query itself.
ncclResult_t PollAsyncState(ncclComm_t comm, absl::Time deadline,
                            const std::atomic<bool>* cancelled = nullptr) {
  Poller poller;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) return queried;
    if (state != ncclInProgress || absl::Now() >= deadline ||
        Raised(cancelled)) {
      return state;
    }
    poller.Pause();
  }
}

}  // namespace

void DisableNcclMulticast() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

absl::StatusOr<ncclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("ncclGetUniqueId: ", NcclWords(result, nullptr)));
  }
  return id;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const ncclUniqueId& id, int rank, int world_size, int device,
    absl::Duration timeout, const std::atomic<bool>* cancelled) {
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  RINGATTN_RETURN_IF_ERROR(UseCudaDevice(device));
  absl::StatusOr<CudaStream> stream =
      CudaStream::Create(/*high_priority=*/true);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<CudaEvent> done = CudaEvent::Create(/*timing=*/false);
  if (!done.ok()) return done.status();

  const absl::Time deadline = absl::Now() + timeout;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclUniqueId id_copy = id;
  const ncclResult_t started =
      ncclCommInitRankConfig(&comm, world_size, id_copy, rank, &config);
  const std::string who =
      absl::StrCat("rank ", rank, " of ", world_size, " on cuda:", device);
  if (started != ncclSuccess && started != ncclInProgress) {
    const std::string words = NcclWords(started, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(
        absl::StrCat(who, ": cannot start the NCCL communicator: ", words));
  }
  const ncclResult_t state = PollAsyncState(comm, deadline, cancelled);
  if (state == ncclInProgress && Raised(cancelled)) {
    ncclCommAbort(comm);
    return absl::CancelledError(
        absl::StrCat(who, ": cancelled while the NCCL communicator came up"));
  }
  if (state == ncclInProgress) {
    ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat(
        who, ": the NCCL communicator did not come up within ",
        absl::FormatDuration(timeout),
        " (some rank of the group never joined or cannot be reached)"));
  }
  if (state != ncclSuccess) {
    const std::string words = NcclWords(state, comm);
    ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat(
        who, ": the NCCL communicator failed to come up: ", words));
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      rank, world_size, device, comm, *std::move(stream), *std::move(done)));
}

NcclCommunicator::NcclCommunicator(int rank, int world_size, int device,
                                   ncclComm_t comm, CudaStream stream,
                                   CudaEvent done)
    : rank_(rank),
      world_size_(world_size),
      device_(device),
      comm_(comm),
      stream_(std::move(stream)),
      done_(std::move(done)) {}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  const bool idle = send_data_ == nullptr && receive_data_ == nullptr;
  if (cudaSetDevice(device_) == cudaSuccess && !broken_ && !abort_requested_ &&
      idle && Finalize()) {
    ncclCommDestroy(comm_);
    return;
  }
  ncclCommAbort(comm_);
  cudaStreamSynchronize(stream_.get());
}

bool NcclCommunicator::Finalize() {
  const ncclResult_t started = ncclCommFinalize(comm_);
  if (started != ncclSuccess && started != ncclInProgress) return false;
  return PollAsyncState(comm_, absl::Now() + kFinalizeTimeout) == ncclSuccess;
}

std::string NcclCommunicator::Describe() const {
  std::string text = absl::StrCat("rank ", rank_, " of ", world_size_);
  if (receive_data_ != nullptr && send_data_ != nullptr) {
    absl::StrAppend(&text, " (receiving from rank ", receive_peer_,
                    ", sending to rank ", send_peer_, ")");
  } else if (receive_data_ != nullptr) {
    absl::StrAppend(&text, " (receiving from rank ", receive_peer_, ")");
  } else if (send_data_ != nullptr) {
    absl::StrAppend(&text, " (sending to rank ", send_peer_, ")");
  }
  return text;
}

absl::Status NcclCommunicator::CheckTransfer(int64_t bytes, int peer,
                                             bool in_flight) const {
  if (broken_ || comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     ": the NCCL communicator is broken by an earlier "
                     "failure"));
  }
  if (abort_requested_) {
    return absl::CancelledError(
        absl::StrCat("rank ", rank_, ": the NCCL communicator was aborted"));
  }
  if (bytes <= 0 || peer < 0 || peer >= world_size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, " of ", world_size_, ": a transfer of ",
                     bytes, " bytes with rank ", peer, " is malformed"));
  }
  if (in_flight || issued_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     ": a transfer of this kind is already in flight; "
                     "Wait first"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::StartSend(const void* data, int64_t bytes,
                                         int peer) {
  RINGATTN_RETURN_IF_ERROR(CheckTransfer(bytes, peer, send_data_ != nullptr));
  if (data == nullptr) {
    return absl::InvalidArgumentError("StartSend: data is null");
  }
  send_data_ = data;
  send_bytes_ = bytes;
  send_peer_ = peer;
  return receive_data_ != nullptr ? Issue() : absl::OkStatus();
}

absl::Status NcclCommunicator::StartReceive(void* data, int64_t bytes,
                                            int peer) {
  RINGATTN_RETURN_IF_ERROR(
      CheckTransfer(bytes, peer, receive_data_ != nullptr));
  if (data == nullptr) {
    return absl::InvalidArgumentError("StartReceive: data is null");
  }
  receive_data_ = data;
  receive_bytes_ = bytes;
  receive_peer_ = peer;
  return send_data_ != nullptr ? Issue() : absl::OkStatus();
}

absl::Status NcclCommunicator::Issue() {
  if (issued_) return absl::OkStatus();
  if (absl::Status s = UseCudaDevice(device_); !s.ok()) return Break(s);
  // Every call below returns ncclInProgress rather than blocking; Wait polls
  // until NCCL has put the group on the stream.
  ncclResult_t result = ncclGroupStart();
  if (result == ncclSuccess && receive_data_ != nullptr) {
    result = ncclRecv(receive_data_, static_cast<size_t>(receive_bytes_),
                      ncclUint8, receive_peer_, comm_, stream_.get());
  }
  if ((result == ncclSuccess || result == ncclInProgress) &&
      send_data_ != nullptr) {
    result = ncclSend(send_data_, static_cast<size_t>(send_bytes_), ncclUint8,
                      send_peer_, comm_, stream_.get());
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (result == ncclSuccess || result == ncclInProgress) result = ended;
  if (result != ncclSuccess && result != ncclInProgress) {
    return Break(absl::UnavailableError(
        absl::StrCat("issuing the transfers: ", NcclWords(result, comm_))));
  }
  issued_ = true;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitUntilIssued(absl::Time deadline) {
  Poller poller;
  while (true) {
    if (abort_requested_) {
      return Break(
          absl::CancelledError("aborted while the transfers were "
                               "being issued"));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess) state = queried;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      return Break(absl::UnavailableError(
          absl::StrCat("NCCL failed: ", NcclWords(state, comm_))));
    }
    if (absl::Now() >= deadline) {
      return Break(absl::DeadlineExceededError(
          "NCCL did not finish issuing the transfers by the deadline (the "
          "peer never joined them)"));
    }
    poller.Pause();
  }
  return CudaStatus(cudaEventRecord(done_.get(), stream_.get()),
                    "recording the transfers' completion");
}

absl::Status NcclCommunicator::Wait(absl::Time deadline) {
  if (broken_ || comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     ": the NCCL communicator is broken by an earlier "
                     "failure"));
  }
  if (send_data_ == nullptr && receive_data_ == nullptr) {
    return abort_requested_ ? Break(absl::CancelledError("aborted"))
                            : absl::OkStatus();
  }
  if (absl::Status s = UseCudaDevice(device_); !s.ok()) return Break(s);
  RINGATTN_RETURN_IF_ERROR(Issue());
  if (absl::Status s = WaitUntilIssued(deadline); !s.ok()) {
    return broken_ ? s : Break(s);
  }
  Poller poller;
  while (true) {
    if (abort_requested_) {
      return Break(
          absl::CancelledError("aborted while transfers were in "
                               "flight"));
    }
    const cudaError_t done = cudaEventQuery(done_.get());
    if (done == cudaSuccess) break;
    if (done != cudaErrorNotReady) {
      return Break(CudaStatus(done, "waiting for the transfers"));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t failure = queried != ncclSuccess ? queried : state;
      return Break(absl::UnavailableError(
          absl::StrCat("NCCL reported a failure (a peer failed or went away): ",
                       NcclWords(failure, comm_))));
    }
    if (absl::Now() >= deadline) {
      return Break(absl::DeadlineExceededError(
          "the transfers did not complete by the deadline (a peer stalled or "
          "went away)"));
    }
    poller.Pause();
  }
  send_data_ = nullptr;
  receive_data_ = nullptr;
  issued_ = false;
  return absl::OkStatus();
}

void NcclCommunicator::Abort() { abort_requested_ = true; }

absl::Status NcclCommunicator::Break(absl::Status status) {
  const std::string who = Describe();
  if (comm_ != nullptr) {
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    // The aborted kernels exit; after this nothing touches caller memory.
    cudaStreamSynchronize(stream_.get());
  }
  broken_ = true;
  send_data_ = nullptr;
  receive_data_ = nullptr;
  issued_ = false;
  return absl::Status(status.code(), absl::StrCat(who, ": ", status.message()));
}

NcclConnector::NcclConnector(gloo::rendezvous::Store& store, int device)
    : store_(store), device_(device) {}

absl::StatusOr<std::unique_ptr<RingCommunicator>> NcclConnector::Connect(
    const std::string& group, int rank, int world_size, absl::Duration timeout,
    const std::atomic<bool>* cancelled) {
  RINGATTN_RETURN_IF_ERROR(CheckRank(rank, world_size));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string key = absl::StrCat(group, "/nccl-unique-id");
  ncclUniqueId id;
  if (rank == 0) {
    absl::StatusOr<ncclUniqueId> fresh = NewNcclUniqueId();
    if (!fresh.ok()) return fresh.status();
    id = *fresh;
    const char* bytes = reinterpret_cast<const char*>(&id);
    try {
      store_.set(key, std::vector<char>(bytes, bytes + sizeof(id)));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("rank 0 could not publish the NCCL unique id under ",
                       key, ": ", e.what()));
    }
  } else {
    std::vector<char> bytes;
    try {
      CancellableStore store(store_, cancelled);
      store.wait({key}, absl::ToChronoMilliseconds(timeout));
      bytes = store_.get(key);
    } catch (const std::exception& e) {
      if (Raised(cancelled)) {
        return absl::CancelledError(
            absl::StrCat("rank ", rank, " of ", world_size,
                         " was cancelled while waiting for the NCCL unique id "
                         "under ",
                         key));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, " of ", world_size,
          " got no NCCL unique id from rank "
          "0 under ",
          key, " within ", absl::FormatDuration(timeout), ": ", e.what()));
    }
    if (bytes.size() != sizeof(id)) {
      return absl::UnavailableError(absl::StrCat("the NCCL unique id under ",
                                                 key, " has ", bytes.size(),
                                                 " bytes, not ", sizeof(id)));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
      NcclCommunicator::Create(
          id, rank, world_size, device_,
          std::max(deadline - absl::Now(), absl::ZeroDuration()), cancelled);
  if (!communicator.ok()) return communicator.status();
  return std::unique_ptr<RingCommunicator>(*std::move(communicator));
}

}  // namespace ringattn
