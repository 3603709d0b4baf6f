#ifndef RINGATTN_SERVER_METRICS_H_
#define RINGATTN_SERVER_METRICS_H_

// Metrics: the coordinator's counters, gauges and histograms, rendered in the
// Prometheus text exposition format for /metrics. A metric is declared once
// (name, help, kind) and then updated by label values. Thread-safe.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ringattn {

class Metrics {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  enum class Kind { kCounter, kGauge, kHistogram };

  // Declares a metric; histograms take their upper bucket bounds (ascending).
  void Declare(const std::string& name, const std::string& help, Kind kind,
               std::vector<double> buckets = {});

  void Add(const std::string& name, const Labels& labels, double amount);
  void Set(const std::string& name, const Labels& labels, double value);
  void Observe(const std::string& name, const Labels& labels, double value);

  std::string Render();

 private:
  struct Series {
    double value = 0;  // counter or gauge
    std::vector<uint64_t>
        counts;  // histogram: per bucket, cumulative at render
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    std::string help;
    Kind kind;
    std::vector<double> buckets;
    std::map<Labels, Series> series;
  };

  Series& SeriesFor(const std::string& name, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Mutex mutex_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_METRICS_H_
