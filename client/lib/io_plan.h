// Request planning for file data I/O: which chunk, chain and target gets which piece of a read or
// write, where the answers land in the caller's buffer, how holes and EOF are handled. Pure logic
// with no I/O, so that it is unit-tested without servers; Client (client.h) executes the plans.
// Thread-safety: free functions are pure; a ClusterRoutes is immutable after construction and may
// be shared between threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/result.h"
#include "common/proto/types.h"

namespace penstock::client {

// One chunk request of a file read or write.
struct ChunkIo {
  uint64_t chunk_index = 0;
  uint32_t offset_in_chunk = 0;
  uint32_t length = 0;
  uint64_t buf_offset = 0;  // where this piece starts in the caller's buffer
  ChainId chain;            // the chain that holds the chunk
};

// Splits [offset, offset + length) of a file with `layout` into chunk requests, in file order.
// Empty for length 0. kInvalid when the layout is not a valid file layout (names the problem).
Result<std::vector<ChunkIo>> plan_chunk_io(const proto::Layout& layout, uint64_t offset,
                                           uint64_t length);

// How many bytes of [offset, offset + length) lie before `file_size` (0 at or past EOF).
uint64_t clip_to_eof(uint64_t offset, uint64_t length, uint64_t file_size);

// A chunk read answered with `received` bytes for a piece of piece.size() bytes: the rest is a hole
// (or the chunk ends early) and reads as zeros. A value above piece.size() is a peer bug and gives
// kProtocol (the bytes could not have fit: the transport never writes past bulk_in).
Status zero_fill_tail(std::span<uint8_t> piece, uint64_t received);

// The distinct chains of a file layout, in layout order (for sync/truncate fan-out).
std::vector<ChainId> distinct_chains(const proto::Layout& layout);

// Where a request goes: a target of a chain and the address of the node serving it.
struct Route {
  ChainId chain;
  TargetId target;
  NodeId node;
  std::string address;  // host:port of the node's data service
};

// Resolves chains and targets through one version of the cluster map.
class ClusterRoutes {
 public:
  ClusterRoutes() = default;
  explicit ClusterRoutes(proto::ClusterMap map);

  // The head target of `chain` (writes enter there). kNotFound when the chain, its target or the
  // target's node is not in the map (the caller refreshes the map once and retries).
  Result<Route> head(ChainId chain) const;
  // The tail target of `chain` (it holds only committed bytes: reads go there). Same errors.
  Result<Route> tail(ChainId chain) const;
  // Every target of `chain`, head first (Sync and Truncate go to all replicas). Same errors.
  Result<std::vector<Route>> all_targets(ChainId chain) const;

  uint64_t version() const { return map_.version; }
  const proto::ClusterMap& map() const { return map_; }

 private:
  Result<Route> route_of_target(ChainId chain, TargetId target) const;
  Result<const proto::ChainInfo*> find_chain(ChainId chain) const;

  proto::ClusterMap map_;
  std::unordered_map<ChainId, size_t> chain_index_;
  std::unordered_map<TargetId, size_t> target_index_;
  std::unordered_map<NodeId, size_t> node_index_;
};

}  // namespace penstock::client
