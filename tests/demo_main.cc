// ringattn-demo: what `./dev demo` shows. Against a running cluster it sends a
// causal request and a dilated one, checks sampled output rows of each against
// the float64 reference, and prints a table: time, throughput, max error,
// memory per worker.

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "core/random_tensor.h"
#include "kernels/cpu/reference_attention.h"
#include "proto/spec_conversion.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(int64_t, n, 16384, "tokens per request");
ABSL_FLAG(int64_t, heads, 8, "query heads");
ABSL_FLAG(int64_t, dim, 64, "head dimension");
ABSL_FLAG(int64_t, check_rows, 48, "output rows checked against the reference");

namespace ringattn {
namespace {

struct Row {
  std::string name;
  double seconds = 0;
  double gflops = 0;
  double max_error = 0;
  double peak_mib = 0;
  int64_t transfers = 0;
};

absl::StatusOr<Row> RunOne(Client& client, const std::string& name,
                           const AttentionSpec& spec) {
  std::mt19937 rng(11);
  auto random = [&](Shape shape) { return RandomTensor(shape, rng); };
  const Tensor<float> q = random({1, spec.q_len, spec.q_heads, spec.head_dim});
  const Tensor<float> k =
      random({1, spec.kv_len, spec.kv_heads, spec.head_dim});
  const Tensor<float> v =
      random({1, spec.kv_len, spec.kv_heads, spec.head_dim});
  v1::AttentionSpec request = SpecToProto(spec);
  request.set_wire_dtype(v1::FP32);
  absl::StatusOr<AttendResult> result =
      client.Attend(request, q.view(), k.view(), v.view());
  if (!result.ok()) return result.status();

  // Check evenly spread rows, the first and the last included.
  const int64_t samples = std::min(absl::GetFlag(FLAGS_check_rows), spec.q_len);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < samples; ++i) {
    rows.push_back(samples == 1 ? 0 : i * (spec.q_len - 1) / (samples - 1));
  }
  Tensor<double> o_ref(q.shape());
  Tensor<double> lse_ref({1, spec.q_len, spec.q_heads, 1});
  ReferenceAttentionRows(spec, q.view(), k.view(), v.view(), rows, o_ref.view(),
                         lse_ref.view());
  Row row;
  row.name = name;
  for (int64_t r : rows) {
    for (int64_t h = 0; h < spec.q_heads; ++h) {
      for (int64_t d = 0; d < spec.head_dim; ++d) {
        row.max_error = std::max(
            row.max_error, std::fabs(result->output.view().At(0, r, h, d) -
                                     o_ref.view().At(0, r, h, d)));
      }
    }
  }
  row.seconds = result->summary.seconds();
  row.gflops = result->summary.flops_per_second() / 1e9;
  for (const v1::WorkerUsage& usage : result->summary.workers()) {
    row.peak_mib = std::max(row.peak_mib, usage.peak_bytes() / 1048576.0);
  }
  row.transfers = result->summary.ring_transfers();
  return row;
}

int Main() {
  ClientOptions options;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::GetFlag(FLAGS_target), options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<v1::ClusterInfo> info = (*client)->GetClusterInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  AttentionSpec causal;
  causal.q_len = causal.kv_len = absl::GetFlag(FLAGS_n);
  causal.q_heads = causal.kv_heads = absl::GetFlag(FLAGS_heads);
  causal.head_dim = absl::GetFlag(FLAGS_dim);
  causal.causal = true;
  AttentionSpec dilated = causal;
  dilated.dilated = {{2048, 1}, {4096, 2}, {8192, 4}};
  const double full_mib = 4.0 * causal.q_len * causal.q_heads *
                          (4 * causal.head_dim + 1) / 1048576.0;
  std::printf("cluster: %d CPU workers at %s\n\n", info->world_size(),
              absl::GetFlag(FLAGS_target).c_str());
  std::printf(
      "| request | tokens | time (s) | GFLOP/s | max error (sampled rows) | "
      "peak MiB per worker (one worker would hold %.0f) | K/V transfers |\n",
      full_mib);
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  for (const auto& [name, spec] :
       {std::pair<std::string, AttentionSpec>{"causal", causal},
        {"dilated (LongNet, 3 branches)", dilated}}) {
    absl::StatusOr<Row> row = RunOne(**client, name, spec);
    if (!row.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", name.c_str(),
                   row.status().ToString().c_str());
      return 1;
    }
    ok = ok && row->max_error <= 2e-5;
    std::printf("| %s | %ld | %.2f | %.1f | %.1e | %.1f | %ld |\n",
                row->name.c_str(), spec.q_len, row->seconds, row->gflops,
                row->max_error, row->peak_mib, row->transfers);
  }
  std::printf("\n%s\n", ok ? "all results match the float64 reference"
                           : "MISMATCH against the float64 reference");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringattn::Main();
}
