#include "client/flags.h"

#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ringattn {

absl::StatusOr<Flags> Flags::Parse(absl::Span<const std::string> args,
                                   const std::set<std::string>& valued,
                                   const std::set<std::string>& switches) {
  Flags flags;
  std::set<std::string> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", args[i], "'"));
    }
    const size_t equals = arg.find('=');
    const std::string name(arg.substr(2, equals - 2));
    std::optional<std::string> value;
    if (equals != std::string_view::npos) {
      value = std::string(arg.substr(equals + 1));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " is given twice"));
    }
    if (switches.count(name) != 0) {
      if (!value.has_value() || *value == "true") {
        flags.switches_on_.insert(name);
      } else if (*value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name,
                         " takes no value or true/false, got '", *value, "'"));
      }
      continue;
    }
    if (valued.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value.has_value()) {
      if (i + 1 == args.size() || args[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    flags.values_[name] = *std::move(value);
  }
  return flags;
}

bool Flags::Has(const std::string& name) const {
  return values_.count(name) != 0 || switches_on_.count(name) != 0;
}

std::optional<std::string> Flags::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> Flags::Require(const std::string& name) const {
  std::optional<std::string> value = Get(name);
  if (!value.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " is required"));
  }
  return *std::move(value);
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name,
                                      int64_t fallback) const {
  std::optional<std::string> text = Get(name);
  if (!text.has_value()) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " takes an integer, got '", *text, "'"));
  }
  return value;
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name,
                                        double fallback) const {
  std::optional<std::string> text = Get(name);
  if (!text.has_value()) return fallback;
  double value;
  if (!absl::SimpleAtod(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " takes a number, got '", *text, "'"));
  }
  return value;
}

bool Flags::GetSwitch(const std::string& name) const {
  return switches_on_.count(name) != 0;
}

}  // namespace ringattn
