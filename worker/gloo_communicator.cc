#include "worker/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/barrier.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "worker/cancellable_store.h"
#include "worker/forwarding_store.h"

namespace ringattn {
namespace {

// The time left until `deadline` in whole milliseconds, rounded up, clamped to
// [0, 24 h] (Gloo adds it to steady_clock::now(), which must not overflow).
std::chrono::milliseconds Remaining(absl::Time deadline) {
  const absl::Duration left =
      std::clamp(deadline - absl::Now(), absl::ZeroDuration(), absl::Hours(24));
  return absl::ToChronoMilliseconds(absl::Ceil(left, absl::Milliseconds(1)));
}

// Forwards to another store and remembers the keys of a wait that failed, so
// that a rendezvous timeout can name the ranks that never showed up (Gloo's
// full-mesh rendezvous keys are the ranks themselves).
class WaitRecordingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  using ForwardingStore::wait;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    try {
      inner().wait(keys, timeout);
    } catch (...) {
      failed_keys_ = keys;
      throw;
    }
  }

  const std::vector<std::string>& failed_keys() const { return failed_keys_; }

 private:
  std::vector<std::string> failed_keys_;
};

// "rank 2" or "ranks 2, 3" for rendezvous keys that are ranks; the keys
// themselves otherwise.
std::string DescribeMissing(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    int rank = 0;
    if (!absl::SimpleAtoi(key, &rank)) {
      return absl::StrCat("rendezvous keys ", absl::StrJoin(keys, ", "));
    }
  }
  return absl::StrCat(keys.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(keys, ", "));
}

// Gloo's TCP transport writes with write(2)/writev(2), which raise SIGPIPE
// when the peer has closed its end, and SIGPIPE's default action ends the
// process: one crashed rank would take down every rank sending to it. With
// the signal ignored, the write fails with EPIPE, Gloo throws, and the ring
// reports the lost peer. A handler the program installed itself is kept.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (current.sa_handler != SIG_DFL) return;
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::transport::Device>> CreateGlooTcpDevice(
    const std::string& hostname, const std::string& interface) {
  IgnoreSigpipeUnlessHandled();
  gloo::transport::tcp::attr attr;
  if (interface.empty()) {
    attr.hostname = hostname;
  } else {
    attr.iface = interface;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create a Gloo TCP device on ",
        interface.empty() ? absl::StrCat("host '", hostname, "'")
                          : absl::StrCat("interface '", interface, "'"),
        ": ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    gloo::rendezvous::Store& store, const std::string& prefix, int rank,
    int world_size, std::shared_ptr<gloo::transport::Device> device,
    absl::Duration timeout, const std::atomic<bool>* cancelled) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " of world size ", world_size,
        " is not a rank of the group: need 0 <= rank < world size"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ring timeout must be positive, got ",
                     absl::FormatDuration(timeout)));
  }
  if (device == nullptr) {
    return absl::InvalidArgumentError("no Gloo device to connect through");
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
  context->setTimeout(absl::ToChronoMilliseconds(timeout));
  gloo::rendezvous::PrefixStore prefixed(prefix, store);
  CancellableStore cancellable(prefixed, cancelled);
  WaitRecordingStore recording(cancellable);
  const absl::Time start = absl::Now();
  try {
    context->connectFullMesh(recording, device);
    // Nobody starts (and so nobody can finish and close its connections) until
    // every rank has connected: a fast rank tearing down would otherwise break
    // a slower rank's connect.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(absl::ToChronoMilliseconds(timeout));
    gloo::barrier(barrier);
  } catch (const std::exception& e) {
    const std::string where = absl::StrCat("rank ", rank, " of ", world_size,
                                           " in group '", prefix, "'");
    if (Raised(cancelled)) {
      return absl::CancelledError(
          absl::StrCat(where, ": cancelled while connecting (", e.what(), ")"));
    }
    if (!recording.failed_keys().empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": ", DescribeMissing(recording.failed_keys()),
                       " did not join within ", absl::FormatDuration(timeout),
                       " (", e.what(), ")"));
    }
    if (absl::Now() - start >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": connecting to the other ranks took longer than ",
          absl::FormatDuration(timeout), " (", e.what(), ")"));
    }
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot connect to the other ranks: ", e.what()));
  }
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(context)));
}

GlooCommunicator::GlooCommunicator(
    std::shared_ptr<gloo::rendezvous::Context> context)
    : rank_(context->rank),
      world_size_(context->size),
      context_(std::move(context)),
      sends_to_(static_cast<size_t>(world_size_), 0),
      receives_from_(static_cast<size_t>(world_size_), 0) {}

GlooCommunicator::~GlooCommunicator() {
  bool in_flight = false;
  {
    absl::MutexLock lock(&mutex_);
    in_flight = send_ != nullptr || receive_ != nullptr;
  }
  if (in_flight) Break(absl::CancelledError("destroyed")).IgnoreError();
}

absl::Status GlooCommunicator::CheckTransfer(int64_t bytes, int peer,
                                             bool in_flight) const {
  if (broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the communicator of rank ", rank(), " failed earlier"));
  }
  {
    absl::MutexLock lock(&mutex_);
    if (aborted_) {
      return absl::CancelledError(
          absl::StrCat("the ring of rank ", rank(), " was aborted"));
    }
  }
  if (in_flight) {
    return absl::FailedPreconditionError(
        "a transfer of that direction is already in flight");
  }
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transfer needs a positive byte count, got ", bytes));
  }
  if (peer < 0 || peer >= world_size() || peer == rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank(), " cannot transfer with rank ", peer,
                     " in a group of ", world_size()));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::StartSend(const void* data, int64_t bytes,
                                         int peer) {
  bool in_flight = false;
  {
    absl::MutexLock lock(&mutex_);
    in_flight = send_ != nullptr;
  }
  absl::Status status = CheckTransfer(bytes, peer, in_flight);
  if (!status.ok()) return Break(std::move(status));
  try {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer =
        context_->createUnboundBuffer(const_cast<void*>(data),
                                      static_cast<size_t>(bytes));
    buffer->send(peer, sends_to_[peer]++);
    send_peer_ = peer;
    absl::MutexLock lock(&mutex_);
    send_ = std::move(buffer);
  } catch (const std::exception& e) {
    return Break(absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " cannot send to rank ", peer, ": ", e.what())));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::StartReceive(void* data, int64_t bytes,
                                            int peer) {
  bool in_flight = false;
  {
    absl::MutexLock lock(&mutex_);
    in_flight = receive_ != nullptr;
  }
  absl::Status status = CheckTransfer(bytes, peer, in_flight);
  if (!status.ok()) return Break(std::move(status));
  try {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer =
        context_->createUnboundBuffer(data, static_cast<size_t>(bytes));
    buffer->recv(peer, receives_from_[peer]++);
    receive_peer_ = peer;
    absl::MutexLock lock(&mutex_);
    receive_ = std::move(buffer);
  } catch (const std::exception& e) {
    return Break(absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " cannot receive from rank ", peer, ": ", e.what())));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Wait(absl::Time deadline) {
  if (broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the communicator of rank ", rank(), " failed earlier"));
  }
  bool aborted = false;
  gloo::transport::UnboundBuffer* send = nullptr;
  gloo::transport::UnboundBuffer* receive = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    aborted = aborted_;
    send = send_.get();
    receive = receive_.get();
  }
  if (aborted) {
    return Break(absl::CancelledError(
        absl::StrCat("the ring of rank ", rank(), " was aborted")));
  }
  // What is being waited for, for the error message.
  bool receiving = true;
  try {
    if (receive != nullptr && !receive->waitRecv(Remaining(deadline))) {
      return Break(absl::CancelledError(absl::StrCat(
          "the ring of rank ", rank(),
          " was aborted while receiving from rank ", receive_peer_)));
    }
    receiving = false;
    if (send != nullptr && !send->waitSend(Remaining(deadline))) {
      return Break(absl::CancelledError(
          absl::StrCat("the ring of rank ", rank(),
                       " was aborted while sending to rank ", send_peer_)));
    }
  } catch (const std::exception& e) {
    const int peer = receiving ? receive_peer_ : send_peer_;
    const char* what = receiving ? "receiving a block" : "sending a block";
    if (absl::Now() >= deadline) {
      return Break(absl::DeadlineExceededError(
          absl::StrCat("rank ", rank(), " timed out ", what,
                       receiving ? " from" : " to", " rank ", peer, ": rank ",
                       peer, " is stalled or gone (", e.what(), ")")));
    }
    return Break(absl::UnavailableError(
        absl::StrCat("rank ", rank(), " lost rank ", peer, " while ", what,
                     ": ", e.what())));
  }
  absl::MutexLock lock(&mutex_);
  send_.reset();
  receive_.reset();
  return absl::OkStatus();
}

void GlooCommunicator::Abort() {
  absl::MutexLock lock(&mutex_);
  aborted_ = true;
  if (send_ != nullptr) send_->abortWaitSend();
  if (receive_ != nullptr) receive_->abortWaitRecv();
}

absl::Status GlooCommunicator::Break(absl::Status status) {
  broken_ = true;
  std::unique_ptr<gloo::transport::UnboundBuffer> send;
  std::unique_ptr<gloo::transport::UnboundBuffer> receive;
  {
    absl::MutexLock lock(&mutex_);
    send = std::move(send_);
    receive = std::move(receive_);
  }
  // Destroying a buffer waits for Gloo's I/O thread to leave it and detaches
  // it from the transfers still pending, so caller memory is safe after this.
  send.reset();
  receive.reset();
  // Closes every connection gently (FIN, not RST: Gloo aborts the process of
  // a peer whose connection is reset before it accepted it), so that peers
  // waiting on this rank fail at once instead of at their timeout.
  context_.reset();
  return status;
}

GlooConnector::GlooConnector(gloo::rendezvous::Store& store,
                             std::shared_ptr<gloo::transport::Device> device)
    : store_(store), device_(std::move(device)) {}

absl::StatusOr<std::unique_ptr<RingCommunicator>> GlooConnector::Connect(
    const std::string& group, int rank, int world_size, absl::Duration timeout,
    const std::atomic<bool>* cancelled) {
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      GlooCommunicator::Connect(store_, group, rank, world_size, device_,
                                timeout, cancelled);
  if (!communicator.ok()) return communicator.status();
  return std::unique_ptr<RingCommunicator>(std::move(*communicator));
}

}  // namespace ringattn
