// The key schema and record formats of penstock-meta's Store (specified in docs/meta-store.md;
// change both together). Keys are a short ASCII prefix ending in '/', then big-endian fixed-width
// ids (so bytewise key order is numeric order), then names. Values are one format byte (1) followed
// by the record in the wire codec (common/proto/codec.h: little-endian, length-prefixed strings).
// Owned by server/meta. Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/ids.h"
#include "common/base/result.h"
#include "common/proto/codec.h"
#include "common/proto/types.h"

namespace penstock::meta::schema {

inline constexpr uint8_t kRecordFormat = 1;

// ---- key prefixes ----
inline constexpr std::string_view kCounterPrefix = "c/";
inline constexpr std::string_view kInodePrefix = "i/";
inline constexpr std::string_view kDentryPrefix = "d/";
inline constexpr std::string_view kXattrPrefix = "x/";
inline constexpr std::string_view kSessionPrefix = "s/";
inline constexpr std::string_view kOpenPrefix = "o/";         // by session, then inode
inline constexpr std::string_view kOpenByInodePrefix = "p/";  // by inode, then session
inline constexpr std::string_view kOrphanPrefix = "r/";
inline constexpr std::string_view kGcPrefix = "g/";
inline constexpr std::string_view kNodePrefix = "n/";
inline constexpr std::string_view kNodeUuidPrefix = "nu/";
inline constexpr std::string_view kTargetPrefix = "t/";
inline constexpr std::string_view kTargetUuidPrefix = "tu/";
inline constexpr std::string_view kChainPrefix = "h/";
inline constexpr std::string_view kGrantPrefix = "u/";  // unused inode numbers given to a session
inline constexpr std::string_view kReplyPrefix = "y/";  // by session, then reply slot (ReplyRecord)

// ---- counters (value: u64 record) ----
inline constexpr std::string_view kNextInode = "c/next_ino";  // end of the persisted allocation batch
inline constexpr std::string_view kNextSession = "c/next_session";
inline constexpr std::string_view kNextNode = "c/next_node";
inline constexpr std::string_view kNextTarget = "c/next_target";
inline constexpr std::string_view kMapVersion = "c/map_version";
inline constexpr std::string_view kUsedInodes = "c/used_inodes";
// The longest directory-entry lease term this database was served with (restart guard).
inline constexpr std::string_view kLeaseTerm = "c/lease_term_ns";
// The longest directory lease term (creates behind) this database was served with (restart guard).
inline constexpr std::string_view kDirLeaseTerm = "c/dir_lease_term_ns";
// The file system's id (FileSystemRecord), made on first start: data servers stamp it into their
// targets and are refused with a target of another file system.
inline constexpr std::string_view kFileSystemId = "c/fs_id";

inline void append_be64(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>((v >> shift) & 0xff));
}
// REQUIRES: s.size() >= 8.
inline uint64_t read_be64(std::string_view s) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}

inline std::string key1(std::string_view prefix, uint64_t id) {
  std::string k(prefix);
  append_be64(&k, id);
  return k;
}
inline std::string key2(std::string_view prefix, uint64_t a, uint64_t b) {
  std::string k = key1(prefix, a);
  append_be64(&k, b);
  return k;
}
inline std::string key_name(std::string_view prefix, uint64_t id, std::string_view name) {
  std::string k = key1(prefix, id);
  k.append(name);
  return k;
}

inline std::string inode_key(InodeId ino) { return key1(kInodePrefix, ino.value); }
inline std::string dentry_prefix(InodeId parent) { return key1(kDentryPrefix, parent.value); }
inline std::string dentry_key(InodeId parent, std::string_view name) { return key_name(kDentryPrefix, parent.value, name); }
inline std::string xattr_prefix(InodeId ino) { return key1(kXattrPrefix, ino.value); }
inline std::string xattr_key(InodeId ino, std::string_view name) { return key_name(kXattrPrefix, ino.value, name); }
inline std::string session_key(SessionId s) { return key1(kSessionPrefix, s.value); }
inline std::string open_prefix(SessionId s) { return key1(kOpenPrefix, s.value); }
inline std::string open_key(SessionId s, InodeId ino) { return key2(kOpenPrefix, s.value, ino.value); }
inline std::string open_by_inode_prefix(InodeId ino) { return key1(kOpenByInodePrefix, ino.value); }
inline std::string open_by_inode_key(InodeId ino, SessionId s) { return key2(kOpenByInodePrefix, ino.value, s.value); }
inline std::string orphan_key(InodeId ino) { return key1(kOrphanPrefix, ino.value); }
inline std::string gc_key(InodeId ino) { return key1(kGcPrefix, ino.value); }
inline std::string node_key(NodeId n) { return key1(kNodePrefix, n.value); }
inline std::string node_uuid_key(std::string_view uuid) { return std::string(kNodeUuidPrefix) + std::string(uuid); }
inline std::string target_key(TargetId t) { return key1(kTargetPrefix, t.value); }
inline std::string target_uuid_key(std::string_view uuid) { return std::string(kTargetUuidPrefix) + std::string(uuid); }
inline std::string chain_key(ChainId c) { return key1(kChainPrefix, c.value); }
inline std::string grant_prefix(SessionId s) { return key1(kGrantPrefix, s.value); }
inline std::string grant_key(SessionId s, InodeId ino) { return key2(kGrantPrefix, s.value, ino.value); }
inline std::string reply_prefix(SessionId s) { return key1(kReplyPrefix, s.value); }
inline std::string reply_key(SessionId s, uint32_t slot) { return key2(kReplyPrefix, s.value, slot); }

// ---- records ----

struct U64Record {
  uint64_t value = 0;
  PENSTOCK_FIELDS(value);
};

// c/fs_id: 32 lowercase hex digits, random, made once.
struct FileSystemRecord {
  std::string id;
  PENSTOCK_FIELDS(id);
};

// An inode. `parent` is kept for directories only (a directory has exactly one parent; rename
// needs it to refuse moving a directory into its own subtree). Symlinks keep their target here.
struct InodeRecord {
  proto::InodeAttr attr;
  InodeId parent;
  std::string symlink_target;
  PENSTOCK_FIELDS(attr, parent, symlink_target);
};

// A directory entry: the child inode and its type bits (S_IFMT part of the mode only, which never
// changes, so chmod does not have to touch dentries).
struct DentryRecord {
  InodeId ino;
  uint32_t type = 0;
  PENSTOCK_FIELDS(ino, type);
};

struct SessionRecord {
  std::string client_name;
  std::string hostname;
  int64_t registered_ns = 0;
  PENSTOCK_FIELDS(client_name, hostname, registered_ns);
};

// How many times one session has one inode open.
struct OpenRecord {
  uint32_t count = 0;
  PENSTOCK_FIELDS(count);
};

// The reply to a session's last change in one reply slot (proto::meta::ReplayReq), written in the
// change's own batch. `request_hash`: XXH3 of the change's encoded request (a repeat must carry
// the same request); `message`: the encoded response.
struct ReplyRecord {
  uint64_t seq = 0;
  uint16_t method = 0;
  std::string message;
  uint64_t request_hash = 0;
  PENSTOCK_FIELDS(seq, method, message, request_hash);
};

// An inode whose last link and last open are gone: its chunks must be removed from every target
// of its layout's chains. The inode record itself is deleted when the entry is queued (its
// attributes, layout included, live on here).
struct GcRecord {
  proto::InodeAttr attr;
  int64_t queued_ns = 0;
  PENSTOCK_FIELDS(attr, queued_ns);
};

struct NodeRecord {
  NodeId id;
  std::string uuid;
  std::string address;
  PENSTOCK_FIELDS(id, uuid, address);
};

struct TargetRecord {
  TargetId id;
  NodeId node;
  std::string uuid;
  std::string path;
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
  PENSTOCK_FIELDS(id, node, uuid, path, capacity_bytes, free_bytes);
};

// Chains are stored as proto::ChainInfo.

template <class T>
std::string encode_record(const T& rec) {
  std::string out(1, static_cast<char>(kRecordFormat));
  proto::Encoder(&out).put(rec);
  return out;
}

// kCorrupt naming `key` when the bytes are not a record of this format.
template <class T>
Result<T> decode_record(std::string_view bytes, std::string_view key) {
  if (bytes.empty() || static_cast<uint8_t>(bytes[0]) != kRecordFormat) {
    return Status(Code::kCorrupt, "metadata record under key '" + std::string(key) + "' has an unknown format");
  }
  auto r = proto::decode<T>(proto::bytes_of(bytes).subspan(1));
  if (!r.has_value()) {
    return Status(Code::kCorrupt, "metadata record under key '" + std::string(key) + "' is damaged: " + r.error().message());
  }
  return std::move(r).value();
}

}  // namespace penstock::meta::schema
