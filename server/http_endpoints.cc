#include "server/http_endpoints.h"

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace ringattn {

absl::StatusOr<std::unique_ptr<HttpEndpoints>> HttpEndpoints::Start(
    const std::string& host, int port, Cluster* cluster, Metrics* metrics,
    std::function<void()> refresh) {
  std::unique_ptr<HttpEndpoints> endpoints(new HttpEndpoints());
  endpoints->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *endpoints->server_;
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server.Get("/readyz",
             [cluster](const httplib::Request&, httplib::Response& res) {
               absl::StatusOr<std::vector<Cluster::Member>> members =
                   cluster->ReadyMembers();
               if (members.ok()) {
                 res.set_content("ready\n", "text/plain");
               } else {
                 res.status = 503;
                 res.set_content(absl::StrCat(members.status().message(), "\n"),
                                 "text/plain");
               }
             });
  server.Get("/metrics", [metrics, refresh](const httplib::Request&,
                                            httplib::Response& res) {
    refresh();
    res.set_content(metrics->Render(), "text/plain; version=0.0.4");
  });
  const int bound = port == 0 ? server.bind_to_any_port(host)
                              : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", host, ":", port));
  }
  endpoints->port_ = bound;
  endpoints->thread_ = std::thread([&server] { server.listen_after_bind(); });
  return endpoints;
}

HttpEndpoints::~HttpEndpoints() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ringattn
