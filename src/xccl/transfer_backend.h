// Which XCCL transport carries the KV transfer between two peers, chosen from their addresses
// (P104): shared memory when both run on one host, UCX otherwise. A pure function, so that
// DistFlow's choice is unit-tested without sockets.
//
// An address is "host", "host:port", "[v6]:port" or a bare IPv6 address. Peers share a host
// when their hosts are spelled the same (case-insensitive), or when the peer's host is a
// loopback address (127.0.0.0/8, ::1, "localhost": only this host can be reached there).
// Two different spellings of one host (a name and its IP) are not resolved here: they pick
// "ucx", which works on one host too, only slower.
#pragma once

#include <string_view>

namespace xds::xccl {

enum class TransferBackend : unsigned char { kShm, kUcx };

// "shm" / "ucx": the names make_transport() and the UCX link go by.
std::string_view transfer_backend_name(TransferBackend b);
// The host part of an address ("[::1]:80" -> "::1", "10.0.0.2:7000" -> "10.0.0.2").
std::string_view address_host(std::string_view address);
bool is_loopback_host(std::string_view host);
TransferBackend pick_transfer_backend(std::string_view self_address, std::string_view peer_address);

}  // namespace xds::xccl
