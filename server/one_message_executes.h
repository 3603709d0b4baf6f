#ifndef RINGATTN_SERVER_ONE_MESSAGE_EXECUTES_H_
#define RINGATTN_SERVER_ONE_MESSAGE_EXECUTES_H_

// OneMessageExecutes: the Execute streams of a small request, each sent as
// its one message (header, rows and 'run'), whose responses the calling
// thread reads itself through one completion queue: no reader thread per
// worker and no hand-over between threads on the way back (a decode step's
// latency). Not thread-safe: one thread starts the streams and takes their
// events.

#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "ringattn/v1/worker.grpc.pb.h"

namespace ringattn {

// What a worker's Execute stream delivers to its call: a response, or (with
// none) the end of the stream and its status.
struct WorkerEvent {
  int rank = 0;
  std::optional<v1::ExecuteResponse> response;
  grpc::Status status;
};

class OneMessageExecutes {
 public:
  OneMessageExecutes() = default;
  // Waits for the operations gRPC still holds (cancel the streams' contexts
  // first to cut them short); the contexts must outlive this.
  ~OneMessageExecutes();

  OneMessageExecutes(const OneMessageExecutes&) = delete;
  OneMessageExecutes& operator=(const OneMessageExecutes&) = delete;

  // Opens worker `rank`'s stream on `context` (deadline set, metadata
  // corked) and sends `request` as its last message.
  void Start(v1::Worker::Stub& stub, grpc::ClientContext* context, int rank,
             const v1::ExecuteRequest& request);

  // The next event of any stream, or none once `timeout` passed without one.
  std::optional<WorkerEvent> Next(absl::Duration timeout);

 private:
  enum class Op { kWrite, kRead, kFinish };
  struct Link {
    int rank = 0;
    std::unique_ptr<
        grpc::ClientAsyncReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>>
        stream;
    v1::ExecuteResponse response;
    grpc::Status status;
  };
  void* Tag(size_t link, Op op);

  grpc::CompletionQueue queue_;
  std::vector<std::unique_ptr<Link>> links_;
  int pending_ = 0;  // operations whose tags the queue has yet to return
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_ONE_MESSAGE_EXECUTES_H_
