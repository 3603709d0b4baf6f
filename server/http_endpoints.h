#ifndef RINGATTN_SERVER_HTTP_ENDPOINTS_H_
#define RINGATTN_SERVER_HTTP_ENDPOINTS_H_

// HttpEndpoints: /healthz (the process is up), /readyz (the cluster can take
// requests) and /metrics (Prometheus text format), served by cpp-httplib on its
// own thread until destroyed.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/cluster.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace ringattn {

class HttpEndpoints {
 public:
  // Serves on host:port (port 0: any free port). `cluster` and `metrics` must
  // outlive the endpoints; `refresh` runs before each /metrics render to update
  // gauges.
  static absl::StatusOr<std::unique_ptr<HttpEndpoints>> Start(
      const std::string& host, int port, Cluster* cluster, Metrics* metrics,
      std::function<void()> refresh);
  ~HttpEndpoints();

  int port() const { return port_; }

 private:
  HttpEndpoints() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_SERVER_HTTP_ENDPOINTS_H_
