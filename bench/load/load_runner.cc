#include "bench/load/load_runner.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/load/request_mix.h"
#include "client/child_process.h"
#include "client/client.h"
#include "client/free_port.h"
#include "proto/spec_conversion.h"

namespace ringattn {
namespace {

// VmRSS and VmHWM of `pid` in bytes (0 where unreadable).
std::pair<int64_t, int64_t> ReadMemory(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  int64_t rss = 0, hwm = 0;
  while (status >> key) {
    int64_t kib = 0;
    if (key == "VmRSS:" && status >> kib) rss = kib * 1024;
    if (key == "VmHWM:" && status >> kib) hwm = kib * 1024;
  }
  return {rss, hwm};
}

// The coordinator and its workers as child processes on loopback; worker
// slots can be emptied (SIGKILL) and refilled. Call from the main thread only
// (children get SIGTERM when the spawning thread exits).
class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(
      const LoadOptions& options) {
    std::unique_ptr<Cluster> cluster(new Cluster(options));
    absl::StatusOr<int> port = FreePort();
    absl::StatusOr<int> http_port = FreePort();
    if (!port.ok()) return port.status();
    if (!http_port.ok()) return http_port.status();
    cluster->target_ = absl::StrCat("127.0.0.1:", *port);
    std::vector<std::string> args = {
        "--host=127.0.0.1", absl::StrCat("--port=", *port),
        absl::StrCat("--http_port=", *http_port),
        absl::StrCat("--world_size=", options.workers)};
    args.insert(args.end(), options.coordinator_flags.begin(),
                options.coordinator_flags.end());
    absl::StatusOr<ChildProcess> coordinator = ChildProcess::Spawn(
        options.coordinator_binary, args, ChildProcess::Output::kToStderr);
    if (!coordinator.ok()) return coordinator.status();
    cluster->coordinator_.emplace(std::move(*coordinator));
    cluster->workers_.resize(options.workers);
    for (int i = 0; i < options.workers; ++i) {
      if (absl::Status s = cluster->StartWorker(i); !s.ok()) return s;
    }
    if (absl::Status s = cluster->WaitReady(absl::Seconds(60)); !s.ok()) {
      return s;
    }
    return cluster;
  }

  ~Cluster() {
    std::vector<ChildProcess*> all;
    for (std::optional<ChildProcess>& w : workers_) {
      if (w.has_value()) all.push_back(&*w);
    }
    TerminateAll(all, absl::Seconds(5));
    if (coordinator_.has_value()) coordinator_->Terminate(absl::Seconds(5));
  }

  const std::string& target() const { return target_; }
  int size() const { return workers_.size(); }
  bool alive(int slot) const { return workers_[slot].has_value(); }
  pid_t coordinator_pid() const { return coordinator_->pid(); }
  pid_t worker_pid(int slot) const { return workers_[slot]->pid(); }

  absl::Status StartWorker(int slot) {
    absl::StatusOr<ChildProcess> worker = ChildProcess::Spawn(
        options_.worker_binary,
        {absl::StrCat("--coordinator=", target_),
         options_.cuda ? absl::StrCat("--device=cuda:", slot)
                       : std::string("--device=cpu"),
         "--host=127.0.0.1", "--port=0"},
        ChildProcess::Output::kToStderr);
    if (!worker.ok()) return worker.status();
    workers_[slot].emplace(std::move(*worker));
    return absl::OkStatus();
  }

  void KillWorker(int slot) {
    workers_[slot]->Signal(SIGKILL);
    workers_[slot]->Wait();
    workers_[slot].reset();
  }

  // Polls the coordinator until it reports the cluster ready.
  absl::Status WaitReady(absl::Duration timeout) {
    ClientOptions options;
    options.wait_for_ready = true;
    options.deadline = absl::Seconds(5);
    std::unique_ptr<Client> client = *Client::Connect(target_, options);
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status last;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::ClusterInfo> info = client->GetClusterInfo();
      if (info.ok() && info->ready()) return absl::OkStatus();
      last = info.status();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "cluster not ready in time; last status: ", last.ToString()));
  }

 private:
  explicit Cluster(const LoadOptions& options) : options_(options) {}

  const LoadOptions& options_;
  std::string target_;
  std::vector<std::optional<ChildProcess>> workers_;
  std::optional<ChildProcess> coordinator_;  // stopped last
};

// One client thread's call in flight, seen by the hang watch.
struct Slot {
  std::atomic<int64_t> started_ns{0};  // 0: no call in flight
  std::atomic<bool> hang_counted{false};
  std::atomic<bool> done{false};
};

absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// What the client threads share with the main thread; owned jointly so that a
// hung thread left behind never outlives it.
struct Shared {
  explicit Shared(const LoadOptions& o, std::string target)
      : options(o), target(std::move(target)), slots(o.clients) {}

  const LoadOptions options;
  const std::string target;
  std::vector<Slot> slots;
  absl::Notification stop;

  Tolerance tolerance() const {
    return options.cuda ? kGpuTolerance : kCpuTolerance;
  }

  absl::Mutex mutex;
  LoadReport report ABSL_GUARDED_BY(mutex);
  std::vector<absl::Duration> latencies ABSL_GUARDED_BY(mutex);

  // Runs `call` as one tracked call of client `index`.
  template <typename F>
  auto Track(int index, F&& call) {
    Slot& slot = slots[index];
    slot.hang_counted = false;
    const absl::Time start = absl::Now();
    slot.started_ns = absl::ToUnixNanos(start);
    auto result = call();
    slot.started_ns = 0;
    const absl::Duration took = absl::Now() - start;
    const absl::Status status = StatusOf(result);
    absl::MutexLock lock(&mutex);
    ++report.sent;
    if (status.ok()) {
      ++report.succeeded;
      latencies.push_back(took);
    } else {
      const std::string code = absl::StatusCodeToString(status.code());
      ++report.failed[code];
      report.examples.emplace(code, std::string(status.message()));
    }
    return result;
  }

  void RecordCheck(const absl::Status& check, const std::string& what,
                   int64_t bytes) {
    absl::MutexLock lock(&mutex);
    ++report.checked;
    if (check.ok()) {
      report.request_bytes += bytes;
      return;
    }
    ++report.wrong;
    if (report.wrong_examples.size() < 5) {
      report.wrong_examples.push_back(
          absl::StrCat(what, ": ", check.message()));
    }
  }

  // After a failed call: a short pause, so a cluster that is not ready is not
  // flooded.
  void Backoff() {
    stop.WaitForNotificationWithTimeout(absl::Milliseconds(200));
  }

  // Counts the calls in flight for longer than their attempts may take (each
  // its deadline and the longest wait before the next) + slack.
  void CountHangs() {
    const int64_t bound_ns = absl::ToInt64Nanoseconds(
        options.max_attempts *
            (options.deadline + ClientOptions::kLongestRetryWait) +
        options.hang_slack);
    const int64_t now = absl::ToUnixNanos(absl::Now());
    for (Slot& slot : slots) {
      const int64_t started = slot.started_ns;
      if (started != 0 && now - started > bound_ns &&
          !slot.hang_counted.exchange(true)) {
        absl::MutexLock lock(&mutex);
        ++report.hangs;
      }
    }
  }
};

std::unique_ptr<Client> NewClient(const Shared& shared) {
  ClientOptions options;
  options.deadline = shared.options.deadline;
  options.max_attempts = shared.options.max_attempts;
  return *Client::Connect(shared.target, options);
}

// Attends of random requests, each checked.
void AttendLoop(std::shared_ptr<Shared> shared, int index) {
  std::mt19937 rng(shared->options.seed * 7919 + index);
  std::unique_ptr<Client> client = NewClient(*shared);
  while (!shared->stop.HasBeenNotified()) {
    const LoadRequest r = RandomRequest(rng, shared->options.max_request_bytes);
    absl::StatusOr<AttendResult> result = shared->Track(index, [&] {
      return client->Attend(r.proto, r.q.view(), r.k.view(), r.v.view());
    });
    if (!result.ok()) {
      shared->Backoff();
      continue;
    }
    shared->RecordCheck(CheckResult(r.spec, r.q.view(), r.k.view(), r.v.view(),
                                    *result, shared->tolerance(), rng),
                        absl::StrCat(r.kind, " ", r.proto.ShortDebugString()),
                        r.bytes);
  }
}

// A resident context of this thread's own: created, appended to in uneven
// pieces, queried (causal or not), decoded into (append + query in one call)
// and deleted, every query checked against the rows uploaded so far. After a
// failure the context is deleted and a new one started under a new name, so
// an ambiguous outcome never leaks into a check.
void ContextLoop(std::shared_ptr<Shared> shared, int index) {
  std::mt19937 rng(shared->options.seed * 7919 + index);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::unique_ptr<Client> client = NewClient(*shared);
  AttentionSpec base;
  base.kv_heads = uniform(1, 2);
  base.q_heads = base.kv_heads * 4;
  base.head_dim = 64;
  const int64_t capacity =
      std::min<int64_t>(6000, shared->options.max_request_bytes /
                                  (8 * base.kv_heads * base.head_dim));
  const Tensor<float> k =
      RandomInput({1, capacity, base.kv_heads, base.head_dim}, v1::FP32, rng);
  const Tensor<float> v =
      RandomInput({1, capacity, base.kv_heads, base.head_dim}, v1::FP32, rng);
  int generation = 0;
  int64_t length = 0;
  std::string name;
  while (!shared->stop.HasBeenNotified()) {
    if (length == 0) {
      name = absl::StrCat("load-", shared->options.seed, "-", index, "-",
                          generation++);
      const int64_t n = uniform(1, capacity / 2);
      absl::Status s =
          shared
              ->Track(index,
                      [&] {
                        return client->CreateContext(name, k.view().Slice(0, n),
                                                     v.view().Slice(0, n));
                      })
              .status();
      if (s.ok()) {
        length = n;
      } else {
        // Counted by Track; a create that failed may still have left a context.
        shared->Track(index, [&] { return client->DeleteContext(name); })
            .IgnoreError();
        shared->Backoff();
      }
      continue;
    }
    const int64_t op = uniform(0, 19);
    absl::Status s;
    if (op == 0 || length + 8 > capacity) {
      s = shared->Track(index, [&] { return client->DeleteContext(name); });
      length = 0;
      if (s.ok()) continue;
    } else if (op < 5) {
      const int64_t n = uniform(1, std::min<int64_t>(300, capacity - length));
      s = shared
              ->Track(index,
                      [&] {
                        return client->AppendContext(
                            name, k.view().Slice(length, length + n),
                            v.view().Slice(length, length + n));
                      })
              .status();
      if (s.ok()) length += n;
    } else {
      // A query (op < 15) or a decode step of 1-4 new rows.
      const bool decode = op >= 15;
      AttentionSpec spec = base;
      spec.q_len = decode ? uniform(1, 4) : uniform(1, 64);
      spec.kv_len = length + (decode ? spec.q_len : 0);
      spec.causal = decode || uniform(0, 1) == 1;
      v1::AttentionSpec proto = SpecToProto(spec);
      proto.set_return_lse(true);
      const Tensor<float> q = RandomInput(
          {1, spec.q_len, spec.q_heads, spec.head_dim}, v1::FP32, rng);
      const View<const float> k_new = k.view().Slice(length, spec.kv_len);
      const View<const float> v_new = v.view().Slice(length, spec.kv_len);
      absl::StatusOr<AttendResult> result = shared->Track(index, [&] {
        return decode ? client->Query(name, proto, q.view(), k_new, v_new)
                      : client->Query(name, proto, q.view());
      });
      s = result.status();
      if (s.ok()) {
        length = spec.kv_len;
        shared->RecordCheck(
            CheckResult(spec, q.view(), k.view().Slice(0, length),
                        v.view().Slice(0, length), *result, shared->tolerance(),
                        rng),
            absl::StrCat(decode ? "decode" : "query", " of context ", name, " ",
                         proto.ShortDebugString()),
            4 * (q.values().size() + 2 * length * base.kv_heads * 64));
      }
    }
    if (!s.ok()) {
      if (length != 0) {
        // Counted by Track; the context may be gone already.
        shared->Track(index, [&] { return client->DeleteContext(name); })
            .IgnoreError();
      }
      length = 0;
      shared->Backoff();
    }
  }
}

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f", bytes / 1048576.0);
}

}  // namespace

std::string LoadReport::ToString() const {
  std::string out = absl::StrFormat(
      "elapsed %.1f s\n"
      "calls sent          %d\n"
      "succeeded           %d\n",
      absl::ToDoubleSeconds(elapsed), sent, succeeded);
  int64_t failures = 0;
  for (const auto& [code, count] : failed) failures += count;
  absl::StrAppendFormat(&out, "failed              %d\n", failures);
  for (const auto& [code, count] : failed) {
    absl::StrAppendFormat(&out, "  %-18s %d   e.g. \"%s\"\n", code, count,
                          examples.at(code));
  }
  absl::StrAppendFormat(
      &out,
      "results checked     %d (%.1f MiB of Q, K, V)\n"
      "wrong results       %d\n"
      "hangs               %d\n"
      "workers killed      %d\n"
      "latency of successes: p50 %.3f s, p99 %.3f s, max %.3f s\n",
      checked, request_bytes / 1048576.0, wrong, hangs, kills,
      absl::ToDoubleSeconds(p50), absl::ToDoubleSeconds(p99),
      absl::ToDoubleSeconds(max_latency));
  for (const std::string& example : wrong_examples) {
    absl::StrAppend(&out, "  wrong: ", example, "\n");
  }
  absl::StrAppend(&out,
                  "memory (MiB)        RSS start  RSS half-way   RSS end   "
                  "peak (VmHWM) end\n");
  for (const ProcessMemory& m : memory) {
    absl::StrAppendFormat(
        &out, "  %-17s %9s %13s %9s %9s%s\n", m.name, MiB(m.rss_start),
        m.rss_half > 0 ? MiB(m.rss_half) : "-", MiB(m.rss_end), MiB(m.peak_end),
        m.restarts > 0 ? absl::StrCat("   (replaced ", m.restarts,
                                      " times: end is the last one)")
                       : "");
  }
  return out;
}

absl::Status CheckFaultRun(const LoadReport& report, int64_t min_kills) {
  std::vector<std::string> problems;
  if (report.wrong > 0)
    problems.push_back(absl::StrCat(report.wrong, " wrong"));
  if (report.hangs > 0) problems.push_back(absl::StrCat(report.hangs, " hung"));
  if (report.kills < min_kills) {
    problems.push_back(absl::StrCat("only ", report.kills, " of ", min_kills,
                                    " workers killed"));
  }
  if (report.checked == 0) problems.push_back("no result checked");
  for (const auto& [code, count] : report.failed) {
    if (code != "UNAVAILABLE" && code != "NOT_FOUND" && code != "ABORTED" &&
        code != "RESOURCE_EXHAUSTED" && code != "FAILED_PRECONDITION") {
      problems.push_back(absl::StrCat(count, " failed with ", code));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the fault run went wrong: ",
                                          absl::StrJoin(problems, ", ")));
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  if (!started.ok()) return started.status();
  Cluster& cluster = **started;
  auto shared = std::make_shared<Shared>(options, cluster.target());

  std::vector<ProcessMemory> memory(cluster.size() + 1);
  memory[0].name = "coordinator";
  memory[0].rss_start = ReadMemory(cluster.coordinator_pid()).first;
  for (int i = 0; i < cluster.size(); ++i) {
    memory[i + 1].name = absl::StrCat("worker ", i);
    memory[i + 1].rss_start = ReadMemory(cluster.worker_pid(i)).first;
  }

  const int context_clients =
      static_cast<int>(options.clients * options.context_share + 0.5);
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([shared, i, context = i < context_clients] {
      if (context) {
        ContextLoop(shared, i);
      } else {
        AttendLoop(shared, i);
      }
      shared->slots[i].done = true;
    });
  }

  // The fault schedule and the hang watch, until the time is up.
  std::mt19937 rng(options.seed);
  auto between = [&](absl::Duration lo, absl::Duration hi) {
    return lo + absl::Nanoseconds(std::uniform_int_distribution<int64_t>(
                    0, absl::ToInt64Nanoseconds(hi - lo))(rng));
  };
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.duration;
  absl::Time next_kill = start + between(options.kill_min, options.kill_max);
  int dead_slot = -1;  // the slot of the killed worker, until restarted
  absl::Time restart_at;
  int64_t kills = 0;
  absl::Status fault_error;
  bool half_sampled = false;
  while (absl::Now() < end) {
    if (!half_sampled && absl::Now() >= start + options.duration / 2) {
      half_sampled = true;
      memory[0].rss_half = ReadMemory(cluster.coordinator_pid()).first;
      for (int i = 0; i < cluster.size(); ++i) {
        if (cluster.alive(i)) {
          memory[i + 1].rss_half = ReadMemory(cluster.worker_pid(i)).first;
        }
      }
    }
    if (options.faults && dead_slot < 0 && absl::Now() >= next_kill) {
      dead_slot =
          std::uniform_int_distribution<int>(0, cluster.size() - 1)(rng);
      cluster.KillWorker(dead_slot);
      ++kills;
      ++memory[dead_slot + 1].restarts;
      restart_at =
          absl::Now() + between(absl::ZeroDuration(), options.restart_max);
    }
    if (dead_slot >= 0 && absl::Now() >= restart_at) {
      fault_error = cluster.StartWorker(dead_slot);
      if (!fault_error.ok()) break;
      dead_slot = -1;
      next_kill = absl::Now() + between(options.kill_min, options.kill_max);
    }
    shared->CountHangs();
    absl::SleepFor(absl::Milliseconds(20));  // the schedule's resolution
  }
  shared->stop.Notify();
  if (dead_slot >= 0 && fault_error.ok()) {
    fault_error = cluster.StartWorker(dead_slot);
  }

  // Wait for the threads' last calls: until all are done, or every one still
  // running is a hang.
  while (true) {
    shared->CountHangs();
    bool waiting = false;
    for (Slot& slot : shared->slots) {
      if (!slot.done && !slot.hang_counted) waiting = true;
    }
    if (!waiting) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (int i = 0; i < options.clients; ++i) {
    if (shared->slots[i].done) {
      threads[i].join();
    } else {
      threads[i].detach();
    }
  }
  if (!fault_error.ok()) return fault_error;

  LoadReport report;
  {
    absl::MutexLock lock(&shared->mutex);
    report = shared->report;
    std::vector<absl::Duration>& l = shared->latencies;
    std::sort(l.begin(), l.end());
    if (!l.empty()) {
      report.p50 = l[l.size() / 2];
      report.p99 = l[std::min(l.size() - 1, l.size() * 99 / 100)];
      report.max_latency = l.back();
    }
  }
  report.elapsed = absl::Now() - start;
  report.kills = kills;
  std::tie(memory[0].rss_end, memory[0].peak_end) =
      ReadMemory(cluster.coordinator_pid());
  for (int i = 0; i < cluster.size(); ++i) {
    std::tie(memory[i + 1].rss_end, memory[i + 1].peak_end) =
        ReadMemory(cluster.worker_pid(i));
  }
  report.memory = std::move(memory);
  return report;
}

}  // namespace ringattn
