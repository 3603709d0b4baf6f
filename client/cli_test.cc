// Tests of the `ringattn` binary: `local` over a fake coordinator and fake
// workers, and the commands that talk to a server against what it starts.

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "client/child_process.h"
#include "client/npy.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

std::string Runfile(const std::string& name) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/ringattn/client/" + name;
}

std::string TempDir() { return std::getenv("TEST_TMPDIR"); }

// Everything read from `fd` until end of file.
std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  return text;
}

// One line read from `fd` (without the newline), or what came before EOF.
std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs `ringattn args...` to the end.
CliResult RunCli(const std::vector<std::string>& args) {
  std::vector<std::string> shell = {"-c", "exec \"$0\" \"$@\" 2>&1",
                                    Runfile("ringattn")};
  shell.insert(shell.end(), args.begin(), args.end());
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Spawn("/bin/sh", shell, ChildProcess::Output::kPipe);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return {-1, ""};
  std::string output = ReadAll(child->stdout_fd());
  return {child->Wait().code, output};
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A directory holding a ringattn-coordinator (the fake one) and a
// ringattn-worker shell script running `worker_body`; fake processes write
// their pids into `pid_dir` (FAKE_PID_DIR).
std::string MakeBinDir(const std::string& name,
                       const std::string& worker_body) {
  const std::string dir = TempDir() + "/" + name;
  mkdir(dir.c_str(), 0755);
  symlink(Runfile("fake_coordinator").c_str(),
          (dir + "/ringattn-coordinator").c_str());
  const std::string worker = dir + "/ringattn-worker";
  std::ofstream(worker) << "#!/bin/sh\n" << worker_body << "\n";
  chmod(worker.c_str(), 0755);
  return dir;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pid_dir_ = TempDir() + "/pids_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(pid_dir_.c_str(), 0755);
    setenv("FAKE_PID_DIR", pid_dir_.c_str(), 1);
    unsetenv("FAKE_COORDINATOR_READY");
  }

  std::string pid_dir_;
};

TEST_F(CliTest, LocalClusterServesTheOtherCommands) {
  const std::string bin_dir = MakeBinDir(
      "bin_ok", "echo \"$@\" > \"$FAKE_PID_DIR/worker.$$\"\nexec sleep 1000");
  absl::StatusOr<ChildProcess> local = ChildProcess::Spawn(
      Runfile("ringattn"), {"local", "--workers", "2", "--bin_dir", bin_dir},
      ChildProcess::Output::kPipe);
  ASSERT_TRUE(local.ok()) << local.status();
  const std::string ready = ReadLine(local->stdout_fd());
  ASSERT_EQ(ready.rfind("ready 127.0.0.1:", 0), 0u) << ready;
  const std::string target = ready.substr(6);

  CliResult info = RunCli({"info", "--target", target});
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_TRUE(Contains(info.output, "world_size 2, ready")) << info.output;

  // Q [N=5, H=2, D=3] echoes back as O; LSE comes back [H, N].
  std::vector<float> q(30), kv(2 * 1 * 3);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.5f * i;
  const std::string dir = TempDir() + "/";
  ASSERT_TRUE(WriteNpy(dir + "q.npy", {5, 2, 3}, q).ok());
  ASSERT_TRUE(WriteNpy(dir + "kv.npy", {2, 1, 3}, kv).ok());
  CliResult attend =
      RunCli({"attend",        "--target", target,           "--q",
              dir + "q.npy",   "--k",      dir + "kv.npy",   "--v",
              dir + "kv.npy",  "--out",    dir + "o.npy",    "--lse_out",
              dir + "lse.npy", "--causal", "--wire_dtype",   "fp32",
              "--chunk_bytes", "30",       "--max_attempts", "3"});
  EXPECT_EQ(attend.exit_code, 0) << attend.output;
  EXPECT_TRUE(Contains(attend.output, "GFLOP/s")) << attend.output;
  // The summary's kernel launches, sorted by kernel name.
  EXPECT_TRUE(
      Contains(attend.output, "; kernel launches: cpu_block 2, cpu_decode 3"))
      << attend.output;
  absl::StatusOr<NpyArray> o = ReadNpy(dir + "o.npy");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shape, (std::vector<int64_t>{5, 2, 3}));
  EXPECT_EQ(o->values, q);
  absl::StatusOr<NpyArray> lse = ReadNpy(dir + "lse.npy");
  ASSERT_TRUE(lse.ok()) << lse.status();
  EXPECT_EQ(lse->shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(lse->values[1 * 5 + 4], 104.0f);

  CliResult create =
      RunCli({"context", "create", "--target", target, "--name", "doc", "--k",
              dir + "kv.npy", "--v", dir + "kv.npy"});
  EXPECT_EQ(create.exit_code, 0) << create.output;
  EXPECT_TRUE(Contains(create.output, "doc: batch 1, length 2, kv_heads 1"))
      << create.output;
  CliResult query =
      RunCli({"context", "query", "--target", target, "--name", "doc", "--q",
              dir + "q.npy", "--out", dir + "o2.npy"});
  EXPECT_EQ(query.exit_code, 0) << query.output;
  EXPECT_EQ(ReadNpy(dir + "o2.npy")->values, q);
  // The dtype the workers hold it in, and a line per worker (the fake's one).
  const std::string listed =
      RunCli({"context", "list", "--target", target}).output;
  EXPECT_TRUE(Contains(
      listed, "doc: batch 1, length 2, kv_heads 1, head_dim 3, fp32, "))
      << listed;
  EXPECT_TRUE(Contains(listed, "\n  rank 0  fake-worker:1  48 B  fp32\n"))
      << listed;
  EXPECT_EQ(RunCli({"context", "delete", "--target", target, "--name", "doc"})
                .exit_code,
            0);
  CliResult missing =
      RunCli({"context", "query", "--target", target, "--name", "doc", "--q",
              dir + "q.npy", "--out", dir + "o2.npy"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(Contains(missing.output, "no context named 'doc'"))
      << missing.output;

  local->Signal(SIGTERM);
  EXPECT_TRUE(local->Wait().success());
  // The workers got their flags and are gone with the cluster.
  int workers = 0;
  DIR* pids = opendir(pid_dir_.c_str());
  ASSERT_NE(pids, nullptr);
  while (const dirent* entry = readdir(pids)) {
    const std::string name = entry->d_name;
    if (name.rfind("worker.", 0) != 0) continue;
    std::ifstream args(pid_dir_ + "/" + name);
    std::string line;
    std::getline(args, line);
    EXPECT_EQ(line, "--coordinator " + target + " --device cpu");
    const pid_t pid = std::stoi(name.substr(7));
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "worker " << pid;
    ++workers;
  }
  closedir(pids);
  EXPECT_EQ(workers, 2);
}

TEST_F(CliTest, LocalFailsWhenAWorkerDies) {
  setenv("FAKE_COORDINATOR_READY", "0", 1);
  const std::string bin_dir = MakeBinDir("bin_dies", "exit 3");
  CliResult local = RunCli({"local", "--workers", "1", "--bin_dir", bin_dir});
  EXPECT_EQ(local.exit_code, 1);
  EXPECT_TRUE(Contains(local.output, "ringattn-worker 0 (pid "))
      << local.output;
  EXPECT_TRUE(
      Contains(local.output, "ended before the cluster was ready: exit code 3"))
      << local.output;
  EXPECT_FALSE(Contains(local.output, "ready 127.0.0.1")) << local.output;
}

TEST_F(CliTest, LocalGivesUpWhenTheClusterIsNotReady) {
  setenv("FAKE_COORDINATOR_READY", "0", 1);
  const std::string bin_dir = MakeBinDir("bin_slow", "exec sleep 1000");
  CliResult local = RunCli({"local", "--workers", "1", "--bin_dir", bin_dir,
                            "--ready_timeout", "1"});
  EXPECT_EQ(local.exit_code, 1);
  EXPECT_TRUE(Contains(local.output, "DEADLINE_EXCEEDED")) << local.output;
  EXPECT_TRUE(Contains(local.output, "last answer: 0 of 1 workers"))
      << local.output;
}

TEST_F(CliTest, LocalNamesMissingBinaries) {
  CliResult local =
      RunCli({"local", "--workers", "1", "--bin_dir", TempDir() + "/nowhere"});
  EXPECT_EQ(local.exit_code, 1);
  EXPECT_TRUE(Contains(local.output, "nowhere/ringattn-coordinator"))
      << local.output;
  EXPECT_TRUE(Contains(local.output, "--bin_dir")) << local.output;
}

TEST_F(CliTest, UsageErrorsExitWith2) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {},
           {"frobnicate"},
           {"attend", "--target", "x:1", "--q", "q.npy"},
           {"attend", "--bogus"},
           {"attend", "--target", "x:1", "--q", "q", "--k", "k", "--v", "v",
            "--out", "o", "--dilated", "8"},
           {"local"},
           {"local", "--workers", "0"},
           {"context", "rename"},
           {"info", "--target", "x:1", "--timeout", "0"},
           {"info", "--target", "x:1", "--max_attempts", "0"},
           {"info", "--target", "x:1", "--max_attempts", "6"},
           {"attend", "--target", "x:1", "--q", "q", "--k", "k", "--v", "v",
            "--out", "o", "--upload_streams", "-1"},
           {"attend", "--target", "x:1", "--q", "q", "--k", "k", "--v", "v",
            "--out", "o", "--download_streams", "65"}}) {
    CliResult result = RunCli(args);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(Contains(result.output, "usage:")) << result.output;
  }
  EXPECT_TRUE(
      Contains(RunCli({"attend", "--target", "x:1", "--q", "q.npy"}).output,
               "flag --k is required"));
  EXPECT_TRUE(
      Contains(RunCli({"attend", "--target", "x:1", "--q", "q", "--k", "k",
                       "--v", "v", "--out", "o", "--download_streams", "65"})
                   .output,
               "--download_streams must be in [0, 64] (0: automatic), got 65"));
  CliResult help = RunCli({"help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(Contains(help.output, "ringattn attend --target HOST:PORT"));
}

TEST_F(CliTest, RequestErrorsExitWith1) {
  const std::string dir = TempDir() + "/";
  CliResult no_file = RunCli(
      {"attend", "--target", "127.0.0.1:1", "--q", dir + "absent.npy", "--k",
       dir + "absent.npy", "--v", dir + "absent.npy", "--out", dir + "o.npy"});
  EXPECT_EQ(no_file.exit_code, 1);
  EXPECT_TRUE(Contains(no_file.output, "NOT_FOUND: " + dir + "absent.npy"))
      << no_file.output;
  CliResult unreachable = RunCli({"info", "--target", "127.0.0.1:1"});
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_TRUE(Contains(unreachable.output, "UNAVAILABLE"))
      << unreachable.output;
}

}  // namespace
}  // namespace ringattn
