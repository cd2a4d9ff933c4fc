// send_now / unsent_rest (common/net/tcp/send_now.h): a frame written from the caller's thread,
// in parts, over a Unix socket pair with a small send buffer so the socket takes only part of it.
#include "common/net/tcp/send_now.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::net {
namespace {

iovec part_of(std::string& s) { return iovec{s.data(), s.size()}; }

std::string joined(const std::vector<iovec>& parts) {
  std::string out;
  for (const iovec& p : parts) out.append(static_cast<const char*>(p.iov_base), p.iov_len);
  return out;
}

TEST(UnsentRestTest, SkipsWholeAndPartialPartsAndDropsEmptyOnes) {
  std::string a = "header", b, c = "message", d = "bulk";
  const std::vector<iovec> parts = {part_of(a), part_of(b), part_of(c), part_of(d)};
  EXPECT_EQ(joined(unsent_rest(parts, 0)), "headermessagebulk");
  EXPECT_EQ(unsent_rest(parts, 0).size(), 3u);  // the empty part is gone
  EXPECT_EQ(joined(unsent_rest(parts, 4)), "ermessagebulk");
  EXPECT_EQ(joined(unsent_rest(parts, 6)), "messagebulk");
  EXPECT_EQ(joined(unsent_rest(parts, 15)), "lk");
  EXPECT_TRUE(unsent_rest(parts, 17).empty());
  // The rest points into the caller's memory: nothing is copied.
  EXPECT_EQ(unsent_rest(parts, 8).front().iov_base, c.data() + 2);
}

class SendNowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    const int small = 16 << 10;
    ASSERT_EQ(::setsockopt(fds_[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  }
  void TearDown() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  int fds_[2] = {-1, -1};
};

TEST_F(SendNowTest, APartialWriteFinishedFromTheRestDeliversEveryByteInOrder) {
  std::string header(32, 'h'), message(1000, 'm'), bulk(512 << 10, 'b');
  for (size_t i = 0; i < bulk.size(); ++i) bulk[i] = static_cast<char>('a' + i % 23);
  const std::vector<iovec> parts = {part_of(header), part_of(message), part_of(bulk)};
  const size_t total = header.size() + message.size() + bulk.size();

  const SendNow r = send_now(fds_[0], parts);
  ASSERT_EQ(r.error, 0);
  ASSERT_GT(r.sent, 0u);
  ASSERT_LT(r.sent, total);  // the small buffer took only part of it

  // What the I/O thread does: write the rest, here with blocking writes while reading the peer.
  std::string received;
  std::vector<uint8_t> buf(64 << 10);
  std::vector<iovec> rest = unsent_rest(parts, r.sent);
  size_t left = total - r.sent;
  while (received.size() < total) {
    const ssize_t n = ::read(fds_[1], buf.data(), buf.size());
    ASSERT_GT(n, 0);
    received.append(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
    if (left > 0) {
      const SendNow more = send_now(fds_[0], rest);
      ASSERT_EQ(more.error, 0);
      left -= more.sent;
      rest = unsent_rest(rest, more.sent);
    }
  }
  EXPECT_EQ(left, 0u);
  EXPECT_EQ(received, header + message + bulk);
}

TEST_F(SendNowTest, AFullSocketTakesNothingAndIsNoError) {
  std::string filler(1 << 20, 'x');
  const std::vector<iovec> parts = {part_of(filler)};
  SendNow r = send_now(fds_[0], parts);
  ASSERT_EQ(r.error, 0);
  ASSERT_GT(r.sent, 0u);
  r = send_now(fds_[0], parts);  // the peer read nothing: the buffer is full
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.sent, 0u);
}

TEST_F(SendNowTest, AClosedPeerIsAnErrorNotASignal) {
  ::close(fds_[1]);
  fds_[1] = -1;
  std::string frame = "frame";
  const std::vector<iovec> parts = {part_of(frame)};
  const SendNow r = send_now(fds_[0], parts);  // SIGPIPE would kill the test binary
  EXPECT_EQ(r.error, EPIPE);
  EXPECT_EQ(r.sent, 0u);
}

}  // namespace
}  // namespace penstock::net
