// The code table from Status codes to errno values: the only place in the tree that turns a
// penstock::Code into an errno (fuse_ops.cc's reply_status() uses it and sends the reply).
// Thread-safety: pure.
#pragma once

#include "common/base/status.h"

namespace penstock::fuse {

// The errno the kernel gets for `code`; 0 for kOk. Codes without a POSIX twin (kUnavailable,
// kProtocol, kInternal, kCancelled, unknown numbers) give EIO.
int errno_of(Code code);

// What a FUSE CREATE answers when the meta server refused its create with `st`, for an open() with
// `open_flags`. The kernel sends CREATE only after a LOOKUP found nothing; kExists then means
// another client made the name in between. With O_EXCL that is EEXIST; without it open() must open
// that file, so the answer is kStale: the kernel then walks the path once more (LOOKUP_REVAL),
// finds the file and opens it the ordinary way, with its permission check and O_TRUNC (both of
// which it skips for a CREATE that succeeds, so answering with the existing file would be wrong).
// Every other status is returned as it is.
Status create_error_for_open(const Status& st, int open_flags);

}  // namespace penstock::fuse
