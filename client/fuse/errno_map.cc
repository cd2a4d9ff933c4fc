#include "client/fuse/errno_map.h"

#include <fcntl.h>

#include <cerrno>

namespace penstock::fuse {

int errno_of(Code code) {
  // No default label: a new Code must be added here (gcc -Wswitch names it).
  switch (code) {
    case Code::kOk: return 0;
    case Code::kNotFound: return ENOENT;
    case Code::kExists: return EEXIST;
    case Code::kNotDir: return ENOTDIR;
    case Code::kIsDir: return EISDIR;
    case Code::kNotEmpty: return ENOTEMPTY;
    case Code::kInvalid: return EINVAL;
    case Code::kNameTooLong: return ENAMETOOLONG;
    case Code::kNoSpace: return ENOSPC;
    case Code::kIo: return EIO;
    case Code::kCorrupt: return EIO;
    case Code::kPermission: return EACCES;
    case Code::kNotPermitted: return EPERM;
    case Code::kTimeout: return ETIMEDOUT;
    case Code::kUnavailable: return EIO;  // the reason is logged by reply_status()
    case Code::kProtocol: return EIO;
    case Code::kNoData: return ENODATA;
    case Code::kRange: return ERANGE;
    case Code::kNotSupported: return EOPNOTSUPP;
    case Code::kTooManyLinks: return EMLINK;
    case Code::kCrossDevice: return EXDEV;
    case Code::kBusy: return EBUSY;
    case Code::kStale: return ESTALE;
    case Code::kInternal: return EIO;
    case Code::kFileTooBig: return EFBIG;
    case Code::kBadHandle: return EBADF;
    case Code::kTooManyOpen: return EMFILE;
    case Code::kCancelled: return EIO;
  }
  return EIO;
}

Status create_error_for_open(const Status& st, int open_flags) {
  if (st.code() != Code::kExists || (open_flags & O_EXCL) != 0) {
    return st;
  }
  return Status(Code::kStale, st.message() + " (another client created it after this mount's lookup; "
                                             "the kernel looks the name up again and opens it)");
}

}  // namespace penstock::fuse
