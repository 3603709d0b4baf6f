// grpc_floor_bench: what one gRPC hop moves on this machine with nothing of
// ringattn's own around it, the floor under the service's per-byte cost. It
// starts itself again as a server that only receives (ByteSink: reads each
// ringattn.v1.TensorChunk and drops it), then streams chunks of
// --message_bytes to it over 1..S streams, all on one connection (as the
// client's upload streams share a channel) or each on a connection of its own.
// Prints a Markdown table: GB/s, and the CPU seconds per GB of the sender and
// of the receiver (all their threads, kernel time included).
//
// With --round_trips=N it also times N round trips of one message to a
// server that writes it back (Echo), at each of --round_trip_bytes: each on a
// call of its own (as every ringattn query opens its calls) and all on one
// open stream; the difference is what a call costs beyond its bytes. It does
// so before the transfers, on a fresh connection, and again after them on the
// same connection.
//
//   grpc_floor_bench [--streams=1,2,4] [--gigabytes=4]
//                    [--message_bytes=4194304] [--round_trips=0]
//                    [--round_trip_bytes=8192,131072,2097152]

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/service/byte_sink.grpc.pb.h"
#include "bench/service/quantile.h"
#include "client/child_process.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::vector<std::string>, streams,
          (std::vector<std::string>{"1", "2", "4"}),
          "concurrent streams to time");
ABSL_FLAG(double, gigabytes, 4, "data bytes each case sends, in GB");
ABSL_FLAG(int64_t, message_bytes, 4 << 20,
          "data bytes per chunk (the client's default chunk is 4 MiB)");
ABSL_FLAG(std::vector<std::string>, channel_args, {},
          "integer gRPC arguments NAME=VALUE set on both ends, e.g. "
          "grpc.http2.max_frame_size=16777215");
ABSL_FLAG(int32_t, round_trips, 0,
          "round trips to time at each of --round_trip_bytes (0: none)");
ABSL_FLAG(std::vector<std::string>, round_trip_bytes,
          (std::vector<std::string>{"8192", "131072", "2097152"}),
          "data bytes of the round trips' messages");
ABSL_FLAG(bool, serve, false,
          "run as the receiving server (started by the bench itself)");

namespace ringattn {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;

// --channel_args as (name, value) pairs, parsed once by main.
std::vector<std::pair<std::string, int>> channel_args;

bool ParseChannelArgs(std::vector<std::pair<std::string, int>>* out) {
  for (const std::string& text : absl::GetFlag(FLAGS_channel_args)) {
    std::vector<std::string> parts = absl::StrSplit(text, '=');
    int value = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &value)) {
      std::fprintf(stderr, "--channel_args: not NAME=INTEGER: %s\n",
                   text.c_str());
      return false;
    }
    out->emplace_back(parts[0], value);
  }
  return true;
}

class ByteSink final : public bench::ByteSink::Service {
  grpc::Status Drain(grpc::ServerContext* /*context*/,
                     grpc::ServerReader<v1::TensorChunk>* reader,
                     bench::DrainSummary* summary) override {
    v1::TensorChunk chunk;
    int64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    summary->set_bytes(bytes);
    return grpc::Status::OK;
  }

  grpc::Status Echo(grpc::ServerContext* /*context*/,
                    grpc::ServerReaderWriter<v1::TensorChunk, v1::TensorChunk>*
                        stream) override {
    v1::TensorChunk chunk;
    while (stream->Read(&chunk)) {
      if (!stream->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }
};

// Serves ByteSink on a free port of 127.0.0.1, printing the port on stdout.
int Serve() {
  ByteSink sink;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&sink);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  for (const auto& [name, value] : channel_args) {
    builder.AddChannelArgument(name, value);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::printf("%d\n", port);
  std::fflush(stdout);
  server->Wait();
  return 0;
}

double OwnCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// User plus system CPU seconds of process `pid` so far.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(file)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which ends with the last ')'.
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(text.rfind(')') + 2), ' ');
  int64_t user = 0;
  int64_t system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return 0;
  }
  return static_cast<double>(user + system) / sysconf(_SC_CLK_TCK);
}

std::shared_ptr<grpc::Channel> NewConnection(const std::string& target,
                                             int index) {
  grpc::ChannelArguments arguments;
  // A channel argument of its own keeps gRPC from sharing the connection.
  arguments.SetInt("ringattn.bench.connection", index);
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  for (const auto& [name, value] : channel_args) arguments.SetInt(name, value);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   arguments);
}

struct Rates {
  double gigabytes_per_second = 0;
  double sender_cpu_per_gigabyte = 0;
  double receiver_cpu_per_gigabyte = 0;
  bool ok = true;
};

// Sends `bytes` in copies of `chunk` over `streams` concurrent streams, all
// on one connection or (`separate`) each on a connection of its own.
Rates Send(const std::string& target, pid_t receiver, int streams,
           bool separate, const v1::TensorChunk& chunk, int64_t bytes) {
  std::vector<std::unique_ptr<bench::ByteSink::Stub>> stubs;
  const std::shared_ptr<grpc::Channel> shared =
      separate ? nullptr : NewConnection(target, 0);
  for (int s = 0; s < streams; ++s) {
    stubs.push_back(bench::ByteSink::NewStub(
        separate ? NewConnection(target, s + 1) : shared));
  }
  const int64_t messages_per_stream = std::max<int64_t>(
      1, bytes / static_cast<int64_t>(chunk.data().size()) / streams);
  const double receiver_before = ProcessCpuSeconds(receiver);
  const double sender_before = OwnCpuSeconds();
  const absl::Time start = absl::Now();
  // Not vector<bool>: its elements share bytes, which threads may not write.
  std::vector<char> ok(streams, 0);
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      grpc::ClientContext context;
      context.set_wait_for_ready(true);
      bench::DrainSummary summary;
      std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer =
          stubs[s]->Drain(&context, &summary);
      for (int64_t m = 0; m < messages_per_stream; ++m) {
        if (!writer->Write(chunk)) break;
      }
      writer->WritesDone();
      ok[s] = writer->Finish().ok() &&
              summary.bytes() == messages_per_stream *
                                     static_cast<int64_t>(chunk.data().size());
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double gigabytes =
      static_cast<double>(messages_per_stream * streams * chunk.data().size()) /
      1e9;
  Rates rates;
  rates.gigabytes_per_second = gigabytes / seconds;
  rates.sender_cpu_per_gigabyte = (OwnCpuSeconds() - sender_before) / gigabytes;
  rates.receiver_cpu_per_gigabyte =
      (ProcessCpuSeconds(receiver) - receiver_before) / gigabytes;
  for (char stream_ok : ok) rates.ok = rates.ok && stream_ok;
  return rates;
}

// A chunk of `bytes` random data bytes.
v1::TensorChunk RandomChunk(int64_t bytes) {
  v1::TensorChunk chunk;
  chunk.set_tensor(v1::K);
  chunk.set_token_count(1);
  std::string data(static_cast<size_t>(bytes), '\0');
  std::mt19937_64 random(1);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t word = random();
    data.replace(i, 8, reinterpret_cast<const char*>(&word), 8);
  }
  chunk.set_data(std::move(data));
  return chunk;
}

struct RoundTrips {
  double p50_us = 0;
  double p99_us = 0;
  bool ok = true;
};

RoundTrips Percentiles(std::vector<double> micros, bool ok) {
  RoundTrips r;
  r.ok = ok && !micros.empty();
  if (!r.ok) return r;
  r.p50_us = Quantile(micros, 0.5);
  r.p99_us = Quantile(micros, 0.99);
  return r;
}

// `count` round trips of `chunk` through Echo, each a call of its own (it
// writes, half-closes, reads the echo and finishes).
RoundTrips CallPerRoundTrip(bench::ByteSink::Stub& stub,
                            const v1::TensorChunk& chunk, int count) {
  std::vector<double> micros;
  v1::TensorChunk echo;
  for (int i = 0; i < count; ++i) {
    const absl::Time start = absl::Now();
    grpc::ClientContext context;
    auto stream = stub.Echo(&context);
    const bool ok = stream->Write(chunk) && stream->WritesDone() &&
                    stream->Read(&echo) && stream->Finish().ok();
    if (!ok || echo.data().size() != chunk.data().size()) {
      return Percentiles(micros, false);
    }
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return Percentiles(micros, true);
}

// `count` round trips of `chunk` on one Echo stream opened before the first.
RoundTrips RoundTripsOnOneStream(bench::ByteSink::Stub& stub,
                                 const v1::TensorChunk& chunk, int count) {
  std::vector<double> micros;
  v1::TensorChunk echo;
  grpc::ClientContext context;
  auto stream = stub.Echo(&context);
  bool ok = true;
  for (int i = 0; ok && i < count; ++i) {
    const absl::Time start = absl::Now();
    ok = stream->Write(chunk) && stream->Read(&echo) &&
         echo.data().size() == chunk.data().size();
    if (ok) micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  ok = stream->WritesDone() && stream->Finish().ok() && ok;
  return Percentiles(micros, ok);
}

// The round-trip table (--round_trips) over `connection`, under `heading`;
// the number of cases that failed.
int TimeRoundTrips(const std::shared_ptr<grpc::Channel>& connection,
                   const char* heading) {
  const int count = absl::GetFlag(FLAGS_round_trips);
  std::unique_ptr<bench::ByteSink::Stub> stub =
      bench::ByteSink::NewStub(connection);
  std::printf(
      "%s\n\n| message bytes | a call per round trip, p50 / p99 us | one open "
      "stream, p50 / p99 us | a call's own cost, p50 us |\n"
      "| --- | --- | --- | --- |\n",
      heading);
  int failures = 0;
  for (const std::string& text : absl::GetFlag(FLAGS_round_trip_bytes)) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(text, &bytes) || bytes < 1 ||
        bytes > kMaxMessageBytes - 1024) {
      std::fprintf(stderr, "--round_trip_bytes: not in [1, %d]: %s\n",
                   kMaxMessageBytes - 1024, text.c_str());
      return failures + 1;
    }
    const v1::TensorChunk chunk = RandomChunk(bytes);
    // Warm: the connection, its windows, the server's threads.
    RoundTripsOnOneStream(*stub, chunk, std::max(1, count / 10));
    const RoundTrips calls = CallPerRoundTrip(*stub, chunk, count);
    const RoundTrips stream = RoundTripsOnOneStream(*stub, chunk, count);
    failures += (calls.ok ? 0 : 1) + (stream.ok ? 0 : 1);
    std::printf("| %lld | %.0f / %.0f | %.0f / %.0f | %.0f |%s\n",
                static_cast<long long>(bytes), calls.p50_us, calls.p99_us,
                stream.p50_us, stream.p99_us, calls.p50_us - stream.p50_us,
                calls.ok && stream.ok ? "" : " failed");
    std::fflush(stdout);
  }
  std::printf("\n");
  return failures;
}

int Run(const char* self) {
  const int64_t message_bytes = absl::GetFlag(FLAGS_message_bytes);
  if (message_bytes < 1 || message_bytes > kMaxMessageBytes - 1024) {
    std::fprintf(stderr, "--message_bytes must be in [1, %d], got %lld\n",
                 kMaxMessageBytes - 1024,
                 static_cast<long long>(message_bytes));
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_gigabytes) > 0)) {
    std::fprintf(stderr, "--gigabytes must be positive, got %g\n",
                 absl::GetFlag(FLAGS_gigabytes));
    return 2;
  }
  if (absl::GetFlag(FLAGS_round_trips) < 0) {
    std::fprintf(stderr, "--round_trips must not be negative, got %d\n",
                 absl::GetFlag(FLAGS_round_trips));
    return 2;
  }
  std::vector<int> stream_counts;
  for (const std::string& text : absl::GetFlag(FLAGS_streams)) {
    int streams = 0;
    if (!absl::SimpleAtoi(text, &streams) || streams < 1) {
      std::fprintf(stderr, "--streams: not a positive count: %s\n",
                   text.c_str());
      return 2;
    }
    stream_counts.push_back(streams);
  }
  std::vector<std::string> server_args = {"--serve"};
  if (!channel_args.empty()) {
    server_args.push_back(
        absl::StrCat("--channel_args=",
                     absl::StrJoin(absl::GetFlag(FLAGS_channel_args), ",")));
  }
  absl::StatusOr<ChildProcess> server =
      ChildProcess::Spawn(self, server_args, ChildProcess::Output::kPipe);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  char line[32] = {};
  int port = 0;
  const ssize_t got = read(server->stdout_fd(), line, sizeof(line) - 1);
  if (got <= 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &port)) {
    std::fprintf(stderr, "the receiving server did not start\n");
    return 1;
  }
  const std::string target = absl::StrCat("127.0.0.1:", port);

  // Held for the whole run: the one-connection transfers below share its
  // connection (same arguments), so the second round-trip table runs on a
  // connection whose flow-control windows they grew, as the service's are.
  const std::shared_ptr<grpc::Channel> connection = NewConnection(target, 0);
  const bool round_trips = absl::GetFlag(FLAGS_round_trips) > 0;
  int failures =
      round_trips ? TimeRoundTrips(connection, "On a fresh connection:") : 0;
  const v1::TensorChunk chunk = RandomChunk(message_bytes);
  const int64_t bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_gigabytes) * 1e9);

  // A first pass to open connections and grow flow-control windows.
  Send(target, server->pid(), 1, false, chunk, bytes / 8);
  std::printf(
      "| streams | connections | GB/s | sender CPU s per GB | receiver CPU s "
      "per GB |\n| --- | --- | --- | --- | --- |\n");
  for (int streams : stream_counts) {
    for (bool separate : {false, true}) {
      if (separate && streams == 1) continue;
      const Rates rates =
          Send(target, server->pid(), streams, separate, chunk, bytes);
      failures += rates.ok ? 0 : 1;
      std::printf("| %d | %s | %.2f | %.2f | %.2f |%s\n", streams,
                  separate ? "one each" : "1", rates.gigabytes_per_second,
                  rates.sender_cpu_per_gigabyte,
                  rates.receiver_cpu_per_gigabyte, rates.ok ? "" : " failed");
      std::fflush(stdout);
    }
  }
  if (round_trips) {
    std::printf("\n");
    failures += TimeRoundTrips(
        connection, "On the same connection after the transfers above:");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ringattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!ringattn::ParseChannelArgs(&ringattn::channel_args)) return 2;
  if (absl::GetFlag(FLAGS_serve)) return ringattn::Serve();
  return ringattn::Run("/proc/self/exe");
}
