// Value types shared by several services: inode attributes, file layouts, the cluster map.
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/ids.h"
#include "common/proto/codec.h"

namespace penstock::proto {

// The S_IFMT part of a mode says the type; these are the Linux values so mode travels unchanged.
enum class FileType : uint8_t { kRegular = 1, kDirectory = 2, kSymlink = 3, kFifo = 4, kCharDev = 5, kBlockDev = 6, kSocket = 7 };
template <> struct EnumLimit<FileType> { static constexpr uint64_t kMax = 7; };

// How a file's bytes are spread: chunk k lives on chains[(k + seed) % chains.size()].
// Directories carry a layout too: its chunk_size and stripe_count are what new files inherit
// (their chain list is empty; chains are picked when a file is created).
struct Layout {
  uint32_t chunk_size = 4u << 20;  // bytes, power of two, 64 KiB .. 64 MiB
  uint32_t stripe_count = 0;       // 0 in a directory layout: "all chains"
  uint32_t seed = 0;
  std::vector<ChainId> chains;     // files only: the chains chosen at create time
  PENSTOCK_FIELDS(chunk_size, stripe_count, seed, chains);
};

// Timestamps are nanoseconds since the Unix epoch.
struct InodeAttr {
  InodeId ino;
  uint32_t mode = 0;  // type bits (S_IFMT) and permission bits, as in struct stat
  uint32_t nlink = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t rdev = 0;
  uint64_t size = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t generation = 0;    // bumped on every data-changing event seen by the meta server
  Layout layout;
  PENSTOCK_FIELDS(ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, ctime_ns, generation, layout);
};

// Who is asking: the FUSE caller's credentials, used for ownership of new inodes.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  PENSTOCK_FIELDS(uid, gid);
};

struct TargetInfo {
  TargetId id;
  NodeId node;
  std::string path;            // directory on the data server's host
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
  bool online = false;
  PENSTOCK_FIELDS(id, node, path, capacity_bytes, free_bytes, online);
};

struct NodeInfo {
  NodeId id;
  std::string address;  // host:port of the data server's RPC listener
  bool online = false;
  int64_t last_heartbeat_ns = 0;
  PENSTOCK_FIELDS(id, address, online, last_heartbeat_ns);
};

// What one RPC method of a server handled since the server started (`penstock stats`): calls
// (over TCP and RDMA), of them those answered with an error, and the time its handler ran, from
// decoding the request to encoding the response, in microseconds (queueing not included).
struct MethodStats {
  std::string name;  // the method's name in common/proto/*_service.h
  uint64_t calls = 0;
  uint64_t errors = 0;
  uint64_t busy_us = 0;
  PENSTOCK_FIELDS(name, calls, errors, busy_us);
};

struct ChainInfo {
  ChainId id;
  std::vector<TargetId> targets;  // head first; v0 has one target per chain
  PENSTOCK_FIELDS(id, targets);
};

// The cluster map: every data server, target and chain, with a version that changes whenever any
// part of the map does (registration, address change, online/offline).
struct ClusterMap {
  uint64_t version = 0;
  std::vector<NodeInfo> nodes;
  std::vector<TargetInfo> targets;
  std::vector<ChainInfo> chains;
  PENSTOCK_FIELDS(version, nodes, targets, chains);
};

}  // namespace penstock::proto
