// Target: one directory on a local file system where a data server keeps chunks (see
// docs/chunk-format.md for the directory layout). Owns the directory's identity (target.uuid,
// written durably on first use; filesystem.id, the file system it belongs to, stamped at its first
// registration) and the path scheme; the chunk bytes are the ChunkStore's job.
// Thread-safety: every method may be called from any thread (only the file-system id changes
// after open(), under its own lock).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/ids.h"
#include "common/base/result.h"

namespace penstock::data {

class Target {
 public:
  // Number of bucket directories under chunks/ (an inode's chunks live in bucket ino % 256).
  static constexpr uint32_t kBuckets = 256;
  // The directory layout this build writes (the file `layout` of the target). 1: every chunk in
  // its inode's directory; 2: chunk 0 directly in the bucket, chunks 1 and up in the inode's
  // directory (docs/chunk-format.md).
  static constexpr uint32_t kLayoutVersion = 2;

  // Opens the target at `dir`, creating the directory, chunks/ and its buckets, target.uuid and
  // `layout` on first use; a target of layout 1 is moved to layout 2 first (each chunk 0 renamed
  // into its bucket; restartable: a crash midway is finished by the next open). kInvalid /
  // kPermission / kIo (from daemon::ensure_directory) naming the path when it is not a writable
  // directory; kCorrupt when target.uuid holds something other than a uuid or `layout` no layout
  // number; kInvalid when `layout` names a newer layout than this build knows.
  static Result<std::unique_ptr<Target>> open(const std::string& dir);

  const std::string& path() const { return path_; }
  const std::string& uuid() const { return uuid_; }

  // The id of the file system this target belongs to (filesystem.id); "" before its first
  // registration.
  std::string fs_id() const;
  // Makes the target belong to file system `id`: stamps filesystem.id durably when it has none;
  // ok when it already holds `id`. kInvalid, naming both ids, when it belongs to another file
  // system (nothing changes); kInvalid for an id that is not 32 lowercase hex digits; kIo.
  Status claim(const std::string& id);

  // Whether any bucket holds anything (a chunk, a leftover .tmp, an inode directory): reads the
  // buckets until the first entry. A bucket that cannot be read counts as holding something.
  bool has_chunks() const;

  struct Space {
    uint64_t capacity_bytes = 0;
    uint64_t free_bytes = 0;  // available to this (unprivileged) process
  };
  // statvfs of the file system holding the target. kIo on failure.
  Result<Space> space() const;

  // Chunk 0 of an inode is the file "<ino>.0" in its bucket: most files of a dataset are one chunk,
  // and a cold open of one then reads no directory of its own. Chunks 1 and up live in the inode's
  // directory "<ino>/" in the bucket, made with the first of them.
  std::string bucket_dir(InodeId ino) const;
  std::string inode_dir(InodeId ino) const;
  std::string chunk_path(InodeId ino, uint64_t chunk_index) const;
  // The directory that names chunk `chunk_index` (the bucket for chunk 0, else the inode's).
  std::string chunk_dir(InodeId ino, uint64_t chunk_index) const;

  // The chunk indices of `ino` present on this target, ascending. Missing inode: empty.
  // Names that are not a chunk index (e.g. "<index>.tmp" left by a crash) are skipped.
  Result<std::vector<uint64_t>> list_chunks(InodeId ino) const;

  // The inodes with anything in bucket `bucket` (< kBuckets): a chunk 0, a "<ino>.0.tmp" left by
  // a crash, or a directory "<ino>/". Those above `after`, ascending, at most `max`; *more says
  // whether others above the last one remain. Names that spell no inode of this bucket are
  // skipped. kInvalid for a bucket out of range, kIo naming the directory when it cannot be listed.
  Result<std::vector<InodeId>> list_inodes(uint32_t bucket, InodeId after, size_t max, bool* more) const;

 private:
  // The directory of bucket `bucket` (< kBuckets).
  std::string bucket_path(uint32_t bucket) const;

  Target(std::string path, std::string uuid, std::string fs_id)
      : path_(std::move(path)), uuid_(std::move(uuid)), fs_id_(std::move(fs_id)) {}

  std::string path_;
  std::string uuid_;
  mutable std::mutex fs_mu_;  // leaf lock; guards fs_id_
  std::string fs_id_;
};

}  // namespace penstock::data
