#include "client/fake_attention.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/dtype.h"
#include "proto/grpc_status.h"

namespace ringattn {
namespace {

std::vector<float> Floats(const std::string& bytes, DType dtype) {
  std::vector<float> values(bytes.size() / DTypeSize(dtype));
  ConvertToFloat(dtype, bytes.data(), values.data(), values.size());
  return values;
}

std::string Bytes(const float* values, int64_t count) {
  return std::string(reinterpret_cast<const char*>(values),
                     count * sizeof(float));
}

// The message type a reader of a request stream reads.
template <typename Reader>
struct MessageOf;
template <typename Response, typename Request>
struct MessageOf<grpc::ServerReaderWriter<Response, Request>> {
  using Type = Request;
};
template <typename Request>
struct MessageOf<grpc::ServerReader<Request>> {
  using Type = Request;
};

grpc::Status NoHeader() {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
}

}  // namespace

void FakeAttention::set_behavior(FakeBehavior behavior) {
  std::lock_guard<std::mutex> lock(mu_);
  behavior_ = behavior;
}

void FakeAttention::FailNext(int calls, bool unchanged) {
  std::lock_guard<std::mutex> lock(mu_);
  unavailable_calls_ = calls;
  unavailable_unchanged_ = unchanged;
}

void FakeAttention::set_cluster(int world_size, bool ready) {
  std::lock_guard<std::mutex> lock(mu_);
  world_size_ = world_size;
  ready_ = ready;
}

int FakeAttention::calls() {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

std::string FakeAttention::authorization() {
  std::lock_guard<std::mutex> lock(mu_);
  return authorization_;
}

ReceivedTensor FakeAttention::received(v1::TensorName name) {
  std::lock_guard<std::mutex> lock(mu_);
  return received_[name];
}

std::vector<v1::TensorName> FakeAttention::chunk_order() {
  std::lock_guard<std::mutex> lock(mu_);
  return chunk_order_;
}

int FakeAttention::header_chunks() {
  std::lock_guard<std::mutex> lock(mu_);
  return header_chunks_;
}

grpc::Status FakeAttention::Attend(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::AttendResponse, v1::AttendRequest>* stream) {
  v1::AttendRequest request;
  if (!stream->Read(&request) || !request.has_header()) return NoHeader();
  return Answer(context, request.header(), {}, stream);
}

grpc::Status FakeAttention::Query(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::AttendResponse, v1::QueryRequest>* stream) {
  v1::QueryRequest request;
  if (!stream->Read(&request) || !request.has_header()) return NoHeader();
  v1::AttentionSpec spec = request.header().spec();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = contexts_.find(request.header().context());
    if (it == contexts_.end()) {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          "no context named '" + request.header().context() + "'");
    }
    spec.set_kv_len(it->second.length());
    header_chunks_ = request.header().chunks_size();
  }
  return Answer(context, spec, request.header().chunks(), stream);
}

grpc::Status FakeAttention::CreateContext(
    grpc::ServerContext* context, grpc::ServerReader<v1::ContextUpload>* reader,
    v1::ContextInfo* info) {
  Start(context);
  v1::ContextUpload upload;
  if (!reader->Read(&upload) || !upload.has_header()) return NoHeader();
  const v1::ContextHeader& header = upload.header();
  const Shape shape{header.batch(), header.length(), header.kv_heads(),
                    header.head_dim()};
  grpc::Status status =
      ReadChunks({}, reader, header.wire_dtype(), shape, shape, shape);
  if (!status.ok()) return status;
  info->set_name(header.name());
  info->set_batch(header.batch());
  info->set_length(header.length());
  info->set_kv_heads(header.kv_heads());
  info->set_head_dim(header.head_dim());
  info->set_bytes(2 * shape.NumElements() * sizeof(float));
  // One part, held as the fp32 the fake keeps.
  v1::ContextPart& part = *info->add_parts();
  part.set_address(kFakeWorkerAddress);
  part.set_bytes(info->bytes());
  part.set_dtype(v1::FP32);
  std::lock_guard<std::mutex> lock(mu_);
  contexts_[header.name()] = *info;
  return grpc::Status::OK;
}

grpc::Status FakeAttention::DeleteContext(
    grpc::ServerContext* context, const v1::DeleteContextRequest* request,
    v1::DeleteContextResponse*) {
  Start(context);
  std::lock_guard<std::mutex> lock(mu_);
  if (contexts_.erase(request->name()) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "no context named '" + request->name() + "'");
  }
  return grpc::Status::OK;
}

grpc::Status FakeAttention::ListContexts(grpc::ServerContext* context,
                                         const v1::ListContextsRequest*,
                                         v1::ListContextsResponse* response) {
  Start(context);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, info] : contexts_) *response->add_contexts() = info;
  return grpc::Status::OK;
}

grpc::Status FakeAttention::GetClusterInfo(grpc::ServerContext* context,
                                           const v1::GetClusterInfoRequest*,
                                           v1::ClusterInfo* info) {
  Start(context);
  std::lock_guard<std::mutex> lock(mu_);
  info->set_world_size(world_size_);
  info->set_ready(ready_);
  info->set_version("fake");
  return grpc::Status::OK;
}

// Counts the call and keeps its authorization metadata.
void FakeAttention::Start(grpc::ServerContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_;
  auto it = context->client_metadata().find("authorization");
  authorization_ = it == context->client_metadata().end()
                       ? ""
                       : std::string(it->second.data(), it->second.size());
}

// Reads every chunk, carried ones first, into received_, checking each chunk
// fits the tensor it names.
template <typename Reader>
grpc::Status FakeAttention::ReadChunks(const Chunks& carried, Reader* reader,
                                       v1::DType wire, Shape q, Shape k,
                                       Shape v) {
  const DType dtype = wire == v1::FP16   ? DType::kFloat16
                      : wire == v1::BF16 ? DType::kBFloat16
                                         : DType::kFloat32;
  std::map<v1::TensorName, ReceivedTensor> received;
  std::vector<v1::TensorName> order;
  for (const auto& [name, shape] :
       std::map<v1::TensorName, Shape>{{v1::Q, q}, {v1::K, k}, {v1::V, v}}) {
    received[name].tensor = Tensor<float>(shape);
    received[name].row_count.assign(shape.batch * shape.seq, 0);
  }
  const auto take = [&](const v1::TensorChunk& chunk) {
    ReceivedTensor& into = received[chunk.tensor()];
    const Shape& shape = into.tensor.shape();
    const std::vector<float> values = Floats(chunk.data(), dtype);
    if (chunk.batch() < 0 || chunk.batch() >= shape.batch ||
        chunk.token_offset() < 0 ||
        chunk.token_offset() + chunk.token_count() > shape.seq ||
        static_cast<int64_t>(values.size()) !=
            chunk.token_count() * shape.heads * shape.dim) {
      return false;
    }
    std::memcpy(into.tensor.view().Row(chunk.batch(), chunk.token_offset(), 0),
                values.data(), values.size() * sizeof(float));
    for (int64_t t = 0; t < chunk.token_count(); ++t) {
      ++into.row_count[chunk.batch() * shape.seq + chunk.token_offset() + t];
    }
    into.chunks.push_back(chunk);
    into.chunks.back().clear_data();
    order.push_back(chunk.tensor());
    return true;
  };
  const grpc::Status bad(grpc::StatusCode::INVALID_ARGUMENT, "bad chunk");
  for (const v1::TensorChunk& chunk : carried) {
    if (!take(chunk)) return bad;
  }
  typename MessageOf<Reader>::Type message;
  while (reader->Read(&message)) {
    if (!take(message.chunk())) return bad;
  }
  std::lock_guard<std::mutex> lock(mu_);
  received_ = std::move(received);
  chunk_order_ = std::move(order);
  return grpc::Status::OK;
}

template <typename Request>
grpc::Status FakeAttention::Answer(
    grpc::ServerContext* context, const v1::AttentionSpec& spec,
    const Chunks& carried,
    grpc::ServerReaderWriter<v1::AttendResponse, Request>* stream) {
  Start(context);
  FakeBehavior behavior;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unavailable_calls_ > 0) {
      --unavailable_calls_;
      if (unavailable_unchanged_) {
        context->AddTrailingMetadata(kUnchangedKey, "1");
      }
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, kFakeNotReadyMessage);
    }
    behavior = behavior_;
  }
  if (behavior == FakeBehavior::kFail) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, kFakeFailMessage);
  }
  if (behavior == FakeBehavior::kHang) {
    release_.WaitForNotification();
    return grpc::Status(grpc::StatusCode::INTERNAL, "released");
  }
  const Shape q{spec.batch(), spec.q_len(), spec.q_heads(), spec.head_dim()};
  const Shape kv{spec.batch(), spec.kv_len(), spec.kv_heads(), spec.head_dim()};
  grpc::Status status =
      ReadChunks(carried, stream, spec.wire_dtype(), q, kv, kv);
  if (!status.ok()) return status;
  const Tensor<float> output = received(v1::Q).tensor;

  // Three rows a chunk, last batch entry first.
  const int64_t row_values = q.heads * q.dim;
  int64_t rows_sent = 0;
  for (int64_t b = q.batch - 1; b >= 0; --b) {
    for (int64_t offset = 0; offset < q.seq; offset += 3) {
      int64_t count = std::min<int64_t>(3, q.seq - offset);
      if (behavior == FakeBehavior::kMissingRow && b == 0 &&
          offset + count == q.seq) {
        --count;
      }
      if (count == 0) continue;
      v1::AttendResponse response;
      v1::OutputChunk* chunk = response.mutable_output();
      chunk->set_batch(b);
      chunk->set_token_offset(offset);
      chunk->set_token_count(count);
      chunk->set_data(
          Bytes(output.view().Row(b, offset, 0), count * row_values));
      if (spec.return_lse()) {
        std::vector<float> lse;
        for (int64_t h = 0; h < q.heads; ++h) {
          for (int64_t t = offset; t < offset + count; ++t) {
            lse.push_back(b * 10000 + h * 100 + t);
          }
        }
        chunk->set_lse(Bytes(lse.data(), lse.size()));
      }
      stream->Write(response);
      rows_sent += count;
    }
  }
  if (behavior == FakeBehavior::kDuplicateRow) {
    v1::AttendResponse response;
    v1::OutputChunk* chunk = response.mutable_output();
    chunk->set_token_count(1);
    chunk->set_data(Bytes(output.data(), row_values));
    if (spec.return_lse()) {
      const std::vector<float> lse(q.heads, 0.0f);
      chunk->set_lse(Bytes(lse.data(), lse.size()));
    }
    stream->Write(response);
  }
  if (behavior != FakeBehavior::kNoSummary) {
    v1::AttendResponse response;
    response.mutable_summary()->set_request_id("fake-1");
    response.mutable_summary()->set_flops(rows_sent);
    (*response.mutable_summary()->mutable_kernel_launches())["cpu_decode"] = 3;
    (*response.mutable_summary()->mutable_kernel_launches())["cpu_block"] = 2;
    stream->Write(response);
  }
  return grpc::Status::OK;
}

}  // namespace ringattn
