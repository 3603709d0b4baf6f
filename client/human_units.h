#ifndef RINGATTN_CLIENT_HUMAN_UNITS_H_
#define RINGATTN_CLIENT_HUMAN_UNITS_H_

// Byte counts and rates written for people, as the CLI prints them.
// Thread-safe.

#include <string>

namespace ringattn {

// "512 B", "3.2 KiB", "1.5 GiB" (binary prefixes, one decimal).
std::string FormatBytes(double bytes);

// "812.3 GFLOP/s" below 1e12 FLOP/s, "1.25 TFLOP/s" from there on.
std::string FormatFlopRate(double flops_per_second);

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_HUMAN_UNITS_H_
