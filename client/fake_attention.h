#ifndef RINGATTN_CLIENT_FAKE_ATTENTION_H_
#define RINGATTN_CLIENT_FAKE_ATTENTION_H_

// An in-process stand-in for the coordinator's public service, for testing
// the client library and the CLI without a cluster: it rebuilds the tensors a
// call uploads, keeps them for inspection, and answers Attend and Query with
// O := Q. Thread-safe.

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/tensor.h"
#include "ringattn/v1/attention.grpc.pb.h"

namespace ringattn {

// What the fake does with an Attend or Query call.
enum class FakeBehavior {
  kEcho,          // O := Q, LSE[b, h, n] := b * 10000 + h * 100 + n
  kFail,          // RESOURCE_EXHAUSTED (kFakeFailMessage) after the header
  kDuplicateRow,  // echo, then row 0 of batch entry 0 again
  kMissingRow,    // echo without the last row of batch entry 0
  kNoSummary,     // echo without the summary
  kHang,          // wait for Release(), then INTERNAL
};

// The one worker the fake's contexts name as holding them.
inline constexpr char kFakeWorkerAddress[] = "fake-worker:1";

inline constexpr char kFakeFailMessage[] =
    "the request needs 12 GiB; the limit is 8 GiB";
inline constexpr char kFakeNotReadyMessage[] =
    "cluster not ready: 1 of 2 workers alive (missing rank 1)";

// A tensor rebuilt from the chunks a client sent, with the chunks' headers.
struct ReceivedTensor {
  Tensor<float> tensor;
  std::vector<v1::TensorChunk> chunks;  // data cleared
  std::vector<int> row_count;           // times each (batch, token) came
};

class FakeAttention final : public v1::Attention::Service {
 public:
  void set_behavior(FakeBehavior behavior);
  // The next `calls` Attend and Query calls end with UNAVAILABLE
  // (kFakeNotReadyMessage) after their header and before any response, as
  // the coordinator ends a call while its cluster is not ready; with
  // `unchanged`, marked as the coordinator marks them (kUnchangedKey).
  void FailNext(int calls, bool unchanged = true);
  // What GetClusterInfo reports (world size 1, ready, by default).
  void set_cluster(int world_size, bool ready);
  // Lets calls held by FakeBehavior::kHang end.
  void Release() { release_.Notify(); }
  bool released() const { return release_.HasBeenNotified(); }

  // Calls served so far.
  int calls();
  // The "authorization" metadata of the last call ("" if none).
  std::string authorization();
  // What the last upload sent of tensor `name`, and the order of its chunks.
  ReceivedTensor received(v1::TensorName name);
  std::vector<v1::TensorName> chunk_order();
  // Chunks the last Query call's header carried (QueryHeader.chunks).
  int header_chunks();

  grpc::Status Attend(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream)
      override;
  grpc::Status Query(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::AttendResponse, v1::QueryRequest>* stream)
      override;
  grpc::Status CreateContext(grpc::ServerContext* context,
                             grpc::ServerReader<v1::ContextUpload>* reader,
                             v1::ContextInfo* info) override;
  grpc::Status DeleteContext(grpc::ServerContext* context,
                             const v1::DeleteContextRequest* request,
                             v1::DeleteContextResponse* response) override;
  grpc::Status ListContexts(grpc::ServerContext* context,
                            const v1::ListContextsRequest* request,
                            v1::ListContextsResponse* response) override;
  grpc::Status GetClusterInfo(grpc::ServerContext* context,
                              const v1::GetClusterInfoRequest* request,
                              v1::ClusterInfo* info) override;

 private:
  void Start(grpc::ServerContext* context);
  // Chunks a Query header carries (QueryHeader.chunks).
  using Chunks = google::protobuf::RepeatedPtrField<v1::TensorChunk>;
  template <typename Reader>
  grpc::Status ReadChunks(const Chunks& carried, Reader* reader, v1::DType wire,
                          Shape q, Shape k, Shape v);
  template <typename Request>
  grpc::Status Answer(
      grpc::ServerContext* context, const v1::AttentionSpec& spec,
      const Chunks& carried,
      grpc::ServerReaderWriter<v1::AttendResponse, Request>* stream);

  std::mutex mu_;
  FakeBehavior behavior_ = FakeBehavior::kEcho;
  int unavailable_calls_ = 0;
  bool unavailable_unchanged_ = true;
  int world_size_ = 1;
  bool ready_ = true;
  int calls_ = 0;
  std::string authorization_;
  std::map<v1::TensorName, ReceivedTensor> received_;
  std::vector<v1::TensorName> chunk_order_;
  int header_chunks_ = 0;
  std::map<std::string, v1::ContextInfo> contexts_;
  absl::Notification release_;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_FAKE_ATTENTION_H_
