#include "client/lib/create_behind.h"

#include <sys/stat.h>

#include <algorithm>

#include "common/base/backoff.h"
#include "common/base/log.h"

namespace penstock::client {

namespace pm = proto::meta;

namespace {

int64_t realtime_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CreateBehind::CreateBehind(CreateBehindOptions options, Rpc rpc) : options_(options), rpc_(std::move(rpc)) {
  flusher_ = std::thread([this] { flush_loop(); });
}

CreateBehind::~CreateBehind() { stop(); }

void CreateBehind::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !flusher_.joinable()) return;
    stopping_ = true;
    for (auto& [k, d] : dirs_) d.held = false;
  }
  wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

CreateBehindStats CreateBehind::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

SessionId CreateBehind::session_locked() {
  const SessionId s = rpc_.session();
  if (s != pool_session_) {
    if (pool_session_.valid()) {
      PENSTOCK_LOG(Warn) << "session " << pool_session_.to_string() << " was replaced by " << s.to_string()
                         << ": its directory leases and inode numbers are given up";
    }
    pool_.clear();
    for (auto& [k, d] : dirs_) d.held = false;
    pool_session_ = s;
  }
  return s;
}

CreateBehind::Dir& CreateBehind::dir_locked(InodeId dir, Clock::time_point now) {
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end()) {
    if (dirs_.size() >= options_.max_dirs) {
      // Forget the directory used longest ago that has nothing queued and no live lease.
      auto victim = dirs_.end();
      for (auto j = dirs_.begin(); j != dirs_.end(); ++j) {
        if (!j->second.queued.empty() || j->second.asking > 0 || live_locked(j->second, now)) continue;
        if (victim == dirs_.end() || j->second.used < victim->second.used) victim = j;
      }
      if (victim != dirs_.end()) dirs_.erase(victim);
    }
    it = dirs_.emplace(dir.value, Dir{}).first;
  }
  it->second.used = now;
  return it->second;
}

void CreateBehind::extend_locked(Dir& d, int64_t lease_ns, Clock::time_point sent) {
  if (lease_ns <= 0) {
    // Not renewed: another mount is waiting for the directory. Stop answering here at once.
    d.held = false;
    d.refused_until = Clock::now() + options_.refused_backoff;
    return;
  }
  // From when the request left, less a quarter of the term: what is created here before then is
  // sent (within flush_interval) long before the server lets anyone else in (term plus grace).
  const auto trust = std::chrono::nanoseconds(lease_ns - lease_ns / 4);
  d.deadline = std::max(d.deadline, sent + std::chrono::duration_cast<Clock::duration>(trust));
}

void CreateBehind::apply_lease_locked(Dir& d, InodeId dir, const pm::DirLeaseResp& r, Clock::time_point sent) {
  for (InodeId ino : r.inos) pool_.push_back(ino);
  if (r.lease_ns <= 0) {
    d.held = false;
    d.refused_until = Clock::now() + options_.refused_backoff;
    return;
  }
  // A new hold lists every name. Names remembered from before stay too: a larger list only sends
  // more lookups to the server, and it keeps creates of ours not yet answered in it.
  for (const std::string& n : r.names) d.names.insert(n);
  d.attr = r.dir_attr;
  if (r.fresh) {
    stats_.leases += 1;
    PENSTOCK_LOG(Debug) << "directory " << dir.to_string() << " leased for creates behind (" << r.names.size()
                        << " names)";
  }
  d.held = true;
  extend_locked(d, r.lease_ns, sent);
}

bool CreateBehind::known_absent(InodeId dir, std::string_view name) {
  std::lock_guard lock(mu_);
  session_locked();  // a replaced session's holds are dropped
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end() || !live_locked(it->second, Clock::now())) return false;
  if (it->second.names.count(std::string(name)) != 0) return false;
  stats_.absent += 1;
  return true;
}

std::optional<proto::InodeAttr> CreateBehind::create(InodeId dir, std::string_view name, uint32_t mode,
                                                     const proto::Caller& caller) {
  std::unique_lock lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it == dirs_.end() || stopping_) return std::nullopt;
  Clock::time_point now = Clock::now();
  const SessionId session = session_locked();
  if (it->second.held && now >= it->second.deadline && now >= it->second.refused_until) {
    // The term ran out while nothing was created behind here: renew it (the server keeps the hold
    // while nobody else came; a fresh grant lists the names again).
    if (!ask_lease_locked(lock, dir, session, true)) return std::nullopt;
    now = Clock::now();
    it = dirs_.find(dir.value);
    if (it == dirs_.end()) return std::nullopt;
  }
  Dir& d = it->second;
  if (session_locked() != session || !live_locked(d, now)) return std::nullopt;
  if (d.names.size() >= options_.max_names) {
    // Remembering more names costs more memory than the round trips it saves: give the lease up
    // here (the server's hold runs out by itself).
    d.held = false;
    d.names.clear();
    d.refused_until = now + options_.refused_backoff;
    PENSTOCK_LOG(Info) << "directory " << dir.to_string() << " holds " << options_.max_names
                       << " names: creates there go to the server one by one again";
    return std::nullopt;
  }
  if (d.sync_creates || pool_.empty()) return std::nullopt;  // sync_creates: the lease answers lookups only
  std::string key(name);
  if (d.names.count(key) != 0) return std::nullopt;  // it may exist: the server decides
  if (!d.queued.empty() && d.queued_session != session) return std::nullopt;  // the old session's go first
  // take_layout() counts it against when it is written before it is sent.
  if (judge_locked(d, dir, false)) return std::nullopt;

  proto::InodeAttr a;
  a.ino = pool_.back();
  pool_.pop_back();
  a.mode = S_IFREG | (mode & 07777);
  a.nlink = 1;
  a.uid = caller.uid;
  a.gid = (d.attr.mode & S_ISGID) != 0 ? d.attr.gid : caller.gid;
  a.atime_ns = a.mtime_ns = a.ctime_ns = realtime_ns();
  a.generation = 1;
  a.layout.chunk_size = d.attr.layout.chunk_size;  // chains come with the server's answer
  d.names.insert(key);
  d.queued_session = session;
  d.queued.push_back(pm::CreateBehind{std::move(key), a.ino, mode & 07777, caller});
  d.used = now;
  queued_seq_ += 1;
  queued_now_ += 1;
  unanswered_.store(queued_seq_ - answered_seq_, std::memory_order_release);
  stats_.created += 1;
  const bool wake = queued_now_ == 1 || queued_now_ >= options_.max_batch;
  lock.unlock();
  if (wake) wake_.notify_one();
  return a;
}

void CreateBehind::created_sync(InodeId dir, std::string_view name, InodeId ino) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  Dir& d = dir_locked(dir, Clock::now());
  d.names.insert(std::string(name));
  if (d.held && !d.sync_creates) return;
  if (recent_.size() >= kRecentKept) recent_.clear();  // files left open: start counting again
  recent_[ino.value] = Recent{dir.value, false};
  recent_size_.store(recent_.size(), std::memory_order_relaxed);
}

void CreateBehind::written(InodeId ino) {
  if (recent_size_.load(std::memory_order_relaxed) == 0) return;  // most writes: no file is watched
  std::lock_guard lock(mu_);
  auto r = recent_.find(ino.value);
  if (r != recent_.end()) r->second.written = true;
}

void CreateBehind::closed(InodeId ino) {
  std::unique_lock lock(mu_);
  if (stopping_ || recent_.empty()) return;
  auto r = recent_.find(ino.value);
  if (r == recent_.end()) return;
  const InodeId dir(r->second.dir);
  const bool written = r->second.written;
  recent_.erase(r);
  recent_size_.store(recent_.size(), std::memory_order_relaxed);
  Clock::time_point now = Clock::now();
  {
    Dir& d = dir_locked(dir, now);
    if (d.held) {
      if (d.sync_creates) judge_locked(d, dir, !written);
      return;
    }
    if (now < d.refused_until) return;
    if (now - d.burst_start > options_.burst_window) {
      d.burst_start = now;
      d.burst = d.burst_written = 0;
    }
    d.burst_written += written ? 1 : 0;
    if (++d.burst < options_.creates_before_lease) return;
    d.sync_creates = 2 * d.burst_written >= d.burst;
    d.judged = d.against = 0;
    d.burst = d.burst_written = 0;
  }
  ask_lease_locked(lock, dir, session_locked(), false);
}

bool CreateBehind::judge_locked(Dir& d, InodeId dir, bool against) {
  if (d.judged >= kJudgeAfter) {
    const bool turn = 2 * d.against >= d.judged;
    PENSTOCK_LOG(Debug) << "directory " << dir.to_string() << ": " << d.against << " of " << d.judged
                        << (d.sync_creates ? " files created there were closed unwritten" : " files created behind were written at once")
                        << (!turn ? "" : d.sync_creates ? "; creates there are answered here again"
                                                        : "; creates there go to the server one by one, lookups are "
                                                          "still answered here");
    d.judged = d.against = 0;
    if (turn) {
      d.sync_creates = !d.sync_creates;
      stats_.turned += 1;
      return true;
    }
  }
  d.judged += 1;
  d.against += against ? 1 : 0;
  return false;
}

bool CreateBehind::ask_lease_locked(std::unique_lock<std::mutex>& lock, InodeId dir, SessionId session,
                                    bool have_names) {
  Dir& asker = dir_locked(dir, Clock::now());
  // A directory that creates synchronously uses no numbers.
  const uint32_t want = !asker.sync_creates && pool_.size() < options_.inode_refill / 2 ? options_.inode_refill : 0;
  asker.asking += 1;
  lock.unlock();
  const Clock::time_point sent = Clock::now();
  auto r = rpc_.lease(pm::DirLeaseReq{session, dir, have_names, want});
  lock.lock();
  const Clock::time_point now = Clock::now();
  Dir& d = dir_locked(dir, now);
  d.asking -= 1;
  if (stopping_ || session_locked() != session) return false;
  if (!r.has_value()) {
    d.held = false;
    d.refused_until = now + options_.refused_backoff;
    PENSTOCK_LOG(Info) << "asking penstock-meta for the lease of directory " << dir.to_string()
                       << " failed (creates there go to the server one by one): " << r.error().to_string();
    return false;
  }
  apply_lease_locked(d, dir, *r, sent);
  return true;
}

void CreateBehind::added(InodeId dir, std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it != dirs_.end()) it->second.names.insert(std::string(name));
}

void CreateBehind::removed(InodeId dir, std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = dirs_.find(dir.value);
  if (it != dirs_.end()) it->second.names.erase(std::string(name));
}

std::optional<proto::Layout> CreateBehind::take_layout(InodeId ino) {
  {
    std::lock_guard lock(mu_);
    for (auto& [k, d] : dirs_) {
      const bool queued = std::any_of(d.queued.begin(), d.queued.end(),
                                      [&](const pm::CreateBehind& e) { return e.ino == ino; });
      // Judged when it was created; counted only while the directory still creates behind and
      // the window has room (a turn or a new window since then leaves it out).
      if (queued) {
        if (!d.sync_creates && d.against < d.judged) d.against += 1;
        break;
      }
    }
  }
  barrier();
  std::lock_guard lock(mu_);
  auto it = layouts_.find(ino.value);
  if (it == layouts_.end()) return std::nullopt;
  proto::Layout l = std::move(it->second);
  layouts_.erase(it);  // its place in layout_order_ goes when it reaches the front
  return l;
}

bool CreateBehind::closed_before_sent(InodeId ino) {
  if (unanswered_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mu_);
  // A millisecond's worth of creates at most: a scan is cheaper than an index.
  for (auto& [k, d] : dirs_) {
    for (pm::CreateBehind& e : d.queued) {
      if (e.ino != ino || !e.open) continue;
      e.open = false;
      return true;
    }
  }
  return false;
}

void CreateBehind::barrier() {
  if (unanswered_.load(std::memory_order_acquire) == 0) return;
  std::unique_lock lock(mu_);
  const uint64_t target = queued_seq_;
  if (answered_seq_ >= target) return;
  hurry_ = true;
  wake_.notify_one();
  answered_.wait(lock, [&] { return answered_seq_ >= target; });
}

Result<pm::CreateBatchResp> CreateBehind::send_batch(const pm::CreateBatchReq& req, Clock::time_point* sent) {
  const Clock::time_point give_up = Clock::now() + options_.batch_retry_for;
  std::optional<Clock::time_point> no_space_give_up;  // from the first refusal for a full disk
  Backoff backoff(std::chrono::milliseconds(2), std::chrono::milliseconds(500));
  pm::CreateBatchReq again;  // a resend asks for no numbers: those of a lost reply are not known here
  for (int attempt = 1;; ++attempt) {
    *sent = Clock::now();
    auto r = rpc_.batch(attempt == 1 ? req : again);
    if (r.has_value()) return r;
    const Code code = r.error().code();
    if (code == Code::kNoSpace && !no_space_give_up.has_value()) {
      no_space_give_up = Clock::now() + options_.no_space_retry_for;
    }
    const bool again_later = failed_in_transit(code) || code == Code::kBusy ||
                             (code == Code::kNoSpace && backoff.fits(*no_space_give_up));
    if (!again_later || !backoff.fits(give_up) || rpc_.session() != req.session) return r;
    if (attempt == 1) {
      again = req;
      again.want_inodes = 0;
    }
    if (attempt == 1 && code != Code::kBusy) {
      const auto retry_for = code == Code::kNoSpace ? options_.no_space_retry_for : options_.batch_retry_for;
      PENSTOCK_LOG(Warn) << "sending " << req.entries.size() << " files created behind in directory "
                         << req.dir.to_string() << " to penstock-meta failed (" << r.error().to_string()
                         << "); sending them again for up to " << retry_for.count() << " ms";
    }
    {
      std::lock_guard lock(mu_);
      stats_.resent += 1;
    }
    // Another mount's lease ends within its term plus grace: try again sooner for kBusy.
    backoff.sleep(std::chrono::milliseconds(code == Code::kBusy ? 50 : 500));
  }
}

void CreateBehind::flush_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || queued_now_ > 0; });
    if (queued_now_ == 0) break;  // stopping, nothing left
    if (!hurry_ && !stopping_ && queued_now_ < options_.max_batch) {
      wake_.wait_for(lock, options_.flush_interval,
                     [&] { return stopping_ || hurry_ || queued_now_ >= options_.max_batch; });
    }
    hurry_ = false;
    struct Work {
      InodeId dir;
      SessionId session;  // the one the queued numbers belong to
      std::vector<pm::CreateBehind> entries;
    };
    std::vector<Work> work;
    for (auto& [k, d] : dirs_) {
      if (d.queued.empty()) continue;
      work.push_back(Work{InodeId(k), d.queued_session, std::move(d.queued)});
      d.queued.clear();
    }
    const uint64_t upto = queued_seq_;
    queued_now_ = 0;
    uint32_t want = pool_.size() < options_.inode_refill / 2 ? options_.inode_refill : 0;
    lock.unlock();

    for (auto& [dir, session, entries] : work) {
      for (size_t begin = 0; begin < entries.size(); begin += pm::kMaxCreateBatch) {
        const size_t end = std::min(entries.size(), begin + pm::kMaxCreateBatch);
        pm::CreateBatchReq req{session, dir, {}, want};
        req.entries.assign(std::make_move_iterator(entries.begin() + static_cast<std::ptrdiff_t>(begin)),
                           std::make_move_iterator(entries.begin() + static_cast<std::ptrdiff_t>(end)));
        Clock::time_point sent = Clock::now();
        auto r = send_batch(req, &sent);
        std::lock_guard relock(mu_);
        stats_.batches += 1;
        Dir& d = dir_locked(dir, Clock::now());
        if (!r.has_value() || r->results.size() != req.entries.size()) {
          const std::string why = r.has_value() ? "the reply has " + std::to_string(r->results.size()) +
                                                      " results for " + std::to_string(req.entries.size()) + " creates"
                                                : r.error().to_string();
          PENSTOCK_LOG(Error) << req.entries.size() << " files created behind in directory " << dir.to_string()
                              << " may be lost (the applications were told they exist): " << why;
          stats_.failed += req.entries.size();
          d.held = false;
          d.refused_until = Clock::now() + options_.refused_backoff;
          continue;
        }
        want = 0;
        if (session_locked() == session) {
          for (InodeId ino : r->inos) pool_.push_back(ino);
        }
        for (size_t i = 0; i < r->results.size(); ++i) {
          pm::CreateResult& res = r->results[i];
          if (res.code == static_cast<uint32_t>(Code::kOk)) {
            if (!res.attr.has_value()) continue;
            const uint64_t ino = req.entries[i].ino.value;
            if (layouts_.emplace(ino, std::move(res.attr->layout)).second) layout_order_.push_back(ino);
            while (layout_order_.size() > kLayoutsKept) {
              layouts_.erase(layout_order_.front());
              layout_order_.pop_front();
            }
            continue;
          }
          stats_.failed += 1;
          // The name stays listed (it may exist: kExists); numbers the server does not know (its
          // database lost what it gave this session: a machine crash, a restore) are all dropped.
          if (res.code == static_cast<uint32_t>(Code::kInvalid)) pool_.clear();
          PENSTOCK_LOG(Error) << "file " << req.entries[i].name << " (inode " << req.entries[i].ino.to_string()
                              << ") created behind in directory " << dir.to_string()
                              << " was refused by penstock-meta after the application was told it exists: "
                              << res.message;
        }
        if (session_locked() == session) extend_locked(d, r->lease_ns, sent);
      }
    }

    lock.lock();
    answered_seq_ = upto;
    unanswered_.store(queued_seq_ - answered_seq_, std::memory_order_release);
    answered_.notify_all();
  }
  answered_seq_ = queued_seq_;
  unanswered_.store(0, std::memory_order_release);
  answered_.notify_all();
}

}  // namespace penstock::client
