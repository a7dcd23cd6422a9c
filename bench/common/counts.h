// "1,4,16" -> {1, 4, 16}: the token or batch counts a benchmark's flag lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xds::bench {

// Every comma-separated item an integer >= 1, at least one; std::invalid_argument naming the
// first bad item otherwise.
std::vector<int64_t> parse_counts(const std::string& csv);

}  // namespace xds::bench
