// GrpcStore against an in-process fake Coordination service over a real gRPC
// channel: values round-trip, gets wait for keys set later, waits time out
// with gloo::IoException, and Gloo ranks rendezvous through it.

#include "worker/grpc_store.h"

#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gloo/common/error.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/fake_coordination.h"
#include "worker/gloo_communicator.h"

namespace ringattn {
namespace {

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&coordination_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Coordination::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  FakeCoordination coordination_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<v1::Coordination::Stub> stub_;
};

TEST_F(GrpcStoreTest, ValuesRoundTrip) {
  GrpcStore store(stub_, absl::Seconds(5));
  const std::vector<char> value = {'a', '\0', '\xff', 'z'};
  store.set("key", value);
  EXPECT_EQ(store.get("key"), value);
  store.wait({"key"});
}

TEST_F(GrpcStoreTest, GetWaitsForAKeySetLater) {
  GrpcStore store(stub_, absl::Seconds(10));
  std::vector<char> got;
  std::thread getter([&] { got = store.get("later"); });
  store.set("later", {'x'});
  getter.join();
  EXPECT_EQ(got, std::vector<char>{'x'});
}

TEST_F(GrpcStoreTest, WaitTimesOutWithIoException) {
  GrpcStore store(stub_, absl::Seconds(10));
  const absl::Time start = absl::Now();
  try {
    store.wait({"missing"}, std::chrono::milliseconds(200));
    FAIL() << "wait returned for a key nobody set";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(GrpcStoreTest, GlooRanksMeetThroughIt) {
  GrpcStore store(stub_, absl::Seconds(10));
  constexpr int kRanks = 3;
  std::vector<absl::Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
          CreateGlooTcpDevice("127.0.0.1");
      if (!device.ok()) {
        results[r] = device.status();
        return;
      }
      GlooConnector connector(store, *device);
      absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
          connector.Connect("request-1", r, kRanks, absl::Seconds(10), nullptr);
      if (!communicator.ok()) {
        results[r] = communicator.status();
        return;
      }
      std::vector<int> out(256, r), in(256, -1);
      RingCommunicator& c = **communicator;
      results[r] = c.StartReceive(in.data(), 1024, (r + kRanks - 1) % kRanks);
      if (results[r].ok()) {
        results[r] = c.StartSend(out.data(), 1024, (r + 1) % kRanks);
      }
      if (results[r].ok()) results[r] = c.Wait(absl::Now() + absl::Seconds(10));
      if (results[r].ok() && in[255] != (r + kRanks - 1) % kRanks) {
        results[r] = absl::InternalError("wrong data");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

TEST_F(GrpcStoreTest, MissingRankIsNamedInTheTimeout) {
  GrpcStore store(stub_, absl::Seconds(10));
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
      CreateGlooTcpDevice("127.0.0.1");
  ASSERT_TRUE(device.ok());
  GlooConnector connector(store, *device);
  const absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
      connector.Connect("request-2", 0, 2, absl::Milliseconds(300), nullptr);
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(communicator.status().message().find("rank 1 did not join"),
            std::string::npos)
      << communicator.status();
}

}  // namespace
}  // namespace ringattn
