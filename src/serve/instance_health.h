// The instance's readiness endpoint (`instance --health-port P`), for orchestrators such as a
// Kubernetes readinessProbe: an HTTP server on the host of the shell's --listen address that
// answers
//
//   GET /health   200 {"status": "ready", "role": ROLE}    every DP group of the running
//                                                          incarnation is up (ShellOptions::ready)
//                 503 {"status": "starting", "role": ROLE} before that, and while it drains
//
// It lives in the incarnation's process (the shell's): while the instance restarts there is
// no listener at all (connection refused), which a probe counts as not ready too.
//
// Thread-safety: the server's io threads read `ready`; the shell's loop writes it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "serve/http_server.h"

namespace xds::serve {

// "tcp://HOST:PORT" -> HOST (brackets kept off an IPv6 host); InvalidArgument naming `listen`
// otherwise.
Result<std::string> listen_host(std::string_view listen);

// Starts the endpoint on host:port (port 0: any free one, HttpServer::port() says which).
// `ready` must outlive the returned server. Fails naming the address when it cannot bind.
Result<std::unique_ptr<HttpServer>> start_instance_health(const std::string& host, int port,
                                                          const std::string& role,
                                                          const std::atomic<bool>& ready);

}  // namespace xds::serve
