// A real etcd for the tests: Debian's /usr/bin/etcd on free client and peer ports with a
// temporary data directory, killed and removed at the end. installed() is false (with why())
// where etcd is not installed, and the tests skip with that reason; an etcd that is installed
// but does not start is a failure (failure()).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "serve/etcd_client.h"

extern char** environ;

namespace xds::fixtures {

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdTestServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  EtcdTestServer() {
    if (::access(kBinary, X_OK) != 0) {
      why_ = std::string(kBinary) + " is not installed (Debian's etcd-server)";
      return;
    }
    char tmpl[] = "/tmp/xds_etcd_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      why_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    const int client = free_tcp_port(), peer = free_tcp_port();
    url_ = "http://127.0.0.1:" + std::to_string(client);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    std::vector<std::string> args = {kBinary,
                                     "--name",
                                     "xds-test",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     url_,
                                     "--advertise-client-urls",
                                     url_,
                                     "--listen-peer-urls",
                                     peer_url,
                                     "--initial-advertise-peer-urls",
                                     peer_url,
                                     "--initial-cluster",
                                     "xds-test=" + peer_url};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its log (stdout and stderr) goes to a file in the data directory's parent.
    const std::string log = dir_ + "/etcd.log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int spawned = ::posix_spawn(&pid_, kBinary, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      failed_ = "posix_spawn of etcd failed";
      pid_ = -1;
      return;
    }
    // Ready once a read answers (etcd elects itself leader within a second or two).
    auto ep = serve::etcd::parse_endpoint(url_, "test");
    serve::etcd::Client c(*ep, std::chrono::milliseconds(1000));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (c.range_prefix("/").ok()) return;
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        failed_ = "etcd exited at start (see " + log + ")";
        dir_.clear();  // kept for its log
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    failed_ = "etcd did not answer within 20 s (see " + log + ")";
    dir_.clear();
  }

  ~EtcdTestServer() {
    kill();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  // Not installed: the tests skip, saying why().
  bool installed() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  // Installed but it did not start: the tests fail with failure().
  const std::string& failure() const { return failed_; }
  const std::string& url() const { return url_; }
  serve::etcd::Client client() const {
    return serve::etcd::Client(*serve::etcd::parse_endpoint(url_, "test"));
  }

 private:
  pid_t pid_ = -1;
  std::string dir_, url_, why_, failed_;
};

}  // namespace xds::fixtures
