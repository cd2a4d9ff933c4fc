#include "client/lib/io_plan.h"

#include <algorithm>
#include <cstring>

#include "common/layout/layout.h"

namespace penstock::client {

Result<std::vector<ChunkIo>> plan_chunk_io(const proto::Layout& layout, uint64_t offset,
                                           uint64_t length) {
  PENSTOCK_RETURN_IF_ERROR(layout::validate_file_layout(layout));
  if (length > UINT64_MAX - offset) {
    return Status(Code::kFileTooBig, "range at offset " + std::to_string(offset) + " of " +
                                         std::to_string(length) + " bytes passes 2^64");
  }
  std::vector<ChunkIo> plan;
  for (const auto& piece : layout::split(offset, length, layout.chunk_size)) {
    ChunkIo io;
    io.chunk_index = piece.chunk_index;
    io.offset_in_chunk = piece.offset_in_chunk;
    io.length = piece.length;
    io.buf_offset = piece.file_offset - offset;
    io.chain = layout::chain_of(layout, piece.chunk_index);
    plan.push_back(io);
  }
  return plan;
}

uint64_t clip_to_eof(uint64_t offset, uint64_t length, uint64_t file_size) {
  if (offset >= file_size) return 0;
  return std::min(length, file_size - offset);
}

Status zero_fill_tail(std::span<uint8_t> piece, uint64_t received) {
  if (received > piece.size()) {
    return Status(Code::kProtocol, "data server returned " + std::to_string(received) +
                                       " bytes for a read of " + std::to_string(piece.size()));
  }
  std::memset(piece.data() + received, 0, piece.size() - received);
  return Status::ok();
}

std::vector<ChainId> distinct_chains(const proto::Layout& layout) {
  std::vector<ChainId> out;
  for (const auto& c : layout.chains) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

ClusterRoutes::ClusterRoutes(proto::ClusterMap map) : map_(std::move(map)) {
  for (size_t i = 0; i < map_.chains.size(); ++i) chain_index_[map_.chains[i].id] = i;
  for (size_t i = 0; i < map_.targets.size(); ++i) target_index_[map_.targets[i].id] = i;
  for (size_t i = 0; i < map_.nodes.size(); ++i) node_index_[map_.nodes[i].id] = i;
}

Result<const proto::ChainInfo*> ClusterRoutes::find_chain(ChainId chain) const {
  auto it = chain_index_.find(chain);
  if (it == chain_index_.end()) {
    return Status(Code::kNotFound, "chain " + chain.to_string() + " is not in cluster map version " +
                                       std::to_string(map_.version));
  }
  const proto::ChainInfo* info = &map_.chains[it->second];
  if (info->targets.empty()) {
    return Status(Code::kNotFound, "chain " + chain.to_string() + " has no targets in cluster map version " +
                                       std::to_string(map_.version));
  }
  return info;
}

Result<Route> ClusterRoutes::route_of_target(ChainId chain, TargetId target) const {
  auto t = target_index_.find(target);
  if (t == target_index_.end()) {
    return Status(Code::kNotFound, "target " + target.to_string() + " of chain " + chain.to_string() +
                                       " is not in cluster map version " + std::to_string(map_.version));
  }
  const proto::TargetInfo& tinfo = map_.targets[t->second];
  auto n = node_index_.find(tinfo.node);
  if (n == node_index_.end()) {
    return Status(Code::kNotFound, "node " + tinfo.node.to_string() + " of target " + target.to_string() +
                                       " is not in cluster map version " + std::to_string(map_.version));
  }
  Route r;
  r.chain = chain;
  r.target = target;
  r.node = tinfo.node;
  r.address = map_.nodes[n->second].address;
  return r;
}

Result<Route> ClusterRoutes::head(ChainId chain) const {
  PENSTOCK_ASSIGN_OR_RETURN(const proto::ChainInfo* info, find_chain(chain));
  return route_of_target(chain, info->targets.front());
}

Result<Route> ClusterRoutes::tail(ChainId chain) const {
  PENSTOCK_ASSIGN_OR_RETURN(const proto::ChainInfo* info, find_chain(chain));
  return route_of_target(chain, info->targets.back());
}

Result<std::vector<Route>> ClusterRoutes::all_targets(ChainId chain) const {
  PENSTOCK_ASSIGN_OR_RETURN(const proto::ChainInfo* info, find_chain(chain));
  std::vector<Route> out;
  for (TargetId t : info->targets) {
    PENSTOCK_ASSIGN_OR_RETURN(Route r, route_of_target(chain, t));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace penstock::client
