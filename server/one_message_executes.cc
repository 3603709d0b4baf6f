#include "server/one_message_executes.h"

#include <chrono>
#include <cstdint>
#include <utility>

namespace ringattn {

OneMessageExecutes::~OneMessageExecutes() {
  void* tag;
  bool ok;
  while (pending_ > 0 && queue_.Next(&tag, &ok)) --pending_;
  queue_.Shutdown();
  while (queue_.Next(&tag, &ok)) {
  }
}

void* OneMessageExecutes::Tag(size_t link, Op op) {
  return reinterpret_cast<void*>(
      static_cast<uintptr_t>(link * 3 + static_cast<size_t>(op)));
}

void OneMessageExecutes::Start(v1::Worker::Stub& stub,
                               grpc::ClientContext* context, int rank,
                               const v1::ExecuteRequest& request) {
  const size_t index = links_.size();
  auto link = std::make_unique<Link>();
  link->rank = rank;
  link->stream = stub.PrepareAsyncExecute(context, &queue_);
  // With the metadata corked, StartCall sends nothing and returns no tag:
  // the metadata goes out with the message.
  link->stream->StartCall(nullptr);
  link->stream->Write(request, grpc::WriteOptions().set_last_message(),
                      Tag(index, Op::kWrite));
  link->stream->Read(&link->response, Tag(index, Op::kRead));
  pending_ += 2;
  links_.push_back(std::move(link));
}

std::optional<WorkerEvent> OneMessageExecutes::Next(absl::Duration timeout) {
  const std::chrono::system_clock::time_point deadline =
      std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout);
  for (;;) {
    void* tag;
    bool ok;
    if (queue_.AsyncNext(&tag, &ok, deadline) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return std::nullopt;
    }
    --pending_;
    const uintptr_t value = reinterpret_cast<uintptr_t>(tag);
    Link& link = *links_[value / 3];
    switch (static_cast<Op>(value % 3)) {
      case Op::kWrite:
        // A failed write shows as the stream's status.
        continue;
      case Op::kRead:
        if (!ok) {
          link.stream->Finish(&link.status, Tag(value / 3, Op::kFinish));
          ++pending_;
          continue;
        }
        {
          WorkerEvent event{link.rank, std::move(link.response),
                            grpc::Status::OK};
          link.response.Clear();
          // The message with 'done' is the stream's last: its status came
          // with it, so Finish takes it without a read that finds the end.
          if (event.response->has_done()) {
            link.stream->Finish(&link.status, Tag(value / 3, Op::kFinish));
          } else {
            link.stream->Read(&link.response, Tag(value / 3, Op::kRead));
          }
          ++pending_;
          return event;
        }
      case Op::kFinish:
        return WorkerEvent{link.rank, std::nullopt, link.status};
    }
  }
}

}  // namespace ringattn
