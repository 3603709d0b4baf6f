#include "client/human_units.h"

#include "absl/strings/str_format.h"

namespace ringattn {

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, kUnits[unit])
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

std::string FormatFlopRate(double flops_per_second) {
  return flops_per_second >= 1e12
             ? absl::StrFormat("%.2f TFLOP/s", flops_per_second / 1e12)
             : absl::StrFormat("%.1f GFLOP/s", flops_per_second / 1e9);
}

}  // namespace ringattn
