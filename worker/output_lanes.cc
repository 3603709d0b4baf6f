#include "worker/output_lanes.h"

#include <algorithm>
#include <utility>

namespace ringattn {

void OutputLanes::Join(Lane* lane) {
  std::shared_ptr<OutputDealer> dealer;
  absl::Status status;
  {
    absl::MutexLock lock(&mutex_);
    if (!answered_) {
      waiting_.push_back(lane);
      return;
    }
    dealer = dealer_;
    status = status_;
  }
  Answer({lane}, dealer, status);
}

bool OutputLanes::Leave(Lane* lane) {
  absl::MutexLock lock(&mutex_);
  auto it = std::find(waiting_.begin(), waiting_.end(), lane);
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

void OutputLanes::Start(std::shared_ptr<OutputDealer> dealer) {
  std::vector<Lane*> lanes;
  {
    absl::MutexLock lock(&mutex_);
    if (answered_) return;
    dealer_ = dealer;
    lanes = TakeWaiting();
  }
  Answer(lanes, dealer, absl::OkStatus());
}

void OutputLanes::End(absl::Status status) {
  std::vector<Lane*> lanes;
  {
    absl::MutexLock lock(&mutex_);
    if (answered_) return;
    status_ = status;
    lanes = TakeWaiting();
  }
  Answer(lanes, nullptr, status);
}

std::vector<OutputLanes::Lane*> OutputLanes::TakeWaiting() {
  answered_ = true;
  std::vector<Lane*> lanes;
  lanes.swap(waiting_);
  return lanes;
}

void OutputLanes::Answer(const std::vector<Lane*>& lanes,
                         const std::shared_ptr<OutputDealer>& dealer,
                         const absl::Status& status) {
  for (Lane* lane : lanes) {
    if (dealer != nullptr) {
      lane->Start(dealer);
    } else {
      lane->End(status);
    }
  }
}

}  // namespace ringattn
