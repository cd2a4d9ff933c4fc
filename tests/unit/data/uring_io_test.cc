#include "server/data/uring_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/data/test_util.h"

namespace penstock::data {
namespace {

using testing::pattern;
using testing::TempDir;

// Every test runs on io_uring (false) and on the POSIX fallback (true).
class UringIo : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    force_posix_io_for_test(GetParam());
    path_ = dir_.path() + "/f";
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
    force_posix_io_for_test(false);
  }
  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_P(UringIo, ReportsEngine) {
  // On this path io_uring_active() must follow the forced setting; with io_uring allowed it is
  // true unless the kernel refuses rings (then the fallback warned once).
  if (GetParam()) {
    EXPECT_FALSE(io_uring_active());
  } else {
    EXPECT_TRUE(io_uring_active()) << "io_uring is refused by this kernel; the fallback is in use";
  }
}

TEST_P(UringIo, GatheredWriteThenScatteredRead) {
  auto a = pattern(5000, 1), b = pattern(3, 2), c = pattern(70000, 3);
  IoOp w = IoOp::write(fd_, 100, {std::span<const uint8_t>(a), std::span<const uint8_t>(b), std::span<const uint8_t>(c)});
  ASSERT_TRUE(run_io(std::span<IoOp>(&w, 1), false).is_ok());
  std::vector<uint8_t> x(5003), y(70000);
  IoOp r = IoOp::read(fd_, 100, {std::span<uint8_t>(x), std::span<uint8_t>(y)});
  ASSERT_TRUE(run_io(std::span<IoOp>(&r, 1), false).is_ok());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), x.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), x.begin() + 5000));
  EXPECT_EQ(y, c);
}

TEST_P(UringIo, OrderedBatchRunsInOrder) {
  auto first = pattern(4096, 4), second = pattern(4096, 5);
  std::vector<uint8_t> got(4096);
  IoOp ops[4] = {IoOp::write(fd_, 0, {std::span<const uint8_t>(first)}),
                 IoOp::write(fd_, 0, {std::span<const uint8_t>(second)}), IoOp::fsync(fd_),
                 IoOp::read(fd_, 0, {std::span<uint8_t>(got)})};
  ASSERT_TRUE(run_io(ops, true).is_ok());
  EXPECT_EQ(got, second);
}

TEST_P(UringIo, BatchLargerThanTheRing) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<IoOp> ops;
  for (uint32_t i = 0; i < 200; ++i) bufs.push_back(pattern(512, i));
  for (uint32_t i = 0; i < 200; ++i) ops.push_back(IoOp::write(fd_, i * 512, {std::span<const uint8_t>(bufs[i])}));
  ASSERT_TRUE(run_io(ops, false).is_ok());
  std::vector<uint8_t> all(200 * 512);
  IoOp r = IoOp::read(fd_, 0, {std::span<uint8_t>(all)});
  ASSERT_TRUE(run_io(std::span<IoOp>(&r, 1), false).is_ok());
  for (uint32_t i = 0; i < 200; ++i) {
    ASSERT_TRUE(std::equal(bufs[i].begin(), bufs[i].end(), all.begin() + i * 512)) << i;
  }
}

TEST_P(UringIo, ReadPastEndOfFileIsAnError) {
  auto a = pattern(100, 6);
  IoOp w = IoOp::write(fd_, 0, {std::span<const uint8_t>(a)});
  ASSERT_TRUE(run_io(std::span<IoOp>(&w, 1), false).is_ok());
  std::vector<uint8_t> got(200);
  IoOp r = IoOp::read(fd_, 0, {std::span<uint8_t>(got)});
  Status st = run_io(std::span<IoOp>(&r, 1), false);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_NE(st.message().find("end of file"), std::string::npos) << st.to_string();
}

TEST_P(UringIo, ErrorStopsAnOrderedBatch) {
  int ro = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  auto a = pattern(10, 7);
  IoOp ops[2] = {IoOp::write(ro, 0, {std::span<const uint8_t>(a)}), IoOp::write(fd_, 0, {std::span<const uint8_t>(a)})};
  Status st = run_io(ops, true);
  ::close(ro);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_FALSE(ops[1].complete());
  EXPECT_EQ(::lseek(fd_, 0, SEEK_END), 0);  // the second write never ran
}

INSTANTIATE_TEST_SUITE_P(Engines, UringIo, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("Posix") : std::string("IoUring"); });

}  // namespace
}  // namespace penstock::data
