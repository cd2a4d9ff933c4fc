#include "server/meta/open_table.h"

#include <cstdint>

#include "server/meta/schema.h"

namespace penstock::meta {

namespace {
constexpr int64_t kDueNow = INT64_MIN;  // a changed_ time: write at the next flush_aged
}  // namespace

uint32_t OpenTable::add(SessionId session, InodeId ino, int64_t now_ns, uint32_t n) {
  if (n == 0) return count(session, ino);
  const Key k{session.value, ino.value};
  Entry& e = entry(k);
  e.count = n > UINT32_MAX - e.count ? UINT32_MAX : e.count + n;  // saturates: never wraps to "closed"
  touch(k, e, now_ns);
  return e.count;
}

size_t OpenTable::size() const {
  size_t held = 0;
  for (const auto& [k, e] : entries_) held += e.count > 0 ? 1 : 0;
  return held;
}

OpenTable::Entry& OpenTable::entry(const Key& k) {
  auto [it, fresh] = entries_.try_emplace(k);
  if (fresh) {
    by_inode_[k.ino].insert(k.session);
    by_session_[k.session].insert(k.ino);
  }
  return it->second;
}

uint32_t OpenTable::count(SessionId session, InodeId ino) const {
  auto it = entries_.find(Key{session.value, ino.value});
  return it == entries_.end() ? 0 : it->second.count;
}

uint32_t OpenTable::drop(SessionId session, InodeId ino, uint32_t times, int64_t now_ns) {
  const Key k{session.value, ino.value};
  auto it = entries_.find(k);
  if (it == entries_.end() || it->second.count == 0) return 0;
  Entry& e = it->second;
  e.count = times >= e.count ? 0 : e.count - times;
  if (e.count == 0 && e.stored == 0) {
    erase(k);  // never reached the store: nothing to write
    return 0;
  }
  touch(k, e, now_ns);
  return e.count;
}

bool OpenTable::has_other(InodeId ino, SessionId except) const {
  auto it = by_inode_.find(ino.value);
  if (it == by_inode_.end()) return false;
  for (uint64_t s : it->second) {
    if (s == except.value) continue;
    auto e = entries_.find(Key{s, ino.value});
    if (e != entries_.end() && e->second.count > 0) return true;
  }
  return false;
}

std::vector<InodeId> OpenTable::inodes_of(SessionId session) const {
  std::vector<InodeId> out;
  auto it = by_session_.find(session.value);
  if (it == by_session_.end()) return out;
  for (uint64_t ino : it->second) {
    auto e = entries_.find(Key{session.value, ino});
    if (e != entries_.end() && e->second.count > 0) out.emplace_back(ino);
  }
  return out;
}

void OpenTable::drop_session(SessionId session, WriteBatch* batch) {
  auto it = by_session_.find(session.value);
  if (it == by_session_.end()) return;
  const std::vector<uint64_t> inos(it->second.begin(), it->second.end());
  for (uint64_t ino : inos) {
    const Key k{session.value, ino};
    auto e = entries_.find(k);
    if (e == entries_.end()) continue;
    e->second.count = 0;
    if (e->second.stored == 0) {
      erase(k);  // never stored: nothing to delete
    } else {
      write(k, e->second, batch);
    }
  }
}

void OpenTable::load(SessionId session, InodeId ino, uint32_t count) {
  if (count == 0) return;
  Entry& e = entry(Key{session.value, ino.value});
  e.count = count;
  e.stored = count;
}

void OpenTable::store_inode(InodeId ino, WriteBatch* batch) {
  auto it = by_inode_.find(ino.value);
  if (it == by_inode_.end()) return;
  const std::vector<uint64_t> sessions(it->second.begin(), it->second.end());
  for (uint64_t s : sessions) {
    const Key k{s, ino.value};
    auto e = entries_.find(k);
    if (e != entries_.end()) write(k, e->second, batch);
  }
}

bool OpenTable::flush_aged(int64_t now_ns, int64_t delay_ns, WriteBatch* batch) {
  bool wrote = false;
  while (!changed_.empty()) {
    const int64_t at = changed_.front().second;
    if (at != kDueNow && at <= now_ns && now_ns - at < delay_ns) break;
    const Key k = changed_.front().first;
    changed_.pop_front();
    auto e = entries_.find(k);
    if (e == entries_.end() || e->second.count == e->second.stored) continue;
    write(k, e->second, batch);
    wrote = true;
  }
  return wrote;
}

void OpenTable::touch(const Key& k, const Entry& e, int64_t now_ns) {
  if (e.count != e.stored) changed_.emplace_back(k, now_ns);
}

void OpenTable::write(const Key& k, const Entry& e, WriteBatch* batch) {
  if (e.count == e.stored) return;
  const SessionId session(k.session);
  const InodeId ino(k.ino);
  if (e.count == 0) {
    batch->del(schema::open_key(session, ino));
    batch->del(schema::open_by_inode_key(ino, session));
  } else {
    batch->put(schema::open_key(session, ino), schema::encode_record(schema::OpenRecord{e.count}));
    // The reverse key too, also when the store has it: a put of the same key costs nothing more.
    batch->put(schema::open_by_inode_key(ino, session), "");
  }
  written_.emplace_back(k, e.count);
}

void OpenTable::written_applied() {
  for (const auto& [k, count] : written_) {
    auto it = entries_.find(k);
    if (it == entries_.end()) continue;
    it->second.stored = count;
    if (it->second.count == 0 && it->second.stored == 0) erase(k);
  }
  written_.clear();
}

void OpenTable::written_dropped() {
  // Still differing from the store: due at the next flush_aged.
  for (const auto& [k, count] : written_) changed_.emplace_front(k, kDueNow);
  written_.clear();
}

void OpenTable::erase(const Key& k) {
  entries_.erase(k);
  if (auto it = by_inode_.find(k.ino); it != by_inode_.end()) {
    it->second.erase(k.session);
    if (it->second.empty()) by_inode_.erase(it);
  }
  if (auto it = by_session_.find(k.session); it != by_session_.end()) {
    it->second.erase(k.ino);
    if (it->second.empty()) by_session_.erase(it);
  }
}

}  // namespace penstock::meta
