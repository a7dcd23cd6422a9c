// pick_transfer_backend against hand-written cases: same host by spelling, loopback peers,
// ports and IPv6 brackets stripped, different hosts -> ucx.
#include <gtest/gtest.h>

#include "xccl/transfer_backend.h"

namespace xds::xccl {
namespace {

TEST(TransferBackend, TheHostPartOfAnAddress) {
  EXPECT_EQ(address_host("10.0.0.2:7000"), "10.0.0.2");
  EXPECT_EQ(address_host("10.0.0.2"), "10.0.0.2");
  EXPECT_EQ(address_host("[fd00::2]:7000"), "fd00::2");
  EXPECT_EQ(address_host("fd00::2"), "fd00::2");
  EXPECT_EQ(address_host("node-3.rack:80"), "node-3.rack");
}

TEST(TransferBackend, LoopbackHosts) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.1.2.3"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("LocalHost"));
  EXPECT_FALSE(is_loopback_host("127.example.com"));
  EXPECT_FALSE(is_loopback_host("128.0.0.1"));
  EXPECT_FALSE(is_loopback_host("10.127.0.1"));
}

TEST(TransferBackend, SharedMemoryOnOneHostUcxBetweenHosts) {
  EXPECT_EQ(pick_transfer_backend("10.0.0.2:7000", "10.0.0.2:7001"), TransferBackend::kShm);
  EXPECT_EQ(pick_transfer_backend("Node-A:1", "node-a:2"), TransferBackend::kShm);
  EXPECT_EQ(pick_transfer_backend("10.0.0.2:7000", "127.0.0.1:7001"), TransferBackend::kShm);
  EXPECT_EQ(pick_transfer_backend("[fd00::2]:1", "fd00::2"), TransferBackend::kShm);
  EXPECT_EQ(pick_transfer_backend("10.0.0.2:7000", "10.0.0.3:7000"), TransferBackend::kUcx);
  EXPECT_EQ(pick_transfer_backend("[fd00::2]:1", "[fd00::3]:1"), TransferBackend::kUcx);
  EXPECT_EQ(pick_transfer_backend("node-a", "node-b"), TransferBackend::kUcx);
  EXPECT_EQ(transfer_backend_name(TransferBackend::kShm), "shm");
  EXPECT_EQ(transfer_backend_name(TransferBackend::kUcx), "ucx");
}

}  // namespace
}  // namespace xds::xccl
