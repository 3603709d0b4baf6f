// NcclCommunicator and NcclConnector between threads of this process, one
// GPU per rank: transfers arrive intact in both directions and alone, and a
// peer that never joins, stalls or is aborted makes the others fail within
// their timeouts instead of hanging; a CommunicatorCache over an NcclConnector
// carries several runs over one communicator and aborts it cleanly after a
// failure. Skips, saying why, where there are too few GPUs.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/communicator_cache.h"
#include "worker/device.h"
#include "worker/gpu_test_skip.h"
#include "worker/nccl_communicator.h"

namespace ringattn {
namespace {

// Allowance for NCCL and thread start-up on top of a timeout under test.
constexpr absl::Duration kSlack = absl::Seconds(5);

// Runs `body(rank)` on one thread per rank and joins them.
void OnRanks(int world_size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// `bytes` bytes on the current device: byte i is (seed + i) % 251.
absl::StatusOr<DeviceBuffer> Pattern(int64_t bytes, int seed) {
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) host[i] = (seed + i) % 251;
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
  if (!buffer.ok()) return buffer;
  absl::Status copied = CudaStatus(cudaMemcpy(buffer->as<void>(), host.data(),
                                              bytes, cudaMemcpyHostToDevice),
                                   "upload");
  if (!copied.ok()) return copied;
  return buffer;
}

// OK if `buffer` holds Pattern(bytes, seed).
absl::Status CheckPattern(const DeviceBuffer& buffer, int64_t bytes, int seed) {
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  absl::Status copied = CudaStatus(
      cudaMemcpy(host.data(), buffer.as<void>(), bytes, cudaMemcpyDeviceToHost),
      "download");
  if (!copied.ok()) return copied;
  for (int64_t i = 0; i < bytes; ++i) {
    if (host[i] != (seed + i) % 251) {
      return absl::DataLossError(
          absl::StrCat("byte ", i, " of ", bytes, " differs"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ncclUniqueId> SharedId() { return NewNcclUniqueId(); }

TEST(NcclCommunicatorTest, OneRankGroupComesUpAndRejectsSelfTransfers) {
  SKIP_WITHOUT_GPUS(1);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
      NcclCommunicator::Create(*id, 0, 1, 0, absl::Seconds(30));
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  EXPECT_EQ((*communicator)->world_size(), 1);
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(16);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ((*communicator)->StartSend(buffer->as<void>(), 16, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*communicator)->Wait(absl::Now() + absl::Seconds(1)).ok());
}

TEST(NcclCommunicatorTest, RejectsBadRanks) {
  SKIP_WITHOUT_GPUS(1);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(
      NcclCommunicator::Create(*id, 2, 2, 0, absl::Seconds(1)).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommunicatorTest, ExchangesBlocksBothWaysRepeatedly) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<absl::Status> results(2);
  OnRanks(2, [&](int rank) {
    results[rank] = [&]() -> absl::Status {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
          NcclCommunicator::Create(*id, rank, 2, rank, absl::Seconds(60));
      if (!communicator.ok()) return communicator.status();
      NcclCommunicator& c = **communicator;
      const int peer = 1 - rank;
      for (const int64_t bytes :
           {int64_t{1}, int64_t{4099}, int64_t{3} << 20}) {
        for (int round = 0; round < 2; ++round) {
          const int seed = 7 * round + rank;
          absl::StatusOr<DeviceBuffer> out = Pattern(bytes, seed);
          if (!out.ok()) return out.status();
          absl::StatusOr<DeviceBuffer> in = DeviceBuffer::Allocate(bytes);
          if (!in.ok()) return in.status();
          absl::Status s = c.StartReceive(in->as<void>(), bytes, peer);
          if (s.ok()) s = c.StartSend(out->as<void>(), bytes, peer);
          if (s.ok()) s = c.Wait(absl::Now() + absl::Seconds(30));
          if (s.ok()) s = CheckPattern(*in, bytes, 7 * round + peer);
          if (!s.ok()) return s;
        }
      }
      return absl::OkStatus();
    }();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST(NcclCommunicatorTest, LoneSendMeetsLoneReceive) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr int64_t kBytes = 1 << 20;
  std::vector<absl::Status> results(2);
  OnRanks(2, [&](int rank) {
    results[rank] = [&]() -> absl::Status {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
          NcclCommunicator::Create(*id, rank, 2, rank, absl::Seconds(60));
      if (!communicator.ok()) return communicator.status();
      absl::StatusOr<DeviceBuffer> buffer =
          rank == 0 ? Pattern(kBytes, 3) : DeviceBuffer::Allocate(kBytes);
      if (!buffer.ok()) return buffer.status();
      absl::Status s =
          rank == 0
              ? (*communicator)->StartSend(buffer->as<void>(), kBytes, 1)
              : (*communicator)->StartReceive(buffer->as<void>(), kBytes, 0);
      if (s.ok()) s = (*communicator)->Wait(absl::Now() + absl::Seconds(30));
      if (s.ok() && rank == 1) s = CheckPattern(*buffer, kBytes, 3);
      return s;
    }();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST(NcclCommunicatorTest, PeerThatNeverJoinsFailsCreateInTime) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Duration timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
      NcclCommunicator::Create(*id, 0, 2, 0, timeout);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kUnavailable)
      << communicator.status();
  EXPECT_NE(communicator.status().message().find("rank 0 of 2"),
            std::string::npos)
      << communicator.status();
  EXPECT_LT(elapsed, timeout + kSlack);
}

// Both ranks join; rank 1 then starts nothing (stalls) until rank 0 is done.
TEST(NcclCommunicatorTest, StalledPeerMeansDeadlineExceeded) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::Notification rank0_done;
  absl::Status rank0;
  absl::Duration rank0_wait;
  OnRanks(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
        NcclCommunicator::Create(*id, rank, 2, rank, absl::Seconds(60));
    if (rank == 1) {
      rank0_done.WaitForNotificationWithTimeout(absl::Seconds(60));
      return;
    }
    rank0 = communicator.status();
    if (rank0.ok()) {
      absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(4096);
      rank0 = buffer.status();
      if (rank0.ok()) {
        rank0 = (*communicator)->StartReceive(buffer->as<void>(), 4096, 1);
      }
      if (rank0.ok()) {
        rank0 = (*communicator)->StartSend(buffer->as<void>(), 4096, 1);
      }
      const absl::Time start = absl::Now();
      if (rank0.ok()) {
        rank0 = (*communicator)->Wait(start + absl::Seconds(2));
      }
      rank0_wait = absl::Now() - start;
      // Broken now: later calls fail at once.
      EXPECT_FALSE(
          (*communicator)->StartSend(buffer->as<void>(), 4096, 1).ok());
    }
    rank0_done.Notify();
  });
  EXPECT_EQ(rank0.code(), absl::StatusCode::kDeadlineExceeded) << rank0;
  EXPECT_NE(rank0.message().find("rank 0 of 2 (receiving from rank 1, "
                                 "sending to rank 1)"),
            std::string::npos)
      << rank0;
  EXPECT_LT(rank0_wait, absl::Seconds(2) + kSlack);
}

TEST(NcclCommunicatorTest, AbortEndsAWaitWithCancelled) {
  SKIP_WITHOUT_GPUS(2);
  absl::StatusOr<ncclUniqueId> id = SharedId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::Notification rank0_done;
  absl::Status rank0;
  OnRanks(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
        NcclCommunicator::Create(*id, rank, 2, rank, absl::Seconds(60));
    if (rank == 1) {
      rank0_done.WaitForNotificationWithTimeout(absl::Seconds(60));
      return;
    }
    rank0 = communicator.status();
    if (!rank0.ok()) {
      rank0_done.Notify();
      return;
    }
    NcclCommunicator* c = communicator->get();
    absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(4096);
    rank0 = buffer.status();
    if (rank0.ok()) rank0 = c->StartReceive(buffer->as<void>(), 4096, 1);
    std::thread aborter([c] {
      absl::SleepFor(absl::Milliseconds(500));
      c->Abort();
    });
    if (rank0.ok()) rank0 = c->Wait(absl::Now() + absl::Seconds(60));
    aborter.join();
    rank0_done.Notify();
  });
  EXPECT_EQ(rank0.code(), absl::StatusCode::kCancelled) << rank0;
}

TEST(NcclConnectorTest, RanksShareTheIdThroughTheStore) {
  SKIP_WITHOUT_GPUS(2);
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> results(2);
  OnRanks(2, [&](int rank) {
    results[rank] = [&]() -> absl::Status {
      NcclConnector connector(store, rank);
      absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
          connector.Connect("request-1", rank, 2, absl::Seconds(60), nullptr);
      if (!communicator.ok()) return communicator.status();
      constexpr int64_t kBytes = 65536;
      absl::StatusOr<DeviceBuffer> out = Pattern(kBytes, rank);
      if (!out.ok()) return out.status();
      absl::StatusOr<DeviceBuffer> in = DeviceBuffer::Allocate(kBytes);
      if (!in.ok()) return in.status();
      absl::Status s =
          (*communicator)->StartReceive(in->as<void>(), kBytes, 1 - rank);
      if (s.ok())
        s = (*communicator)->StartSend(out->as<void>(), kBytes, 1 - rank);
      if (s.ok()) s = (*communicator)->Wait(absl::Now() + absl::Seconds(30));
      if (s.ok()) s = CheckPattern(*in, kBytes, 1 - rank);
      return s;
    }();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST(NcclConnectorTest, MissingRankZeroMeansDeadlineExceeded) {
  SKIP_WITHOUT_GPUS(1);
  gloo::rendezvous::HashStore store;
  NcclConnector connector(store, 0);
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
      connector.Connect("request-2", 1, 2, absl::Seconds(2), nullptr);
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kDeadlineExceeded)
      << communicator.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2) + kSlack);
}

// Lends `key`'s communicator from `cache` as rank `rank` of 2 and swaps a
// 64 KiB pattern with the other rank over it, waiting at most `wait`; sets
// *reused as Lend does.
absl::Status SwapOverCache(CommunicatorCache& cache, const std::string& key,
                           int rank, absl::Duration wait, bool* reused) {
  absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
      cache.Lend(key, 0, rank, 2, absl::Seconds(60), reused);
  if (!communicator.ok()) return communicator.status();
  constexpr int64_t kBytes = 65536;
  absl::StatusOr<DeviceBuffer> out = Pattern(kBytes, rank);
  if (!out.ok()) return out.status();
  absl::StatusOr<DeviceBuffer> in = DeviceBuffer::Allocate(kBytes);
  if (!in.ok()) return in.status();
  absl::Status s =
      (*communicator)->StartReceive(in->as<void>(), kBytes, 1 - rank);
  if (s.ok()) s = (*communicator)->StartSend(out->as<void>(), kBytes, 1 - rank);
  if (s.ok()) s = (*communicator)->Wait(absl::Now() + wait);
  if (s.ok()) s = CheckPattern(*in, kBytes, 1 - rank);
  return s;
}

TEST(CommunicatorCacheNcclTest, RunsOverOneKeyShareOneCommunicator) {
  SKIP_WITHOUT_GPUS(2);
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<NcclConnector>> connectors;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
  for (int rank = 0; rank < 2; ++rank) {
    connectors.push_back(std::make_unique<NcclConnector>(store, rank));
    caches.push_back(std::make_unique<CommunicatorCache>(*connectors[rank]));
  }
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    std::vector<absl::Status> results(2);
    std::vector<bool> reused(2);
    OnRanks(2, [&](int rank) {
      bool r = false;
      results[rank] =
          SwapOverCache(*caches[rank], "key-1", rank, absl::Seconds(30), &r);
      reused[rank] = r;
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << results[rank];
      EXPECT_EQ(reused[rank], run > 0) << "rank " << rank;
      EXPECT_EQ(caches[rank]->creations(), 1);
    }
  }
}

TEST(CommunicatorCacheNcclTest, FailedRunAbortsAndTheNextKeyConnects) {
  SKIP_WITHOUT_GPUS(2);
  gloo::rendezvous::HashStore store;
  std::vector<std::unique_ptr<NcclConnector>> connectors;
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
  for (int rank = 0; rank < 2; ++rank) {
    connectors.push_back(std::make_unique<NcclConnector>(store, rank));
    caches.push_back(std::make_unique<CommunicatorCache>(*connectors[rank]));
  }
  std::vector<absl::Status> results(2);
  OnRanks(2, [&](int rank) {
    bool reused = false;
    results[rank] =
        SwapOverCache(*caches[rank], "key-1", rank, absl::Seconds(30), &reused);
  });
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];

  // Rank 1 sits this run out: rank 0 times out on the kept communicator,
  // which is aborted and never kept again.
  bool reused = false;
  const absl::Time start = absl::Now();
  const absl::Status lonely =
      SwapOverCache(*caches[0], "key-1", 0, absl::Seconds(2), &reused);
  EXPECT_TRUE(reused);
  EXPECT_EQ(lonely.code(), absl::StatusCode::kDeadlineExceeded) << lonely;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2) + kSlack);
  EXPECT_EQ(
      SwapOverCache(*caches[0], "key-1", 0, absl::Seconds(2), &reused).code(),
      absl::StatusCode::kFailedPrecondition);

  // Rank 1 still keeps its end of key-1, healthy as far as it knows; the
  // next key retires it (aborted) on both ranks and connects afresh.
  OnRanks(2, [&](int rank) {
    bool r = true;
    results[rank] =
        SwapOverCache(*caches[rank], "key-2", rank, absl::Seconds(30), &r);
    if (results[rank].ok() && r) {
      results[rank] = absl::InternalError("key-2 claims reuse");
    }
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_EQ(caches[0]->creations(), 2);
  EXPECT_EQ(caches[1]->creations(), 2);
}

}  // namespace
}  // namespace ringattn
