#include "server/meta/dir_leases.h"

#include <algorithm>

namespace penstock::meta {

// The guard covers what earlier runs may have granted (restart_guard_ns, from the database), not this
// run's own term: a new database does not wait.
DirLeases::DirLeases(DirLeaseOptions options)
    : options_(std::move(options)),
      restart_guard_until_(options_.restart_guard_ns > 0 ? options_.clock() + options_.restart_guard_ns : 0) {}

size_t DirLeases::size() const {
  std::lock_guard lock(mu_);
  return dirs_.size();
}

int64_t DirLeases::check_locked(Dir& d, SessionId session, int64_t now) {
  if (d.holder == 0) return 0;
  if (session.valid() && d.holder == session.value) {
    // Another session is waiting and the term is over: the holder's own operations go on without
    // the hold, so that its changes in progress cannot keep the others waiting.
    if (now < d.contended_until && now >= d.expiry + options_.grace_ns && d.changers.empty()) d.holder = 0;
    return 0;
  }
  d.contended_until = now + options_.contended_ns;
  const int64_t free_at = d.expiry + options_.grace_ns;
  if (now < free_at) return free_at - now;
  // A batch of the holder's creates being applied finishes first (changes while a hold exists are
  // the holder's own: a grant waits for every other session's change to end).
  if (!d.changers.empty()) return 1'000'000;
  d.holder = 0;  // its term and grace are over: the holder stopped using it
  return 0;
}

int64_t DirLeases::check(InodeId dir, SessionId session) {
  const int64_t now = options_.clock();
  if (restart_guard_until_ != 0 && now < restart_guard_until_ + options_.grace_ns) {
    return restart_guard_until_ + options_.grace_ns - now;
  }
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end()) return 0;
  return check_locked(it->second, session, now);
}

DirLeases::Change::Change(DirLeases& leases, InodeId dir, SessionId session)
    : leases_(leases), dir_(dir), session_(session.value) {
  const int64_t now = leases.options_.clock();
  if (leases.restart_guard_until_ != 0 && now < leases.restart_guard_until_ + leases.options_.grace_ns) {
    wait_ns_ = leases.restart_guard_until_ + leases.options_.grace_ns - now;
    return;
  }
  std::lock_guard lock(leases.mu_);
  auto it = leases.dirs_.find(dir.value);
  if (it == leases.dirs_.end()) {
    // A record only while something needs it: a change without any hold in sight is counted, so a
    // grant cannot start during it; sweep() drops the record afterwards. (Over max_dirs, a sweep
    // first: what stays are holds and changes in progress, both bounded.)
    if (leases.dirs_.size() >= leases.options_.max_dirs) leases.sweep_locked(now);
    it = leases.dirs_.emplace(dir.value, Dir{}).first;
  }
  wait_ns_ = leases.check_locked(it->second, session, now);
  if (wait_ns_ == 0) it->second.changers.push_back(session_);
}

DirLeases::Change::~Change() {
  if (wait_ns_ != 0) return;
  std::lock_guard lock(leases_.mu_);
  auto it = leases_.dirs_.find(dir_.value);
  if (it == leases_.dirs_.end()) return;  // unreachable: a record with changes is never swept
  std::vector<uint64_t>& c = it->second.changers;
  c.erase(std::find(c.begin(), c.end(), session_));
}

DirLeases::Grant DirLeases::grant(InodeId dir, SessionId session, bool have_names) {
  Grant g;
  if (options_.term_ns <= 0 || !session.valid()) return g;
  const int64_t now = options_.clock();
  if (restart_guard_until_ != 0 && now < restart_guard_until_ + options_.grace_ns) return g;
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end()) {
    if (dirs_.size() >= options_.max_dirs) sweep_locked(now);
    if (dirs_.size() >= options_.max_dirs) return g;
    it = dirs_.emplace(dir.value, Dir{}).first;
  }
  Dir& d = it->second;
  const bool renewal = d.holder == session.value && have_names;
  if (!renewal) {
    if (changed_by_other(d, session.value) || now < d.contended_until) return g;
    if (d.holder != 0 && d.holder != session.value && now < d.expiry + options_.grace_ns) return g;
  } else if (now < d.contended_until) {
    return g;  // another session is waiting for this hold to end
  }
  d.holder = session.value;
  d.expiry = now + options_.term_ns;
  g.lease_ns = options_.term_ns;
  g.fresh = !renewal;
  return g;
}

bool DirLeases::confirm(InodeId dir, SessionId session) {
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  return it != dirs_.end() && it->second.holder == session.value;
}

bool DirLeases::holds(InodeId dir, SessionId session) {
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  return it != dirs_.end() && session.valid() && it->second.holder == session.value;
}

int64_t DirLeases::renew(InodeId dir, SessionId session) {
  const int64_t now = options_.clock();
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end() || !session.valid() || it->second.holder != session.value) return 0;
  Dir& d = it->second;
  if (now < d.contended_until) return 0;
  d.expiry = now + options_.term_ns;
  return options_.term_ns;
}

void DirLeases::release(InodeId dir, SessionId session) {
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it != dirs_.end() && it->second.holder == session.value) it->second.holder = 0;
}

size_t DirLeases::inodes_held(SessionId session) {
  std::lock_guard lock(mu_);
  auto it = inodes_.find(session.value);
  return it == inodes_.end() ? 0 : it->second.size();
}

void DirLeases::give_inodes(SessionId session, const std::vector<InodeId>& inos) {
  std::lock_guard lock(mu_);
  auto& set = inodes_[session.value];
  for (InodeId ino : inos) set.insert(ino.value);
}

std::vector<InodeId> DirLeases::inodes_of(SessionId session) {
  std::lock_guard lock(mu_);
  std::vector<InodeId> out;
  auto it = inodes_.find(session.value);
  if (it == inodes_.end()) return out;
  out.reserve(it->second.size());
  for (uint64_t ino : it->second) out.emplace_back(ino);
  return out;
}

bool DirLeases::take_inode(SessionId session, InodeId ino) {
  std::lock_guard lock(mu_);
  auto it = inodes_.find(session.value);
  return it != inodes_.end() && it->second.erase(ino.value) == 1;
}

void DirLeases::drop_session(SessionId session) {
  std::lock_guard lock(mu_);
  inodes_.erase(session.value);
  for (auto& [dir, d] : dirs_) {
    if (d.holder == session.value) d.holder = 0;
  }
}

void DirLeases::sweep_locked(int64_t now) {
  std::erase_if(dirs_, [&](const auto& kv) {
    const Dir& d = kv.second;
    const bool hold_over = d.holder == 0 || now >= d.expiry + options_.grace_ns + options_.contended_ns;
    return d.changers.empty() && hold_over && now >= d.contended_until;
  });
}

void DirLeases::sweep() {
  const int64_t now = options_.clock();
  std::lock_guard lock(mu_);
  sweep_locked(now);
}

}  // namespace penstock::meta
