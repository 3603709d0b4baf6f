// Resident contexts end to end: K/V uploaded once in uneven appends, queried
// with new rows (causal continuation), listed, deleted; chunks carried in a
// query's header; bad uses get precise statuses.

#include <array>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/chunking.h"
#include "gtest/gtest.h"
#include "tests/attention_checks.h"
#include "tests/test_cluster.h"

namespace ringattn {
namespace {

class Contexts : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.workers = 3});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  // A context of `n` tokens uploaded as a create and appends of the given
  // sizes.
  static void Upload(Client& client, const std::string& name,
                     const RandomInputs& in,
                     const std::vector<int64_t>& pieces) {
    int64_t at = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const View<const float> k = in.k.view().Slice(at, at + pieces[i]);
      const View<const float> v = in.v.view().Slice(at, at + pieces[i]);
      absl::StatusOr<v1::ContextInfo> info =
          i == 0 ? client.CreateContext(name, k, v)
                 : client.AppendContext(name, k, v);
      ASSERT_TRUE(info.ok()) << info.status();
      at += pieces[i];
      EXPECT_EQ(info->length(), at);
    }
  }

  static TestCluster* cluster_;
};

TestCluster* Contexts::cluster_ = nullptr;

// That `context` holds `length` rows of fp32 K and V (2 x 80 values each) over
// the 3 workers, and at most the room appends leave: an eighth more, and a
// row on each worker.
void ExpectHoldsFp32Rows(const v1::ContextInfo& context, int64_t length) {
  const int64_t row_bytes = 2 * 2 * 80 * 4;
  EXPECT_GE(context.bytes(), length * row_bytes);
  EXPECT_LE(context.bytes(),
            length * row_bytes + length * row_bytes / 8 + 3 * row_bytes);
}

AttentionSpec ContextSpec(int64_t nq, int64_t nk, bool causal) {
  AttentionSpec spec;
  spec.q_len = nq;
  spec.kv_len = nk;
  spec.q_heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 80;
  spec.causal = causal;
  return spec;
}

// Random queries for `spec` against the K/V of `context` (all of it).
RandomInputs QueryInputs(const RandomInputs& context, const AttentionSpec& spec,
                         uint32_t seed) {
  RandomInputs in = MakeRandomInputs(spec, seed);
  in.k.values() = context.k.values();
  in.v.values() = context.v.values();
  return in;
}

// The first `n` K/V rows of `all` (ContextSpec's heads), to upload as a
// context that later steps append to.
RandomInputs KvPrefix(const RandomInputs& all, int64_t n) {
  RandomInputs prefix;
  prefix.k = Tensor<float>({1, n, 2, 80});
  prefix.v = Tensor<float>({1, n, 2, 80});
  CopyView(all.k.view().Slice(0, n), prefix.k.view());
  CopyView(all.v.view().Slice(0, n), prefix.v.view());
  return prefix;
}

TEST_F(Contexts, QueriesAgainstUnevenAppendsMatchReference) {
  const int64_t n = 307;  // prime
  const RandomInputs context = MakeRandomInputs(ContextSpec(n, n, true), 21);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "book", context, {100, 37, 1, 169});
  for (int64_t nq : {1, 3, 17, 300}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE("Nq=" + std::to_string(nq) +
                   (causal ? " causal" : " dense"));
      const AttentionSpec spec = ContextSpec(nq, n, causal);
      RandomInputs in = MakeRandomInputs(spec, 30 + static_cast<uint32_t>(nq));
      in.k = Tensor<float>(context.k.shape());
      in.k.values() = context.k.values();
      in.v = Tensor<float>(context.v.shape());
      in.v.values() = context.v.values();
      absl::StatusOr<AttendResult> result =
          client->Query("book", RequestSpec(spec), in.q.view());
      ASSERT_TRUE(result.ok()) << result.status();
      ExpectMatchesReference(spec, in, *result);
    }
  }
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name(), "book");
  EXPECT_EQ((*listed)[0].length(), n);
  ExpectHoldsFp32Rows((*listed)[0], n);
  ASSERT_TRUE(client->DeleteContext("book").ok());
  absl::StatusOr<AttendResult> gone =
      client->Query("book", RequestSpec(ContextSpec(1, n, true)),
                    MakeRandomInputs(ContextSpec(1, n, true), 1).q.view());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("book"), std::string::npos);
}

TEST_F(Contexts, FewerTokensThanWorkers) {
  const RandomInputs context = MakeRandomInputs(ContextSpec(2, 2, true), 5);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "tiny", context, {1, 1});
  const AttentionSpec spec = ContextSpec(2, 2, true);
  const RandomInputs in = QueryInputs(context, spec, 6);
  absl::StatusOr<AttendResult> result =
      client->Query("tiny", RequestSpec(spec), in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_TRUE(client->DeleteContext("tiny").ok());
}

// A query that leaves kv_heads at 0 takes the context's.
TEST_F(Contexts, QueryWithoutKvHeadsTakesTheContexts) {
  const int64_t n = 41;
  const RandomInputs context = MakeRandomInputs(ContextSpec(n, n, false), 40);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "heads", context, {n});
  const AttentionSpec spec = ContextSpec(5, n, true);
  const RandomInputs in = QueryInputs(context, spec, 41);
  v1::AttentionSpec unset = RequestSpec(spec);
  unset.set_kv_heads(0);
  absl::StatusOr<AttendResult> result =
      client->Query("heads", unset, in.q.view());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectMatchesReference(spec, in, *result);
  EXPECT_TRUE(client->DeleteContext("heads").ok());
}

// Decoding: each call appends the new token's K/V and attends its query row to
// the whole context, new token included; a failed step leaves the context as it
// was.
TEST_F(Contexts, DecodeStepsAppendAndAttendInOneCall) {
  const int64_t n = 131, steps = 5;
  const RandomInputs all =
      MakeRandomInputs(ContextSpec(n + steps, n + steps, true), 50);
  std::unique_ptr<Client> client = cluster_->NewClient();
  const RandomInputs prefix = KvPrefix(all, n);
  Upload(*client, "chat", prefix, {n});
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int64_t length = n + step + 1;
    const AttentionSpec spec = ContextSpec(1, length, true);
    RandomInputs in = MakeRandomInputs(spec, 60 + static_cast<uint32_t>(step));
    CopyView(all.k.view().Slice(0, length), in.k.view());
    CopyView(all.v.view().Slice(0, length), in.v.view());
    absl::StatusOr<AttendResult> result =
        client->Query("chat", RequestSpec(spec), in.q.view(),
                      in.k.view().Slice(length - 1, length),
                      in.v.view().Slice(length - 1, length));
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectMatchesReference(spec, in, *result);
  }
  // A step whose query is malformed appends nothing.
  AttentionSpec bad = ContextSpec(1, n + steps + 1, true);
  bad.q_heads = 3;  // not a multiple of kv_heads
  const RandomInputs wrong = MakeRandomInputs(bad, 70);
  EXPECT_EQ(client
                ->Query("chat", RequestSpec(bad), wrong.q.view(),
                        wrong.k.view().Slice(0, 1), wrong.v.view().Slice(0, 1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].length(), n + steps);
  EXPECT_TRUE(client->DeleteContext("chat").ok());
}

// The total peak memory the workers reported for a request.
int64_t WorkersPeakBytes(const v1::Summary& summary) {
  int64_t total = 0;
  for (const v1::WorkerUsage& worker : summary.workers()) {
    total += worker.peak_bytes();
  }
  return total;
}

// Decode steps of every strategy against contexts uploaded in bf16 and fp32:
// a context is held at its width (bf16 takes half the bytes; the listing
// names each worker's part and its dtype), broadcast-Q and pass-Q read it in
// place (their peak memory for a query holds no copy of it), pass-KV copies
// it into ring blocks of its width, and the results match the reference on
// the same bf16 values.
TEST_F(Contexts, ContextsAreHeldAtTheirWidthAndReadInPlace) {
  const int64_t n = 223, steps = 6;
  const AttentionSpec full = ContextSpec(n + steps, n + steps, true);
  const RandomInputs all = MakeRandomInputs(full, 90, v1::BF16);
  std::unique_ptr<Client> client = cluster_->NewClient();
  const RandomInputs prefix = KvPrefix(all, n);
  for (const char* name : {"bf16", "fp32"}) {
    const v1::DType wire = std::string(name) == "bf16" ? v1::BF16 : v1::FP32;
    ASSERT_TRUE(
        client->CreateContext(name, prefix.k.view(), prefix.v.view(), wire)
            .ok());
  }
  for (int64_t step = 0; step < steps; ++step) {
    const v1::Strategy strategy =
        std::array{v1::BROADCAST_Q, v1::PASS_Q, v1::PASS_KV}[step % 3];
    SCOPED_TRACE("step " + std::to_string(step) + " " +
                 v1::Strategy_Name(strategy));
    const int64_t length = n + step + 1;
    const AttentionSpec spec = ContextSpec(1, length, true);
    RandomInputs in =
        MakeRandomInputs(spec, 91 + static_cast<uint32_t>(step), v1::BF16);
    CopyView(all.k.view().Slice(0, length), in.k.view());
    CopyView(all.v.view().Slice(0, length), in.v.view());
    int64_t peak_bytes[2] = {};
    for (int wide = 0; wide < 2; ++wide) {
      v1::AttentionSpec request = RequestSpec(spec, wide ? v1::FP32 : v1::BF16);
      request.set_strategy(strategy);
      absl::StatusOr<AttendResult> result =
          client->Query(wide ? "fp32" : "bf16", request, in.q.view(),
                        in.k.view().Slice(length - 1, length),
                        in.v.view().Slice(length - 1, length));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->summary.strategy(), strategy);
      ExpectMatchesReference(spec, in, *result);
      peak_bytes[wide] = WorkersPeakBytes(result->summary);
    }
    if (strategy == v1::PASS_KV) {
      // Its ring blocks copy the context, at the context's width: half the
      // bytes for the bf16 one.
      EXPECT_LT(peak_bytes[0], peak_bytes[1]);
    } else {
      // Less than a bf16 copy of K and V over all workers.
      EXPECT_LT(peak_bytes[0], 2 * length * 2 * 80 * 2);
      EXPECT_EQ(peak_bytes[1], peak_bytes[0]);
    }
  }
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  const v1::ContextInfo& bf16 =
      (*listed)[0].name() == "bf16" ? (*listed)[0] : (*listed)[1];
  const v1::ContextInfo& fp32 =
      (*listed)[0].name() == "bf16" ? (*listed)[1] : (*listed)[0];
  EXPECT_EQ(2 * bf16.bytes(), fp32.bytes());
  // Each worker's part, in the dtype it was uploaded in, after appends by
  // their own streams (the creation) and inside queries (the decode steps).
  for (const v1::ContextInfo* info : {&bf16, &fp32}) {
    SCOPED_TRACE(info->name());
    ASSERT_EQ(info->parts_size(), 3);
    int64_t bytes = 0;
    for (int rank = 0; rank < 3; ++rank) {
      const v1::ContextPart& part = info->parts(rank);
      EXPECT_EQ(part.rank(), rank);
      EXPECT_FALSE(part.address().empty());
      EXPECT_GT(part.bytes(), 0);
      EXPECT_EQ(part.dtype(), info == &bf16 ? v1::BF16 : v1::FP32);
      bytes += part.bytes();
    }
    EXPECT_EQ(bytes, info->bytes());
  }
  for (const char* name : {"bf16", "fp32"}) {
    EXPECT_TRUE(client->DeleteContext(name).ok());
  }
}

// Decode steps cut short by their deadline at every point (before, while and
// after the workers store the new row): a step that fails leaves the context
// as it was, with no row left behind on any worker, so the steps after it
// append and attend exactly as if it never ran. (A step can also succeed on
// the service just as its client gives up; the context then holds its row,
// and the next step shows it.)
TEST_F(Contexts, DecodeStepsThatFailMidwayLeaveTheContextAsItWas) {
  const int64_t n = 64, tries = 40;
  const RandomInputs all =
      MakeRandomInputs(ContextSpec(n + 2 * tries, n + 2 * tries, true), 80);
  std::unique_ptr<Client> client = cluster_->NewClient();
  const RandomInputs prefix = KvPrefix(all, n);
  Upload(*client, "cut", prefix, {n});
  std::vector<int64_t> held(n);  // the rows of `all` the context holds
  std::iota(held.begin(), held.end(), 0);
  int64_t next = n;  // the row of `all` the next step appends
  // The reference inputs of a step attending to `rows` of `all` (its query
  // depends on `seed` alone).
  auto inputs = [&](const std::vector<int64_t>& rows, uint32_t seed) {
    const int64_t length = static_cast<int64_t>(rows.size());
    RandomInputs in = MakeRandomInputs(ContextSpec(1, length, true), seed);
    for (int64_t i = 0; i < length; ++i) {
      CopyView(all.k.view().Slice(rows[i], rows[i] + 1),
               in.k.view().Slice(i, i + 1));
      CopyView(all.v.view().Slice(rows[i], rows[i] + 1),
               in.v.view().Slice(i, i + 1));
    }
    return in;
  };
  // Appends row `row` of `all` and attends the query of `seed`.
  auto step = [&](Client& caller, int64_t row, uint32_t seed) {
    std::vector<int64_t> rows = held;
    rows.push_back(row);
    const RandomInputs in = inputs(rows, seed);
    return caller.Query("cut", RequestSpec(ContextSpec(1, rows.size(), true)),
                        in.q.view(), all.k.view().Slice(row, row + 1),
                        all.v.view().Slice(row, row + 1));
  };
  int failed = 0;
  for (int64_t i = 0; i < tries; ++i) {
    SCOPED_TRACE("try " + std::to_string(i));
    ClientOptions options;
    options.deadline = absl::Microseconds(250 * (1 + i % 16));
    const int64_t row = next++;
    const uint32_t seed = 100 + static_cast<uint32_t>(row);
    absl::StatusOr<AttendResult> cut =
        step(*cluster_->NewClient(options), row, seed);
    if (cut.ok()) {
      held.push_back(row);
      ExpectMatchesReference(ContextSpec(1, held.size(), true),
                             inputs(held, seed), *cut);
      continue;
    }
    ++failed;
    EXPECT_TRUE(absl::IsDeadlineExceeded(cut.status()) ||
                absl::IsAborted(cut.status()))
        << cut.status();
    // The next step waits out the failed one (ABORTED while that still holds
    // the context), then shows what the context holds.
    const int64_t again = next++;
    const uint32_t again_seed = 100 + static_cast<uint32_t>(again);
    absl::StatusOr<AttendResult> result;
    do {
      result = step(*client, again, again_seed);
    } while (absl::IsAborted(result.status()));
    ASSERT_TRUE(result.ok()) << result.status();
    absl::StatusOr<std::vector<v1::ContextInfo>> listed =
        client->ListContexts();
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 1u);
    const int64_t length = (*listed)[0].length();
    if (length == static_cast<int64_t>(held.size()) + 2) held.push_back(row);
    held.push_back(again);
    ASSERT_EQ(length, static_cast<int64_t>(held.size()));
    ExpectHoldsFp32Rows((*listed)[0], length);
    ExpectMatchesReference(ContextSpec(1, length, true),
                           inputs(held, again_seed), *result);
  }
  EXPECT_GT(failed, 0) << "no step was cut short; shorten the deadlines";
  EXPECT_TRUE(client->DeleteContext("cut").ok());
}

// Q rows [begin, end) of `q` (fp32 on the wire) as a chunk.
v1::TensorChunk QueryRows(const Tensor<float>& q, int64_t begin, int64_t end) {
  const int64_t row_values = q.shape().heads * q.shape().dim;
  v1::TensorChunk chunk;
  chunk.set_tensor(v1::Q);
  chunk.set_token_offset(begin);
  chunk.set_token_count(end - begin);
  chunk.set_data(reinterpret_cast<const char*>(q.view().Row(0, begin, 0)),
                 (end - begin) * row_values * sizeof(float));
  return chunk;
}

std::unique_ptr<v1::Attention::Stub> RawStub(const TestCluster& cluster,
                                             grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  return v1::Attention::NewStub(grpc::CreateChannel(
      cluster.target(), grpc::InsecureChannelCredentials()));
}

// A Query header for context `name` that carries `carried`.
v1::QueryRequest CarryingHeader(const std::string& name,
                                const AttentionSpec& spec,
                                std::vector<v1::TensorChunk> carried) {
  v1::QueryRequest header;
  header.mutable_header()->set_context(name);
  *header.mutable_header()->mutable_spec() = RequestSpec(spec);
  for (v1::TensorChunk& chunk : carried) {
    *header.mutable_header()->add_chunks() = std::move(chunk);
  }
  return header;
}

// The output and LSE a Query or QueryOnce call's `stream` returns (fp32,
// batch 1), put together and checked by the client library's
// OutputAssembler; the call's status.
template <typename Stream>
grpc::Status ReadQueryOutput(Stream& stream, const AttentionSpec& spec,
                             AttendResult& result) {
  OutputAssembler output({1, spec.q_len, spec.q_heads, spec.head_dim},
                         /*with_lse=*/true);
  v1::AttendResponse response;
  while (stream.Read(&response)) {
    if (!response.has_output()) continue;
    const absl::Status added = output.Add(response.output());
    EXPECT_TRUE(added.ok()) << added;
  }
  const grpc::Status status = stream.Finish();
  if (status.ok()) {
    const absl::Status complete = output.CheckComplete();
    EXPECT_TRUE(complete.ok()) << complete;
  }
  result.output = std::move(output.output());
  result.lse = std::move(output.lse());
  return status;
}

// A raw Query call whose header carries `carried` and whose stream then
// brings `streamed`.
grpc::Status RawQuery(const TestCluster& cluster, const std::string& name,
                      const AttentionSpec& spec,
                      std::vector<v1::TensorChunk> carried,
                      std::vector<v1::TensorChunk> streamed,
                      AttendResult& result) {
  grpc::ClientContext context;
  auto stub = RawStub(cluster, context);
  auto stream = stub->Query(&context);
  bool open = stream->Write(CarryingHeader(name, spec, std::move(carried)));
  for (v1::TensorChunk& chunk : streamed) {
    v1::QueryRequest message;
    *message.mutable_chunk() = std::move(chunk);
    open = open && stream->Write(message);
  }
  if (open) stream->WritesDone();
  return ReadQueryOutput(*stream, spec, result);
}

// A raw QueryOnce call of `request`.
grpc::Status RawQueryOnce(const TestCluster& cluster,
                          const v1::QueryRequest& request,
                          const AttentionSpec& spec, AttendResult& result) {
  grpc::ClientContext context;
  auto stub = RawStub(cluster, context);
  auto reader = stub->QueryOnce(&context, request);
  return ReadQueryOutput(*reader, spec, result);
}

// A small query goes up as one message, its chunks carried in the header;
// the coordinator takes them as if each had come on its own, before the
// stream's own chunk messages, with the same checks.
TEST_F(Contexts, HeaderCarriesChunksBesideStreamedOnes) {
  const int64_t n = 53;
  const RandomInputs context = MakeRandomInputs(ContextSpec(n, n, true), 90);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "carried", context, {n});
  const AttentionSpec spec = ContextSpec(9, n, true);
  const RandomInputs in = QueryInputs(context, spec, 91);
  AttendResult result;
  const grpc::Status mixed =
      RawQuery(*cluster_, "carried", spec,
               {QueryRows(in.q, 0, 2), QueryRows(in.q, 2, 5)},
               {QueryRows(in.q, 5, 9)}, result);
  ASSERT_TRUE(mixed.ok()) << mixed.error_message();
  ExpectMatchesReference(spec, in, result);
  const grpc::Status all_carried =
      RawQuery(*cluster_, "carried", spec, {QueryRows(in.q, 0, 9)}, {}, result);
  ASSERT_TRUE(all_carried.ok()) << all_carried.error_message();
  ExpectMatchesReference(spec, in, result);

  const grpc::Status twice =
      RawQuery(*cluster_, "carried", spec, {QueryRows(in.q, 0, 5)},
               {QueryRows(in.q, 4, 9)}, result);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(twice.error_message().find("already sent"), std::string::npos)
      << twice.error_message();
  const grpc::Status missing =
      RawQuery(*cluster_, "carried", spec, {QueryRows(in.q, 0, 5)}, {}, result);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << missing.error_message();
  EXPECT_TRUE(client->DeleteContext("carried").ok());
}

// QueryOnce: the whole query in one message, on a call without a request
// stream, answered as Query answers it.
TEST_F(Contexts, QueryOnceAnswersAsQueryDoes) {
  const int64_t n = 61;
  const RandomInputs context = MakeRandomInputs(ContextSpec(n, n, true), 92);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "once", context, {n});
  const AttentionSpec spec = ContextSpec(7, n, true);
  const RandomInputs in = QueryInputs(context, spec, 93);
  AttendResult once;
  const grpc::Status ok = RawQueryOnce(
      *cluster_, CarryingHeader("once", spec, {QueryRows(in.q, 0, 7)}), spec,
      once);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ExpectMatchesReference(spec, in, once);

  AttendResult failed;
  const grpc::Status missing = RawQueryOnce(
      *cluster_, CarryingHeader("once", spec, {QueryRows(in.q, 0, 4)}), spec,
      failed);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << missing.error_message();
  const grpc::Status unknown = RawQueryOnce(
      *cluster_, CarryingHeader("nowhere", spec, {QueryRows(in.q, 0, 7)}), spec,
      failed);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND)
      << unknown.error_message();
  v1::QueryRequest chunk_alone;
  *chunk_alone.mutable_chunk() = QueryRows(in.q, 0, 7);
  const grpc::Status headless =
      RawQueryOnce(*cluster_, chunk_alone, spec, failed);
  EXPECT_EQ(headless.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << headless.error_message();
  EXPECT_TRUE(client->DeleteContext("once").ok());
}

TEST_F(Contexts, BadUsesGetPreciseStatuses) {
  const RandomInputs context = MakeRandomInputs(ContextSpec(20, 20, true), 7);
  std::unique_ptr<Client> client = cluster_->NewClient();
  Upload(*client, "c", context, {20});
  EXPECT_EQ(client->CreateContext("c", context.k.view(), context.v.view())
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client->AppendContext("nope", context.k.view(), context.v.view())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // Another number of heads than the context holds.
  AttentionSpec spec = ContextSpec(4, 20, true);
  spec.kv_heads = 4;
  const RandomInputs wrong = MakeRandomInputs(spec, 8);
  absl::StatusOr<AttendResult> result =
      client->Query("c", RequestSpec(spec), wrong.q.view());
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("kv_heads"), std::string::npos)
      << result.status();
  absl::StatusOr<v1::ContextInfo> other_heads =
      client->AppendContext("c", wrong.k.view(), wrong.v.view());
  EXPECT_EQ(other_heads.status().code(), absl::StatusCode::kInvalidArgument)
      << other_heads.status();
  // A failed append leaves the context as it was.
  absl::StatusOr<std::vector<v1::ContextInfo>> listed = client->ListContexts();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed)[0].length(), 20);
  EXPECT_TRUE(client->DeleteContext("c").ok());
  EXPECT_EQ(client->DeleteContext("c").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ringattn
