#ifndef RINGATTN_WORKER_BACKGROUND_PAGE_FAULTS_H_
#define RINGATTN_WORKER_BACKGROUND_PAGE_FAULTS_H_

// BackgroundPageFaults: faults in the pages of freshly allocated host buffers
// on a thread of its own, so that the thread that writes arriving rows into
// them does not stop at every page for the kernel to map and clear it (on CPU
// workers that was 45% of a worker's CPU during an upload, all of it on the
// one thread that reads the stream). The contents are left alone
// (MADV_POPULATE_WRITE), so rows may land while it runs; where the kernel
// lacks that advice (before Linux 5.14) it does nothing. A caller may have each
// region handed on once it is in (to be page-locked for CUDA copies, say).

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/types/span.h"

namespace ringattn {

// Buffers smaller than this in all are not worth the thread.
inline constexpr int64_t kBackgroundPageFaultBytes = int64_t{16} << 20;

class BackgroundPageFaults {
 public:
  // Called on the thread with each region once all of it is in.
  using Then = std::function<void(absl::Span<char>)>;

  // Starts faulting in `regions`, in order, calling `then` (if set) after
  // each. They must outlive this object.
  explicit BackgroundPageFaults(std::vector<absl::Span<char>> regions,
                                Then then = nullptr);
  // Stops at the next step and waits for the thread.
  ~BackgroundPageFaults();

  BackgroundPageFaults(const BackgroundPageFaults&) = delete;
  BackgroundPageFaults& operator=(const BackgroundPageFaults&) = delete;

  // Waits until every region is faulted in (or the kernel refused), and
  // returns the bytes faulted in.
  int64_t Wait();

 private:
  void Run(std::vector<absl::Span<char>> regions, const Then& then);

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> faulted_{0};
  std::thread thread_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_BACKGROUND_PAGE_FAULTS_H_
