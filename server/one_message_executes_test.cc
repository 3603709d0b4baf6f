// OneMessageExecutes against fake workers over real gRPC: responses and the
// end of every stream reach the calling thread in order (the status a worker
// ends with even when asked for right after its done), a silent worker
// leaves Next empty-handed (so the call can look at its client) until its
// stream is cancelled, and an unreachable worker ends with UNAVAILABLE.

#include "server/one_message_executes.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Answers the one message of each stream with its rank as the output's batch
// and then a done message (and, failing after done, an error status), or
// (silent) waits until the stream is cancelled.
enum class Behaviour { kAnswers, kSilent, kFailsAfterDone };

class FakeWorker final : public v1::Worker::Service {
 public:
  explicit FakeWorker(Behaviour behaviour) : behaviour_(behaviour) {}

  grpc::Status Execute(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ExecuteResponse, v1::ExecuteRequest>* stream)
      override {
    v1::ExecuteRequest request;
    if (!stream->Read(&request)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no message");
    }
    if (behaviour_ == Behaviour::kSilent) {
      while (!context->IsCancelled()) {
        cancelled_.WaitForNotificationWithTimeout(absl::Milliseconds(10));
      }
      return grpc::Status::CANCELLED;
    }
    v1::ExecuteResponse output;
    output.mutable_output()->set_batch(request.header().rank());
    stream->Write(output);
    v1::ExecuteResponse done;
    done.mutable_done()->set_ring_steps(1);
    stream->Write(done);
    if (behaviour_ == Behaviour::kFailsAfterDone) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "lost after done");
    }
    return grpc::Status::OK;
  }

 private:
  const Behaviour behaviour_;
  absl::Notification cancelled_;  // never notified: a wait that wakes
};

class Server {
 public:
  explicit Server(Behaviour behaviour) : worker_(behaviour) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&worker_);
    server_ = builder.BuildAndStart();
    stub_ = v1::Worker::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  ~Server() { server_->Shutdown(); }
  v1::Worker::Stub& stub() { return *stub_; }

 private:
  FakeWorker worker_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

v1::ExecuteRequest Message(int rank) {
  v1::ExecuteRequest request;
  request.mutable_header()->set_rank(rank);
  request.mutable_header()->set_run(true);
  return request;
}

void Prepare(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  context.set_initial_metadata_corked(true);
}

TEST(OneMessageExecutes, DeliversEveryResponseThenTheEndOfEachStream) {
  Server server(Behaviour::kAnswers);
  grpc::ClientContext contexts[2];
  OneMessageExecutes executes;
  for (int rank = 0; rank < 2; ++rank) {
    Prepare(contexts[rank]);
    executes.Start(server.stub(), &contexts[rank], rank, Message(rank));
  }
  int outputs[2] = {0, 0}, dones[2] = {0, 0}, ends[2] = {0, 0};
  while (ends[0] + ends[1] < 2) {
    std::optional<WorkerEvent> event = executes.Next(absl::Seconds(30));
    ASSERT_TRUE(event.has_value());
    const int rank = event->rank;
    if (!event->response.has_value()) {
      EXPECT_TRUE(event->status.ok()) << event->status.error_message();
      EXPECT_EQ(outputs[rank] + dones[rank], 2) << "the end came first";
      ++ends[rank];
      continue;
    }
    if (event->response->has_output()) {
      EXPECT_EQ(event->response->output().batch(), rank);
      ++outputs[rank];
    }
    if (event->response->has_done()) ++dones[rank];
  }
  EXPECT_EQ(outputs[0] + outputs[1], 2);
  EXPECT_EQ(dones[0] + dones[1], 2);
}

// After a worker's done the call asks for the stream's status at once; that
// must still be the status the worker ended with.
TEST(OneMessageExecutes, StatusAfterDoneIsTheWorkers) {
  Server server(Behaviour::kFailsAfterDone);
  grpc::ClientContext context;
  Prepare(context);
  OneMessageExecutes executes;
  executes.Start(server.stub(), &context, 0, Message(0));
  bool done = false;
  for (;;) {
    std::optional<WorkerEvent> event = executes.Next(absl::Seconds(30));
    ASSERT_TRUE(event.has_value());
    if (event->response.has_value()) {
      done = done || event->response->has_done();
      continue;
    }
    EXPECT_TRUE(done) << "the end came before done";
    EXPECT_EQ(event->status.error_code(), grpc::StatusCode::DATA_LOSS);
    EXPECT_EQ(event->status.error_message(), "lost after done");
    break;
  }
}

TEST(OneMessageExecutes, SilentWorkerLeavesNextEmptyUntilItsStreamIsCancelled) {
  Server server(Behaviour::kSilent);
  grpc::ClientContext context;
  Prepare(context);
  OneMessageExecutes executes;
  executes.Start(server.stub(), &context, 0, Message(0));
  EXPECT_FALSE(executes.Next(absl::Milliseconds(50)).has_value());
  context.TryCancel();
  std::optional<WorkerEvent> event = executes.Next(absl::Seconds(30));
  ASSERT_TRUE(event.has_value());
  EXPECT_FALSE(event->response.has_value());
  EXPECT_EQ(event->status.error_code(), grpc::StatusCode::CANCELLED);
}

TEST(OneMessageExecutes, CancelledStreamsAreLetGoOfWithoutBeingRead) {
  Server server(Behaviour::kSilent);
  grpc::ClientContext context;
  Prepare(context);
  {
    OneMessageExecutes executes;
    executes.Start(server.stub(), &context, 0, Message(0));
    context.TryCancel();
  }  // the destructor waits for gRPC's operations, which end at once
}

TEST(OneMessageExecutes, UnreachableWorkerEndsWithUnavailable) {
  // The port of a worker that is gone.
  std::unique_ptr<v1::Worker::Stub> stub;
  {
    FakeWorker worker(Behaviour::kAnswers);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&worker);
    std::unique_ptr<grpc::Server> gone = builder.BuildAndStart();
    ASSERT_NE(gone, nullptr);
    gone->Shutdown();
    stub = v1::Worker::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  grpc::ClientContext context;
  Prepare(context);
  OneMessageExecutes executes;
  executes.Start(*stub, &context, 0, Message(0));
  std::optional<WorkerEvent> event = executes.Next(absl::Seconds(30));
  ASSERT_TRUE(event.has_value());
  EXPECT_FALSE(event->response.has_value());
  EXPECT_EQ(event->status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << event->status.error_message();
}

}  // namespace
}  // namespace ringattn
