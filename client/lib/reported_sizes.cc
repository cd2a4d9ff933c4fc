#include "client/lib/reported_sizes.h"

#include <algorithm>

namespace penstock::client {

void ReportedSizes::note(const proto::InodeAttr& after, Clock::time_point now) {
  if (keep_ <= Clock::duration::zero() || max_entries_ == 0) return;
  drop_expired(now);
  entries_[after.ino] = Entry{after.generation, after.size, after.mtime_ns, now};
  order_.emplace_back(now, after.ino);
  while (entries_.size() > max_entries_ && !order_.empty()) drop_oldest();
}

void ReportedSizes::drop_expired(Clock::time_point now) {
  while (!order_.empty() && now - order_.front().first >= keep_) drop_oldest();
}

void ReportedSizes::drop_oldest() {
  auto [at, ino] = order_.front();
  order_.pop_front();
  auto it = entries_.find(ino);
  if (it != entries_.end() && it->second.at == at) entries_.erase(it);  // not a later report's
}

void ReportedSizes::merge(proto::InodeAttr* attr) const {
  if (entries_.empty()) return;
  auto it = entries_.find(attr->ino);
  if (it == entries_.end() || attr->generation >= it->second.generation) return;
  attr->size = std::max(attr->size, it->second.size);
  attr->mtime_ns = std::max(attr->mtime_ns, it->second.mtime_ns);
}

}  // namespace penstock::client
