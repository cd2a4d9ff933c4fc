#include "client/lib/layout_text.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

TEST(FormatLayout, FileShowsChains) {
  proto::Layout l;
  l.chunk_size = 4u << 20;
  l.stripe_count = 3;
  l.chains = {ChainId(1), ChainId(2), ChainId(3)};
  EXPECT_EQ(format_layout(l), "chunk_size=4194304 stripe_count=3 chains=1,2,3");
}

TEST(FormatLayout, DirectoryHasNoChains) {
  proto::Layout l;
  l.chunk_size = 1u << 20;
  l.stripe_count = 0;
  EXPECT_EQ(format_layout(l), "chunk_size=1048576 stripe_count=0");
}

TEST(ParseSize, Suffixes) {
  EXPECT_EQ(parse_size("65536").value(), 65536u);
  EXPECT_EQ(parse_size("64K").value(), 65536u);
  EXPECT_EQ(parse_size("64k").value(), 65536u);
  EXPECT_EQ(parse_size("4M").value(), 4u << 20);
  EXPECT_EQ(parse_size("4MiB").value(), 4u << 20);
  EXPECT_EQ(parse_size("4MB").value(), 4u << 20);
  EXPECT_EQ(parse_size("2G").value(), 2ull << 30);
  EXPECT_EQ(parse_size("0").value(), 0u);
}

TEST(ParseSize, Rejects) {
  for (const char* bad : {"", "M", "4T", "4Mx", "-4", "4 M", "99999999999999999999", "17179869184G"}) {
    auto r = parse_size(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code(), Code::kInvalid) << bad;
  }
}

TEST(ParseLayoutSpec, BothKeysAnyOrder) {
  auto r = parse_layout_spec("  stripe_count=2   chunk_size=1M ");
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->chunk_size, 1u << 20);
  EXPECT_EQ(r->stripe_count, 2u);
}

TEST(ParseLayoutSpec, EitherKeyOptional) {
  auto a = parse_layout_spec("chunk_size=65536");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->chunk_size, 65536u);
  EXPECT_FALSE(a->stripe_count.has_value());
  auto b = parse_layout_spec("stripe_count=0");
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->chunk_size.has_value());
  EXPECT_EQ(b->stripe_count, 0u);
}

TEST(ParseLayoutSpec, FormatOutputOfADirectoryParsesBack) {
  proto::Layout l;
  l.chunk_size = 8u << 20;
  l.stripe_count = 4;
  auto r = parse_layout_spec(format_layout(l));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->chunk_size, 8u << 20);
  EXPECT_EQ(r->stripe_count, 4u);
}

TEST(ParseLayoutSpec, RejectsBadInput) {
  const char* bad[] = {
      "",                                  // nothing to set
      "   ",                               // nothing to set
      "chunk_size",                        // no '='
      "chunk_size=",                       // no value
      "chunk_size=3M",                     // not a power of two
      "chunk_size=32K",                    // below 64 KiB
      "chunk_size=128M",                   // above 64 MiB
      "chunk_size=8G",                     // above 32 bits
      "stripe_count=-1",                   // not a whole number
      "stripe_count=two",                  // not a number
      "stripe_count=",                     // no value
      "stripe_count=99999999999",          // too large
      "chunk_size=1M chunk_size=2M",       // repeated
      "stripe_count=1 stripe_count=2",     // repeated
      "chains=1,2,3",                      // chosen at create time
      "chunk_size=1M chains=1",            // chosen at create time
      "seed=3",                            // unknown key
      "CHUNK_SIZE=1M",                     // keys are case-sensitive
  };
  for (const char* text : bad) {
    auto r = parse_layout_spec(text);
    ASSERT_FALSE(r.has_value()) << "'" << text << "' parsed";
    EXPECT_EQ(r.error().code(), Code::kInvalid) << text;
    EXPECT_FALSE(r.error().message().empty()) << text;
  }
}

// user.penstock.stats: one "name value" line per counter, and a probe size no later read outgrows.
TEST(MountCounters, OneLinePerCounterAndAProbeSizeNoValueOutgrows) {
  std::vector<Counter> counters{{"cache_hits", 12}, {"cache_misses", 0}};
  EXPECT_EQ(format_counters(counters), "cache_hits 12\ncache_misses 0\n");
  EXPECT_EQ(format_counters({}), "");
  const size_t probe = max_counters_size(counters);
  counters[0].value = UINT64_MAX;
  counters[1].value = UINT64_MAX;
  EXPECT_EQ(format_counters(counters).size(), probe);
}

// What `penstock stats --mount` reads back: the same counters in the same order; a line that is
// not "name value" is an error that names it.
TEST(MountCounters, ParseReadsFormattedCountersBackAndNamesABadLine) {
  std::vector<Counter> counters{{"cache_hits", 12}, {"fuse_places", 8}, {"big", UINT64_MAX}};
  auto back = parse_counters(format_counters(counters));
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[0].name, "cache_hits");
  EXPECT_EQ((*back)[0].value, 12u);
  EXPECT_EQ((*back)[1].name, "fuse_places");
  EXPECT_EQ((*back)[2].value, UINT64_MAX);
  EXPECT_TRUE(parse_counters("").value().empty());
  EXPECT_EQ(parse_counters("a 1\n\nb 2").value().size(), 2u);  // blank lines and no final newline
  for (const char* text : {"cache_hits\n", "cache_hits \n", " 12\n", "cache_hits 12x\n", "Cache 1\n",
                           "a-b 1\n", "cache_hits 18446744073709551616\n", "cache_hits -1\n", "a 1 2\n"}) {
    auto r = parse_counters(std::string("ok 1\n") + text);
    ASSERT_FALSE(r.has_value()) << "'" << text << "' parsed";
    EXPECT_EQ(r.error().code(), Code::kInvalid) << text;
    EXPECT_NE(r.error().message().find("line 2"), std::string::npos) << r.error().message();
  }
  EXPECT_TRUE(is_level_counter("cache_bytes"));
  EXPECT_TRUE(is_level_counter("cache_blocks"));
  EXPECT_TRUE(is_level_counter("fuse_places"));
  EXPECT_FALSE(is_level_counter("cache_hits"));
  EXPECT_FALSE(is_level_counter("fuse_threads_started"));
}

}  // namespace
}  // namespace penstock::client
