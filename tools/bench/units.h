// Units of penstock-bench: parsing sizes with K/M/G/T suffixes and formatting byte counts.
// Thread-safety: pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/result.h"

namespace penstock::bench {

// Parses a byte size: a non-negative decimal number (fractions allowed: "1.5G") optionally
// followed by K, M, G or T (case-insensitive, powers of 1024), optionally followed by "B" or
// "iB" ("4M", "4MiB", "4mb", "512", "512B"). Returns kInvalid for empty text, a unit it does not
// know, a negative number, a result that is not a whole number of bytes, or one above 2^63.
Result<uint64_t> parse_size(std::string_view text);

// "1 GiB", "128 KiB", "1.5 MiB", "100 B": the largest binary unit that keeps the number >= 1,
// with up to two decimals (trailing zeros removed).
std::string format_size(uint64_t bytes);

// A number with up to `decimals` decimals, trailing zeros removed ("2.5", "3", "0.012").
std::string format_number(double value, int decimals = 3);

}  // namespace penstock::bench
