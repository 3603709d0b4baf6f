#include "client/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ringattn {
namespace {

// How often WaitUntil looks at a child that has not ended yet.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

ExitStatus FromWaitStatus(int status) {
  ExitStatus exit;
  if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  } else {
    exit.code = WEXITSTATUS(status);
  }
  return exit;
}

void CloseIfOpen(int fd) {
  if (fd >= 0) close(fd);
}

// Runs in the child between fork and exec, so only async-signal-safe calls:
// wires stdout, arranges for SIGTERM when the parent goes, resets signals,
// and executes `argv`; on failure writes errno to `error_fd` and exits.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp,
                            ChildProcess::Output output, int stdout_fd,
                            int error_fd, pid_t parent) {
  if (output == ChildProcess::Output::kToStderr) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
  } else if (output == ChildProcess::Output::kPipe) {
    dup2(stdout_fd, STDOUT_FILENO);
  }
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction default_action;
  memset(&default_action, 0, sizeof(default_action));
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) {
    sigaction(signal, &default_action, nullptr);
  }
  execve(argv[0], argv, envp);
  const int error = errno;
  if (write(error_fd, &error, sizeof(error)) < 0) _exit(127);
  _exit(127);
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    return absl::StrCat("killed by signal ", signal, " (", strsignal(signal),
                        ")");
  }
  return absl::StrCat("exit code ", code);
}

absl::StatusOr<ChildProcess> ChildProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args,
    Output output,
    const std::vector<std::pair<std::string, std::string>>&
        environment_defaults) {
  std::vector<std::string> strings = {path};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<std::string> added;
  for (const auto& [name, value] : environment_defaults) {
    if (getenv(name.c_str()) == nullptr) {
      added.push_back(absl::StrCat(name, "=", value));
    }
  }
  std::vector<char*> envp;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    envp.push_back(*variable);
  }
  for (std::string& s : added) envp.push_back(s.data());
  envp.push_back(nullptr);

  int error_pipe[2];
  int stdout_pipe[2] = {-1, -1};
  if (pipe2(error_pipe, O_CLOEXEC) != 0 ||
      (output == Output::kPipe && pipe2(stdout_pipe, O_CLOEXEC) != 0)) {
    const int error = errno;
    return absl::InternalError(
        absl::StrCat("cannot start ", path, ": pipe: ", strerror(error)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    ExecChild(argv.data(), envp.data(), output, stdout_pipe[1], error_pipe[1],
              parent);
  }
  const int fork_error = errno;
  close(error_pipe[1]);
  CloseIfOpen(stdout_pipe[1]);
  if (pid < 0) {
    close(error_pipe[0]);
    CloseIfOpen(stdout_pipe[0]);
    return absl::InternalError(
        absl::StrCat("cannot start ", path, ": fork: ", strerror(fork_error)));
  }
  ChildProcess child(pid, stdout_pipe[0]);
  // The pipe closes unread on a successful exec (close-on-exec).
  int exec_error;
  ssize_t got;
  do {
    got = read(error_pipe[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (got == sizeof(exec_error)) {
    child.Wait();
    return absl::Status(
        exec_error == ENOENT ? absl::StatusCode::kNotFound
                             : absl::StatusCode::kFailedPrecondition,
        absl::StrCat("cannot run ", path, ": ", strerror(exec_error)));
  }
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      exit_(std::move(other.exit_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = std::exchange(other.pid_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    exit_ = std::move(other.exit_);
  }
  return *this;
}

ChildProcess::~ChildProcess() { Release(); }

void ChildProcess::Release() {
  if (pid_ > 0 && !exit_.has_value()) {
    kill(pid_, SIGKILL);
    Wait();
  }
  CloseIfOpen(stdout_fd_);
  stdout_fd_ = -1;
  pid_ = -1;
}

std::optional<ExitStatus> ChildProcess::Poll() {
  if (exit_.has_value() || pid_ <= 0) return exit_;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) exit_ = FromWaitStatus(status);
  return exit_;
}

ExitStatus ChildProcess::Wait() {
  if (exit_.has_value()) return *exit_;
  if (pid_ <= 0) return ExitStatus{-1, 0};
  int status;
  pid_t got;
  do {
    got = waitpid(pid_, &status, 0);
  } while (got < 0 && errno == EINTR);
  exit_ = got == pid_ ? FromWaitStatus(status) : ExitStatus{-1, 0};
  return *exit_;
}

std::optional<ExitStatus> ChildProcess::WaitUntil(absl::Time deadline) {
  while (!Poll().has_value() && absl::Now() < deadline) {
    absl::SleepFor(kPollInterval);
  }
  return exit_;
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0 && !Poll().has_value()) kill(pid_, signal);
}

ExitStatus ChildProcess::Terminate(absl::Duration grace) {
  TerminateAll({this}, grace);
  return Wait();
}

void TerminateAll(std::vector<ChildProcess*> children, absl::Duration grace) {
  for (ChildProcess* child : children) child->Signal(SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  for (ChildProcess* child : children) {
    if (!child->WaitUntil(deadline).has_value()) {
      child->Signal(SIGKILL);
      child->Wait();
    }
  }
}

}  // namespace ringattn
