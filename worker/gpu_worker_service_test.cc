// WorkerService on CUDA workers (options.cuda_device, an NcclConnector meeting
// the other ranks in an in-process store), through real gRPC channels: a
// causal GQA request in each wire dtype, on two GPUs where there are two (one
// otherwise), against the float64 reference. The GPU computes in bf16 for bf16
// and fp32 wire data and in fp16 for fp16, so the tolerance is |O - O_ref| <=
// 3e-2 * (1 + |O_ref|) (the inputs of an fp32 request are rounded to bf16
// too), and 1e-2 * (1 + |LSE_ref|) for the LSE. Requests that carry one
// communicator key ring over one kept NCCL communicator, and one that fails
// on it leaves the next key's request working. Skips, saying why, without a
// GPU (or with one, for the tests that need two).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "core/ring_plan.h"
#include "core/shard_layout.h"
#include "gloo/rendezvous/hash_store.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kernels/cpu/merge_with_lse.h"
#include "kernels/cpu/reference_attention.h"
#include "proto/spec_conversion.h"
#include "worker/device.h"
#include "worker/gpu_test_skip.h"
#include "worker/nccl_communicator.h"
#include "worker/worker_service.h"

namespace ringattn {
namespace {

// Where a test worker stages its requests in host memory.
enum class Staging {
  kLentBuffers,  // page-locked buffers of its pool, as a short request's
  kLockedAfter,  // faulted in and page-locked behind its rows, as a large one's
};

// One WorkerService on CUDA device `device` behind a gRPC server on
// 127.0.0.1, meeting other workers in `store`.
class GpuTestWorker {
 public:
  GpuTestWorker(gloo::rendezvous::Store& store, int device,
                Staging staging = Staging::kLockedAfter) {
    connector_ = std::make_unique<NcclConnector>(store, device);
    WorkerServiceOptions options;
    options.cuda_device = device;
    options.memory_bytes = int64_t{8} << 30;
    if (staging == Staging::kLockedAfter) {
      options.pinned_staging_buffer_bytes = 0;
      options.background_page_fault_bytes = 0;
    }
    service_ = std::make_unique<WorkerService>(*connector_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::Worker::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  ~GpuTestWorker() { server_->Shutdown(); }

  v1::Worker::Stub& stub() { return *stub_; }
  const WorkerService& service() const { return *service_; }

 private:
  std::unique_ptr<NcclConnector> connector_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

struct ExecuteResult {
  grpc::Status status;
  std::vector<v1::ExecuteResponse> responses;
};

ExecuteResult Execute(v1::Worker::Stub& stub,
                      const std::vector<v1::ExecuteRequest>& requests) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto stream = stub.Execute(&context);
  for (const v1::ExecuteRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  ExecuteResult result;
  v1::ExecuteResponse response;
  while (stream->Read(&response)) result.responses.push_back(response);
  result.status = stream->Finish();
  return result;
}

// Every request of rank `rank`'s stream: header, its rows in `dtype`, run.
// Pass-KV sends the rank its shard of Q, K and V; broadcast-Q all of Q and
// its shard of K and V.
std::vector<v1::ExecuteRequest> StreamOf(
    const AttentionSpec& spec, DType dtype, int rank, int ranks,
    const std::string& prefix, const Tensor<float>& q, const Tensor<float>& k,
    const Tensor<float>& v, v1::Strategy strategy = v1::PASS_KV) {
  std::vector<v1::ExecuteRequest> requests(1);
  v1::ExecuteHeader* header = requests[0].mutable_header();
  header->set_request_id(prefix);
  *header->mutable_spec() = SpecToProto(spec);
  header->mutable_spec()->set_wire_dtype(DTypeToProto(dtype));
  header->mutable_spec()->set_strategy(strategy);
  header->set_rank(rank);
  header->set_world_size(ranks);
  header->set_rendezvous_prefix(prefix);
  header->set_timeout_seconds(60);
  const std::vector<Range> kv_chunks =
      LayoutFor(spec, spec.kv_len, ranks).Chunks(rank);
  const std::vector<Range> q_chunks =
      strategy == v1::BROADCAST_Q ? std::vector<Range>{Range{0, spec.q_len}}
                                  : QueryLayoutFor(spec, ranks).Chunks(rank);
  for (int64_t b = 0; b < spec.batch; ++b) {
    for (const auto& [name, t] :
         {std::make_pair(v1::Q, &q), std::make_pair(v1::K, &k),
          std::make_pair(v1::V, &v)}) {
      for (const Range& chunk : name == v1::Q ? q_chunks : kv_chunks) {
        v1::ExecuteRequest request;
        v1::ShardRows* rows = request.mutable_rows();
        rows->set_tensor(name);
        rows->set_batch(b);
        rows->set_first_position(chunk.begin);
        rows->set_count(chunk.size());
        const int64_t values = t->shape().heads * t->shape().dim;
        std::string& data = *rows->mutable_data();
        data.resize(chunk.size() * values * DTypeSize(dtype));
        for (int64_t i = 0; i < chunk.size(); ++i) {
          ConvertFromFloat(dtype, t->view().Row(b, chunk.begin + i, 0),
                           &data[i * values * DTypeSize(dtype)], values);
        }
        requests.push_back(request);
      }
    }
  }
  v1::ExecuteRequest run;
  run.set_run(true);
  requests.push_back(run);
  return requests;
}

// A tensor of normal values rounded to bf16 (what the GPU computes on).
Tensor<float> Bf16Normal(std::mt19937& rng, int64_t len, int64_t heads,
                         int64_t dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor<float> t({1, len, heads, dim});
  for (float& x : t.values()) x = BFloat16ToFloat(FloatToBFloat16(normal(rng)));
  return t;
}

// One causal GQA request of `strategy` (PASS_KV or PASS_Q: the same shards)
// in every wire dtype on min(2, GPUs) workers staging as `staging` says,
// against the reference.
void ExpectRanksOnGpusMatchTheReference(
    v1::Strategy strategy, Staging staging = Staging::kLockedAfter) {
  const int ranks = CudaDeviceCount() >= 2 ? 2 : 1;
  AttentionSpec spec;
  spec.batch = 2;
  spec.q_len = spec.kv_len = 301;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = true;
  for (const DType dtype :
       {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " on ", ranks, " GPU(s)"));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // The values as the wire dtype carries them.
    auto make = [&](int64_t heads) {
      Tensor<float> t({spec.batch, spec.q_len, heads, spec.head_dim});
      for (float& x : t.values()) {
        const float value = normal(rng);
        uint16_t bits = 0;
        x = value;
        if (dtype != DType::kFloat32) {
          ConvertFromFloat(dtype, &value, &bits, 1);
          ConvertToFloat(dtype, &bits, &x, 1);
        }
      }
      return t;
    };
    const Tensor<float> q = make(spec.q_heads);
    const Tensor<float> k = make(spec.kv_heads);
    const Tensor<float> v = make(spec.kv_heads);
    Tensor<double> o_ref(q.shape());
    Tensor<double> lse_ref({spec.batch, spec.q_len, spec.q_heads, 1});
    ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                       lse_ref.view());

    gloo::rendezvous::HashStore store;
    std::vector<std::unique_ptr<GpuTestWorker>> workers;
    for (int r = 0; r < ranks; ++r) {
      workers.push_back(std::make_unique<GpuTestWorker>(store, r, staging));
    }
    const std::string prefix =
        absl::StrCat("gpu-ring-", strategy, "-", DTypeName(dtype));
    std::vector<ExecuteResult> results(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        results[r] =
            Execute(workers[r]->stub(),
                    StreamOf(spec, dtype, r, ranks, prefix, q, k, v, strategy));
      });
    }
    for (std::thread& t : threads) t.join();

    Tensor<float> o(q.shape());
    Tensor<float> lse({spec.batch, spec.q_len, spec.q_heads, 1});
    std::vector<bool> seen(spec.batch * spec.q_len, false);
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(results[r].status.ok())
          << "rank " << r << ": " << results[r].status.error_message();
      ASSERT_TRUE(results[r].responses.back().has_done());
      // The service page-locked a buffer for each request it admits at once.
      EXPECT_EQ(workers[r]->service().staging_buffers(),
                staging == Staging::kLentBuffers
                    ? WorkerServiceOptions().max_concurrent_executions
                    : 0);
      const v1::ExecuteDone& done = results[r].responses.back().done();
      EXPECT_EQ(done.ring_steps(), ranks);
      EXPECT_GT(done.peak_bytes(), 0);
      // Every rank computed its diagonal, on the GPU paths (worker.proto).
      EXPECT_FALSE(done.kernel_launches().empty()) << "rank " << r;
      for (const auto& [kernel, launches] : done.kernel_launches()) {
        EXPECT_TRUE(
            std::set<std::string>({"cudnn", "flash", "hopper", "decode"})
                .count(kernel))
            << "rank " << r << " ran " << kernel;
        EXPECT_GT(launches, 0) << kernel;
      }
      if (strategy == v1::PASS_Q) {
        // The rank sends a query block on at each of p steps, the last one
        // home; nothing travels in a world of one.
        EXPECT_EQ(done.transfers(), ranks > 1 ? ranks : 0);
      }
      for (const v1::ExecuteResponse& response : results[r].responses) {
        if (!response.has_output()) continue;
        const v1::ShardOutput& out = response.output();
        const int64_t row_values = spec.q_heads * spec.head_dim;
        ASSERT_EQ(out.data().size(), out.count() * row_values * 4);
        for (int64_t i = 0; i < out.count(); ++i) {
          const int64_t p = out.first_position() + i;
          seen[out.batch() * spec.q_len + p] = true;
          std::memcpy(o.view().Row(out.batch(), p, 0),
                      out.data().data() + i * row_values * 4, row_values * 4);
          std::memcpy(lse.view().Row(out.batch(), p, 0),
                      out.lse().data() + i * spec.q_heads * 4,
                      spec.q_heads * 4);
        }
      }
    }
    for (bool s : seen) ASSERT_TRUE(s) << "an output row is missing";
    for (size_t i = 0; i < o.values().size(); ++i) {
      const double want = o_ref.values()[i];
      ASSERT_NEAR(o.values()[i], want, 3e-2 * (1 + std::fabs(want))) << i;
    }
    for (size_t i = 0; i < lse.values().size(); ++i) {
      const double want = lse_ref.values()[i];
      ASSERT_NEAR(lse.values()[i], want, 1e-2 * (1 + std::fabs(want))) << i;
    }
  }
}

TEST(GpuWorkerServiceTest, RanksOnGpusMatchTheReference) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  DisableNcclMulticast();
  ExpectRanksOnGpusMatchTheReference(v1::PASS_KV);
}

TEST(GpuWorkerServiceTest, RanksStagingInLentBuffersMatchTheReference) {
  SKIP_WITHOUT_GPUS(1);
  ExpectRanksOnGpusMatchTheReference(v1::PASS_KV, Staging::kLentBuffers);
  ExpectRanksOnGpusMatchTheReference(v1::PASS_Q, Staging::kLentBuffers);
}

// PASS_Q forced in the header: CUDA workers run it (they used to answer
// UNIMPLEMENTED) and return the same rows as pass-KV would.
TEST(GpuWorkerServiceTest, PassQForcedOnGpuWorkersMatchesTheReference) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  }
  DisableNcclMulticast();
  ExpectRanksOnGpusMatchTheReference(v1::PASS_Q);
}

// Runs rank r's request stream, `stream_of(r)`, on one fresh GPU test worker
// per rank, all ranks at once; returns what each answered.
std::vector<ExecuteResult> ExecuteOnRanks(
    int ranks,
    const std::function<std::vector<v1::ExecuteRequest>(int)>& stream_of) {
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<GpuTestWorker>> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.push_back(std::make_unique<GpuTestWorker>(store, r));
  }
  std::vector<ExecuteResult> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = Execute(workers[r]->stub(), stream_of(r)); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(GpuWorkerServiceTest, BroadcastQPartialsMergeToTheReference) {
  const int gpus = CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  DisableNcclMulticast();
  const int ranks = gpus >= 2 ? 2 : 1;
  AttentionSpec spec;  // a causal continuation: 17 new rows, 301 keys
  spec.q_len = 17;
  spec.kv_len = 301;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.causal = true;
  std::mt19937 rng(11);
  const Tensor<float> q =
      Bf16Normal(rng, spec.q_len, spec.q_heads, spec.head_dim);
  const Tensor<float> k =
      Bf16Normal(rng, spec.kv_len, spec.kv_heads, spec.head_dim);
  const Tensor<float> v =
      Bf16Normal(rng, spec.kv_len, spec.kv_heads, spec.head_dim);
  Tensor<double> o_ref(q.shape());
  Tensor<double> lse_ref({1, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                     lse_ref.view());
  const std::vector<ExecuteResult> results = ExecuteOnRanks(ranks, [&](int r) {
    return StreamOf(spec, DType::kBFloat16, r, ranks, "gpu-broadcast", q, k, v,
                    v1::BROADCAST_Q);
  });

  // Every rank returns a partial (O, LSE) for every row; merge them by LSE.
  Tensor<float> o(q.shape());
  Tensor<float> lse({1, spec.q_len, spec.q_heads, 1});
  std::fill(lse.values().begin(), lse.values().end(), -INFINITY);
  const int64_t row_values = spec.q_heads * spec.head_dim;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_TRUE(results[r].status.ok())
        << "rank " << r << ": " << results[r].status.error_message();
    ASSERT_TRUE(results[r].responses.back().has_done());
    EXPECT_EQ(results[r].responses.back().done().transfers(), 0);
    Tensor<float> part_o(q.shape());
    Tensor<float> part_lse({1, spec.q_len, spec.q_heads, 1});
    int64_t rows = 0;
    for (const v1::ExecuteResponse& response : results[r].responses) {
      if (!response.has_output()) continue;
      const v1::ShardOutput& out = response.output();
      ASSERT_EQ(out.data().size(), out.count() * row_values * 4);
      std::memcpy(part_o.view().Row(0, out.first_position(), 0),
                  out.data().data(), out.data().size());
      std::memcpy(part_lse.view().Row(0, out.first_position(), 0),
                  out.lse().data(), out.lse().size());
      rows += out.count();
    }
    ASSERT_EQ(rows, spec.q_len) << "rank " << r;
    MergeWithLse(o.view(), lse.view(), part_o.view(), part_lse.view());
  }
  for (size_t i = 0; i < o.values().size(); ++i) {
    const double want = o_ref.values()[i];
    ASSERT_NEAR(o.values()[i], want, 3e-2 * (1 + std::fabs(want))) << i;
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    const double want = lse_ref.values()[i];
    ASSERT_NEAR(lse.values()[i], want, 1e-2 * (1 + std::fabs(want))) << i;
  }
}

TEST(GpuWorkerServiceTest,
     BroadcastQMergedOnWorkersReturnsBf16RowsFromRankZero) {
  if (CudaDeviceCount() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices; runs on a GPU machine";
  }
  DisableNcclMulticast();
  const int ranks = 2;
  AttentionSpec spec;  // a causal continuation: 300 new rows, 4400 keys
  spec.q_len = 300;
  spec.kv_len = 4400;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 128;
  spec.causal = true;
  std::mt19937 rng(12);
  const Tensor<float> q =
      Bf16Normal(rng, spec.q_len, spec.q_heads, spec.head_dim);
  const Tensor<float> k =
      Bf16Normal(rng, spec.kv_len, spec.kv_heads, spec.head_dim);
  const Tensor<float> v =
      Bf16Normal(rng, spec.kv_len, spec.kv_heads, spec.head_dim);
  Tensor<double> o_ref(q.shape());
  Tensor<double> lse_ref({1, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                     lse_ref.view());
  const std::vector<ExecuteResult> results = ExecuteOnRanks(ranks, [&](int r) {
    std::vector<v1::ExecuteRequest> stream =
        StreamOf(spec, DType::kBFloat16, r, ranks, "gpu-broadcast-tree", q, k,
                 v, v1::BROADCAST_Q);
    v1::AttentionSpec* sent = stream[0].mutable_header()->mutable_spec();
    sent->set_partial_merge(v1::MERGE_ON_WORKERS);
    sent->set_output_dtype(v1::BF16);
    return stream;
  });
  for (int r = 0; r < ranks; ++r) {
    ASSERT_TRUE(results[r].status.ok())
        << "rank " << r << ": " << results[r].status.error_message();
    ASSERT_TRUE(results[r].responses.back().has_done());
  }
  // Rank 1 sent its partial to rank 0 over NCCL and returns no rows.
  EXPECT_EQ(results[1].responses.back().done().transfers(), 1);
  for (const v1::ExecuteResponse& response : results[1].responses) {
    EXPECT_FALSE(response.has_output() && response.output().count() > 0);
  }
  // Rank 0 returns every merged row in bf16.
  const int64_t row_values = spec.q_heads * spec.head_dim;
  Tensor<float> o(q.shape());
  Tensor<float> lse({1, spec.q_len, spec.q_heads, 1});
  int64_t rows = 0;
  for (const v1::ExecuteResponse& response : results[0].responses) {
    if (!response.has_output()) continue;
    const v1::ShardOutput& out = response.output();
    ASSERT_EQ(out.dtype(), v1::BF16);
    ASSERT_EQ(out.data().size(), out.count() * row_values * 2);
    ConvertDType(DType::kBFloat16, out.data().data(), DType::kFloat32,
                 o.view().Row(0, out.first_position(), 0),
                 out.count() * row_values);
    std::memcpy(lse.view().Row(0, out.first_position(), 0), out.lse().data(),
                out.lse().size());
    rows += out.count();
  }
  ASSERT_EQ(rows, spec.q_len);
  for (size_t i = 0; i < o.values().size(); ++i) {
    const double want = o_ref.values()[i];
    ASSERT_NEAR(o.values()[i], want, 3e-2 * (1 + std::fabs(want))) << i;
  }
  for (size_t i = 0; i < lse.values().size(); ++i) {
    const double want = lse_ref.values()[i];
    ASSERT_NEAR(lse.values()[i], want, 1e-2 * (1 + std::fabs(want))) << i;
  }
}

// Rows [first, first + count) of `t` (batch 0) in `dtype`, as ShardRows.
v1::ShardRows RowsOf(v1::TensorName name, const Tensor<float>& t, int64_t first,
                     int64_t count, DType dtype) {
  v1::ShardRows rows;
  rows.set_tensor(name);
  rows.set_first_position(first);
  rows.set_count(count);
  const int64_t values = t.shape().heads * t.shape().dim;
  std::string& data = *rows.mutable_data();
  data.resize(count * values * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    ConvertFromFloat(dtype, t.view().Row(0, first + i, 0),
                     &data[i * values * DTypeSize(dtype)], values);
  }
  return rows;
}

// Stores positions `piece` of k and v as a piece of context `name`; the
// worker answers in `response`.
grpc::Status StorePiece(v1::Worker::Stub& stub, const std::string& name,
                        bool create, const Range& piece, const Tensor<float>& k,
                        const Tensor<float>& v,
                        v1::StoreContextResponse* response) {
  grpc::ClientContext context;
  auto stream = stub.StoreContext(&context, response);
  v1::StoreContextRequest request;
  v1::StoreContextHeader* header = request.mutable_header();
  header->set_name(name);
  header->set_create(create);
  header->set_batch(1);
  header->set_kv_heads(k.shape().heads);
  header->set_head_dim(k.shape().dim);
  header->set_wire_dtype(DTypeToProto(DType::kBFloat16));
  header->set_first_position(piece.begin);
  header->set_count(piece.size());
  stream->Write(request);
  for (const auto& [tensor, t] :
       {std::make_pair(v1::K, &k), std::make_pair(v1::V, &v)}) {
    v1::StoreContextRequest rows;
    *rows.mutable_rows() =
        RowsOf(tensor, *t, piece.begin, piece.size(), DType::kBFloat16);
    stream->Write(rows);
  }
  stream->WritesDone();
  return stream->Finish();
}

// Rank `rank`'s stream of a query of context `name`, held as `held` (every
// rank's positions): header, its Q rows, run.
std::vector<v1::ExecuteRequest> ContextQueryOf(
    const AttentionSpec& spec, int rank, int ranks, const std::string& prefix,
    const std::string& name, const std::vector<std::vector<Range>>& held,
    const Tensor<float>& q, v1::Strategy strategy) {
  std::vector<v1::ExecuteRequest> requests(1);
  v1::ExecuteHeader* header = requests[0].mutable_header();
  header->set_request_id(prefix);
  *header->mutable_spec() = SpecToProto(spec);
  header->mutable_spec()->set_wire_dtype(DTypeToProto(DType::kBFloat16));
  header->mutable_spec()->set_strategy(strategy);
  header->set_rank(rank);
  header->set_world_size(ranks);
  header->set_rendezvous_prefix(prefix);
  header->set_timeout_seconds(60);
  header->set_context(name);
  for (const std::vector<Range>& chunks : held) {
    v1::KvChunks* layout = header->add_kv_layout();
    for (const Range& chunk : chunks) {
      layout->add_begin(chunk.begin);
      layout->add_end(chunk.end);
    }
  }
  const std::vector<Range> q_chunks =
      strategy == v1::BROADCAST_Q ? std::vector<Range>{Range{0, spec.q_len}}
                                  : QueryLayoutFor(spec, ranks).Chunks(rank);
  for (const Range& chunk : q_chunks) {
    v1::ExecuteRequest request;
    *request.mutable_rows() =
        RowsOf(v1::Q, q, chunk.begin, chunk.size(), DType::kBFloat16);
    requests.push_back(request);
  }
  v1::ExecuteRequest run;
  run.set_run(true);
  requests.push_back(run);
  return requests;
}

// A context stored on the GPUs in three uneven appends (so each rank holds
// non-adjacent positions, and a piece of one row), then queried with
// broadcast-Q (read in place; 1 and 17 causal rows, the decode kernel and
// cuDNN), pass-KV (copied into the ring's blocks; 300 rows) and pass-Q (read
// in place while the query blocks travel; 300 causal rows): the merged
// outputs match the reference within the bf16 tolerance of this file.
TEST(GpuWorkerServiceTest, ResidentContextOnGpuMatchesTheReference) {
  const int gpus = CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device here; runs on a GPU machine";
  DisableNcclMulticast();
  const int ranks = gpus >= 2 ? 2 : 1;
  const int64_t kv_len = 3001;  // prime
  const int64_t q_heads = 8, kv_heads = 2, dim = 80;
  std::mt19937 rng(23);
  const Tensor<float> k = Bf16Normal(rng, kv_len, kv_heads, dim);
  const Tensor<float> v = Bf16Normal(rng, kv_len, kv_heads, dim);

  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<GpuTestWorker>> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.push_back(std::make_unique<GpuTestWorker>(store, r));
  }
  std::vector<std::vector<Range>> held(ranks);
  bool create = true;
  for (const Range& piece :
       {Range{0, 1500}, Range{1500, 2999}, Range{2999, kv_len}}) {
    for (int r = 0; r < ranks; ++r) {
      const int64_t share = piece.size() / ranks;
      const Range part{
          piece.begin + r * share,
          r + 1 == ranks ? piece.end : piece.begin + (r + 1) * share};
      v1::StoreContextResponse response;
      const grpc::Status stored =
          StorePiece(workers[r]->stub(), "book", create, part, k, v, &response);
      ASSERT_TRUE(stored.ok())
          << "rank " << r << ": " << stored.error_message();
      // What the coordinator lists: the bytes held and the dtype, bf16.
      EXPECT_GT(response.bytes(), 0);
      EXPECT_EQ(response.dtype(), v1::BF16);
      if (!part.empty()) held[r].push_back(part);
    }
    create = false;
  }

  int query = 0;
  for (const auto& [q_len, strategy] :
       {std::make_pair(int64_t{1}, v1::BROADCAST_Q),
        std::make_pair(int64_t{17}, v1::BROADCAST_Q),
        std::make_pair(int64_t{300}, v1::PASS_KV),
        std::make_pair(int64_t{300}, v1::PASS_Q)}) {
    SCOPED_TRACE(absl::StrCat(q_len, " query rows, strategy ", strategy));
    AttentionSpec spec;
    spec.q_len = q_len;
    spec.kv_len = kv_len;
    spec.q_heads = q_heads;
    spec.kv_heads = kv_heads;
    spec.head_dim = dim;
    spec.causal = strategy != v1::PASS_KV;
    const Tensor<float> q = Bf16Normal(rng, q_len, q_heads, dim);
    Tensor<double> o_ref(q.shape());
    Tensor<double> lse_ref({1, q_len, q_heads, 1});
    ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                       lse_ref.view());

    const std::string prefix = absl::StrCat("gpu-context-", query++);
    std::vector<ExecuteResult> results(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        results[r] = Execute(
            workers[r]->stub(),
            ContextQueryOf(spec, r, ranks, prefix, "book", held, q, strategy));
      });
    }
    for (std::thread& t : threads) t.join();

    // Every row's partials (one per rank for broadcast-Q, one in all for
    // pass-KV and pass-Q) merge by LSE into the answer.
    Tensor<float> o(q.shape());
    std::fill(o.values().begin(), o.values().end(), 0.0f);
    Tensor<float> lse({1, q_len, q_heads, 1});
    std::fill(lse.values().begin(), lse.values().end(), -INFINITY);
    const int64_t row_values = q_heads * dim;
    int64_t rows = 0;
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(results[r].status.ok())
          << "rank " << r << ": " << results[r].status.error_message();
      Tensor<float> part_o(q.shape());
      std::fill(part_o.values().begin(), part_o.values().end(), 0.0f);
      Tensor<float> part_lse({1, q_len, q_heads, 1});
      std::fill(part_lse.values().begin(), part_lse.values().end(), -INFINITY);
      for (const v1::ExecuteResponse& response : results[r].responses) {
        if (!response.has_output()) continue;
        const v1::ShardOutput& out = response.output();
        ASSERT_EQ(out.data().size(), out.count() * row_values * 4);
        std::memcpy(part_o.view().Row(0, out.first_position(), 0),
                    out.data().data(), out.data().size());
        std::memcpy(part_lse.view().Row(0, out.first_position(), 0),
                    out.lse().data(), out.lse().size());
        rows += out.count();
      }
      MergeWithLse(o.view(), lse.view(), part_o.view(), part_lse.view());
    }
    EXPECT_EQ(rows, strategy == v1::BROADCAST_Q ? q_len * ranks : q_len);
    for (size_t i = 0; i < o.values().size(); ++i) {
      const double want = o_ref.values()[i];
      ASSERT_NEAR(o.values()[i], want, 3e-2 * (1 + std::fabs(want))) << i;
    }
    for (size_t i = 0; i < lse.values().size(); ++i) {
      const double want = lse_ref.values()[i];
      ASSERT_NEAR(lse.values()[i], want, 1e-2 * (1 + std::fabs(want))) << i;
    }
  }
}

// The pass-KV request of the reuse tests: causal GQA, bf16, two ranks.
AttentionSpec ReuseSpec() {
  AttentionSpec spec;
  spec.batch = 1;
  spec.q_len = spec.kv_len = 257;
  spec.q_heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.causal = true;
  return spec;
}

// OK if the output rows of `results` (every rank's) match the float64
// reference of `q`, `k`, `v` within the bf16 tolerance and cover every row.
absl::Status CheckAgainstReference(const AttentionSpec& spec,
                                   const Tensor<float>& q,
                                   const Tensor<float>& k,
                                   const Tensor<float>& v,
                                   const std::vector<ExecuteResult>& results) {
  Tensor<double> o_ref(q.shape());
  Tensor<double> lse_ref({spec.batch, spec.q_len, spec.q_heads, 1});
  ReferenceAttention(spec, q.view(), k.view(), v.view(), o_ref.view(),
                     lse_ref.view());
  const int64_t row_values = spec.q_heads * spec.head_dim;
  int64_t rows = 0;
  for (const ExecuteResult& result : results) {
    if (!result.status.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(result.status.error_code()),
          result.status.error_message());
    }
    for (const v1::ExecuteResponse& response : result.responses) {
      if (!response.has_output()) continue;
      const v1::ShardOutput& out = response.output();
      std::vector<float> o(out.count() * row_values);
      std::memcpy(o.data(), out.data().data(), o.size() * sizeof(float));
      for (int64_t i = 0; i < out.count(); ++i) {
        const int64_t p = out.first_position() + i;
        for (int64_t j = 0; j < row_values; ++j) {
          const double want = o_ref.view().Row(out.batch(), p, 0)[j];
          const double got = o[i * row_values + j];
          if (std::fabs(got - want) > 3e-2 * (1 + std::fabs(want))) {
            return absl::DataLossError(absl::StrCat(
                "row ", p, " value ", j, ": ", got, ", want ", want));
          }
        }
      }
      rows += out.count();
    }
  }
  if (rows != spec.batch * spec.q_len) {
    return absl::DataLossError(absl::StrCat("got ", rows, " output rows of ",
                                            spec.batch * spec.q_len));
  }
  return absl::OkStatus();
}

// Runs one pass-KV request over `key` on ranks [0, ranks) of `workers` at
// once (fewer than all: the others never join), with ring timeout `timeout`.
std::vector<ExecuteResult> RunKeyed(
    std::vector<std::unique_ptr<GpuTestWorker>>& workers, int ranks,
    const AttentionSpec& spec, const std::string& prefix,
    const std::string& key, double timeout, const Tensor<float>& q,
    const Tensor<float>& k, const Tensor<float>& v) {
  std::vector<ExecuteResult> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<v1::ExecuteRequest> requests =
          StreamOf(spec, DType::kBFloat16, r, static_cast<int>(workers.size()),
                   prefix, q, k, v);
      requests[0].mutable_header()->set_communicator_key(key);
      requests[0].mutable_header()->set_timeout_seconds(timeout);
      results[r] = Execute(workers[r]->stub(), requests);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(GpuWorkerServiceTest, SecondRequestOfAKeyReusesTheNcclCommunicator) {
  if (CudaDeviceCount() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices; this machine has "
                 << CudaDeviceCount() << "; runs on a GPU machine";
  }
  DisableNcclMulticast();
  const AttentionSpec spec = ReuseSpec();
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<GpuTestWorker>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<GpuTestWorker>(store, r));
  }
  const std::string key = "communicator/c/epoch-1/generation-1";
  std::mt19937 rng(11);
  for (int request = 0; request < 2; ++request) {
    SCOPED_TRACE(absl::StrCat("request ", request));
    const Tensor<float> q =
        Bf16Normal(rng, spec.q_len, spec.q_heads, spec.head_dim);
    const Tensor<float> k =
        Bf16Normal(rng, spec.q_len, spec.kv_heads, spec.head_dim);
    const Tensor<float> v =
        Bf16Normal(rng, spec.q_len, spec.kv_heads, spec.head_dim);
    const absl::Time start = absl::Now();
    const std::vector<ExecuteResult> results = RunKeyed(
        workers, 2, spec, absl::StrCat("reuse-", request), key, 60, q, k, v);
    std::printf("request %d over one key: %s\n", request,
                absl::FormatDuration(absl::Now() - start).c_str());
    const absl::Status checked = CheckAgainstReference(spec, q, k, v, results);
    EXPECT_TRUE(checked.ok()) << checked;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(workers[r]->service().cached_communicator_creations(), 1)
          << "rank " << r;
    }
  }
}

TEST(GpuWorkerServiceTest, RequestAfterAnAbortedKeyedRunStillWorks) {
  if (CudaDeviceCount() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices; this machine has "
                 << CudaDeviceCount() << "; runs on a GPU machine";
  }
  DisableNcclMulticast();
  const AttentionSpec spec = ReuseSpec();
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<GpuTestWorker>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<GpuTestWorker>(store, r));
  }
  std::mt19937 rng(13);
  const Tensor<float> q =
      Bf16Normal(rng, spec.q_len, spec.q_heads, spec.head_dim);
  const Tensor<float> k =
      Bf16Normal(rng, spec.q_len, spec.kv_heads, spec.head_dim);
  const Tensor<float> v =
      Bf16Normal(rng, spec.q_len, spec.kv_heads, spec.head_dim);
  const std::string key = "communicator/c/epoch-1/generation-1";
  const absl::Status first = CheckAgainstReference(
      spec, q, k, v, RunKeyed(workers, 2, spec, "abort-1", key, 60, q, k, v));
  ASSERT_TRUE(first.ok()) << first;

  // Rank 1 never runs: rank 0's transfers over the kept communicator time
  // out, it is aborted (ncclCommAbort) and the peer is reported unavailable.
  const absl::Time start = absl::Now();
  const std::vector<ExecuteResult> lonely =
      RunKeyed(workers, 1, spec, "abort-2", key, 2, q, k, v);
  EXPECT_EQ(lonely[0].status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << lonely[0].status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2 + 10));

  // The coordinator names the next generation after a failure: both ranks
  // drop what they kept and connect afresh.
  const absl::Status next = CheckAgainstReference(
      spec, q, k, v,
      RunKeyed(workers, 2, spec, "abort-3",
               "communicator/c/epoch-1/generation-2", 60, q, k, v));
  EXPECT_TRUE(next.ok()) << next;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->service().cached_communicator_creations(), 2)
        << "rank " << r;
  }
}

}  // namespace
}  // namespace ringattn
