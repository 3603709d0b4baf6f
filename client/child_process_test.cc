#include "client/child_process.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Everything the child writes to its stdout, until it closes it.
std::string ReadAll(int fd) {
  std::string text;
  char buffer[256];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  return text;
}

bool Exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

TEST(ChildProcessTest, ReportsTheExitCode) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn("/bin/sh", {"-c", "exit 3"});
  ASSERT_TRUE(child.ok()) << child.status();
  const ExitStatus exit = child->Wait();
  EXPECT_EQ(exit.code, 3);
  EXPECT_FALSE(exit.success());
  EXPECT_EQ(exit.ToString(), "exit code 3");
  EXPECT_EQ(child->Poll()->code, 3);
}

TEST(ChildProcessTest, PipesStdout) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn("/bin/sh", {"-c", "echo hello \"$0\"", "world"},
                          ChildProcess::Output::kPipe);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(ReadAll(child->stdout_fd()), "hello world\n");
  EXPECT_TRUE(child->Wait().success());
}

TEST(ChildProcessTest, EnvironmentDefaultsFillOnlyWhatIsMissing) {
  setenv("RINGATTN_TEST_SET", "parent", 1);
  unsetenv("RINGATTN_TEST_UNSET");
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(
      "/bin/sh", {"-c", "echo $RINGATTN_TEST_SET $RINGATTN_TEST_UNSET"},
      ChildProcess::Output::kPipe,
      {{"RINGATTN_TEST_SET", "default"}, {"RINGATTN_TEST_UNSET", "default"}});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(ReadAll(child->stdout_fd()), "parent default\n");
  EXPECT_TRUE(child->Wait().success());
}

TEST(ChildProcessTest, MissingProgramIsNotFound) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn("/no/such/program", {});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(child.status().message().find("/no/such/program"),
            std::string::npos);
  EXPECT_EQ(ChildProcess::Spawn("/etc/passwd", {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ChildProcessTest, TerminateStopsARunningChild) {
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn("/bin/sleep", {"1000"});
  ASSERT_TRUE(child.ok());
  EXPECT_FALSE(child->Poll().has_value());
  const ExitStatus exit = child->Terminate(absl::Seconds(10));
  EXPECT_EQ(exit.signal, SIGTERM);
  EXPECT_EQ(exit.ToString(), "killed by signal 15 (Terminated)");
}

TEST(ChildProcessTest, TerminateKillsAChildThatIgnoresSigterm) {
  // The shell says "ready" once its trap is set, so SIGTERM comes after.
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(
      "/bin/sh", {"-c", "trap '' TERM; echo ready; while :; do :; done"},
      ChildProcess::Output::kPipe);
  ASSERT_TRUE(child.ok());
  char ready[6];
  ASSERT_EQ(read(child->stdout_fd(), ready, sizeof(ready)), 6);
  EXPECT_EQ(child->Terminate(absl::Milliseconds(100)).signal, SIGKILL);
}

TEST(ChildProcessTest, DestructionKillsAndReaps) {
  pid_t pid;
  {
    absl::StatusOr<ChildProcess> child =
        ChildProcess::Spawn("/bin/sleep", {"1000"});
    ASSERT_TRUE(child.ok());
    pid = child->pid();
    ChildProcess moved = *std::move(child);
    EXPECT_EQ(moved.pid(), pid);
  }
  EXPECT_FALSE(Exists(pid));
}

}  // namespace
}  // namespace ringattn
