#include "xccl/transfer_backend.h"

#include <algorithm>
#include <cctype>

namespace xds::xccl {

std::string_view transfer_backend_name(TransferBackend b) {
  return b == TransferBackend::kShm ? "shm" : "ucx";
}

std::string_view address_host(std::string_view a) {
  if (!a.empty() && a.front() == '[') {
    const size_t close = a.find(']');
    return close == std::string_view::npos ? a.substr(1) : a.substr(1, close - 1);
  }
  const size_t colon = a.find(':');
  if (colon == std::string_view::npos) return a;
  if (a.find(':', colon + 1) != std::string_view::npos) return a;  // bare IPv6
  return a.substr(0, colon);
}

namespace {

bool equal_nocase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

bool is_loopback_host(std::string_view h) {
  if (equal_nocase(h, "localhost") || h == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  if (h.substr(0, 4) != "127.") return false;
  int dots = 0;
  for (char c : h) {
    if (c == '.')
      ++dots;
    else if (!std::isdigit(static_cast<unsigned char>(c)))
      return false;
  }
  return dots == 3;
}

TransferBackend pick_transfer_backend(std::string_view self_address,
                                      std::string_view peer_address) {
  const std::string_view self = address_host(self_address);
  const std::string_view peer = address_host(peer_address);
  if (equal_nocase(self, peer) || is_loopback_host(peer)) return TransferBackend::kShm;
  return TransferBackend::kUcx;
}

}  // namespace xds::xccl
