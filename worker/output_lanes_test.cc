#include "worker/output_lanes.h"

#include <memory>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// Records how the lanes answered.
class RecordingLane final : public OutputLanes::Lane {
 public:
  void Start(std::shared_ptr<OutputDealer> dealer) override {
    ++answers;
    started = std::move(dealer);
  }
  void End(absl::Status status) override {
    ++answers;
    ended = std::move(status);
  }

  int answers = 0;
  std::shared_ptr<OutputDealer> started;
  absl::Status ended;
};

std::shared_ptr<OutputDealer> EmptyDealer() {
  return std::make_shared<OutputDealer>(TypedTensor(), Tensor<float>(),
                                        std::vector<Range>{}, false, 1, 1);
}

TEST(OutputLanes, StartReachesLanesThatWaitAndThatJoinLater) {
  OutputLanes lanes;
  RecordingLane early;
  lanes.Join(&early);
  EXPECT_EQ(early.answers, 0);
  const std::shared_ptr<OutputDealer> dealer = EmptyDealer();
  lanes.Start(dealer);
  EXPECT_EQ(early.answers, 1);
  EXPECT_EQ(early.started, dealer);
  RecordingLane late;
  lanes.Join(&late);
  EXPECT_EQ(late.started, dealer);
  // The first answer stands.
  lanes.End(absl::InternalError("too late"));
  EXPECT_EQ(early.answers, 1);
  EXPECT_TRUE(early.ended.ok());
}

TEST(OutputLanes, EndReachesEveryLaneWithTheStatus) {
  OutputLanes lanes;
  RecordingLane early;
  lanes.Join(&early);
  lanes.End(absl::UnavailableError("peer lost"));
  lanes.Start(EmptyDealer());
  RecordingLane late;
  lanes.Join(&late);
  for (const RecordingLane* lane : {&early, &late}) {
    EXPECT_EQ(lane->answers, 1);
    EXPECT_EQ(lane->started, nullptr);
    EXPECT_EQ(lane->ended.code(), absl::StatusCode::kUnavailable);
  }
}

TEST(OutputLanes, LaneThatLeftIsNotAnswered) {
  OutputLanes lanes;
  RecordingLane gone;
  lanes.Join(&gone);
  EXPECT_TRUE(lanes.Leave(&gone));
  EXPECT_FALSE(lanes.Leave(&gone));
  lanes.Start(EmptyDealer());
  EXPECT_EQ(gone.answers, 0);
}

}  // namespace
}  // namespace ringattn
