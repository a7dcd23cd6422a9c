// The HTTP server out of file descriptors: a server process with RLIMIT_NOFILE at 64 gets 150
// idle connections, so accept() fails with EMFILE while the rest wait in the backlog. Checked
// against the kernel's own accounting: over 2 s the server process uses little CPU time (a
// retry loop uses a core: ~2 s), its log holds a handful of "accept failed" lines (not
// millions), and once the idle connections close a new request is answered.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "serve/http_server.h"

namespace xds::serve {
namespace {

constexpr rlim_t kFdLimit = 64;
constexpr int kIdleConnections = 150;

// utime + stime of `pid` in seconds, from /proc/PID/stat (fields 14 and 15).
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::vector<std::string> fields;
  for (std::string w; rest >> w;) fields.push_back(w);
  if (fields.size() < 13) return -1;
  const double ticks = std::stod(fields[11]) + std::stod(fields[12]);  // fields 14, 15
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int connect_to(uint16_t port) {
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  return s;
}

// GET /ping on a new connection; the response's bytes (empty after 20 s without an answer).
std::string get_ping(uint16_t port) {
  const int s = connect_to(port);
  if (s < 0) return "";
  const std::string req = "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (write(s, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  std::string got;
  char buf[1024];
  while (true) {
    pollfd p{s, POLLIN, 0};
    if (poll(&p, 1, 20'000) <= 0) break;
    const ssize_t n = read(s, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(s);
  return got;
}

size_t count_lines_with(const std::string& path, const std::string& needle, size_t* total) {
  std::ifstream f(path);
  size_t n = 0;
  *total = 0;
  for (std::string line; std::getline(f, line);) {
    ++*total;
    if (line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

TEST(HttpAcceptLimits, OutOfDescriptorsTheServerBacksOffQuietlyAndRecovers) {
  char log_path[] = "/tmp/xds-http-emfile-XXXXXX";
  const int log_fd = mkstemp(log_path);
  ASSERT_GE(log_fd, 0);
  int port_pipe[2], stop_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  ASSERT_EQ(pipe(stop_pipe), 0);
  const pid_t server = fork();
  if (server == 0) {
    dup2(log_fd, 2);
    rlimit lim{kFdLimit, kFdLimit};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(10);
    HttpServerOptions o;
    o.port = 0;
    o.threads = 1;
    HttpServer http(o);
    http.route("GET", "/ping", [](HttpRequest, Responder r) {
      HttpResponse resp;
      resp.content_type = "text/plain";
      resp.body = "pong";
      r.send(std::move(resp));
    });
    if (!http.start().ok()) _exit(11);
    const uint16_t port = http.port();
    if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) _exit(12);
    char c;
    (void)!read(stop_pipe[0], &c, 1);
    http.stop(std::chrono::milliseconds(0));
    _exit(0);
  }
  uint16_t port = 0;
  ASSERT_EQ(read(port_pipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ASSERT_EQ(get_ping(port).find("pong") != std::string::npos, true);  // serves at first

  std::vector<int> idle;
  for (int i = 0; i < kIdleConnections; ++i) {
    const int s = connect_to(port);
    ASSERT_GE(s, 0) << "connection " << i;
    idle.push_back(s);
  }
  usleep(300'000);  // the server accepts what it can and runs out of descriptors
  const double cpu0 = cpu_seconds(server);
  sleep(2);
  const double cpu1 = cpu_seconds(server);
  ASSERT_GE(cpu0, 0);
  // A retry loop spends ~2 s of CPU here; backing off (10 ms doubling to 1 s), next to none.
  EXPECT_LT(cpu1 - cpu0, 0.5) << "CPU seconds over 2 s out of descriptors";
  size_t total = 0;
  const size_t accept_lines = count_lines_with(log_path, "accept failed", &total);
  EXPECT_GE(accept_lines, 1u) << "the server never ran out of descriptors";
  EXPECT_LE(accept_lines, 40u);  // at most the logger's 20 a second, and backoff gives fewer
  EXPECT_LE(total, 100u);

  for (int s : idle) close(s);
  const std::string answer = get_ping(port);
  EXPECT_NE(answer.find("200"), std::string::npos) << answer;
  EXPECT_NE(answer.find("pong"), std::string::npos) << answer;

  ASSERT_EQ(write(stop_pipe[1], "s", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(server, &status, 0), server);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {port_pipe[0], port_pipe[1], stop_pipe[0], stop_pipe[1], log_fd}) close(fd);
  unlink(log_path);
}

}  // namespace
}  // namespace xds::serve
