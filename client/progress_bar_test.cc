#include "client/progress_bar.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

// A ProgressBar drawing into a memory buffer on a clock the test moves.
class ProgressBarTest : public ::testing::Test {
 protected:
  ProgressBarTest()
      : out_(open_memstream(&buffer_, &size_)),
        bar_(out_, [this] { return now_; }) {}
  ~ProgressBarTest() override {
    std::fclose(out_);
    std::free(buffer_);
  }

  std::string Drawn() {
    std::fflush(out_);
    return std::string(buffer_, size_);
  }

  void Update(Progress::Phase phase, int64_t done, int64_t total,
              absl::Duration at) {
    now_ = absl::UnixEpoch() + at;
    bar_.Update({phase, done, total});
  }

  char* buffer_ = nullptr;
  size_t size_ = 0;
  std::FILE* out_;
  absl::Time now_ = absl::UnixEpoch();
  ProgressBar bar_;
};

TEST_F(ProgressBarTest, DrawsNothingForAShortPhase) {
  Update(Progress::Phase::kUpload, 0, 100, absl::ZeroDuration());
  Update(Progress::Phase::kUpload, 50, 100, absl::Milliseconds(500));
  Update(Progress::Phase::kUpload, 100, 100, absl::Milliseconds(900));
  EXPECT_EQ(Drawn(), "");
}

TEST_F(ProgressBarTest, DrawsALongPhaseAndEndsTheLine) {
  constexpr int64_t kMiB = 1 << 20;
  Update(Progress::Phase::kUpload, 0, 8 * kMiB, absl::ZeroDuration());
  Update(Progress::Phase::kUpload, 2 * kMiB, 8 * kMiB, absl::Seconds(2));
  EXPECT_EQ(Drawn(),
            "\rupload   [#######                       ]  25%  2.0 MiB / 8.0 "
            "MiB  1.0 MiB/s");
  // Within the redraw interval: nothing new.
  Update(Progress::Phase::kUpload, 3 * kMiB, 8 * kMiB,
         absl::Seconds(2) + absl::Milliseconds(50));
  const size_t drawn = Drawn().size();
  Update(Progress::Phase::kUpload, 8 * kMiB, 8 * kMiB, absl::Seconds(4));
  const std::string last = Drawn().substr(drawn);
  EXPECT_EQ(last,
            "\rupload   [##############################] 100%  8.0 MiB / 8.0 "
            "MiB  2.0 MiB/s\n");
}

TEST_F(ProgressBarTest, StartsOverForTheNextPhase) {
  Update(Progress::Phase::kUpload, 0, 10, absl::ZeroDuration());
  Update(Progress::Phase::kUpload, 10, 10, absl::Seconds(3));
  const size_t drawn = Drawn().size();
  Update(Progress::Phase::kDownload, 0, 10, absl::Seconds(3));
  Update(Progress::Phase::kDownload, 10, 10, absl::Seconds(3.5));
  EXPECT_EQ(Drawn().size(), drawn);
}

}  // namespace
}  // namespace ringattn
