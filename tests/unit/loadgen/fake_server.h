// A plain POSIX-socket HTTP/1.1 server for the benchmark client's tests, written without
// Beast so the client is checked against a second reading of the protocol. Each connection
// gets its own thread; the test's handler reads the parsed request and writes raw bytes.
// Every socket has a 10 s receive timeout, so a broken client fails a test instead of hanging.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace xds::loadgen::testing {

struct FakeRequest {
  std::string method;
  std::string target;
  std::string head;  // the whole head, header names as sent
  std::string body;
};

// Writes all of `data`; false when the peer went away.
inline bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// One HTTP/1.1 chunk holding `data`.
inline std::string http_chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

class FakeServer {
 public:
  using Handler = std::function<void(const FakeRequest&, int fd)>;

  explicit FakeServer(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 512);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~FakeServer() {
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : workers_) t.join();
  }

  uint16_t port() const { return port_; }
  int connections() const { return connections_.load(); }

 private:
  void accept_loop() {
    while (!stopping_) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      ++connections_;
      timeval tv{10, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::lock_guard<std::mutex> lock(mu_);
      workers_.emplace_back([this, fd] {
        FakeRequest req;
        if (read_request(fd, req)) handler_(req, fd);
        ::close(fd);
      });
    }
  }

  static bool read_request(int fd, FakeRequest& req) {
    std::string buf;
    size_t head_end;
    char tmp[4096];
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
    req.head = buf.substr(0, head_end);
    std::string body = buf.substr(head_end + 4);
    const size_t sp1 = req.head.find(' ');
    const size_t sp2 = req.head.find(' ', sp1 + 1);
    req.method = req.head.substr(0, sp1);
    req.target = req.head.substr(sp1 + 1, sp2 - sp1 - 1);
    size_t length = 0;
    std::string lower = req.head;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t cl = lower.find("\r\ncontent-length:");
    if (cl != std::string::npos) length = std::strtoul(lower.c_str() + cl + 17, nullptr, 10);
    while (body.size() < length) {
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      body.append(tmp, static_cast<size_t>(n));
    }
    req.body = body;
    return true;
  }

  Handler handler_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

// The head of a chunked SSE response.
inline std::string sse_head() {
  return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         "Transfer-Encoding: chunked\r\n\r\n";
}

}  // namespace xds::loadgen::testing
