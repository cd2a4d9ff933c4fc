#include "client/fuse/errno_map.h"

#include <fcntl.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <map>

namespace penstock::fuse {
namespace {

// The table the FUSE adapter must implement, written out independently of errno_map.cc.
const std::map<Code, int>& expected_table() {
  static const std::map<Code, int> table = {
      {Code::kOk, 0},
      {Code::kNotFound, ENOENT},
      {Code::kExists, EEXIST},
      {Code::kNotDir, ENOTDIR},
      {Code::kIsDir, EISDIR},
      {Code::kNotEmpty, ENOTEMPTY},
      {Code::kInvalid, EINVAL},
      {Code::kNameTooLong, ENAMETOOLONG},
      {Code::kNoSpace, ENOSPC},
      {Code::kIo, EIO},
      {Code::kCorrupt, EIO},
      {Code::kPermission, EACCES},
      {Code::kNotPermitted, EPERM},
      {Code::kTimeout, ETIMEDOUT},
      {Code::kUnavailable, EIO},
      {Code::kProtocol, EIO},
      {Code::kNoData, ENODATA},
      {Code::kRange, ERANGE},
      {Code::kNotSupported, EOPNOTSUPP},
      {Code::kTooManyLinks, EMLINK},
      {Code::kCrossDevice, EXDEV},
      {Code::kBusy, EBUSY},
      {Code::kStale, ESTALE},
      {Code::kInternal, EIO},
      {Code::kFileTooBig, EFBIG},
      {Code::kBadHandle, EBADF},
      {Code::kTooManyOpen, EMFILE},
      {Code::kCancelled, EIO},
  };
  return table;
}

TEST(ErrnoOf, EveryKnownCodeHasItsErrno) {
  int known = 0;
  // Walk the wire numbers: a code added to status.h without a row here fails this test.
  for (uint32_t raw = 0; raw < 1000; ++raw) {
    if (!code_is_known(raw)) continue;
    ++known;
    const Code code = static_cast<Code>(raw);
    auto it = expected_table().find(code);
    ASSERT_NE(it, expected_table().end()) << "code " << raw << " (" << code_name(code)
                                          << ") has no expected errno in this test";
    EXPECT_EQ(errno_of(code), it->second) << code_name(code);
  }
  EXPECT_EQ(known, static_cast<int>(expected_table().size()));
}

TEST(ErrnoOf, OnlyOkIsZero) {
  for (const auto& [code, err] : expected_table()) {
    if (code == Code::kOk) {
      EXPECT_EQ(errno_of(code), 0);
    } else {
      EXPECT_GT(errno_of(code), 0) << code_name(code);
    }
  }
}

TEST(ErrnoOf, UnknownNumberIsEio) {
  EXPECT_EQ(errno_of(static_cast<Code>(9999)), EIO);
}

// A name another client made between the kernel's LOOKUP and its CREATE: open() without O_EXCL
// must open that file (ESTALE makes the kernel look the name up again), with O_EXCL it is EEXIST.
TEST(CreateErrorForOpen, ANameMadeElsewhereAfterTheLookupIsLookedUpAgainUnlessExclusive) {
  const Status exists(Code::kExists, "shard.pt exists in directory 7");
  const Status again = create_error_for_open(exists, O_CREAT | O_WRONLY | O_TRUNC);
  EXPECT_EQ(errno_of(again.code()), ESTALE);
  EXPECT_NE(again.message().find("shard.pt exists in directory 7"), std::string::npos) << again.message();
  EXPECT_EQ(errno_of(create_error_for_open(exists, O_CREAT | O_EXCL | O_WRONLY).code()), EEXIST);
  // Other failures are the create's own, whatever the flags.
  for (Code code : {Code::kNotFound, Code::kPermission, Code::kNoSpace, Code::kUnavailable}) {
    const Status st(code, "create failed");
    EXPECT_EQ(create_error_for_open(st, O_CREAT | O_RDWR).code(), code) << code_name(code);
    EXPECT_EQ(create_error_for_open(st, O_CREAT | O_EXCL | O_RDWR).code(), code) << code_name(code);
  }
}

}  // namespace
}  // namespace penstock::fuse
