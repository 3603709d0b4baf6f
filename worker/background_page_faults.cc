#include "worker/background_page_faults.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace ringattn {
namespace {

// Bytes faulted in per step: small enough to stop soon when asked, and to
// hold the process's memory map only briefly (every mapping other threads
// make, gRPC's buffers among them, waits for the step in progress, and page
// faults queue behind such a mapping).
constexpr uintptr_t kStepBytes = 4 << 20;

}  // namespace

BackgroundPageFaults::BackgroundPageFaults(
    std::vector<absl::Span<char>> regions, Then then)
    : thread_([this, regions = std::move(regions),
               then = std::move(then)]() mutable {
        Run(std::move(regions), then);
      }) {}

BackgroundPageFaults::~BackgroundPageFaults() {
  stop_ = true;
  Wait();
}

int64_t BackgroundPageFaults::Wait() {
  if (thread_.joinable()) thread_.join();
  return faulted_;
}

void BackgroundPageFaults::Run(std::vector<absl::Span<char>> regions,
                               const Then& then) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (absl::Span<char> region : regions) {
    if (region.empty()) continue;
    // Whole pages around the region: the pages at its ends belong to the
    // same mapping, and their contents are not touched.
    const uintptr_t begin =
        reinterpret_cast<uintptr_t>(region.data()) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(region.data()) +
                           region.size() + page - 1) /
                          page * page;
    for (uintptr_t at = begin; at < end; at += kStepBytes) {
      if (stop_) return;
      const uintptr_t bytes = std::min(kStepBytes, end - at);
      if (madvise(reinterpret_cast<void*>(at), bytes, MADV_POPULATE_WRITE) !=
          0) {
        return;  // an older kernel, or out of memory: the writer faults
      }
      faulted_ += static_cast<int64_t>(bytes);
    }
    if (then && !stop_) then(region);
  }
}

}  // namespace ringattn
