// Membership against an in-process fake coordinator: it registers, sends
// heartbeats, registers again after the coordinator restarts, keeps retrying
// until a late coordinator comes up, and stops promptly.

#include "worker/membership.h"

#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <thread>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/fake_coordination.h"

namespace ringattn {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(10);

// An abstract unix socket address private to this test process.
// Unique per run: parallel test runs may share the network namespace and even
// the pid.
std::string SocketAddress(const std::string& name) {
  static const std::string run = std::to_string(std::random_device{}());
  return "unix-abstract:ringattn-membership-test-" + run + "-" + name;
}

std::unique_ptr<grpc::Server> Serve(FakeCoordination& coordination,
                                    const std::string& address) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&coordination);
  return builder.BuildAndStart();
}

MembershipOptions FastOptions() {
  MembershipOptions options;
  options.heartbeat_interval = absl::Milliseconds(20);
  options.first_backoff = absl::Milliseconds(10);
  options.most_backoff = absl::Milliseconds(50);
  return options;
}

v1::RegisterRequest Self() {
  v1::RegisterRequest self;
  self.set_address("127.0.0.1:1234");
  self.set_device("cpu");
  self.set_memory_bytes(1 << 30);
  return self;
}

TEST(Membership, RegistersHeartbeatsAndRegistersAgainAfterRestart) {
  FakeCoordination coordination;
  const std::string address = SocketAddress("coordinator-1");
  std::unique_ptr<grpc::Server> server = Serve(coordination, address);
  ASSERT_NE(server, nullptr);
  Membership membership(v1::Coordination::NewStub(grpc::CreateChannel(
                            address, grpc::InsecureChannelCredentials())),
                        Self(), FastOptions());
  std::thread runner([&] { membership.Run(); });
  EXPECT_TRUE(coordination.AwaitRegistrations(1, kPatience));
  EXPECT_EQ(coordination.last_address(), "127.0.0.1:1234");
  EXPECT_TRUE(coordination.AwaitHeartbeats(3, kPatience));
  coordination.Restart();
  EXPECT_TRUE(coordination.AwaitRegistrations(2, kPatience));
  EXPECT_TRUE(coordination.AwaitHeartbeats(1, kPatience));
  membership.Stop();
  runner.join();
  server->Shutdown();
}

TEST(Membership, RetriesUntilTheCoordinatorComesUp) {
  FakeCoordination coordination;
  const std::string address = SocketAddress("coordinator-2");
  Membership membership(v1::Coordination::NewStub(grpc::CreateChannel(
                            address, grpc::InsecureChannelCredentials())),
                        Self(), FastOptions());
  std::thread runner([&] { membership.Run(); });
  std::unique_ptr<grpc::Server> server = Serve(coordination, address);
  EXPECT_NE(server, nullptr);
  EXPECT_TRUE(server != nullptr &&
              coordination.AwaitRegistrations(1, kPatience));
  membership.Stop();
  runner.join();
  if (server != nullptr) server->Shutdown();
}

TEST(Membership, StopsPromptlyWithoutACoordinator) {
  MembershipOptions options = FastOptions();
  options.rpc_timeout = absl::Seconds(30);
  Membership membership(
      v1::Coordination::NewStub(grpc::CreateChannel(
          SocketAddress("nobody"), grpc::InsecureChannelCredentials())),
      Self(), options);
  std::thread runner([&] { membership.Run(); });
  const absl::Time start = absl::Now();
  membership.Stop();
  runner.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace ringattn
