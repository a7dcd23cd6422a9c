#include "counts.h"

#include <charconv>
#include <sstream>
#include <stdexcept>

namespace xds::bench {

std::vector<int64_t> parse_counts(const std::string& csv) {
  std::vector<int64_t> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size() || v < 1)
      throw std::invalid_argument("'" + item + "' is not a token count (an integer >= 1)");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument("no token counts");
  return out;
}

}  // namespace xds::bench
