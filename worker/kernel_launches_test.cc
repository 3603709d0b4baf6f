#include "worker/kernel_launches.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

using Named = std::vector<std::pair<std::string, int64_t>>;

TEST(KernelLaunches, NamesOnlyTheKernelsThatRan) {
  KernelLaunches launches;
  EXPECT_EQ(launches.Named(), Named());
  EXPECT_EQ(launches.ToString(), "none");
  launches.Add(CpuKernel::kDecode);
  launches.Add(CpuKernel::kBlock);
  launches.Add(CpuKernel::kDecode);
  EXPECT_EQ(launches.Named(), (Named{{"cpu_block", 1}, {"cpu_decode", 2}}));
  launches.hopper = 4;
  launches.decode = 1;
  EXPECT_EQ(
      launches.Named(),
      (Named{
          {"cpu_block", 1}, {"cpu_decode", 2}, {"hopper", 4}, {"decode", 1}}));
  EXPECT_EQ(launches.ToString(),
            "cpu_block 1, cpu_decode 2, hopper 4, decode 1");
}

TEST(KernelLaunches, NamesEveryGpuPath) {
  KernelLaunches launches;
  launches.cudnn = 1;
  launches.flash = 2;
  EXPECT_EQ(launches.Named(), (Named{{"cudnn", 1}, {"flash", 2}}));
}

}  // namespace
}  // namespace ringattn
