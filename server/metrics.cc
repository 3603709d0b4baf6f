#include "server/metrics.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace ringattn {
namespace {

std::string FormatValue(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

std::string FormatLabels(const Metrics::Labels& labels,
                         const std::string& extra_name = "",
                         const std::string& extra_value = "") {
  std::string out;
  auto append = [&](const std::string& name, const std::string& value) {
    absl::StrAppend(&out, out.empty() ? "{" : ",", name, "=\"",
                    absl::StrReplaceAll(
                        value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}),
                    "\"");
  };
  for (const auto& [name, value] : labels) append(name, value);
  if (!extra_name.empty()) append(extra_name, extra_value);
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

void Metrics::Declare(const std::string& name, const std::string& help,
                      Kind kind, std::vector<double> buckets) {
  absl::MutexLock lock(&mutex_);
  Family& family = families_[name];
  family.help = help;
  family.kind = kind;
  family.buckets = std::move(buckets);
}

Metrics::Series& Metrics::SeriesFor(const std::string& name,
                                    const Labels& labels) {
  Family& family = families_[name];
  Series& series = family.series[labels];
  if (family.kind == Kind::kHistogram && series.counts.empty()) {
    series.counts.assign(family.buckets.size(), 0);
  }
  return series;
}

void Metrics::Add(const std::string& name, const Labels& labels,
                  double amount) {
  absl::MutexLock lock(&mutex_);
  SeriesFor(name, labels).value += amount;
}

void Metrics::Set(const std::string& name, const Labels& labels, double value) {
  absl::MutexLock lock(&mutex_);
  SeriesFor(name, labels).value = value;
}

void Metrics::Observe(const std::string& name, const Labels& labels,
                      double value) {
  absl::MutexLock lock(&mutex_);
  const std::vector<double>& buckets = families_[name].buckets;
  Series& series = SeriesFor(name, labels);
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (value <= buckets[i]) {
      ++series.counts[i];
      break;
    }
  }
  series.sum += value;
  ++series.count;
}

std::string Metrics::Render() {
  absl::MutexLock lock(&mutex_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.kind == Kind::kCounter ? "counter"
                       : family.kind == Kind::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name,
                    " ", type, "\n");
    for (const auto& [labels, series] : family.series) {
      if (family.kind != Kind::kHistogram) {
        absl::StrAppend(&out, name, FormatLabels(labels), " ",
                        FormatValue(series.value), "\n");
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < family.buckets.size(); ++i) {
        cumulative += series.counts[i];
        absl::StrAppend(
            &out, name, "_bucket",
            FormatLabels(labels, "le", FormatValue(family.buckets[i])), " ",
            cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_bucket", FormatLabels(labels, "le", "+Inf"),
                      " ", series.count, "\n", name, "_sum",
                      FormatLabels(labels), " ", FormatValue(series.sum), "\n",
                      name, "_count", FormatLabels(labels), " ", series.count,
                      "\n");
    }
  }
  return out;
}

}  // namespace ringattn
