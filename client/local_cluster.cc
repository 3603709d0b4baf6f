#include "client/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "client/child_process.h"
#include "client/client.h"

namespace ringattn {
namespace {

// How long each readiness check may wait for the coordinator, and how long
// to pause after one that failed.
constexpr absl::Duration kInfoDeadline = absl::Seconds(1);
constexpr absl::Duration kReadyPollInterval = absl::Milliseconds(200);

sigset_t ClusterSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  return set;
}

// The cluster signal that arrives within `timeout`, or 0 if none does.
int WaitForSignal(absl::Duration timeout) {
  const sigset_t set = ClusterSignals();
  const timespec limit = absl::ToTimespec(timeout);
  const int signal = sigtimedwait(&set, nullptr, &limit);
  return signal < 0 ? 0 : signal;
}

// The next cluster signal, however long it takes.
int WaitForSignal() {
  const sigset_t set = ClusterSignals();
  int signal;
  do {
    signal = sigwaitinfo(&set, nullptr);
  } while (signal < 0 && errno == EINTR);
  return signal;
}

// Sockets bound to free ports of 127.0.0.1, closed on destruction.
class PortReservation {
 public:
  PortReservation() = default;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation() {
    for (int fd : sockets_) close(fd);
  }

  // A port no other socket holds now (it may be taken again once this
  // reservation is gone, which is why several are picked while it holds).
  absl::StatusOr<int> Take() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot pick a free port: ", strerror(errno)));
    }
    sockets_.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot pick a free port: ", strerror(errno)));
    }
    return ntohs(address.sin_port);
  }

 private:
  std::vector<int> sockets_;
};

absl::StatusOr<std::string> ExecutableDir() {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length < 0) {
    return absl::InternalError(absl::StrCat(
        "cannot find this executable (/proc/self/exe): ", strerror(errno),
        "; pass --bin_dir"));
  }
  const std::string self(path, length);
  return self.substr(0, self.rfind('/'));
}

// A child of the cluster and what to call it in messages.
struct Member {
  std::string name;
  ChildProcess process;
};

// ABORTED naming the first member that has ended, or OK.
absl::Status CheckRunning(std::vector<Member>& members,
                          absl::string_view when) {
  for (Member& member : members) {
    if (std::optional<ExitStatus> exit = member.process.Poll()) {
      return absl::AbortedError(absl::StrCat(member.name, " (pid ",
                                             member.process.pid(), ") ended ",
                                             when, ": ", exit->ToString()));
    }
  }
  return absl::OkStatus();
}

// Where program `name` is: in `bin_dir`, or else, as Bazel lays out
// bazel-bin, in the sibling folder `package` (bazel-bin/client/ringattn next to
// bazel-bin/server/ringattn-coordinator). Returns the first path if neither
// exists, so that the error names it.
std::string FindProgram(const std::string& bin_dir, const std::string& package,
                        const std::string& name) {
  const std::string beside = bin_dir + "/" + name;
  const std::string sibling = bin_dir + "/../" + package + "/" + name;
  return access(beside.c_str(), F_OK) != 0 && access(sibling.c_str(), F_OK) == 0
             ? sibling
             : beside;
}

absl::Status Spawn(
    const std::string& name, const std::string& path,
    const std::vector<std::string>& args, std::vector<Member>* members,
    const std::vector<std::pair<std::string, std::string>>& environment = {}) {
  absl::StatusOr<ChildProcess> process = ChildProcess::Spawn(
      path, args, ChildProcess::Output::kToStderr, environment);
  if (process.ok()) {
    members->push_back({name, *std::move(process)});
    return absl::OkStatus();
  }
  if (absl::IsNotFound(process.status())) {
    return absl::NotFoundError(
        absl::StrCat(process.status().message(),
                     " (pass --bin_dir to say where the ringattn binaries "
                     "are)"));
  }
  return process.status();
}

}  // namespace

void BlockClusterSignals() {
  const sigset_t set = ClusterSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::Status RunLocalCluster(const LocalClusterOptions& options,
                             std::FILE* out) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be >= 1, got ", options.workers));
  }
  std::string bin_dir = options.bin_dir;
  if (bin_dir.empty()) {
    absl::StatusOr<std::string> dir = ExecutableDir();
    if (!dir.ok()) return dir.status();
    bin_dir = *std::move(dir);
  }
  int port = options.port, http_port = options.http_port;
  {
    PortReservation reservation;
    for (int* chosen : {&port, &http_port}) {
      if (*chosen != 0) continue;
      absl::StatusOr<int> free_port = reservation.Take();
      if (!free_port.ok()) return free_port.status();
      *chosen = *free_port;
    }
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);

  std::vector<Member> members;
  absl::Cleanup stop = [&members, &options] {
    std::vector<ChildProcess*> processes;
    for (Member& member : members) processes.push_back(&member.process);
    TerminateAll(processes, options.grace);
  };
  absl::Status spawned = Spawn(
      "ringattn-coordinator",
      FindProgram(bin_dir, "server", "ringattn-coordinator"),
      {"--port", absl::StrCat(port), "--http_port", absl::StrCat(http_port),
       "--world_size", absl::StrCat(options.workers)},
      &members);
  const std::string worker = FindProgram(bin_dir, "worker", "ringattn-worker");
  // Unless the user's environment says otherwise, the workers' OpenMP threads
  // sleep once a parallel region ends instead of spinning (libgomp's default),
  // since the workers share this machine's cores. On 2 cores with 2 workers a
  // 1-row query against a 4K-token context took 15 ms p50 with spinning
  // threads and 3.8 ms with sleeping ones; an 8K causal request took the same
  // 0.45 s either way.
  const std::vector<std::pair<std::string, std::string>> worker_environment = {
      {"OMP_WAIT_POLICY", "passive"}};
  for (int i = 0; i < options.workers && spawned.ok(); ++i) {
    spawned = Spawn(absl::StrCat("ringattn-worker ", i), worker,
                    {"--coordinator", address, "--device", "cpu"}, &members,
                    worker_environment);
  }
  if (!spawned.ok()) return spawned;

  ClientOptions client_options;
  client_options.deadline = kInfoDeadline;
  // Waiting in the call keeps this thread polling the connection as it comes
  // up; a call that fails at once would leave that to gRPC's 5 s backup poller.
  client_options.wait_for_ready = true;
  client_options.reconnect_backoff = kReadyPollInterval;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(address, client_options);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + options.ready_timeout;
  std::string last_answer;
  while (true) {
    absl::Status running =
        CheckRunning(members, "before the cluster was ready");
    if (!running.ok()) return running;
    absl::StatusOr<v1::ClusterInfo> info = (*client)->GetClusterInfo();
    if (info.ok() && info->ready()) break;
    last_answer = info.ok()
                      ? absl::StrCat(info->workers_size(), " of ",
                                     info->world_size(), " workers have joined")
                      : info.status().ToString();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the cluster at ", address, " was not ready after ",
                       absl::FormatDuration(options.ready_timeout),
                       "; last answer: ", last_answer));
    }
    const int signal = WaitForSignal(kReadyPollInterval);
    if (signal == SIGINT || signal == SIGTERM) return absl::OkStatus();
  }
  std::fprintf(out, "ready %s\n", address.c_str());
  std::fflush(out);

  while (true) {
    const int signal = WaitForSignal();
    if (signal == SIGINT || signal == SIGTERM) return absl::OkStatus();
    absl::Status running = CheckRunning(members, "while the cluster ran");
    if (!running.ok()) return running;
  }
}

}  // namespace ringattn
