// Byte sizes as people write them in flags and config files: digits with an optional K, M, G or T
// suffix (powers of 1024; "KiB", "MiB", ... and "B" too). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/base/result.h"

namespace penstock {

// kInvalid with a message naming the text when it is not such a size, or on overflow.
Result<uint64_t> parse_byte_size(std::string_view text);

}  // namespace penstock
