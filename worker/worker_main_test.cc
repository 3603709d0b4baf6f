// The ringattn-worker binary as a child process against an in-process fake
// coordinator: it registers, serves a request whose ring rendezvous goes
// through the coordinator's store, registers again after the coordinator
// forgets it, and exits 0 on SIGTERM; bad flags exit 2 with a message.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "worker/fake_coordination.h"

extern char** environ;

namespace ringattn {
namespace {

constexpr char kBinary[] = "worker/ringattn-worker";
constexpr absl::Duration kPatience = absl::Seconds(15);

// A child process, killed and reaped on destruction if still running.
class Child {
 public:
  // Starts kBinary with `args`; its stderr goes to `stderr_path` if given.
  Child(const std::vector<std::string>& args, const std::string& stderr_path) {
    std::vector<std::string> argv_strings = {kBinary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!stderr_path.empty()) {
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO,
                                       stderr_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (posix_spawn(&pid_, kBinary, &actions, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ <= 0 || exited_) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  bool started() const { return pid_ > 0; }
  void Signal(int signal) { kill(pid_, signal); }

  // The exit code once the child exits within `timeout`; nullopt otherwise
  // (or if a signal ended it).
  std::optional<int> WaitForExit(absl::Duration timeout) {
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) return std::nullopt;
    pollfd fd{pidfd, POLLIN, 0};
    const int ready =
        poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    close(pidfd);
    if (ready != 1) return std::nullopt;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return std::nullopt;
    exited_ = true;
    if (!WIFEXITED(status)) return std::nullopt;
    return WEXITSTATUS(status);
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(WorkerMain, RegistersServesReregistersAndStopsOnSigterm) {
  FakeCoordination coordination;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&coordination);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  Child worker({absl::StrCat("--coordinator=127.0.0.1:", port),
                "--memory_bytes=100000000", "--listen=127.0.0.1"},
               "");
  ASSERT_TRUE(worker.started());
  ASSERT_TRUE(coordination.AwaitRegistrations(1, kPatience));

  // One request on one rank; the Gloo rendezvous goes through the
  // coordinator's store.
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(grpc::CreateChannel(
          coordination.last_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kPatience));
  auto stream = stub->Execute(&context);
  v1::ExecuteRequest header;
  v1::AttentionSpec* spec = header.mutable_header()->mutable_spec();
  spec->set_batch(1);
  spec->set_q_len(3);
  spec->set_kv_len(3);
  spec->set_q_heads(1);
  spec->set_kv_heads(1);
  spec->set_head_dim(2);
  spec->set_wire_dtype(v1::FP32);
  header.mutable_header()->set_request_id("main-test");
  header.mutable_header()->set_world_size(1);
  header.mutable_header()->set_rendezvous_prefix("main-test");
  ASSERT_TRUE(stream->Write(header));
  for (v1::TensorName tensor : {v1::Q, v1::K, v1::V}) {
    v1::ExecuteRequest rows;
    rows.mutable_rows()->set_tensor(tensor);
    rows.mutable_rows()->set_count(3);
    const float values[6] = {1, 0, 0, 1, 1, 1};
    rows.mutable_rows()->set_data(values, sizeof(values));
    ASSERT_TRUE(stream->Write(rows));
  }
  v1::ExecuteRequest run;
  run.set_run(true);
  ASSERT_TRUE(stream->Write(run));
  stream->WritesDone();
  v1::ExecuteResponse response;
  int outputs = 0;
  bool done = false;
  while (stream->Read(&response)) {
    outputs += response.has_output();
    done = done || response.has_done();
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(outputs, 1);
  EXPECT_TRUE(done);

  coordination.Restart();
  EXPECT_TRUE(coordination.AwaitRegistrations(2, kPatience));

  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.WaitForExit(kPatience), std::optional<int>(0));
  server->Shutdown();
}

TEST(WorkerMain, BadFlagsExitWithUsageError) {
  const std::string errors = TempPath("errors.txt");
  {
    Child worker({"--coordinator=127.0.0.1:1", "--device=cuda:99"}, errors);
    ASSERT_TRUE(worker.started());
    EXPECT_EQ(worker.WaitForExit(kPatience), std::optional<int>(2));
  }
  EXPECT_NE(ReadFile(errors).find("no CUDA device 99: "), std::string::npos)
      << ReadFile(errors);
  {
    Child worker({}, errors);
    ASSERT_TRUE(worker.started());
    EXPECT_EQ(worker.WaitForExit(kPatience), std::optional<int>(2));
  }
  EXPECT_NE(ReadFile(errors).find("--coordinator HOST:PORT is required"),
            std::string::npos)
      << ReadFile(errors);
  {
    Child worker({"--coordinator=127.0.0.1:1", "--compute_linger_us=-2"},
                 errors);
    ASSERT_TRUE(worker.started());
    EXPECT_EQ(worker.WaitForExit(kPatience), std::optional<int>(2));
  }
  EXPECT_NE(ReadFile(errors).find("--compute_linger_us must be -1 (automatic) "
                                  "or at least 0, got -2"),
            std::string::npos)
      << ReadFile(errors);
  {
    Child worker({"--coordinator=127.0.0.1:1", "--pinned_staging_gib=-1"},
                 errors);
    ASSERT_TRUE(worker.started());
    EXPECT_EQ(worker.WaitForExit(kPatience), std::optional<int>(2));
  }
  EXPECT_NE(ReadFile(errors).find(
                "--pinned_staging_gib must not be negative, got -1"),
            std::string::npos)
      << ReadFile(errors);
}

}  // namespace
}  // namespace ringattn
