#ifndef RINGATTN_CLIENT_PROGRESS_BAR_H_
#define RINGATTN_CLIENT_PROGRESS_BAR_H_

// A one-line progress bar for the uploads and downloads of the `ringattn`
// CLI, fed by ClientOptions::progress. Not thread-safe (the Client makes its
// progress calls one at a time).

#include <cstdio>
#include <functional>

#include "absl/time/time.h"
#include "client/client.h"

namespace ringattn {

class ProgressBar {
 public:
  // Draws on `out` (a terminal), reading the time from `clock`.
  ProgressBar(std::FILE* out, std::function<absl::Time()> clock);

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Shows `progress` once its phase has run for more than a second: redraws
  // the line at most ten times a second, and ends it with a newline when the
  // phase completes. Nothing is drawn for a phase that ends sooner.
  void Update(const Progress& progress);

 private:
  std::FILE* out_;
  std::function<absl::Time()> clock_;
  Progress::Phase phase_ = Progress::Phase::kUpload;
  absl::Time phase_start_ = absl::InfinitePast();
  absl::Time last_drawn_ = absl::InfinitePast();
  bool drawing_ = false;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_PROGRESS_BAR_H_
