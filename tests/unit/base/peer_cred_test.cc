// check_same_user (base/peer_cred.h) against what the kernel knows independently: a
// socketpair's peer is this very process; a child that dropped to uid 65534 ("nobody") before
// connecting is refused, naming its uid; a pipe is not a socket.
#include "base/peer_cred.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace xds {
namespace {

constexpr uid_t kNobody = 65534;

TEST(PeerCred, ASocketPairsPeerIsThisProcessAndPasses) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto cred = peer_cred(sv[0]);
  ASSERT_TRUE(cred.ok()) << cred.status().to_string();
  EXPECT_EQ(cred->pid, getpid());
  EXPECT_EQ(cred->uid, geteuid());
  EXPECT_TRUE(check_same_user(sv[0]).ok());
  EXPECT_TRUE(check_same_user(sv[1]).ok());
  close(sv[0]);
  close(sv[1]);
}

TEST(PeerCred, APipeIsNotASocket) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const Status st = check_same_user(p[0]);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  close(p[0]);
  close(p[1]);
}

// Root can become nobody; anyone else cannot make a peer of another uid, so the test skips.
TEST(PeerCred, APeerRunningAsNobodyIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534";
  const int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "xds-peer-cred-test-" + std::to_string(getpid());
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // abstract: sun_path[0] = 0
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), len), 0);
  ASSERT_EQ(listen(lfd, 1), 0);
  const pid_t child = fork();
  if (child == 0) {
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(10);
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) _exit(11);
    char c;
    (void)!read(s, &c, 1);  // until the parent closes
    _exit(0);
  }
  const int conn = accept(lfd, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  auto cred = peer_cred(conn);
  ASSERT_TRUE(cred.ok()) << cred.status().to_string();
  EXPECT_EQ(cred->uid, kNobody);
  EXPECT_EQ(cred->pid, child);
  const Status st = check_same_user(conn);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("uid 65534"), std::string::npos) << st.message();
  close(conn);
  close(lfd);
  int ws = 0;
  ASSERT_EQ(waitpid(child, &ws, 0), child);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ws;
}

}  // namespace
}  // namespace xds
