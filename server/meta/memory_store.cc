#include <mutex>

#include "server/meta/store.h"

namespace penstock::meta {

namespace {
// Entries copied per lock hold during a scan: the callback runs without the lock (it may call
// get()), and a huge prefix is walked in pages instead of copied whole.
constexpr size_t kScanPage = 256;
}  // namespace

Result<std::optional<std::string>> MemoryStore::get(std::string_view key) {
  std::shared_lock lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

Status MemoryStore::apply(const WriteBatch& batch) {
  std::unique_lock lock(mu_);
  for (const auto& op : batch.ops()) {
    if (op.is_delete) {
      data_.erase(op.key);
    } else {
      data_.insert_or_assign(op.key, op.value);
    }
  }
  return Status::ok();
}

Status MemoryStore::scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) {
  std::string from(seek < prefix ? prefix : seek);
  bool inclusive = true;
  std::vector<std::pair<std::string, std::string>> page;
  for (;;) {
    page.clear();
    {
      std::shared_lock lock(mu_);
      auto it = inclusive ? data_.lower_bound(from) : data_.upper_bound(from);
      for (; it != data_.end() && page.size() < kScanPage; ++it) {
        if (std::string_view(it->first).substr(0, prefix.size()) != prefix) break;
        page.emplace_back(it->first, it->second);
      }
    }
    for (const auto& [k, v] : page) {
      if (!fn(k, v)) return Status::ok();
    }
    if (page.size() < kScanPage) return Status::ok();
    from = page.back().first;
    inclusive = false;
  }
}

size_t MemoryStore::size() const {
  std::shared_lock lock(mu_);
  return data_.size();
}

}  // namespace penstock::meta
