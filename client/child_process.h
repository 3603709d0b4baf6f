#ifndef RINGATTN_CLIENT_CHILD_PROCESS_H_
#define RINGATTN_CLIENT_CHILD_PROCESS_H_

// Child processes owned like any other resource, for `ringattn local`, which
// runs a coordinator and its workers beside itself.

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringattn {

// How a child process ended.
struct ExitStatus {
  int code = 0;    // the exit code, when `signal` is 0
  int signal = 0;  // the signal that killed it, or 0

  bool success() const { return signal == 0 && code == 0; }
  // "exit code 3" or "killed by signal 9 (Killed)".
  std::string ToString() const;
};

// A running program started by this process and owned by this object: when
// the object goes (destroyed, or assigned over) a child still running is
// killed with SIGKILL and reaped, so no child outlives its owner unnoticed.
// The child also gets SIGTERM if the thread that spawned it exits first
// (PR_SET_PDEATHSIG), so spawn from the main thread. Move-only; not
// thread-safe.
class ChildProcess {
 public:
  // Where the child's standard output goes.
  enum class Output {
    kInherit,   // this process's stdout
    kToStderr,  // this process's stderr
    kPipe,      // a pipe this object reads through stdout_fd()
  };

  // Starts the program at `path` with arguments `args` (argv[1...]); stdin
  // and stderr are this process's, signals start unblocked with default
  // actions. NOT_FOUND if there is no program at `path`, FAILED_PRECONDITION
  // if it cannot be executed, INTERNAL if no process can be made; each
  // message names the path.
  // The child's environment is this process's, plus those of
  // `environment_defaults` (name, value) that it lacks.
  static absl::StatusOr<ChildProcess> Spawn(
      const std::string& path, const std::vector<std::string>& args,
      Output output = Output::kInherit,
      const std::vector<std::pair<std::string, std::string>>&
          environment_defaults = {});

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();

  pid_t pid() const { return pid_; }

  // The read end of the stdout pipe with Output::kPipe, owned by this object;
  // -1 otherwise.
  int stdout_fd() const { return stdout_fd_; }

  // How the child ended if it has (reaping it), or nullopt while it runs.
  std::optional<ExitStatus> Poll();

  // Waits until the child ends and returns how.
  ExitStatus Wait();

  // As Wait(), giving up (nullopt) at `deadline`.
  std::optional<ExitStatus> WaitUntil(absl::Time deadline);

  // Sends `signal` to the child if it is still running.
  void Signal(int signal);

  // Sends SIGTERM, waits up to `grace` for the child to end, then kills it
  // with SIGKILL; returns how it ended.
  ExitStatus Terminate(absl::Duration grace);

 private:
  ChildProcess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  // Kills and reaps a child still running, and closes the pipe.
  void Release();

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::optional<ExitStatus> exit_;
};

// Sends SIGTERM to every child still running, gives them together up to
// `grace` to end, then kills the rest with SIGKILL and reaps them all.
void TerminateAll(std::vector<ChildProcess*> children, absl::Duration grace);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_CHILD_PROCESS_H_
