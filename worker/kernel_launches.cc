#include "worker/kernel_launches.h"

#include "absl/strings/str_join.h"

namespace ringattn {

void KernelLaunches::Add(CpuKernel kernel) {
  ++(kernel == CpuKernel::kDecode ? cpu_decode : cpu_block);
}

std::vector<std::pair<std::string, int64_t>> KernelLaunches::Named() const {
  const std::pair<const char*, int64_t> all[] = {
      {"cpu_block", cpu_block}, {"cpu_decode", cpu_decode}, {"cudnn", cudnn},
      {"flash", flash},         {"hopper", hopper},         {"decode", decode}};
  std::vector<std::pair<std::string, int64_t>> named;
  for (const auto& [name, launches] : all) {
    if (launches > 0) named.emplace_back(name, launches);
  }
  return named;
}

std::string KernelLaunches::ToString() const {
  const std::vector<std::pair<std::string, int64_t>> named = Named();
  if (named.empty()) return "none";
  return absl::StrJoin(named, ", ", absl::PairFormatter(" "));
}

}  // namespace ringattn
