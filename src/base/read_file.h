// Reading a whole (small) file into memory: configs, index JSON, tokenizer files, prompts.
#pragma once

#include <string>

#include "base/status.h"

namespace xds {

// The file's bytes. Errors name the path: NotFound when it cannot be opened (with the OS's
// reason), InvalidArgument for a directory, DataLoss when reading fails part way.
Result<std::string> read_whole_file(const std::string& path);

}  // namespace xds
