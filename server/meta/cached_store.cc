#include "server/meta/cached_store.h"

#include <algorithm>

namespace penstock::meta {

namespace {
// Shards: enough that the meta server's worker threads rarely meet on one mutex.
constexpr size_t kShards = 16;
// What an entry costs beyond its key and value bytes: the list node (two pointers, two strings'
// headers, the optional's flag: ~96), the index node and its bucket (~56), allocator slack.
constexpr size_t kEntryOverhead = 192;
}  // namespace

CachedStore::CachedStore(Store* inner, CachedStoreOptions options)
    : inner_(inner), options_(std::move(options)), shard_capacity_(options_.capacity_bytes / kShards), shards_(kShards) {}

bool CachedStore::cacheable(std::string_view key) const {
  if (shard_capacity_ == 0) return false;
  return std::any_of(options_.prefixes.begin(), options_.prefixes.end(),
                     [key](const std::string& p) { return key.starts_with(p); });
}

CachedStore::Shard& CachedStore::shard_of(std::string_view key) {
  return shards_[StringHash{}(key) % shards_.size()];
}

size_t CachedStore::entry_bytes(const Entry& e) {
  return e.key.size() + (e.value.has_value() ? e.value->size() : 0) + kEntryOverhead;
}

void CachedStore::erase_locked(Shard& s, std::string_view key) {
  auto it = s.index.find(key);
  if (it == s.index.end()) return;
  auto node = it->second;
  s.bytes -= entry_bytes(*node);
  s.index.erase(it);
  s.lru.erase(node);
}

void CachedStore::insert_locked(Shard& s, std::string_view key, const std::optional<std::string>& value) {
  erase_locked(s, key);
  Entry e{std::string(key), value};
  const size_t size = entry_bytes(e);
  if (size > shard_capacity_) return;
  while (s.bytes + size > shard_capacity_ && !s.lru.empty()) erase_locked(s, s.lru.back().key);
  s.lru.push_front(std::move(e));
  s.index.emplace(s.lru.front().key, s.lru.begin());
  s.bytes += size;
}

Result<std::optional<std::string>> CachedStore::get(std::string_view key) {
  if (!cacheable(key)) return inner_->get(key);
  Shard& s = shard_of(key);
  uint64_t generation = 0;
  bool may_insert = false;
  {
    std::lock_guard lock(s.mu);
    if (auto it = s.index.find(key); it != s.index.end()) {
      s.lru.splice(s.lru.begin(), s.lru, it->second);
      hits_.fetch_add(1, std::memory_order_relaxed);
      return it->second->value;
    }
    may_insert = !s.in_flight.contains(key);
    generation = s.generation;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  auto r = inner_->get(key);
  if (!r.has_value() || !may_insert) return r;
  std::lock_guard lock(s.mu);
  // No write started or ended in this shard since the read began: what was read is current.
  if (s.generation == generation) insert_locked(s, key, *r);
  return r;
}

Status CachedStore::apply(const WriteBatch& batch) {
  std::vector<std::string_view> marked;
  for (const auto& op : batch.ops()) {
    if (!cacheable(op.key)) continue;
    Shard& s = shard_of(op.key);
    std::lock_guard lock(s.mu);
    erase_locked(s, op.key);
    ++s.in_flight[op.key];
    ++s.generation;
    marked.push_back(op.key);
  }
  Status st = inner_->apply(batch);
  for (std::string_view key : marked) {
    Shard& s = shard_of(key);
    std::lock_guard lock(s.mu);
    auto it = s.in_flight.find(key);
    if (--it->second == 0) s.in_flight.erase(it);
    ++s.generation;
  }
  return st;
}

uint64_t CachedStore::drop_caches() {
  uint64_t dropped = 0;
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    dropped += s.bytes;
    s.index.clear();
    s.lru.clear();
    s.bytes = 0;
  }
  return dropped + inner_->drop_caches();
}

size_t CachedStore::bytes() const {
  size_t total = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    total += s.bytes;
  }
  return total;
}

}  // namespace penstock::meta
