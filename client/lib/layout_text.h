// The text form of a layout, as shown and accepted by the virtual xattr `user.penstock.layout`,
// and of a mount's counters (`user.penstock.stats`)
// (and printed by `penstock layout get`):
//   get: "chunk_size=4194304 stripe_count=3 chains=1,2,3"   (chains only when the layout has some,
//        i.e. on files; a directory's stripe_count 0 means "all chains")
//   set: "chunk_size=N stripe_count=M"   either key optional, N may carry a K/M/G (binary) suffix.
// Pure functions. Thread-safety: pure.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"
#include "common/proto/types.h"

namespace penstock::client {

// The xattr name the client serves itself: never stored at the meta server, never listed.
inline constexpr std::string_view kLayoutXattr = "user.penstock.layout";
// Setting this virtual xattr on any inode of a mount (any value, e.g. "1") drops the caches on the
// way to the disks (Client::drop_caches): the mount's chunk cache and every data server's caches.
// Root or the mount's owner only (EPERM otherwise); reading it gives ENODATA; never stored or listed.
inline constexpr std::string_view kDropCachesXattr = "user.penstock.drop_caches";
// Reading this virtual xattr on any inode of a mount gives the mount's counters since it started
// and its chunk cache's current size (format_counters); setting or removing it gives EPERM; never
// stored or listed.
inline constexpr std::string_view kStatsXattr = "user.penstock.stats";

// One counter of a mount (kStatsXattr).
struct Counter {
  std::string_view name;
  uint64_t value = 0;
};
// "name value\n" per counter, in the order given: `getfattr --only-values -n user.penstock.stats`.
std::string format_counters(std::span<const Counter> counters);
// The longest text format_counters() can give for these names (every value at 20 digits): the
// size a getxattr probe is told, so the read that follows fits although the counters moved on.
size_t max_counters_size(std::span<const Counter> counters);

// One counter read back from format_counters()'s text.
struct ParsedCounter {
  std::string name;
  uint64_t value = 0;
};
// Reads format_counters()'s text back, in its order. Errors: kInvalid naming the first line that
// is not "NAME VALUE" (NAME of [a-z0-9_], VALUE decimal and at most UINT64_MAX).
Result<std::vector<ParsedCounter>> parse_counters(std::string_view text);
// Whether a mount counter is a level, how much there is now (the chunk cache's bytes and blocks,
// the FUSE loop's places), rather than a count of what happened since the mount started:
// `penstock stats --mount --interval` shows levels as they are and counts as rates.
// Keep in step with mount_counters() (client/fuse/fuse_ops.cc).
bool is_level_counter(std::string_view name);

// A parsed `set` request: the keys that were given. At least one is present.
struct LayoutSpec {
  std::optional<uint32_t> chunk_size;
  std::optional<uint32_t> stripe_count;
};

// "chunk_size=4194304 stripe_count=3 chains=1,2,3" (the chains part only when layout.chains is
// not empty).
std::string format_layout(const proto::Layout& layout);

// Parses a byte size: decimal digits with an optional K, M or G suffix (binary: 1K = 1024),
// case-insensitive, optionally followed by "iB" or "B" ("4M", "4MiB", "65536").
// kInvalid naming the text when it is not a size or does not fit in 64 bits.
Result<uint64_t> parse_size(std::string_view text);

// Parses "chunk_size=N stripe_count=M" (whitespace-separated, either key optional, any order).
// kInvalid with the reason on: an unknown key (chains cannot be set: they are chosen at create
// time), a repeated key, a missing '=', a bad number, a chunk size that is not a power of two in
// [64 KiB, 64 MiB], or no key at all.
Result<LayoutSpec> parse_layout_spec(std::string_view text);

}  // namespace penstock::client
