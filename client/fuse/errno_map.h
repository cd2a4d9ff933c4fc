// The code table from Status codes to errno values: the only place in the tree that turns a
// penstock::Code into an errno (fuse_ops.cc's reply_status() uses it and sends the reply).
// Thread-safety: pure.
#pragma once

#include "common/base/status.h"

namespace penstock::fuse {

// The errno the kernel gets for `code`; 0 for kOk. Codes without a POSIX twin (kUnavailable,
// kProtocol, kInternal, kCancelled, unknown numbers) give EIO.
int errno_of(Code code);

}  // namespace penstock::fuse
