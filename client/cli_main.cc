// ringattn: the command-line client of the ringattn service. It sends .npy
// tensors to a coordinator and writes the results as .npy, manages resident
// contexts, and runs a local CPU cluster (kUsage below says how).

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli_request.h"
#include "client/cli_security.h"
#include "client/client.h"
#include "client/flags.h"
#include "client/human_units.h"
#include "client/local_cluster.h"
#include "client/npy.h"
#include "client/progress_bar.h"
#include "core/dtype.h"
#include "core/large_buffers.h"
#include "proto/spec_conversion.h"

namespace ringattn {
namespace {

constexpr char kUsage[] = R"(usage:
  ringattn attend --target HOST:PORT --q Q.npy --k K.npy --v V.npy --out O.npy
      [--lse_out L.npy] [--causal] [--scale S] [--wire_dtype fp32|fp16|bf16]
      [--dilated W:R,W:R,...] [--dilated_combine lse|head_groups]
      [--block_size B [--local_blocks L] [--global_blocks G]
       [--dilated_blocks R] [--random_blocks K [--seed S]]]
      [--hilbert HxW] [--strategy auto|pass_kv|pass_q|broadcast_q]
      [--merge auto|coordinator|workers] [--upload_streams N]
      [--download_streams N]
  ringattn local --workers P [--port PORT] [--http_port PORT] [--bin_dir DIR]
      [--ready_timeout SECONDS]
  ringattn info --target HOST:PORT
  ringattn context create --target HOST:PORT --name NAME --k K.npy --v V.npy
      [--wire_dtype fp32|fp16|bf16] [--upload_streams N]
  ringattn context append --target HOST:PORT --name NAME --k K.npy --v V.npy
      [--wire_dtype fp32|fp16|bf16] [--upload_streams N]
  ringattn context query --target HOST:PORT --name NAME --q Q.npy --out O.npy
      [--lse_out L.npy] [--k_new K.npy --v_new V.npy] [the attention flags of
      attend, --strategy auto|pass_kv|pass_q|broadcast_q,
      --merge auto|coordinator|workers and the stream flags among them]
      (with --k_new/--v_new the rows are appended first, so the context grows
      and the queries see them)
  ringattn context delete --target HOST:PORT --name NAME
  ringattn context list --target HOST:PORT

Every command that talks to a server also takes:
  --timeout SECONDS   deadline of each call (default: none)
  --chunk_bytes N     largest tensor chunk sent (default 4194304)
  --max_attempts N    attempts of an attend or query that ends with
                      UNAVAILABLE before any output (the cluster not ready, a
                      worker lost), 1 to 5, after waits of 0.25-0.5 s that
                      double up to 4 s (default 1: no retry)
  --token_file FILE   file holding a bearer token, sent as
                      "authorization: Bearer TOKEN" on every call
  --tls_ca FILE       connect over TLS, verifying the server against this PEM
                      CA bundle (any --tls_* flag turns TLS on; without
                      --tls_ca the system's roots verify the server)
  --tls_cert FILE, --tls_key FILE
                      this client's PEM certificate and key, for servers that
                      require client certificates (mutual TLS)

`attend --upload_streams N` (and `context query`, `create`, `append`) uploads
the tensors over N streams of one request, each serialized on its own thread
here and parsed on its own thread by the coordinator: faster where one
stream's CPU is the limit. `--download_streams N` brings the output back over
N streams the same way. 0, the default: 4 for a request that moves 8 MiB or
more that way, else 1.

Inputs are .npy float32 or float16 arrays in C order, [N, H, D] or
[B, N, H, D]. O is written as float32 with Q's shape; LSE as float32 [H, N]
or [B, H, N]. `local` prints "ready 127.0.0.1:PORT" once the cluster is up and
runs until interrupted.
)";

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Prints what was wrong with the command line and the usage; returns the exit
// code for it.
int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "ringattn: %s\n\n%s",
               std::string(status.message()).c_str(), kUsage);
  return kExitUsage;
}

// Prints why the command failed; returns the exit code for it.
int Failure(const absl::Status& status) {
  std::fprintf(stderr, "ringattn: %s\n", status.ToString().c_str());
  return kExitFailure;
}

// The flags every command that talks to a server takes.
std::set<std::string> ConnectionFlagNames() {
  std::set<std::string> names = {"target", "timeout", "chunk_bytes",
                                 "max_attempts"};
  names.insert(SecurityFlagNames().begin(), SecurityFlagNames().end());
  return names;
}

std::set<std::string> Union(std::set<std::string> a,
                            const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// Everything a command needs to talk to the server, from its flags.
struct Connection {
  std::unique_ptr<ProgressBar> progress_bar;  // when stderr is a terminal
  std::unique_ptr<Client> client;
};

// INVALID_ARGUMENT (a usage error) for bad connection flags; NOT_FOUND for
// unreadable --token_file or --tls_* files.
absl::StatusOr<Connection> Connect(const Flags& flags) {
  absl::StatusOr<std::string> target = flags.Require("target");
  if (!target.ok()) return target.status();
  ClientOptions options;
  absl::StatusOr<double> timeout = flags.GetDouble("timeout", 0);
  if (!timeout.ok()) return timeout.status();
  if (flags.Has("timeout")) options.deadline = absl::Seconds(*timeout);
  absl::StatusOr<int64_t> chunk_bytes =
      flags.GetInt("chunk_bytes", options.chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  options.chunk_bytes = *chunk_bytes;
  absl::StatusOr<int64_t> attempts =
      flags.GetInt("max_attempts", options.max_attempts);
  if (!attempts.ok()) return attempts.status();
  if (*attempts < 1 || *attempts > ClientOptions::kMostAttempts) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attempts must be in [1, ",
                     ClientOptions::kMostAttempts, "], got ", *attempts));
  }
  options.max_attempts = static_cast<int>(*attempts);
  for (auto [name, streams] :
       {std::pair{"upload_streams", &options.upload_streams},
        std::pair{"download_streams", &options.download_streams}}) {
    absl::StatusOr<int64_t> value = flags.GetInt(name, *streams);
    if (!value.ok()) return value.status();
    if (*value < 0 || *value > 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " must be in [0, 64] (0: automatic), got ", *value));
    }
    *streams = static_cast<int>(*value);
  }
  if (absl::Status s = ApplySecurityFlags(flags, &options); !s.ok()) return s;
  Connection connection;
  if (isatty(STDERR_FILENO)) {
    connection.progress_bar = std::make_unique<ProgressBar>(stderr, absl::Now);
    options.progress = [bar = connection.progress_bar.get()](
                           const Progress& progress) { bar->Update(progress); };
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(*target, std::move(options));
  if (!client.ok()) return client.status();
  connection.client = *std::move(client);
  return connection;
}

// A .npy file read as a [batch, seq, heads, dim] tensor.
struct InputTensor {
  NpyArray array;
  Shape shape;

  HostTensor view() const { return HostTensor(array.values.data(), shape); }
};

absl::StatusOr<InputTensor> ReadInput(const std::string& path) {
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  if (!array.ok()) return array.status();
  absl::StatusOr<Shape> shape = AttentionShape(*array, path);
  if (!shape.ok()) return shape.status();
  return InputTensor{*std::move(array), *shape};
}

// Writes O (with Q's file shape) and, if asked, LSE.
absl::Status WriteOutputs(const Flags& flags, const InputTensor& q,
                          const AttendResult& result) {
  absl::Status written =
      WriteNpy(*flags.Get("out"), q.array.shape, result.output.values());
  if (!written.ok()) return written;
  if (std::optional<std::string> lse_path = flags.Get("lse_out")) {
    return WriteNpy(*lse_path, LseFileShape(q.array.shape), result.lse);
  }
  return absl::OkStatus();
}

void PrintSummary(const v1::Summary& summary, absl::Duration wall) {
  std::string line = absl::StrFormat(
      "%.3f s (server %.3f s), %s, %.3g FLOP; sent %s, received %s",
      absl::ToDoubleSeconds(wall), summary.seconds(),
      FormatFlopRate(summary.flops_per_second()), summary.flops(),
      FormatBytes(summary.bytes_in()), FormatBytes(summary.bytes_out()));
  if (summary.strategy() != v1::STRATEGY_AUTO) {
    absl::StrAppend(&line, "; ", v1::Strategy_Name(summary.strategy()));
  }
  if (summary.partial_merge() == v1::MERGE_ON_WORKERS) {
    absl::StrAppend(&line, " merged on the workers");
  }
  if (summary.ring_steps() > 0) {
    absl::StrAppend(&line, ", ", summary.ring_steps(), " ring steps");
  }
  if (!summary.kernel_launches().empty()) {
    // Sorted by name: the proto map has no order.
    const std::map<std::string, int64_t> launches(
        summary.kernel_launches().begin(), summary.kernel_launches().end());
    absl::StrAppend(&line, "; kernel launches: ",
                    absl::StrJoin(launches, ", ", absl::PairFormatter(" ")));
  }
  if (!summary.request_id().empty()) {
    absl::StrAppend(&line, "; request ", summary.request_id());
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Parses `args` for a command, which requires every flag in `required`.
absl::StatusOr<Flags> ParseCommand(const std::vector<std::string>& args,
                                   const std::set<std::string>& valued,
                                   const std::set<std::string>& switches,
                                   const std::vector<std::string>& required) {
  absl::StatusOr<Flags> flags = Flags::Parse(args, valued, switches);
  if (!flags.ok()) return flags.status();
  for (const std::string& name : required) {
    absl::StatusOr<std::string> value = flags->Require(name);
    if (!value.ok()) return value.status();
  }
  return flags;
}

int RunAttend(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      ParseCommand(args,
                   Union(Union(ConnectionFlagNames(), SpecFlagNames()),
                         {"q", "k", "v", "out", "lse_out", "upload_streams",
                          "download_streams"}),
                   SpecSwitchNames(), {"target", "q", "k", "v", "out"});
  if (!flags.ok()) return UsageError(flags.status());
  v1::AttentionSpec spec;
  if (absl::Status s = ApplySpecFlags(*flags, &spec); !s.ok()) {
    return UsageError(s);
  }
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());

  absl::StatusOr<InputTensor> q = ReadInput(*flags->Get("q"));
  if (!q.ok()) return Failure(q.status());
  absl::StatusOr<InputTensor> k = ReadInput(*flags->Get("k"));
  if (!k.ok()) return Failure(k.status());
  absl::StatusOr<InputTensor> v = ReadInput(*flags->Get("v"));
  if (!v.ok()) return Failure(v.status());
  spec.set_batch(q->shape.batch);
  spec.set_q_len(q->shape.seq);
  spec.set_q_heads(q->shape.heads);
  spec.set_head_dim(q->shape.dim);
  spec.set_kv_len(k->shape.seq);
  spec.set_kv_heads(k->shape.heads);
  spec.set_return_lse(flags->Has("lse_out"));

  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result =
      connection->client->Attend(spec, q->view(), k->view(), v->view());
  if (!result.ok()) return Failure(result.status());
  const absl::Duration wall = absl::Now() - start;
  if (absl::Status s = WriteOutputs(*flags, *q, *result); !s.ok()) {
    return Failure(s);
  }
  PrintSummary(result->summary, wall);
  return 0;
}

int RunLocal(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags = ParseCommand(
      args, {"workers", "port", "http_port", "bin_dir", "ready_timeout"}, {},
      {"workers"});
  if (!flags.ok()) return UsageError(flags.status());
  LocalClusterOptions options;
  absl::StatusOr<int64_t> workers = flags->GetInt("workers", 0);
  absl::StatusOr<int64_t> port = flags->GetInt("port", 0);
  absl::StatusOr<int64_t> http_port = flags->GetInt("http_port", 0);
  absl::StatusOr<double> ready_timeout = flags->GetDouble(
      "ready_timeout", absl::ToDoubleSeconds(options.ready_timeout));
  for (const absl::Status& status :
       {workers.status(), port.status(), http_port.status(),
        ready_timeout.status()}) {
    if (!status.ok()) return UsageError(status);
  }
  if (*workers < 1 || *workers > 1024) {
    return UsageError(absl::InvalidArgumentError(
        absl::StrCat("--workers must be in [1, 1024], got ", *workers)));
  }
  for (int64_t value : {*port, *http_port}) {
    if (value < 0 || value > 65535) {
      return UsageError(absl::InvalidArgumentError(
          absl::StrCat("a port must be in [0, 65535], got ", value)));
    }
  }
  options.workers = static_cast<int>(*workers);
  options.port = static_cast<int>(*port);
  options.http_port = static_cast<int>(*http_port);
  options.bin_dir = flags->Get("bin_dir").value_or("");
  options.ready_timeout = absl::Seconds(*ready_timeout);
  BlockClusterSignals();
  absl::Status status = RunLocalCluster(options, stdout);
  return status.ok() ? 0 : Failure(status);
}

int RunInfo(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      ParseCommand(args, ConnectionFlagNames(), {}, {"target"});
  if (!flags.ok()) return UsageError(flags.status());
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());
  absl::StatusOr<v1::ClusterInfo> info = connection->client->GetClusterInfo();
  if (!info.ok()) return Failure(info.status());
  std::printf("world_size %d, %s, version %s, max request %s\n",
              info->world_size(), info->ready() ? "ready" : "not ready",
              info->version().c_str(),
              FormatBytes(info->max_request_bytes()).c_str());
  for (const v1::WorkerInfo& worker : info->workers()) {
    std::printf("  rank %d  %s  %s  %s  %s\n", worker.rank(),
                worker.address().c_str(), worker.device().c_str(),
                FormatBytes(worker.memory_bytes()).c_str(),
                worker.alive() ? "alive" : "dead");
  }
  return 0;
}

// "fp32", "bf16", ...; "-" for a part that holds no rows (or a worker that
// did not say).
std::string PartDTypeName(v1::DType dtype) {
  absl::StatusOr<DType> known = DTypeFromProto(dtype);
  return known.ok() ? DTypeName(*known) : "-";
}

// The context's line (its shape, the dtype its workers hold it in, "mixed"
// where they differ, and its bytes), then a line per worker.
void PrintContext(const v1::ContextInfo& info) {
  std::set<std::string> dtypes;
  for (const v1::ContextPart& part : info.parts()) {
    if (std::string name = PartDTypeName(part.dtype()); name != "-") {
      dtypes.insert(std::move(name));
    }
  }
  const std::string dtype = dtypes.size() == 1 ? *dtypes.begin()
                            : dtypes.empty()   ? "-"
                                               : "mixed";
  std::printf(
      "%s: batch %lld, length %lld, kv_heads %lld, head_dim %lld, %s, %s\n",
      info.name().c_str(), static_cast<long long>(info.batch()),
      static_cast<long long>(info.length()),
      static_cast<long long>(info.kv_heads()),
      static_cast<long long>(info.head_dim()), dtype.c_str(),
      FormatBytes(info.bytes()).c_str());
  for (const v1::ContextPart& part : info.parts()) {
    std::printf("  rank %d  %s  %s  %s\n", part.rank(), part.address().c_str(),
                FormatBytes(part.bytes()).c_str(),
                PartDTypeName(part.dtype()).c_str());
  }
}

int RunContextUpload(bool create, const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      ParseCommand(args,
                   Union(ConnectionFlagNames(),
                         {"name", "k", "v", "wire_dtype", "upload_streams"}),
                   {}, {"target", "name", "k", "v"});
  if (!flags.ok()) return UsageError(flags.status());
  absl::StatusOr<v1::DType> wire_dtype =
      ParseWireDType(flags->Get("wire_dtype").value_or("fp32"));
  if (!wire_dtype.ok()) return UsageError(wire_dtype.status());
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());
  absl::StatusOr<InputTensor> k = ReadInput(*flags->Get("k"));
  if (!k.ok()) return Failure(k.status());
  absl::StatusOr<InputTensor> v = ReadInput(*flags->Get("v"));
  if (!v.ok()) return Failure(v.status());
  const std::string name = *flags->Get("name");
  absl::StatusOr<v1::ContextInfo> info =
      create ? connection->client->CreateContext(name, k->view(), v->view(),
                                                 *wire_dtype)
             : connection->client->AppendContext(name, k->view(), v->view(),
                                                 *wire_dtype);
  if (!info.ok()) return Failure(info.status());
  PrintContext(*info);
  return 0;
}

int RunContextQuery(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      ParseCommand(args,
                   Union(Union(ConnectionFlagNames(), SpecFlagNames()),
                         {"name", "q", "out", "lse_out", "k_new", "v_new",
                          "upload_streams", "download_streams"}),
                   SpecSwitchNames(), {"target", "name", "q", "out"});
  if (!flags.ok()) return UsageError(flags.status());
  v1::AttentionSpec spec;
  if (absl::Status s = ApplySpecFlags(*flags, &spec); !s.ok()) {
    return UsageError(s);
  }
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());
  absl::StatusOr<InputTensor> q = ReadInput(*flags->Get("q"));
  if (!q.ok()) return Failure(q.status());

  // The server fills in the context's K/V heads and length (kv_heads 0).
  const std::string name = *flags->Get("name");
  spec.set_batch(q->shape.batch);
  spec.set_q_len(q->shape.seq);
  spec.set_q_heads(q->shape.heads);
  spec.set_head_dim(q->shape.dim);
  spec.set_return_lse(flags->Has("lse_out"));
  // With --k_new/--v_new the rows are appended first and attended to as well.
  if (flags->Has("k_new") != flags->Has("v_new")) {
    return UsageError(absl::InvalidArgumentError(
        "--k_new and --v_new go together: both or neither"));
  }
  std::optional<InputTensor> k_new, v_new;
  if (flags->Has("k_new")) {
    absl::StatusOr<InputTensor> k = ReadInput(*flags->Get("k_new"));
    if (!k.ok()) return Failure(k.status());
    absl::StatusOr<InputTensor> v = ReadInput(*flags->Get("v_new"));
    if (!v.ok()) return Failure(v.status());
    k_new = std::move(*k);
    v_new = std::move(*v);
    // The client checks the new rows against the heads the spec names.
    spec.set_kv_heads(k_new->shape.heads);
  }

  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> result =
      k_new.has_value()
          ? connection->client->Query(name, spec, q->view(), k_new->view(),
                                      v_new->view())
          : connection->client->Query(name, spec, q->view());
  if (!result.ok()) return Failure(result.status());
  const absl::Duration wall = absl::Now() - start;
  if (absl::Status s = WriteOutputs(*flags, *q, *result); !s.ok()) {
    return Failure(s);
  }
  PrintSummary(result->summary, wall);
  return 0;
}

int RunContextDelete(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags = ParseCommand(
      args, Union(ConnectionFlagNames(), {"name"}), {}, {"target", "name"});
  if (!flags.ok()) return UsageError(flags.status());
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());
  const std::string name = *flags->Get("name");
  absl::Status status = connection->client->DeleteContext(name);
  if (!status.ok()) return Failure(status);
  std::printf("deleted %s\n", name.c_str());
  return 0;
}

int RunContextList(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags =
      ParseCommand(args, ConnectionFlagNames(), {}, {"target"});
  if (!flags.ok()) return UsageError(flags.status());
  absl::StatusOr<Connection> connection = Connect(*flags);
  if (!connection.ok()) return UsageError(connection.status());
  absl::StatusOr<std::vector<v1::ContextInfo>> contexts =
      connection->client->ListContexts();
  if (!contexts.ok()) return Failure(contexts.status());
  for (const v1::ContextInfo& info : *contexts) PrintContext(info);
  return 0;
}

int RunContext(const std::vector<std::string>& args) {
  if (args.empty()) {
    return UsageError(absl::InvalidArgumentError(
        "context needs one of create, append, query, delete, list"));
  }
  const std::string& action = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (action == "create") return RunContextUpload(/*create=*/true, rest);
  if (action == "append") return RunContextUpload(/*create=*/false, rest);
  if (action == "query") return RunContextQuery(rest);
  if (action == "delete") return RunContextDelete(rest);
  if (action == "list") return RunContextList(rest);
  return UsageError(absl::InvalidArgumentError(
      absl::StrCat("unknown context command '", action,
                   "' (create, append, query, delete, list)")));
}

int Run(const std::vector<std::string>& args) {
  if (args.empty()) {
    return UsageError(absl::InvalidArgumentError("no command given"));
  }
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "attend") return RunAttend(rest);
  if (command == "local") return RunLocal(rest);
  if (command == "info") return RunInfo(rest);
  if (command == "context") return RunContext(rest);
  return UsageError(absl::InvalidArgumentError(
      absl::StrCat("unknown command '", command, "'")));
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  ringattn::KeepLargeBuffersInTheHeap();
  return ringattn::Run(std::vector<std::string>(argv + 1, argv + argc));
}
