// What both daemons share: blocking SIGINT/SIGTERM before any thread starts, waiting for one,
// turning a CLI11 parse into a clear exit, and the data/state directory checks.
// Thread-safety: call block_termination_signals() from main() before starting threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/result.h"

namespace penstock::daemon {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (threads created later inherit the mask)
// and ignores SIGPIPE, so that a peer closing a socket never kills the process.
void block_termination_signals();

// Waits until SIGINT or SIGTERM arrives; returns the signal's name for the log.
std::string wait_for_termination_signal();
// The same, but gives up after `timeout`: then empty.
std::string wait_for_termination_signal(std::chrono::milliseconds timeout);

// Raises the soft open-file limit to the hard one (each client connection and each cached chunk
// file is a descriptor) and returns the limit now in force (SIZE_MAX for unlimited).
size_t raise_open_file_limit();

// Creates `dir` (and parents) if missing and checks it is a writable directory.
// kInvalid / kPermission / kIo with the path and what to do.
Status ensure_directory(const std::string& dir);

// The space of the file system holding `path`. `free` is f_bavail, also for root: the blocks ext4
// keeps back need CAP_SYS_RESOURCE, which root in a container often lacks.
struct DiskSpace {
  uint64_t total = 0;                 // bytes of the file system
  uint64_t free = 0;                  // bytes this process may still write
  uint64_t free_inodes = UINT64_MAX;  // files it may still make (no limit where the file system counts none)
};
// kIo naming the path when statvfs fails.
Result<DiskSpace> disk_space(const std::string& path);

// Reads a one-line text file (e.g. a uuid); kNotFound when missing.
Result<std::string> read_small_file(const std::string& path);
// Writes a small file durably (write to .tmp, fsync, rename, fsync dir).
Status write_small_file_durably(const std::string& path, const std::string& contents);
// A new random 128-bit id as 32 lowercase hex digits.
std::string random_uuid();
// Whether `s` is such an id (32 lowercase hex digits).
bool is_uuid(const std::string& s);

}  // namespace penstock::daemon
