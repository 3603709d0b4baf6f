// Cluster's eviction of workers that no longer connect, against real sockets
// on the loopback interface.

#include "server/cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

using std::chrono::milliseconds;

// A server of the worker API whose methods are all unimplemented: it accepts
// connections as a live worker does.
class LiveServer {
 public:
  LiveServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~LiveServer() { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  v1::Worker::Service service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A loopback socket that listens and never answers: the kernel completes TCP
// connects to it, but no HTTP/2 handshake ever comes back, as with a worker
// whose process is stopped.
class SilentListener {
 public:
  SilentListener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 ||
        bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "no listening loopback socket: " << strerror(errno);
      return;
    }
    port_ = ntohs(address.sin_port);
  }
  ~SilentListener() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_;
  int port_ = 0;
};

// An address nothing listens on: a live server's port after it shut down.
std::string RefusingAddress() { return LiveServer().address(); }

void Register(Cluster& cluster, const std::string& address) {
  v1::RegisterRequest request;
  request.set_address(address);
  ASSERT_TRUE(cluster.Register(request).ok());
}

TEST(ClusterEviction, RefusedWorkerIsEvictedAndLiveOnesStay) {
  LiveServer live;
  const std::string refusing = RefusingAddress();
  Cluster cluster(2, std::chrono::hours(1));
  Register(cluster, live.address());
  Register(cluster, refusing);
  ASSERT_TRUE(cluster.Ready());

  const auto start = std::chrono::steady_clock::now();
  const std::vector<Cluster::Member> evicted =
      cluster.EvictUnreachable(std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "a refused connect ends the probe without using up the patience";
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].rank, 1);
  EXPECT_EQ(evicted[0].address, refusing);
  absl::StatusOr<std::vector<Cluster::Member>> members = cluster.ReadyMembers();
  ASSERT_EQ(members.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(members.status().message().find("missing rank 1"),
            std::string::npos)
      << members.status();
  EXPECT_FALSE(cluster.Heartbeat(1, refusing))
      << "an evicted worker must register again";
  EXPECT_TRUE(cluster.Heartbeat(0, live.address()));

  EXPECT_TRUE(cluster.EvictUnreachable(milliseconds(200)).empty())
      << "the live worker connects";
}

TEST(ClusterEviction, WorkerThatNeverAnswersIsEvictedOnceThePatienceIsUp) {
  LiveServer live;
  SilentListener silent;
  Cluster cluster(2, std::chrono::hours(1));
  Register(cluster, silent.address());
  Register(cluster, live.address());

  const auto start = std::chrono::steady_clock::now();
  const std::vector<Cluster::Member> evicted =
      cluster.EvictUnreachable(milliseconds(300));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].address, silent.address());
  EXPECT_FALSE(cluster.Ready());
}

TEST(ClusterEviction, AllLiveWorkersStayAndTheEpochHoldsItsValue) {
  LiveServer first, second;
  Cluster cluster(2, std::chrono::hours(1));
  Register(cluster, first.address());
  Register(cluster, second.address());
  absl::StatusOr<Cluster::Membership> before = cluster.ReadyMembership();
  ASSERT_TRUE(before.ok());

  EXPECT_TRUE(cluster.EvictUnreachable(std::chrono::seconds(5)).empty());
  absl::StatusOr<Cluster::Membership> after = cluster.ReadyMembership();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->epoch, before->epoch)
      << "a probe that evicts nobody keeps the workers' communicators";
}

}  // namespace
}  // namespace ringattn
