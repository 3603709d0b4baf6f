// service_bench: one-shot Attend requests through a running ringattn service,
// end to end, with inputs too large for the client's memory. Q, K and V are
// generated row by row as they stream out (each row a window of a fixed pool
// of random bf16 values, chosen by a hash of its tensor and position), the
// output streams back into a consumer that keeps only sampled rows, and those
// rows are checked against a float64 reference computed from the same
// generator. Prints a Markdown table: time end to end, the workers' own
// compute time, upload and download rates, and the service's overhead.
// With --decode_steps it uploads each length as a resident context instead and
// times decode steps against it, then (--query_rows) queries of given sizes.
//
//   service_bench --target=127.0.0.1:50051 --lengths=262144,1048576 --causal
//   service_bench --lengths=1048576 --kv_heads=8 --decode_steps=100
//       --query_rows=1,16,256
//   service_bench --lengths=65536 --upload_only
//
// --round_trips=N first prints the p50 and p99 of N GetClusterInfo calls.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/service/quantile.h"
#include "client/chunking.h"
#include "client/client.h"
#include "core/dtype.h"
#include "core/large_buffers.h"
#include "core/tensor.h"
#include "proto/spec_conversion.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "the coordinator");
ABSL_FLAG(std::string, lengths, "262144",
          "K/V lengths (and Q lengths unless --q_len), comma-separated");
ABSL_FLAG(int64_t, q_len, 0,
          "query rows (0: as many as K/V); causal is bottom-right aligned");
ABSL_FLAG(int64_t, heads, 32, "query heads");
ABSL_FLAG(int64_t, kv_heads, 32, "K/V heads");
ABSL_FLAG(int64_t, dim, 128, "head dim");
ABSL_FLAG(bool, causal, true, "causal attention");
ABSL_FLAG(int, check_rows, 4, "output rows checked against float64");
ABSL_FLAG(int64_t, chunk_bytes, 4 << 20, "bytes per uploaded chunk");
ABSL_FLAG(int, threads, 0, "reference threads (0: all cores)");
ABSL_FLAG(int, upload_streams, 0,
          "streams each request (one-shot or query) uploads over "
          "(ClientOptions.upload_streams; 0, the client's default: four "
          "from 8 MiB, else one)");
ABSL_FLAG(int, download_streams, 0,
          "streams each request's output comes back over "
          "(ClientOptions.download_streams; 0, the client's default: four "
          "from 8 MiB, else one)");
ABSL_FLAG(int, decode_steps, 0,
          "instead of one-shot requests: upload each length as a resident "
          "context, then time this many decode steps (1 query row, 1 new K/V "
          "row each) against it");
ABSL_FLAG(std::string, query_rows, "",
          "with --decode_steps: also time queries of these many rows "
          "(comma-separated, no rows appended) against each context");
ABSL_FLAG(int, query_repeats, 10, "how often each --query_rows query runs");
ABSL_FLAG(bool, query_fp32_tensors, false,
          "send --query_rows queries as fp32 tensors through Client::Query "
          "(the client narrows Q to bf16 and widens O to fp32) instead of as "
          "bf16 chunks through Client::QueryStreaming, as a caller holding "
          "bf16 rows sends them");
ABSL_FLAG(bool, query_timeline, false,
          "with --query_rows: write a line to stderr per timed query: its "
          "request id, and when the client began it, took its first output and "
          "was done (local time, stamped as the processes' logs stamp theirs; "
          "bench/service/query_phases.py joins them)");
ABSL_FLAG(std::string, query_output_dtype, "BF16",
          "the dtype O of decode steps and --query_rows queries comes back in "
          "(FP32, FP16 or BF16; before the twenty-second session: FP32)");
ABSL_FLAG(std::string, query_strategies, "STRATEGY_AUTO",
          "with --query_rows: the strategies each query size runs with "
          "(comma-separated: STRATEGY_AUTO, PASS_KV, PASS_Q, BROADCAST_Q, each "
          "optionally with /MERGE_AT_COORDINATOR or /MERGE_ON_WORKERS: where "
          "broadcast-Q merges its partials)");
ABSL_FLAG(bool, upload_only, false,
          "upload each length as a resident context, print the upload rate "
          "and delete it again (no decode steps, no queries)");
ABSL_FLAG(int, round_trips, 0,
          "first time this many GetClusterInfo calls: the gRPC round trip "
          "to the coordinator, the floor under every request");
ABSL_FLAG(int, wait_ready_seconds, 0,
          "how long to wait for the cluster to become ready");

namespace ringattn {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A pool of random bf16 values; every token row of every tensor is a window
// of it, so rows are cheap to make and to make again.
class RowPool {
 public:
  RowPool(int64_t values, uint64_t seed) : bits_(values), floats_(values) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (int64_t i = 0; i < values; ++i) {
      bits_[i] = FloatToBFloat16(uniform(rng));
      floats_[i] = BFloat16ToFloat(bits_[i]);
    }
  }

  // The first value of row `row` (of `row_values` values) of tensor `tensor`.
  int64_t Offset(int tensor, int64_t row, int64_t row_values) const {
    uint64_t h =
        (static_cast<uint64_t>(row) << 2 | tensor) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return static_cast<int64_t>(
        h % static_cast<uint64_t>(bits_.size() - row_values));
  }
  const uint16_t* Bits(int tensor, int64_t row, int64_t row_values) const {
    return bits_.data() + Offset(tensor, row, row_values);
  }
  const float* Floats(int tensor, int64_t row, int64_t row_values) const {
    return floats_.data() + Offset(tensor, row, row_values);
  }

 private:
  std::vector<uint16_t> bits_;
  std::vector<float> floats_;
};

struct Shapes {
  int64_t nq, n, hq, hkv, d;
  bool causal;
  int64_t RowValues(int tensor) const { return (tensor == 0 ? hq : hkv) * d; }
};

// The chunks of Q, K and V (batch 1, bf16), generated as they go, in order
// or any chunk on demand (so that upload streams fill theirs in parallel);
// those of tensors [first_tensor, end_tensor) (1 to 3: only K and V, a
// context's upload; 0 to 1: only Q, a query's).
class GeneratedSource : public ChunkSource {
 public:
  GeneratedSource(const RowPool& pool, const Shapes& shapes,
                  int64_t chunk_bytes, int first_tensor = 0, int end_tensor = 3)
      : pool_(pool), shapes_(shapes) {
    for (int tensor = first_tensor; tensor < end_tensor; ++tensor) {
      total_bytes_ += 2 * Length(tensor) * shapes_.RowValues(tensor);
    }
    // Cut as the client's own ChunkStream cuts.
    const int64_t most_bytes = SplitChunkBytes(chunk_bytes, total_bytes_);
    for (int tensor = first_tensor; tensor < end_tensor; ++tensor) {
      const int64_t length = Length(tensor);
      const int64_t rows =
          std::max<int64_t>(1, most_bytes / (2 * shapes_.RowValues(tensor)));
      for (int64_t row = 0; row < length; row += rows) {
        places_.push_back({tensor, row, std::min(rows, length - row)});
      }
    }
  }

  bool Next(v1::TensorChunk* chunk) override {
    if (next_ == chunk_count()) return false;
    Fill(next_++, chunk);
    return true;
  }

  int64_t total_bytes() const override { return total_bytes_; }

  int64_t chunk_count() override {
    return static_cast<int64_t>(places_.size());
  }

  void Fill(int64_t index, v1::TensorChunk* chunk) const override {
    const Place& place = places_[static_cast<size_t>(index)];
    const int64_t row_values = shapes_.RowValues(place.tensor);
    chunk->set_tensor(static_cast<v1::TensorName>(place.tensor + 1));
    chunk->set_batch(0);
    chunk->set_token_offset(place.row);
    chunk->set_token_count(place.rows);
    std::string* data = chunk->mutable_data();
    data->resize(static_cast<size_t>(place.rows * row_values * 2));
    for (int64_t i = 0; i < place.rows; ++i) {
      std::memcpy(&(*data)[i * row_values * 2],
                  pool_.Bits(place.tensor, place.row + i, row_values),
                  row_values * 2);
    }
    if (filled_.fetch_add(1) + 1 == static_cast<int64_t>(places_.size())) {
      done_ticks_ = Clock::now().time_since_epoch().count();
    }
  }

  // When the last chunk was made.
  Clock::time_point done() const {
    return Clock::time_point(Clock::duration(done_ticks_.load()));
  }

 private:
  // A chunk: rows [row, row + rows) of tensor 0 (Q), 1 (K) or 2 (V).
  struct Place {
    int tensor = 0;
    int64_t row = 0;
    int64_t rows = 0;
  };

  int64_t Length(int tensor) const {
    return tensor == 0 ? shapes_.nq : shapes_.n;
  }

  const RowPool& pool_;
  const Shapes shapes_;
  int64_t total_bytes_ = 0;
  std::vector<Place> places_;
  int64_t next_ = 0;
  mutable std::atomic<int64_t> filled_{0};
  mutable std::atomic<Clock::rep> done_ticks_{0};
};

// Float64 attention of the query rows `rows` against all keys, from the pool:
// [rows.size(), hq, d]. Threads split the keys and merge by LSE.
std::vector<double> Reference(const RowPool& pool, const Shapes& s,
                              const std::vector<int64_t>& rows, int threads) {
  const size_t r = rows.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  const int64_t group = s.hq / s.hkv;
  struct Partial {
    std::vector<double> m, l, acc;  // [r, hq], [r, hq], [r, hq, d]
  };
  std::vector<Partial> parts(threads);
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t) {
    pool_threads.emplace_back([&, t] {
      Partial& p = parts[t];
      p.m.assign(r * s.hq, -INFINITY);
      p.l.assign(r * s.hq, 0.0);
      p.acc.assign(r * s.hq * s.d, 0.0);
      const int64_t begin = s.n * t / threads, end = s.n * (t + 1) / threads;
      for (int64_t j = begin; j < end; ++j) {
        const float* k = pool.Floats(1, j, s.RowValues(1));
        const float* v = pool.Floats(2, j, s.RowValues(2));
        for (size_t i = 0; i < r; ++i) {
          if (s.causal && j > rows[i] + s.n - s.nq) continue;
          const float* q = pool.Floats(0, rows[i], s.RowValues(0));
          for (int64_t h = 0; h < s.hq; ++h) {
            const float* qh = q + h * s.d;
            const float* kh = k + (h / group) * s.d;
            double dot = 0;
            for (int64_t x = 0; x < s.d; ++x) dot += double{qh[x]} * kh[x];
            dot *= scale;
            const size_t at = i * s.hq + h;
            double* acc = &p.acc[at * s.d];
            if (dot > p.m[at]) {
              const double c = std::exp(p.m[at] - dot);
              p.l[at] *= c;
              for (int64_t x = 0; x < s.d; ++x) acc[x] *= c;
              p.m[at] = dot;
            }
            const double w = std::exp(dot - p.m[at]);
            p.l[at] += w;
            const float* vh = v + (h / group) * s.d;
            for (int64_t x = 0; x < s.d; ++x) acc[x] += w * vh[x];
          }
        }
      }
    });
  }
  for (std::thread& t : pool_threads) t.join();
  std::vector<double> out(r * s.hq * s.d, 0.0);
  for (size_t at = 0; at < r * s.hq; ++at) {
    double m = -INFINITY;
    for (const Partial& p : parts) m = std::max(m, p.m[at]);
    double l = 0;
    for (const Partial& p : parts) {
      if (p.m[at] == -INFINITY) continue;
      const double c = std::exp(p.m[at] - m);
      l += p.l[at] * c;
      for (int64_t x = 0; x < s.d; ++x) {
        out[at * s.d + x] += p.acc[at * s.d + x] * c;
      }
    }
    // A row that sees no key is 0 (DESIGN.md).
    if (l == 0) continue;
    for (int64_t x = 0; x < s.d; ++x) out[at * s.d + x] /= l;
  }
  return out;
}

double PhaseSeconds(const v1::Summary& summary, const std::string& phase) {
  for (const v1::PhaseTiming& t : summary.timings()) {
    if (t.phase() == phase) return t.seconds();
  }
  return 0;
}

// Row `row` of tensor `tensor` from the pool as a [1, 1, heads, d] fp32
// tensor (exactly its bf16 values).
Tensor<float> PoolRow(const RowPool& pool, const Shapes& s, int tensor,
                      int64_t row) {
  const int64_t values = s.RowValues(tensor);
  Tensor<float> t(Shape{1, 1, values / s.d, s.d});
  std::memcpy(t.data(), pool.Floats(tensor, row, values),
              sizeof(float) * values);
  return t;
}

// Times `calls` GetClusterInfo round trips; prints their p50 and p99.
bool TimeRoundTrips(Client& client, int calls) {
  std::vector<double> ms;
  for (int i = 0; i < calls; ++i) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::ClusterInfo> info = client.GetClusterInfo();
    if (!info.ok()) {
      std::fprintf(stderr, "GetClusterInfo: %s\n",
                   info.status().ToString().c_str());
      return false;
    }
    ms.push_back(1e3 * Seconds(start, Clock::now()));
  }
  const double p50 = Quantile(ms, 0.5);
  std::printf(
      "gRPC round trip to the coordinator (GetClusterInfo, %d calls): p50 "
      "%.3f ms, p99 %.3f ms\n\n",
      calls, p50, Quantile(ms, 0.99));
  std::fflush(stdout);
  return true;
}

// How far output rows are from float64: the largest error relative to its
// row's RMS, and whether every value is within the tolerance. That is 3e-2 of
// the row's RMS (bf16 inputs, bf16 tiles merged in fp32: a few bf16 ulps)
// plus what rounding the value to the output dtype may cost, half a unit in
// its last place (2^-8 of it in bf16, 2^-11 in fp16, none to speak of in
// fp32): a bf16 output may round each value of a row that is right to 3e-2
// by another 0.4%, which at a row's largest values is 1-1.5% of its RMS.
struct RowCheck {
  double error = 0;
  bool ok = true;
};

double OutputRounding(v1::DType output_dtype) {
  switch (output_dtype) {
    case v1::BF16:
      return std::ldexp(1.0, -8);
    case v1::FP16:
      return std::ldexp(1.0, -11);
    default:
      return 0;
  }
}

// Checks `got` against `want`, rows of `row_values` values each; a row whose
// reference is all 0 (it sees no key) is held to 0 absolutely.
RowCheck CheckRows(const std::vector<double>& want, const float* got,
                   int64_t row_values, v1::DType output_dtype) {
  constexpr double kTolerance = 3e-2;
  const double rounding = OutputRounding(output_dtype);
  RowCheck check;
  for (size_t row = 0; row * row_values < want.size(); ++row) {
    const double* w = &want[row * row_values];
    const float* g = got + row * row_values;
    double rms = 0;
    for (int64_t x = 0; x < row_values; ++x) rms += w[x] * w[x];
    rms = std::sqrt(rms / row_values);
    const double unit = rms > 0 ? rms : 1;
    for (int64_t x = 0; x < row_values; ++x) {
      const double err = std::abs(g[x] - w[x]);
      if (std::isnan(err)) {
        check.error = INFINITY;
        check.ok = false;
        continue;
      }
      check.error = std::max(check.error, err / unit);
      if (err > kTolerance * unit + rounding * std::abs(w[x])) check.ok = false;
    }
  }
  return check;
}

// Row 0 of a query of `nq` causal rows against `n` keys, checked.
RowCheck CheckRowZero(const RowPool& pool, Shapes s, int64_t n, int64_t nq,
                      const float* row, v1::DType output_dtype, int threads) {
  s.nq = nq;
  s.n = n;
  return CheckRows(Reference(pool, s, {0}, threads), row, s.RowValues(0),
                   output_dtype);
}

// The compute seconds of the request's slowest worker.
double SlowestWorkerCompute(const v1::Summary& summary) {
  double slowest = 0;
  for (const v1::WorkerUsage& w : summary.workers()) {
    slowest = std::max(slowest, w.compute_seconds());
  }
  return slowest;
}

// The dtype --query_output_dtype names, if it names one (Run checks first).
std::optional<v1::DType> QueryOutputDType() {
  v1::DType dtype;
  if (!v1::DType_Parse(absl::GetFlag(FLAGS_query_output_dtype), &dtype) ||
      dtype == v1::DTYPE_UNSPECIFIED) {
    return std::nullopt;
  }
  return dtype;
}

// How a timed query asks to run: its strategy and, for broadcast-Q, where its
// partials merge.
struct QueryChoice {
  v1::Strategy strategy = v1::STRATEGY_AUTO;
  v1::PartialMerge merge = v1::MERGE_AUTO;
};

// One query of `spec` against context `name`: through QueryStreaming, its Q
// rows made from the pool as bf16 chunks and O's row 0 kept, widened, in
// `row0`; or with `q`, through Query with fp32 tensors (narrowed and widened
// by the client), O's row 0 then copied into `row0`.
absl::StatusOr<v1::Summary> SendQuery(
    Client& client, const RowPool& pool, Shapes s, const std::string& name,
    const v1::AttentionSpec& spec, int64_t chunk_bytes, const Tensor<float>* q,
    std::vector<float>& row0, absl::Time& first_output) {
  const int64_t row_values = s.RowValues(0);
  if (q != nullptr) {
    absl::StatusOr<AttendResult> result = client.Query(name, spec, q->view());
    if (!result.ok()) return result.status();
    std::memcpy(row0.data(), result->output.values().data(),
                sizeof(float) * row_values);
    return result->summary;
  }
  s.nq = spec.q_len();
  GeneratedSource source(pool, s, chunk_bytes, /*first_tensor=*/0,
                         /*end_tensor=*/1);
  absl::StatusOr<DType> dtype = DTypeFromProto(spec.output_dtype());
  if (!dtype.ok()) return dtype.status();
  return client.QueryStreaming(
      name, spec, source, [&](const v1::OutputChunk& chunk) {
        if (first_output == absl::InfiniteFuture()) first_output = absl::Now();
        if (chunk.batch() == 0 && chunk.token_offset() == 0) {
          ConvertToFloat(*dtype, chunk.data().data(), row0.data(), row_values);
        }
        return absl::OkStatus();
      });
}

// `t` as the processes' logs stamp their lines (local time, microseconds), or
// "-" for InfiniteFuture (never).
std::string LogStamp(absl::Time t) {
  if (t == absl::InfiniteFuture()) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%E6S", t, absl::LocalTimeZone());
}

// Times `repeats` queries of `nq` rows (rows of the pool) against context
// `name` of `n` tokens, no rows appended, sent as bf16 chunks
// (QueryStreaming) or, with `fp32_tensors`, as fp32 tensors (Query); returns
// a table row (p50 end to end, inside the coordinator and the slowest
// worker's compute, and the share of the time spent outside the GPUs), or the
// failure.
std::string TimeQueries(Client& client, const RowPool& pool, const Shapes& s,
                        const std::string& name, int64_t n, int64_t nq,
                        const QueryChoice& choice, int repeats,
                        int64_t chunk_bytes, bool fp32_tensors, int threads) {
  std::optional<Tensor<float>> q;
  if (fp32_tensors) {
    q.emplace(Shape{1, nq, s.hq, s.d});
    for (int64_t i = 0; i < nq; ++i) {
      std::memcpy(q->view().Row(0, i, 0), pool.Floats(0, i, s.RowValues(0)),
                  sizeof(float) * s.RowValues(0));
    }
  }
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_q_len(nq);
  spec.set_q_heads(s.hq);
  spec.set_kv_heads(s.hkv);
  spec.set_head_dim(s.d);
  spec.set_causal(s.causal);
  spec.set_wire_dtype(v1::BF16);
  spec.set_output_dtype(*QueryOutputDType());
  spec.set_strategy(choice.strategy);
  spec.set_partial_merge(choice.merge);
  std::vector<double> latencies, coordinator, computes;
  std::vector<float> row0(s.RowValues(0), NAN);
  absl::StatusOr<v1::Summary> summary;
  for (int i = 0; i < repeats; ++i) {
    const Clock::time_point begin = Clock::now();
    const absl::Time began = absl::Now();
    absl::Time first_output = absl::InfiniteFuture();
    summary = SendQuery(client, pool, s, name, spec, chunk_bytes,
                        q.has_value() ? &*q : nullptr, row0, first_output);
    if (!summary.ok()) {
      return absl::StrCat("| ", n, " | ", nq,
                          " | failed: ", summary.status().ToString(), " |");
    }
    if (absl::GetFlag(FLAGS_query_timeline)) {
      std::fprintf(stderr,
                   "timeline: request %s: %lld rows; began %s, first output "
                   "%s, done %s\n",
                   summary->request_id().c_str(), static_cast<long long>(nq),
                   LogStamp(began).c_str(), LogStamp(first_output).c_str(),
                   LogStamp(absl::Now()).c_str());
    }
    latencies.push_back(Seconds(begin, Clock::now()));
    coordinator.push_back(summary->seconds());
    computes.push_back(SlowestWorkerCompute(*summary));
  }
  const RowCheck check =
      CheckRowZero(pool, s, n, nq, row0.data(), *QueryOutputDType(), threads);
  const double bytes = 2.0 * n * s.hkv * s.d * 2;
  const double compute = Quantile(computes, 0.5);
  const double latency = Quantile(latencies, 0.5);
  std::string ran = v1::Strategy_Name(summary->strategy());
  if (summary->strategy() == v1::BROADCAST_Q) {
    absl::StrAppend(&ran, "/", v1::PartialMerge_Name(summary->partial_merge()));
  }
  return absl::StrFormat(
      "| %d | %d | %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f%% | %.2g | %s "
      "|",
      n, nq, ran, 1e3 * latency, 1e3 * Quantile(latencies, 0.99),
      1e3 * Quantile(coordinator, 0.5), 1e3 * compute,
      compute > 0 ? bytes / compute / 1e9 : 0.0, 100 * (1 - compute / latency),
      check.error, check.ok ? "ok" : "FAILED");
}

// Uploads `s.n` K/V rows as context `name`, then runs `steps` decode steps
// against it (each: query row 0 of the pool and the next K/V row, appended
// and attended in one call), and checks the last step against float64. Prints
// one table row; false if anything failed. Then times queries of each of
// `query_rows` rows with each of `choices`, adding a line to `query_lines`
// for each. With no steps it only uploads: the row says how fast, and the
// context is deleted.
bool RunDecodeSteps(Client& client, const RowPool& pool, Shapes s, int steps,
                    int64_t chunk_bytes, int threads,
                    const std::vector<int64_t>& query_rows,
                    const std::vector<QueryChoice>& choices,
                    std::vector<std::string>& query_lines) {
  const std::string name = absl::StrCat("service-bench-", s.n);
  client.DeleteContext(name).IgnoreError();
  v1::ContextHeader header;
  header.set_name(name);
  header.set_batch(1);
  header.set_kv_heads(s.hkv);
  header.set_head_dim(s.d);
  header.set_length(s.n);
  header.set_wire_dtype(v1::BF16);
  GeneratedSource source(pool, s, chunk_bytes, /*first_tensor=*/1);
  const Clock::time_point start = Clock::now();
  absl::StatusOr<v1::ContextInfo> info =
      client.UploadContextStreaming(/*create=*/true, header, source);
  const double upload = Seconds(start, Clock::now());
  if (!info.ok()) {
    std::printf("| %lld | failed: %s |\n", static_cast<long long>(s.n),
                info.status().ToString().c_str());
    return false;
  }
  if (steps == 0) {
    client.DeleteContext(name).IgnoreError();
    std::printf("| %lld | %.2f | %.2f | 0 | | | | | | | | | |\n",
                static_cast<long long>(s.n), info->bytes() / 1e9,
                info->bytes() / 1e9 / upload);
    std::fflush(stdout);
    return true;
  }
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_q_len(1);
  spec.set_q_heads(s.hq);
  spec.set_kv_heads(s.hkv);
  spec.set_head_dim(s.d);
  spec.set_causal(s.causal);
  spec.set_wire_dtype(v1::BF16);
  spec.set_output_dtype(*QueryOutputDType());
  const Tensor<float> q = PoolRow(pool, s, 0, 0);
  // Where a step's time goes: end to end at the client, inside the
  // coordinator (header read to summary written), waiting for the workers
  // (its compute phase), and the slowest worker's own compute.
  std::vector<double> latencies, coordinator, waiting, computes;
  absl::StatusOr<AttendResult> result;
  std::string strategy;
  for (int step = 0; step < steps; ++step) {
    const Tensor<float> k = PoolRow(pool, s, 1, s.n + step);
    const Tensor<float> v = PoolRow(pool, s, 2, s.n + step);
    const Clock::time_point begin = Clock::now();
    result = client.Query(name, spec, q.view(), k.view(), v.view());
    latencies.push_back(Seconds(begin, Clock::now()));
    if (!result.ok()) break;
    strategy = v1::Strategy_Name(result->summary.strategy());
    coordinator.push_back(result->summary.seconds());
    for (const v1::PhaseTiming& timing : result->summary.timings()) {
      if (timing.phase() == "compute") waiting.push_back(timing.seconds());
    }
    computes.push_back(SlowestWorkerCompute(result->summary));
  }
  if (result.ok()) {
    for (int64_t nq : query_rows) {
      for (const QueryChoice& choice : choices) {
        query_lines.push_back(
            TimeQueries(client, pool, s, name, s.n + steps, nq, choice,
                        absl::GetFlag(FLAGS_query_repeats), chunk_bytes,
                        absl::GetFlag(FLAGS_query_fp32_tensors), threads));
      }
    }
  }
  client.DeleteContext(name).IgnoreError();
  if (!result.ok()) {
    std::printf("| %lld | failed: %s |\n", static_cast<long long>(s.n),
                result.status().ToString().c_str());
    return false;
  }
  // The last step's query row saw every key: the context and the new rows.
  const RowCheck check =
      CheckRowZero(pool, s, s.n + steps, 1, result->output.values().data(),
                   *QueryOutputDType(), threads);
  std::printf(
      "| %lld | %.2f | %.2f | %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | "
      "%.2f | %.2g | %s |\n",
      static_cast<long long>(s.n), info->bytes() / 1e9,
      info->bytes() / 1e9 / upload, steps, strategy.c_str(),
      1e3 * Quantile(latencies, 0.5), 1e3 * Quantile(latencies, 0.99),
      1e3 * Quantile(latencies, 1.0), 1e3 * Quantile(coordinator, 0.5),
      1e3 * Quantile(waiting, 0.5), 1e3 * Quantile(computes, 0.5), check.error,
      check.ok ? "ok" : "FAILED");
  std::fflush(stdout);
  return check.ok;
}

int Run() {
  const Shapes base{0,
                    0,
                    absl::GetFlag(FLAGS_heads),
                    absl::GetFlag(FLAGS_kv_heads),
                    absl::GetFlag(FLAGS_dim),
                    absl::GetFlag(FLAGS_causal)};
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (!QueryOutputDType().has_value()) {
    std::fprintf(stderr, "--query_output_dtype must be FP32, FP16 or BF16\n");
    return 2;
  }
  const RowPool pool(int64_t{1} << 24, 2026);
  ClientOptions options;
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.upload_streams = absl::GetFlag(FLAGS_upload_streams);
  options.download_streams = absl::GetFlag(FLAGS_download_streams);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::GetFlag(FLAGS_target), options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  const Clock::time_point give_up =
      Clock::now() +
      std::chrono::seconds(absl::GetFlag(FLAGS_wait_ready_seconds));
  for (;;) {
    absl::StatusOr<v1::ClusterInfo> info = (*client)->GetClusterInfo();
    if (info.ok() && info->ready()) break;
    if (Clock::now() >= give_up) {
      std::fprintf(
          stderr, "the cluster is not ready: %s\n",
          info.ok() ? "workers missing" : info.status().ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (const int calls = absl::GetFlag(FLAGS_round_trips);
      calls > 0 && !TimeRoundTrips(**client, calls)) {
    return 1;
  }
  if (const int steps = absl::GetFlag(FLAGS_decode_steps);
      steps > 0 || absl::GetFlag(FLAGS_upload_only)) {
    std::printf(
        "| context tokens | context GB | upload GB/s | decode steps | strategy "
        "| p50 ms | p99 ms | max ms | coordinator p50 ms | waiting for "
        "workers p50 ms | slowest worker's compute p50 ms | max err / RMS "
        "(last step) | check |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
        "--- | --- |\n");
    std::vector<int64_t> query_rows;
    for (absl::string_view text : absl::StrSplit(
             absl::GetFlag(FLAGS_query_rows), ',', absl::SkipEmpty())) {
      int64_t rows = 0;
      if (!absl::SimpleAtoi(text, &rows) || rows < 1) {
        std::fprintf(stderr, "bad query rows '%s'\n",
                     std::string(text).c_str());
        return 2;
      }
      query_rows.push_back(rows);
    }
    std::vector<QueryChoice> choices;
    for (absl::string_view text : absl::StrSplit(
             absl::GetFlag(FLAGS_query_strategies), ',', absl::SkipEmpty())) {
      const std::vector<std::string> parts = absl::StrSplit(text, '/');
      QueryChoice choice;
      if (parts.size() > 2 || !v1::Strategy_Parse(parts[0], &choice.strategy) ||
          (parts.size() == 2 &&
           !v1::PartialMerge_Parse(parts[1], &choice.merge))) {
        std::fprintf(stderr, "bad query strategy '%s'\n",
                     std::string(text).c_str());
        return 2;
      }
      choices.push_back(choice);
    }
    bool ok = true;
    std::vector<std::string> query_lines;
    for (absl::string_view text :
         absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
      Shapes s = base;
      if (!absl::SimpleAtoi(text, &s.n) || s.n < 1) {
        std::fprintf(stderr, "bad length '%s'\n", std::string(text).c_str());
        return 2;
      }
      ok &= RunDecodeSteps(
          **client, pool, s, absl::GetFlag(FLAGS_upload_only) ? 0 : steps,
          options.chunk_bytes, threads, query_rows, choices, query_lines);
    }
    if (!query_lines.empty()) {
      std::printf(
          "\n| context tokens | query rows | strategy | p50 ms | p99 ms | "
          "coordinator p50 ms | slowest worker's compute p50 ms | its K/V "
          "GB/s | outside the GPUs | max err / RMS (row 0) | check |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
          "|\n");
      for (const std::string& line : query_lines) {
        std::printf("%s\n", line.c_str());
        ok &= line.find("| ok |") != std::string::npos;
      }
    }
    return ok ? 0 : 1;
  }
  std::printf(
      "| Nq | N | mask | end to end s | workers' compute s | upload GB | "
      "upload "
      "GB/s | download GB | download GB/s | overhead s | overhead %% | peak "
      "device GiB/worker | max err / row RMS | check |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "| "
      "--- | --- |\n");
  std::fflush(stdout);
  int failures = 0;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    Shapes s = base;
    if (!absl::SimpleAtoi(text, &s.n) || s.n < 2) {
      std::fprintf(stderr, "bad length '%s'\n", std::string(text).c_str());
      return 2;
    }
    s.nq = absl::GetFlag(FLAGS_q_len) > 0 ? absl::GetFlag(FLAGS_q_len) : s.n;
    std::vector<int64_t> rows;
    const int r = std::max(1, absl::GetFlag(FLAGS_check_rows));
    for (int i = 0; i < r; ++i) {
      rows.push_back(
          std::min(s.nq - 1, (s.nq - 1) * i / std::max(1, r - 1) + 3 * i));
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());

    v1::AttentionSpec spec;
    spec.set_batch(1);
    spec.set_q_len(s.nq);
    spec.set_kv_len(s.n);
    spec.set_q_heads(s.hq);
    spec.set_kv_heads(s.hkv);
    spec.set_head_dim(s.d);
    spec.set_causal(s.causal);
    spec.set_wire_dtype(v1::BF16);
    spec.set_output_dtype(v1::BF16);

    const int64_t row_values = s.hq * s.d;
    std::vector<float> got(rows.size() * row_values, NAN);
    GeneratedSource source(pool, s, options.chunk_bytes);
    Clock::time_point first_output;
    bool any_output = false;
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::Summary> summary = (*client)->AttendStreaming(
        spec, source, [&](const v1::OutputChunk& chunk) {
          if (!any_output) {
            any_output = true;
            first_output = Clock::now();
          }
          const int64_t begin = chunk.token_offset();
          const int64_t end = begin + chunk.token_count();
          for (size_t i = 0; i < rows.size(); ++i) {
            if (rows[i] < begin || rows[i] >= end) continue;
            ConvertToFloat(
                DType::kBFloat16,
                chunk.data().data() + (rows[i] - begin) * row_values * 2,
                &got[i * row_values], row_values);
          }
          return absl::OkStatus();
        });
    const Clock::time_point end = Clock::now();
    if (!summary.ok()) {
      std::printf("| %lld | %lld | %s | failed: %s |\n",
                  static_cast<long long>(s.nq), static_cast<long long>(s.n),
                  s.causal ? "causal" : "dense",
                  summary.status().ToString().c_str());
      std::fflush(stdout);
      ++failures;
      continue;
    }
    const std::vector<double> want = Reference(pool, s, rows, threads);
    const RowCheck check = CheckRows(want, got.data(), row_values, v1::BF16);
    if (!check.ok) ++failures;
    double compute = 0;
    int64_t peak = 0;
    for (const v1::WorkerUsage& w : summary->workers()) {
      compute = std::max(compute, w.compute_seconds());
      peak = std::max(peak, w.peak_bytes());
    }
    const double total = Seconds(start, end);
    const double upload = Seconds(start, source.done());
    const double download = any_output ? Seconds(first_output, end) : 0;
    std::printf(
        "| %lld | %lld | %s | %.2f | %.2f | %.1f | %.2f | %.1f | %.2f | %.2f | "
        "%.0f%% "
        "| %.1f | %.2g | %s |\n",
        static_cast<long long>(s.nq), static_cast<long long>(s.n),
        s.causal ? "causal" : "dense", total, compute,
        summary->bytes_in() / 1e9, summary->bytes_in() / 1e9 / upload,
        summary->bytes_out() / 1e9,
        download > 0 ? summary->bytes_out() / 1e9 / download : 0.0,
        total - compute, 100 * (total - compute) / total,
        peak / double(int64_t{1} << 30), check.error,
        check.ok ? "ok" : "FAILED");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "N=%lld: coordinator upload phase %.2f s, compute phase %.2f "
                 "s, rows checked %zu\n",
                 static_cast<long long>(s.n), PhaseSeconds(*summary, "upload"),
                 PhaseSeconds(*summary, "compute"), rows.size());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  ringattn::KeepLargeBuffersInTheHeap();
  absl::ParseCommandLine(argc, argv);
  return ringattn::Run();
}
