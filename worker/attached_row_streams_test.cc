#include "worker/attached_row_streams.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Records what the registry answered.
class RecordingWaiter final : public AttachedRowStreams::Waiter {
 public:
  void Attach(AttachedShard shard) override {
    ++answers;
    attached = std::move(shard);
  }
  void Refuse(absl::Status status) override {
    ++answers;
    refused = std::move(status);
  }

  int answers = 0;
  AttachedShard attached;
  absl::Status refused;
};

AttachedShard EmptyShard() {
  return {std::make_shared<ShardIntake>(std::array<ShardRowsTarget, 3>{},
                                        DType::kFloat32),
          std::make_shared<OutputLanes>()};
}

TEST(AttachedRowStreams, StreamThatComesFirstWaitsForTheHeader) {
  AttachedRowStreams streams;
  RecordingWaiter early;
  streams.Await("r1/0", &early);
  EXPECT_EQ(early.answers, 0);
  const AttachedShard shard = EmptyShard();
  ASSERT_TRUE(streams.Open("r1/0", shard).ok());
  EXPECT_EQ(early.answers, 1);
  EXPECT_EQ(early.attached.intake, shard.intake);
  EXPECT_EQ(early.attached.lanes, shard.lanes);

  RecordingWaiter late;
  streams.Await("r1/0", &late);
  EXPECT_EQ(late.answers, 1);
  EXPECT_EQ(late.attached.intake, shard.intake);
}

TEST(AttachedRowStreams, ClosedKeyRefusesWaitingAndLaterStreams) {
  AttachedRowStreams streams;
  RecordingWaiter waiting;
  streams.Await("r2/1", &waiting);
  // The Execute stream failed before its shard opened.
  streams.Close("r2/1");
  EXPECT_EQ(waiting.answers, 1);
  EXPECT_EQ(waiting.refused.code(), absl::StatusCode::kFailedPrecondition);

  RecordingWaiter late;
  streams.Await("r2/1", &late);
  EXPECT_EQ(late.answers, 1);
  EXPECT_EQ(late.refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(streams.Open("r2/1", EmptyShard()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AttachedRowStreams, ForgottenWaiterIsNotAnswered) {
  AttachedRowStreams streams;
  RecordingWaiter cancelled;
  streams.Await("r3/0", &cancelled);
  EXPECT_TRUE(streams.Forget("r3/0", &cancelled));
  EXPECT_FALSE(streams.Forget("r3/0", &cancelled));
  ASSERT_TRUE(streams.Open("r3/0", EmptyShard()).ok());
  EXPECT_EQ(cancelled.answers, 0);
}

TEST(AttachedRowStreams, KeyOpenTwiceIsRefused) {
  AttachedRowStreams streams;
  ASSERT_TRUE(streams.Open("r4/0", EmptyShard()).ok());
  const absl::Status second = streams.Open("r4/0", EmptyShard());
  EXPECT_EQ(second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.message().find("in use"), std::string::npos) << second;
}

}  // namespace
}  // namespace ringattn
