#include "client/progress_bar.h"

#include <algorithm>
#include <string>
#include <utility>

#include "client/human_units.h"

namespace ringattn {
namespace {

constexpr absl::Duration kShowAfter = absl::Seconds(1);
constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);
constexpr int kBarWidth = 30;

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, std::function<absl::Time()> clock)
    : out_(out), clock_(std::move(clock)) {}

void ProgressBar::Update(const Progress& progress) {
  const absl::Time now = clock_();
  if (progress.bytes_done == 0 || progress.phase != phase_ ||
      phase_start_ == absl::InfinitePast()) {
    if (drawing_) std::fputc('\n', out_);
    drawing_ = false;
    phase_ = progress.phase;
    phase_start_ = now;
    last_drawn_ = absl::InfinitePast();
  }
  const bool complete = progress.bytes_done >= progress.bytes_total;
  const absl::Duration elapsed = now - phase_start_;
  if (elapsed <= kShowAfter ||
      (!complete && now - last_drawn_ < kRedrawInterval)) {
    return;
  }
  const double fraction =
      progress.bytes_total > 0
          ? std::min(1.0, static_cast<double>(progress.bytes_done) /
                              progress.bytes_total)
          : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::fprintf(
      out_, "\r%-8s [%s%s] %3d%%  %s / %s  %s/s",
      progress.phase == Progress::Phase::kUpload ? "upload" : "download",
      std::string(filled, '#').c_str(),
      std::string(kBarWidth - filled, ' ').c_str(),
      static_cast<int>(fraction * 100),
      FormatBytes(progress.bytes_done).c_str(),
      FormatBytes(progress.bytes_total).c_str(),
      FormatBytes(progress.bytes_done / absl::ToDoubleSeconds(elapsed))
          .c_str());
  drawing_ = true;
  last_drawn_ = now;
  if (complete) {
    std::fputc('\n', out_);
    drawing_ = false;
    phase_start_ = absl::InfinitePast();
  }
  std::fflush(out_);
}

}  // namespace ringattn
