// Unit tests of penstock-bench: the self-verifying data pattern, size parsing, the report helpers
// and the rank-process group. No network, no root, no sleeps.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tools/bench/pattern.h"
#include "tools/bench/report.h"
#include "tools/bench/runtime.h"
#include "tools/bench/units.h"

namespace penstock::bench {
namespace {

std::vector<std::byte> make(uint64_t id, uint64_t offset, size_t len) {
  std::vector<std::byte> v(len);
  fill_pattern(id, offset, v.data(), len);
  return v;
}

TEST(PatternTest, RoundTripsAlignedAndUnaligned) {
  const auto whole = make(7, 0, 64 * 1024);
  EXPECT_TRUE(verify_pattern(7, 0, whole.data(), whole.size(), "f").is_ok());
  // Any sub-range of the file is the same bytes, whatever its alignment.
  const auto part = make(7, 4096 * 3 + 123, 10000);
  EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + 4096 * 3 + 123, part.size()));
  EXPECT_TRUE(verify_pattern(7, 4096 * 3 + 123, part.data(), part.size(), "f").is_ok());
  EXPECT_TRUE(verify_pattern(7, 5, whole.data() + 5, 1, "f").is_ok());
}

TEST(PatternTest, BlockHeaderHoldsIdOffsetAndHash) {
  std::vector<std::byte> b(kPatternBlock);
  generate_block(42, 8192, b.data());
  uint64_t magic, id, off;
  std::memcpy(&magic, b.data(), 8);
  std::memcpy(&id, b.data() + 8, 8);
  std::memcpy(&off, b.data() + 16, 8);
  EXPECT_EQ(kMagic, magic);
  EXPECT_EQ(42u, id);
  EXPECT_EQ(8192u, off);
  // Blocks of other offsets and other files differ in their random part too.
  std::vector<std::byte> other(kPatternBlock);
  generate_block(42, 12288, other.data());
  EXPECT_NE(0, std::memcmp(b.data() + kPatternHeader, other.data() + kPatternHeader, kPatternBlock - kPatternHeader));
  generate_block(43, 8192, other.data());
  EXPECT_NE(0, std::memcmp(b.data() + kPatternHeader, other.data() + kPatternHeader, kPatternBlock - kPatternHeader));
}

TEST(PatternTest, DetectsFlippedByteAndNamesFileAndOffset) {
  auto v = make(9, 1 << 20, 32 * 1024);
  v[5000] ^= std::byte{0x01};
  const Status s = verify_pattern(9, 1 << 20, v.data(), v.size(), "/data/shard-1");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(Code::kCorrupt, s.code());
  EXPECT_NE(std::string::npos, s.message().find("/data/shard-1"));
  EXPECT_NE(std::string::npos, s.message().find("offset " + std::to_string((1 << 20) + 5000)));
}

TEST(PatternTest, DetectsFlippedByteInEveryHeaderField) {
  for (size_t pos : {0u, 9u, 17u, 25u, 31u}) {
    auto v = make(9, 0, 8192);
    v[4096 + pos] ^= std::byte{0x80};
    const Status s = verify_pattern(9, 0, v.data(), v.size(), "f");
    EXPECT_EQ(Code::kCorrupt, s.code()) << "header byte " << pos;
  }
}

TEST(PatternTest, DetectsFlippedByteInPartialBlocks) {
  auto v = make(3, 100, 9000);  // partial first block, one full block, partial last block
  for (size_t pos : {0u, 3995u, 8999u}) {
    auto w = v;
    w[pos] ^= std::byte{0x10};
    const Status s = verify_pattern(3, 100, w.data(), w.size(), "f");
    ASSERT_EQ(Code::kCorrupt, s.code()) << pos;
    EXPECT_NE(std::string::npos, s.message().find("offset " + std::to_string(100 + pos))) << s.message();
  }
}

TEST(PatternTest, DetectsMisplacedBlock) {
  auto v = make(5, 0, 4 * kPatternBlock);
  // Blocks 1 and 2 swapped: each is intact but sits at the wrong offset.
  std::vector<std::byte> tmp(v.begin() + kPatternBlock, v.begin() + 2 * kPatternBlock);
  std::memcpy(v.data() + kPatternBlock, v.data() + 2 * kPatternBlock, kPatternBlock);
  std::memcpy(v.data() + 2 * kPatternBlock, tmp.data(), kPatternBlock);
  const Status s = verify_pattern(5, 0, v.data(), v.size(), "f");
  ASSERT_EQ(Code::kCorrupt, s.code());
  EXPECT_NE(std::string::npos, s.message().find("misplaced")) << s.message();
  EXPECT_NE(std::string::npos, s.message().find("offset 4096")) << s.message();
}

TEST(PatternTest, DetectsBlockOfAnotherFile) {
  auto v = make(5, 0, kPatternBlock);
  const Status s = verify_pattern(6, 0, v.data(), v.size(), "f");
  ASSERT_EQ(Code::kCorrupt, s.code());
  EXPECT_NE(std::string::npos, s.message().find("another file")) << s.message();
}

TEST(PatternTest, DetectsZeroBlock) {
  std::vector<std::byte> v(kPatternBlock);
  const Status s = verify_pattern(1, 0, v.data(), v.size(), "f");
  ASSERT_EQ(Code::kCorrupt, s.code());
  EXPECT_NE(std::string::npos, s.message().find("all zeros")) << s.message();
}

TEST(SizeTest, ParsesSuffixes) {
  EXPECT_EQ(4096u, *parse_size("4096"));
  EXPECT_EQ(512u, *parse_size("512B"));
  EXPECT_EQ(64u << 10, *parse_size("64K"));
  EXPECT_EQ(64u << 10, *parse_size("64k"));
  EXPECT_EQ(4u << 20, *parse_size("4M"));
  EXPECT_EQ(4u << 20, *parse_size("4MiB"));
  EXPECT_EQ(4u << 20, *parse_size("4mb"));
  EXPECT_EQ(1ULL << 30, *parse_size("1G"));
  EXPECT_EQ(3ULL << 29, *parse_size("1.5G"));
  EXPECT_EQ(2ULL << 40, *parse_size(" 2T "));
  EXPECT_EQ(0u, *parse_size("0"));
}

TEST(SizeTest, RejectsBadText) {
  for (const char* bad : {"", "abc", "4X", "-1", "1.5", "4Mx", "1..2K", "K", "4 iB", "99999999999T"}) {
    const Result<uint64_t> r = parse_size(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(Code::kInvalid, r.error().code());
  }
}

TEST(SizeTest, Formats) {
  EXPECT_EQ("1 GiB", format_size(1ULL << 30));
  EXPECT_EQ("128 KiB", format_size(128 << 10));
  EXPECT_EQ("1.5 MiB", format_size(3 << 19));
  EXPECT_EQ("100 B", format_size(100));
}

TEST(ReportTest, JsonLineEscapesAndFormats) {
  Metric m{"write_throughput", 2.5, "GB/s"};
  EXPECT_EQ(R"({"workload":"ckpt-write","dir":"/a \"b\"\\c","metric":"write_throughput","value":2.5,"unit":"GB/s"})",
            json_line("ckpt-write", "/a \"b\"\\c", m));
}

TEST(ReportTest, MedianAndRatio) {
  EXPECT_EQ(2.0, median({3, 1, 2}));
  EXPECT_EQ(2.5, median({4, 1, 2, 3}));
  CompareResult c;
  c.workload = "train-rand";
  c.dirs = {"/a", "/b"};
  c.metrics = {Metric{"samples_per_s", 0, "samples/s"}, Metric{"p99_latency", 0, "ms", true, true}};
  c.median = {{100, 50}, {2, 4}};
  c.runs = 3;
  EXPECT_DOUBLE_EQ(0.5, ratio(c, 0, 1));
  EXPECT_DOUBLE_EQ(2.0, ratio(c, 1, 1));
  const std::string svg = render_svg(c);
  EXPECT_EQ(0u, svg.rfind("<svg", 0));
  EXPECT_NE(std::string::npos, svg.find("penstock-bench train-rand"));
  EXPECT_NE(std::string::npos, svg.find("0.50x"));
  EXPECT_NE(std::string::npos, svg.find("2.00x"));
  EXPECT_NE(std::string::npos, svg.find("lower is better"));
  EXPECT_NE(std::string::npos, svg.find("</svg>"));
}

TEST(ProcessGroupTest, BarriersAndReports) {
  ProcessGroup g;
  ASSERT_TRUE(g.spawn(3, [](int rank, Barrier& b) -> Result<RankReport> {
                 PENSTOCK_RETURN_IF_ERROR(b.arrive_and_wait());
                 RankReport r;
                 r.bytes = static_cast<uint64_t>(rank) + 10;
                 return r;
               }).is_ok());
  ASSERT_TRUE(g.wait_barrier().has_value());
  ASSERT_TRUE(g.release().is_ok());
  Result<std::vector<RankReport>> reports = g.finish();
  ASSERT_TRUE(reports.has_value()) << reports.error().to_string();
  ASSERT_EQ(3u, reports->size());
  EXPECT_EQ(12u, (*reports)[2].bytes);
}

TEST(ProcessGroupTest, FailingRankCancelsTheRun) {
  ProcessGroup g;
  ASSERT_TRUE(g.spawn(3, [](int rank, Barrier& b) -> Result<RankReport> {
                 if (rank == 1) return make_error(Code::kCorrupt, "bad byte in shard 1");
                 PENSTOCK_RETURN_IF_ERROR(b.arrive_and_wait());
                 return RankReport{};
               }).is_ok());
  Result<double> r = g.wait_barrier();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(Code::kCorrupt, r.error().code());  // the code survives the trip through the pipe
  EXPECT_NE(std::string::npos, r.error().message().find("rank 1"));
  EXPECT_NE(std::string::npos, r.error().message().find("bad byte in shard 1"));
}

TEST(MountTest, FindsTheDeepestMountHoldingAPath) {
  const std::string mounts =
      "/dev/vda / ext4 rw 0 0\n"
      "penstock /mnt/pen\\040fs fuse.penstock rw,nosuid 0 0\n"
      "tmpfs /mnt/pen\\040fs/tmp tmpfs rw 0 0\n"
      "tmpfs /mnt/penx tmpfs rw 0 0\n";
  EXPECT_EQ("ext4", fstype_for_path(mounts, "/home/x"));
  EXPECT_EQ("fuse.penstock", fstype_for_path(mounts, "/mnt/pen fs"));
  EXPECT_EQ("fuse.penstock", fstype_for_path(mounts, "/mnt/pen fs/data/ckpt"));
  EXPECT_EQ("tmpfs", fstype_for_path(mounts, "/mnt/pen fs/tmp/a"));
  EXPECT_EQ("tmpfs", fstype_for_path(mounts, "/mnt/penx"));
  // A later mount on the same point hides the earlier one.
  EXPECT_EQ("fuse.penstock-mount", fstype_for_path(mounts + "penstock /mnt/penx fuse.penstock-mount rw 0 0\n", "/mnt/penx/a"));
  EXPECT_TRUE(is_penstock_fstype("fuse.penstock"));
  EXPECT_TRUE(is_penstock_fstype("fuse.penstock-mount"));
  EXPECT_FALSE(is_penstock_fstype("fuse.sshfs"));
  EXPECT_EQ("proc", mount_fstype("/proc"));
}

TEST(ProcStat, BusyTicksAddUserNiceSystemIrqSoftirqSteal) {
  const std::string sample =
      "cpu  10132153 290696 3084719 46828483 16683 0 25195 7 11 13\n"
      "cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n"
      "intr 1462898 0 0\n"
      "ctxt 1990473\n";
  auto t = busy_ticks_from_proc_stat(sample);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  // user 10132153 + nice 290696 + system 3084719 + irq 0 + softirq 25195 + steal 7; not idle,
  // iowait, or guest (inside user already).
  EXPECT_EQ(*t, 10132153u + 290696u + 3084719u + 0u + 25195u + 7u);
  // Without steal (7 fields, old kernels) it still parses.
  auto old = busy_ticks_from_proc_stat("cpu  1 2 3 4 5 6 7\n");
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(*old, 1u + 2u + 3u + 6u + 7u);
  // The aggregate line is needed: per-CPU lines alone do not count.
  EXPECT_FALSE(busy_ticks_from_proc_stat("cpu0 1 2 3 4 5 6 7 8\n").has_value());
  EXPECT_FALSE(busy_ticks_from_proc_stat("cpu  1 2 x\n").has_value());
  EXPECT_FALSE(busy_ticks_from_proc_stat("cpu  1 2 3\n").has_value());
  EXPECT_FALSE(busy_ticks_from_proc_stat("").has_value());
  // The live file parses and moves forward.
  auto a = machine_busy_cpu_seconds();
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  // Busy-spin (this process's CPU counts) until a clock tick shows it, or give up after 5 s.
  const double deadline = now_seconds() + 5;
  double b = *a;
  volatile uint64_t spin = 0;
  while (b <= *a && now_seconds() < deadline) {
    for (uint64_t i = 0; i < 1'000'000; ++i) spin = spin + i;
    auto now = machine_busy_cpu_seconds();
    ASSERT_TRUE(now.has_value());
    b = *now;
  }
  EXPECT_GT(b, *a);
}

TEST(PenstockDetect, LocalDirectoryIsNotPenstock) {
  EXPECT_FALSE(is_penstock_dir("/tmp"));
  EXPECT_FALSE(is_penstock_dir("/proc"));
  EXPECT_EQ(penstock_cache_drops(), 0);
}

}  // namespace
}  // namespace penstock::bench
