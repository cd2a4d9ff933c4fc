#include "server/meta/entry_leases.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace penstock::meta {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

EntryLeases::EntryLeases(EntryLeaseOptions options)
    : options_(std::move(options)),
      restart_guard_until_(options_.restart_guard() > 0 ? options_.clock() + options_.restart_guard() : 0) {}

uint64_t EntryLeases::key(Name n) {
  // Two names sharing a key only cost a needless wait or a refused grant, never a stale dentry.
  const uint64_t h = std::hash<std::string_view>{}(n.name);
  return h ^ (n.parent.value * 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

uint64_t EntryLeases::epoch() const { return epoch_.load(std::memory_order_acquire); }

size_t EntryLeases::size() const {
  std::lock_guard lock(mu_);
  return names_.size();
}

void EntryLeases::sweep(int64_t now) {
  for (auto it = names_.begin(); it != names_.end();) {
    auto& hs = it->second.holders;
    std::erase_if(hs, [now](const Holder& h) { return h.expiry <= now; });
    if (hs.empty() && it->second.changing == 0) {
      it = names_.erase(it);
    } else {
      ++it;
    }
  }
}

void EntryLeases::sweep_expired() {
  const int64_t now = options_.clock();
  std::lock_guard lock(mu_);
  sweep(now);
}

int64_t EntryLeases::grant(Name n, SessionId holder, uint64_t epoch_seen) {
  if (options_.term_ns <= 0 || !holder.valid()) return 0;
  const int64_t now = options_.clock();
  std::lock_guard lock(mu_);
  if (epoch_.load(std::memory_order_relaxed) != epoch_seen) return 0;
  const uint64_t k = key(n);
  auto it = names_.find(k);
  if (it == names_.end()) {
    if (names_.size() >= options_.max_names) sweep(now);
    if (names_.size() >= options_.max_names) return 0;
    it = names_.emplace(k, Entry{}).first;
  }
  Entry& e = it->second;
  if (e.changing > 0) return 0;
  const int64_t expiry = now + options_.term_ns;
  bool found = false;
  for (auto h = e.holders.begin(); h != e.holders.end();) {
    if (h->session == holder.value) {
      h->expiry = expiry;
      found = true;
      ++h;
    } else if (h->expiry <= now) {
      h = e.holders.erase(h);
    } else {
      ++h;
    }
  }
  if (!found) e.holders.push_back(Holder{holder.value, expiry});
  return options_.term_ns;
}

EntryLeases::Change::Change(EntryLeases& leases, std::vector<Name> names, SessionId requester)
    : leases_(leases), requester_(requester) {
  if (leases_.options_.term_ns <= 0 && leases_.restart_guard_until_ == 0) return;
  int64_t until = 0;
  const int64_t now = leases_.options_.clock();
  if (leases_.options_.term_ns > 0) {
    std::lock_guard lock(leases_.mu_);
    for (const Name& n : names) {
      const uint64_t k = key(n);
      keys_.push_back(k);
      Entry& e = leases_.names_[k];
      ++e.changing;
      for (const Holder& h : e.holders) {
        if (h.session != requester.value && h.expiry > now) until = std::max(until, h.expiry);
      }
    }
  }
  if (now < leases_.restart_guard_until_) until = std::max(until, leases_.restart_guard_until_);
  if (until == 0) return;
  until += leases_.options_.grace_ns;
  if (leases_.options_.sleep_until) {
    leases_.options_.sleep_until(until);
  } else {
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(until)));
  }
  waited_ns_ = until - now;
}

void EntryLeases::Change::moved(Name from, Name to) {
  if (leases_.options_.term_ns <= 0 || !requester_.valid()) return;
  const int64_t now = leases_.options_.clock();
  std::lock_guard lock(leases_.mu_);
  auto src = leases_.names_.find(key(from));
  if (src == leases_.names_.end()) return;
  int64_t expiry = 0;
  for (const Holder& h : src->second.holders) {
    if (h.session == requester_.value) expiry = h.expiry;
  }
  if (expiry <= now) return;
  // The destination is one of this change's names, so its entry exists and refuses grants.
  Entry& dst = leases_.names_[key(to)];
  for (Holder& h : dst.holders) {
    if (h.session == requester_.value) {
      h.expiry = std::max(h.expiry, expiry);
      return;
    }
  }
  dst.holders.push_back(Holder{requester_.value, expiry});
}

EntryLeases::Change::~Change() {
  if (leases_.options_.term_ns <= 0) return;
  std::lock_guard lock(leases_.mu_);
  for (uint64_t k : keys_) {
    auto it = leases_.names_.find(k);
    if (it == leases_.names_.end()) continue;  // cannot happen: changing > 0 keeps it
    if (--it->second.changing == 0 && it->second.holders.empty()) leases_.names_.erase(it);
  }
  leases_.epoch_.fetch_add(1, std::memory_order_release);
}

}  // namespace penstock::meta
