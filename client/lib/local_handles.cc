#include "client/lib/local_handles.h"

#include "common/base/status.h"

namespace penstock::client {

void LocalHandles::begin(InodeId ino, Kind kind) {
  Shard& s = shard(ino);
  std::lock_guard<std::mutex> lock(s.mu);
  Counts& c = s.open[ino];
  if (kind == Kind::kWriter) {
    ++s.epoch;
    ++c.writers;
  } else {
    ++c.readers;
  }
}

void LocalHandles::end(InodeId ino, Kind kind) {
  Shard& s = shard(ino);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.open.find(ino);
  PENSTOCK_CHECK(it != s.open.end());  // an end() without its begin()
  Counts& c = it->second;
  if (kind == Kind::kWriter) {
    PENSTOCK_CHECK(c.writers > 0);
    ++s.epoch;
    --c.writers;
  } else {
    PENSTOCK_CHECK(c.readers > 0);
    --c.readers;
  }
  if (c.readers == 0 && c.writers == 0) s.open.erase(it);
}

uint64_t LocalHandles::epoch(InodeId ino) const {
  const Shard& s = shard(ino);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.epoch;
}

bool LocalHandles::run_if_quiet(InodeId ino, uint64_t epoch, const std::function<void()>& fill) {
  Shard& s = shard(ino);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.epoch != epoch || s.open.count(ino) != 0) return false;
  fill();
  return true;
}

int LocalHandles::open_count(InodeId ino) const {
  const Shard& s = shard(ino);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.open.find(ino);
  return it == s.open.end() ? 0 : it->second.readers + it->second.writers;
}

}  // namespace penstock::client
