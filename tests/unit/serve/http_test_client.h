// A plain blocking HTTP/1.1 client over POSIX sockets for the server's tests: written
// independently of Beast, so the server is checked against a second reading of the protocol.
// Every read has a 10 s socket timeout, so a broken server fails a test instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

namespace xds::serve::testing {

struct ParsedResponse {
  bool ok = false;  // a complete response was read
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;  // de-chunked
};

class TestClient {
 public:
  explicit TestClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~TestClient() { close(); }
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool send_all(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads one response (Content-Length, chunked, or until EOF).
  ParsedResponse read_response() {
    ParsedResponse r;
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return r;
    }
    std::string head = buf_.substr(0, head_end);
    buf_.erase(0, head_end + 4);
    size_t line_end = head.find("\r\n");
    std::string status_line = head.substr(0, line_end);
    if (status_line.size() < 12) return r;
    r.status = std::atoi(status_line.c_str() + 9);
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string::npos) e = head.size();
      std::string line = head.substr(pos, e - pos);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        size_t v = colon + 1;
        while (v < line.size() && line[v] == ' ') ++v;
        r.headers[name] = line.substr(v);
      }
      pos = e + 2;
    }
    if (r.status == 100) return read_response();
    if (r.headers.count("transfer-encoding") && r.headers["transfer-encoding"] == "chunked") {
      while (true) {
        size_t e;
        while ((e = buf_.find("\r\n")) == std::string::npos) {
          if (!fill()) return r;
        }
        size_t size = std::strtoul(buf_.substr(0, e).c_str(), nullptr, 16);
        while (buf_.size() < e + 2 + size + 2) {
          if (!fill()) return r;
        }
        r.body += buf_.substr(e + 2, size);
        buf_.erase(0, e + 2 + size + 2);
        if (size == 0) break;
      }
    } else if (r.headers.count("content-length")) {
      size_t len = std::strtoul(r.headers["content-length"].c_str(), nullptr, 10);
      while (buf_.size() < len) {
        if (!fill()) return r;
      }
      r.body = buf_.substr(0, len);
      buf_.erase(0, len);
    } else {
      while (fill()) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    r.ok = true;
    return r;
  }

  // Reads raw bytes until `needle` has arrived (true) or the connection ends / times out.
  bool read_until(const std::string& needle) {
    while (buf_.find(needle) == std::string::npos) {
      if (!fill()) return false;
    }
    return true;
  }
  const std::string& raw() const { return buf_; }

  // True when the server closed the connection (EOF) within the timeout.
  bool wait_closed() {
    while (fill()) {
    }
    return eof_;
  }

 private:
  bool fill() {
    char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      eof_ = n == 0;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

inline std::string get_request(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
}

inline std::string post_request(const std::string& path, const std::string& body,
                                const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

}  // namespace xds::serve::testing
