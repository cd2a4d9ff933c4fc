// ChunkService: the data service's request handling without the network: validates each request
// of common/proto/data_service.h, finds the ChunkStore of the named TargetId and runs it. The RPC
// bindings (data_server.h) only move bytes between frames and these calls, so every rule here is
// unit-tested without sockets.
//
// Which TargetIds are served changes at runtime (the meta server assigns them at registration);
// until set_served() has been called every request is refused with kNotFound.
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/ids.h"
#include "common/base/result.h"
#include "common/proto/data_service.h"
#include "server/data/chunk_store.h"

namespace penstock::data {

class ChunkService {
 public:
  // Replaces the served set: requests naming these TargetIds go to these stores.
  void set_served(std::unordered_map<TargetId, std::shared_ptr<ChunkStore>> served);
  // The store serving `target`; kNotFound "target T is not served here".
  Result<std::shared_ptr<ChunkStore>> store_for(TargetId target) const;

  // Each call validates its request and returns kInvalid naming what is wrong: chunk_size not a
  // valid layout size, offset + length past chunk_size, a request bulk that does not match
  // (Write: the bulk is the data, at least one byte; others: no bulk at all), inode 0.
  // kNotFound for an unknown target; otherwise the ChunkStore's errors.
  Result<proto::data::WriteResp> write(const proto::data::WriteReq& req, std::span<const uint8_t> bulk_in);
  // On success `bulk_out` holds exactly resp.length bytes. With `unread` (a caller that can send a
  // file range) and req.verify_at_client, the store may leave the bytes unread instead: then
  // `*unread` says where they are, bulk_out stays empty and resp.block_sums is filled.
  Result<proto::data::ReadResp> read(const proto::data::ReadReq& req, std::span<const uint8_t> bulk_in,
                                     ByteBuffer* bulk_out, std::optional<ChunkStore::UnreadRange>* unread = nullptr);
  Status truncate(const proto::data::TruncateReq& req, std::span<const uint8_t> bulk_in);
  Status remove(const proto::data::RemoveReq& req, std::span<const uint8_t> bulk_in);
  Status sync(const proto::data::SyncReq& req, std::span<const uint8_t> bulk_in);
  // Drops the caches of the named targets (all served ones when none is named; none yet before
  // registration). kNotFound for a target not served here (nothing dropped then), kIo from a store.
  Result<proto::data::DropCachesResp> drop_caches(const proto::data::DropCachesReq& req,
                                                  std::span<const uint8_t> bulk_in);
  // The inodes with chunks in one bucket of a target (Target::list_inodes), at most
  // kMaxListInodes a page. kInvalid for a bucket out of range.
  Result<proto::data::ListInodesResp> list_inodes(const proto::data::ListInodesReq& req,
                                                  std::span<const uint8_t> bulk_in);

  // What every served target answered since its store opened (proto::data::Stats), by target
  // id: each request above counts in its target's ChunkStore::counters() once the target is found
  // (a request for a target not served here counts under no target), failed ones as errors too.
  // uptime_ms and methods are left for the caller, whose RPC server knows them.
  // kInvalid when the request carries bulk bytes.
  Result<proto::data::StatsResp> stats(std::span<const uint8_t> bulk_in) const;

 private:
  mutable std::shared_mutex mu_;  // guards served_
  std::unordered_map<TargetId, std::shared_ptr<ChunkStore>> served_;
};

}  // namespace penstock::data
