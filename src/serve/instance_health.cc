#include "serve/instance_health.h"

#include <nlohmann/json.hpp>

namespace xds::serve {

Result<std::string> listen_host(std::string_view listen) {
  constexpr std::string_view kScheme = "tcp://";
  const size_t colon = listen.rfind(':');
  if (!listen.starts_with(kScheme) || colon == std::string_view::npos || colon <= kScheme.size()) {
    return invalid_argument(
        "--health-port needs a --listen address of the form tcp://HOST:PORT, got '{}'", listen);
  }
  std::string_view host = listen.substr(kScheme.size(), colon - kScheme.size());
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "*") return std::string("0.0.0.0");  // ZeroMQ's "every interface"
  return std::string(host);
}

Result<std::unique_ptr<HttpServer>> start_instance_health(const std::string& host, int port,
                                                          const std::string& role,
                                                          const std::atomic<bool>& ready) {
  if (port < 0 || port > 65535) {
    return invalid_argument("--health-port must be in [0, 65535], got {}", port);
  }
  HttpServerOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(port);
  o.threads = 1;
  auto server = std::make_unique<HttpServer>(o);
  server->route("GET", "/health", [&ready, role](HttpRequest, Responder resp) {
    const bool up = ready.load(std::memory_order_relaxed);
    HttpResponse r;
    r.status = up ? 200 : 503;
    r.body = nlohmann::json{{"status", up ? "ready" : "starting"}, {"role", role}}.dump();
    resp.send(std::move(r));
  });
  XDS_RETURN_IF_ERROR(server->start());
  return server;
}

}  // namespace xds::serve
