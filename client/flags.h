#ifndef RINGATTN_CLIENT_FLAGS_H_
#define RINGATTN_CLIENT_FLAGS_H_

// The flags of one `ringattn` subcommand, parsed by hand so that each
// subcommand accepts exactly its own set: "--name value", "--name=value", and
// bare "--name" for switches. A plain value type.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringattn {

class Flags {
 public:
  // Parses `args` against the flag names (without "--") in `valued`, which
  // take a value, and `switches`, which may stand alone ("--causal") or take
  // true/false ("--causal=false"). INVALID_ARGUMENT, naming the argument, for
  // an unknown flag, a positional argument, a repeated flag, or a valued flag
  // without its value.
  static absl::StatusOr<Flags> Parse(absl::Span<const std::string> args,
                                     const std::set<std::string>& valued,
                                     const std::set<std::string>& switches);

  // Whether `name` was given.
  bool Has(const std::string& name) const;

  // The value of `name`, or nullopt when it was not given.
  std::optional<std::string> Get(const std::string& name) const;

  // The value of `name`; INVALID_ARGUMENT saying it is required when absent.
  absl::StatusOr<std::string> Require(const std::string& name) const;

  // The value of `name` as a number, or `fallback` when absent.
  // INVALID_ARGUMENT naming the flag when the value is not one.
  absl::StatusOr<int64_t> GetInt(const std::string& name,
                                 int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name,
                                   double fallback) const;

  // Whether switch `name` is on.
  bool GetSwitch(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_on_;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_FLAGS_H_
