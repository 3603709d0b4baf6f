// DeleteInSteps: what it must release first goes while the buffer still holds
// its contents, for buffers the heap takes and for one too large for it
// (handed back to the kernel in steps, then unmapped); a TypedTensor keeps
// its guard through moves and drops it when its storage goes.

#include "core/large_buffers.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/typed_tensor.h"
#include "gtest/gtest.h"

namespace ringattn {
namespace {

// A guard that, when dropped, records the bytes at `offsets` of `data`.
std::shared_ptr<void> Recorder(const char* data,
                               const std::vector<size_t>& offsets,
                               std::vector<char>* seen) {
  return std::shared_ptr<void>(nullptr, [=](void*) {
    for (size_t offset : offsets) seen->push_back(data[offset]);
  });
}

TEST(DeleteInSteps, DropsWhatItReleasesFirstWhileTheBufferHoldsItsBytes) {
  for (size_t bytes : {size_t{4096}, (size_t{5} << 29) + 12345}) {
    SCOPED_TRACE(bytes);
    char* data = new char[bytes];
    // Only these pages are touched: the rest of a large buffer stays
    // unmapped memory the kernel never filled.
    const std::vector<size_t> offsets = {0, bytes / 2, bytes - 1};
    for (size_t i = 0; i < offsets.size(); ++i) {
      data[offsets[i]] = static_cast<char>('a' + i);
    }
    std::vector<char> seen;
    DeleteInSteps{bytes, Recorder(data, offsets, &seen)}(data);
    EXPECT_EQ(seen, (std::vector<char>{'a', 'b', 'c'}));
  }
}

TEST(DeleteInSteps, TypedTensorDropsItsGuardOnlyWithItsStorage) {
  std::vector<char> seen;
  TypedTensor tensor(DType::kFloat32, Shape{1, 1024, 1, 4});
  tensor.view().data()[7] = 'x';
  tensor.ReleaseBeforeFree(Recorder(tensor.view().data(), {7}, &seen));
  TypedTensor moved = std::move(tensor);
  TypedTensor other(DType::kFloat32, Shape{1, 1, 1, 4});
  other = std::move(moved);
  EXPECT_TRUE(seen.empty());
  other = TypedTensor();
  EXPECT_EQ(seen, std::vector<char>{'x'});
}

}  // namespace
}  // namespace ringattn
