#ifndef RINGATTN_SERVER_WORKER_WRITER_H_
#define RINGATTN_SERVER_WORKER_WRITER_H_

// WorkerWriter: writes the ExecuteRequests of one call to one worker stream
// (Execute or AttachRows) on a thread of its own, so that the call reads the
// client's next chunk while the rows of the last are still being written, and
// the workers of a call, and a worker's streams, are written to in parallel. At
// most a fixed number of bytes wait in its queue; Push blocks beyond that,
// which passes the workers' pace back to the client. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "ringattn/v1/worker.pb.h"

namespace ringattn {

class WorkerWriter {
 public:
  // One blocking write to the stream; false once the stream is broken.
  using Write = std::function<bool(const v1::ExecuteRequest&)>;

  // Writes through `write`, whose stream must outlive the writer and see no
  // other writes until Flush has returned.
  WorkerWriter(Write write, int64_t max_queued_bytes);
  // Stops after the write in progress (cancel the call first to cut it
  // short); what is still queued is dropped.
  ~WorkerWriter();

  WorkerWriter(const WorkerWriter&) = delete;
  WorkerWriter& operator=(const WorkerWriter&) = delete;

  // Queues `request`, waiting while the queue is full. False once a write
  // has failed (the stream is broken: its Finish says why).
  bool Push(v1::ExecuteRequest request);

  // Waits until everything queued is written; false if a write failed.
  bool Flush();

 private:
  void Run();

  const Write write_;
  const int64_t max_queued_bytes_;
  absl::Mutex mutex_;
  struct Queued {
    v1::ExecuteRequest request;
    int64_t bytes = 0;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mutex_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  bool failed_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

// A WorkerWriter of `stream` (an Execute or AttachRows stream).
template <typename Stream>
std::unique_ptr<WorkerWriter> WriterOf(Stream* stream,
                                       int64_t max_queued_bytes) {
  return std::make_unique<WorkerWriter>(
      [stream](const v1::ExecuteRequest& request) {
        return stream->Write(request);
      },
      max_queued_bytes);
}

}  // namespace ringattn

#endif  // RINGATTN_SERVER_WORKER_WRITER_H_
