#include "client/lib/dir_attr_cache.h"

#include <sys/stat.h>

namespace penstock::client {

DirAttrCache::Ticket DirAttrCache::ticket() const {
  std::lock_guard lock(mu_);
  return Ticket{generation_, Clock::now()};
}

void DirAttrCache::offer(const Ticket& t, const proto::InodeAttr& attr) {
  if (max_age_ <= Clock::duration::zero()) return;  // off: nothing would ever be served
  if (!S_ISDIR(attr.mode) || !attr.ino.valid()) return;
  std::lock_guard lock(mu_);
  if (t.generation != generation_) return;
  auto it = entries_.find(attr.ino.value);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (attr.ctime_ns < e.attr.ctime_ns) return;  // what we hold includes a later change
    if (attr.ctime_ns == e.attr.ctime_ns && t.sent < e.sent) return;  // same state, learned earlier
    e = Entry{attr, t.sent};
    return;
  }
  if (entries_.size() >= max_entries_) {
    const Clock::time_point now = Clock::now();
    std::erase_if(entries_, [&](const auto& e) { return now - e.second.sent >= max_age_; });
    if (entries_.size() >= max_entries_) entries_.clear();
  }
  entries_.emplace(attr.ino.value, Entry{attr, t.sent});
}

void DirAttrCache::invalidate(InodeId dir) {
  std::lock_guard lock(mu_);
  ++generation_;
  entries_.erase(dir.value);
}

void DirAttrCache::invalidate_all() {
  std::lock_guard lock(mu_);
  ++generation_;
  entries_.clear();
}

std::optional<DirAttrCache::Hit> DirAttrCache::get(InodeId dir) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(dir.value);
  if (it == entries_.end()) return std::nullopt;
  const Clock::duration left = max_age_ - (Clock::now() - it->second.sent);
  if (left <= Clock::duration::zero()) return std::nullopt;
  return Hit{it->second.attr, std::chrono::duration<double>(left).count()};
}

size_t DirAttrCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace penstock::client
