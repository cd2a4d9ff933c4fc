#include "server/data/chunk_service.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "common/layout/layout.h"

namespace penstock::data {
namespace {

Status no_bulk(std::span<const uint8_t> bulk, const char* method) {
  if (!bulk.empty()) {
    return Status(Code::kInvalid, std::string(method) + " carries no data, but the request had " +
                                      std::to_string(bulk.size()) + " bulk bytes");
  }
  return Status::ok();
}

Status check_key(const proto::data::ChunkKey& key, uint64_t offset, uint64_t length, const char* method) {
  if (!key.ino.valid()) return Status(Code::kInvalid, std::string(method) + ": inode 0 is not a file");
  Status st = layout::validate_chunk_size(key.chunk_size);
  if (!st.is_ok()) return st.with_context(method);
  if (offset + length > key.chunk_size) {
    return Status(Code::kInvalid, std::string(method) + " [" + std::to_string(offset) + ", +" +
                                      std::to_string(length) + ") does not fit a chunk of " +
                                      std::to_string(key.chunk_size) + " bytes");
  }
  return Status::ok();
}

using Counters = ChunkStore::Counters;

// Counts a request of the target under `op` (penstock stats), and its error when it failed.
void tally(ChunkStore& store, std::atomic<uint64_t> Counters::*op, const Status& st) {
  Counters& c = store.counters();
  (c.*op).fetch_add(1, std::memory_order_relaxed);
  if (st.is_ok()) return;
  c.errors.fetch_add(1, std::memory_order_relaxed);
  if (st.code() == Code::kCorrupt) c.corrupt.fetch_add(1, std::memory_order_relaxed);
  if (st.code() == Code::kNoSpace) c.no_space.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void ChunkService::set_served(std::unordered_map<TargetId, std::shared_ptr<ChunkStore>> served) {
  std::unique_lock<std::shared_mutex> g(mu_);
  served_ = std::move(served);
}

Result<std::shared_ptr<ChunkStore>> ChunkService::store_for(TargetId target) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = served_.find(target);
  if (it == served_.end()) {
    return Status(Code::kNotFound, "target " + target.to_string() + " is not served here");
  }
  return it->second;
}

Result<proto::data::WriteResp> ChunkService::write(const proto::data::WriteReq& req,
                                                   std::span<const uint8_t> bulk_in) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.key.target));
  auto written = [&]() -> Result<uint64_t> {
    if (bulk_in.empty()) return Status(Code::kInvalid, "Write carries no data bytes");
    PENSTOCK_RETURN_IF_ERROR(check_key(req.key, req.offset, bulk_in.size(), "Write"));
    return store->write(req.key.ino, req.key.chunk_index, req.key.chunk_size, req.offset, bulk_in);
  }();
  tally(*store, &Counters::writes, written.status());
  if (!written.has_value()) return written.error();
  store->counters().write_bytes.fetch_add(bulk_in.size(), std::memory_order_relaxed);
  return proto::data::WriteResp{*written};
}

Result<proto::data::ReadResp> ChunkService::read(const proto::data::ReadReq& req, std::span<const uint8_t> bulk_in,
                                                 ByteBuffer* bulk_out, std::optional<ChunkStore::UnreadRange>* unread) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.key.target));
  // One store call whichever way the bytes go: sent unread (the receiver verifies them) when the
  // transport can and the client asked, else read and verified into the reply.
  const bool unread_ok = unread != nullptr && req.verify_at_client;
  auto r = [&]() -> Result<ChunkStore::ReplyRead> {
    PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "Read"));
    PENSTOCK_RETURN_IF_ERROR(check_key(req.key, req.offset, req.length, "Read"));
    return store->read_for_reply(req.key.ino, req.key.chunk_index, req.key.chunk_size, req.offset, req.length,
                                 unread_ok, bulk_out, req.sequential);
  }();
  tally(*store, &Counters::reads, r.status());
  if (!r.has_value()) return r.error();
  Counters& c = store->counters();
  if (req.sequential) c.sequential_reads.fetch_add(1, std::memory_order_relaxed);
  if (r->unread.has_value()) {
    if (r->unread->length > 0) c.unread_reads.fetch_add(1, std::memory_order_relaxed);  // a hole sends nothing
    c.read_bytes.fetch_add(r->unread->length, std::memory_order_relaxed);
    proto::data::ReadResp resp{r->unread->length, std::move(r->unread->block_sums)};
    r->unread->block_sums.clear();
    *unread = std::move(r->unread);
    return resp;
  }
  c.read_bytes.fetch_add(r->length, std::memory_order_relaxed);
  return proto::data::ReadResp{r->length};
}

Status ChunkService::truncate(const proto::data::TruncateReq& req, std::span<const uint8_t> bulk_in) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.target));
  Status st = [&]() -> Status {
    PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "Truncate"));
    if (!req.ino.valid()) return Status(Code::kInvalid, "Truncate: inode 0 is not a file");
    PENSTOCK_RETURN_IF_ERROR(layout::validate_chunk_size(req.chunk_size).with_context("Truncate"));
    return store->truncate(req.ino, req.size, req.chunk_size);
  }();
  tally(*store, &Counters::truncates, st);
  return st;
}

Status ChunkService::remove(const proto::data::RemoveReq& req, std::span<const uint8_t> bulk_in) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.target));
  Status st = [&]() -> Status {
    PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "Remove"));
    if (!req.ino.valid()) return Status(Code::kInvalid, "Remove: inode 0 is not a file");
    return store->remove(req.ino);
  }();
  tally(*store, &Counters::removes, st);
  return st;
}

Status ChunkService::sync(const proto::data::SyncReq& req, std::span<const uint8_t> bulk_in) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.target));
  Status st = [&]() -> Status {
    PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "Sync"));
    if (!req.ino.valid()) return Status(Code::kInvalid, "Sync: inode 0 is not a file");
    return store->sync(req.ino);
  }();
  tally(*store, &Counters::syncs, st);
  return st;
}

Result<proto::data::DropCachesResp> ChunkService::drop_caches(const proto::data::DropCachesReq& req,
                                                             std::span<const uint8_t> bulk_in) {
  PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "DropCaches"));
  std::vector<std::pair<TargetId, std::shared_ptr<ChunkStore>>> stores;
  if (req.targets.empty()) {
    std::shared_lock<std::shared_mutex> g(mu_);
    for (const auto& [id, store] : served_) stores.emplace_back(id, store);
  } else {
    for (TargetId t : req.targets) {
      PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(t));
      stores.emplace_back(t, std::move(store));
    }
  }
  proto::data::DropCachesResp resp;
  for (auto& [id, store] : stores) {
    auto dropped = store->drop_caches();
    if (!dropped.has_value()) return dropped.error().with_context("DropCaches of target " + id.to_string());
    ++resp.targets;
    resp.files += dropped->files;
    resp.fds_closed += dropped->fds_closed;
  }
  return resp;
}

Result<proto::data::StatsResp> ChunkService::stats(std::span<const uint8_t> bulk_in) const {
  PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "Stats"));
  proto::data::StatsResp resp;
  std::shared_lock<std::shared_mutex> g(mu_);
  for (const auto& [id, store] : served_) resp.targets.push_back(proto::data::TargetStats{id, store->counters_now()});
  std::sort(resp.targets.begin(), resp.targets.end(),
            [](const auto& a, const auto& b) { return a.target.value < b.target.value; });
  return resp;
}

static_assert(proto::data::kListBuckets == Target::kBuckets, "ListInodes pages through the target's buckets");

Result<proto::data::ListInodesResp> ChunkService::list_inodes(const proto::data::ListInodesReq& req,
                                                             std::span<const uint8_t> bulk_in) {
  PENSTOCK_ASSIGN_OR_RETURN(auto store, store_for(req.target));
  PENSTOCK_RETURN_IF_ERROR(no_bulk(bulk_in, "ListInodes"));
  const uint32_t max =
      req.max == 0 || req.max > proto::data::kMaxListInodes ? proto::data::kMaxListInodes : req.max;
  proto::data::ListInodesResp resp;
  PENSTOCK_ASSIGN_OR_RETURN(resp.inodes, store->target().list_inodes(req.bucket, req.after, max, &resp.more));
  return resp;
}

}  // namespace penstock::data
