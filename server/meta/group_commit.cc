#include "server/meta/group_commit.h"

#include <algorithm>

namespace penstock::meta {

GroupCommitter::GroupCommitter(SyncFn sync) : sync_(std::move(sync)) {}

uint64_t GroupCommitter::note_applied() { return applied_.fetch_add(1, std::memory_order_acq_rel) + 1; }

Status GroupCommitter::wait_durable(uint64_t ticket) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!error_.is_ok()) return error_;
    if (durable_ >= ticket) return Status::ok();
    if (syncing_) {
      // A sync is running; it may have started before our write was noted, so wait for it and
      // check again (the next leader covers us).
      ++followers_;
      cv_.wait(lock);
      --followers_;
      continue;
    }
    // Leader: everything noted up to now is in the log, so one sync covers all of it.
    syncing_ = true;
    const uint64_t upto = applied_.load(std::memory_order_acquire);
    lock.unlock();
    Status st = sync_();
    lock.lock();
    syncing_ = false;
    if (st.is_ok()) {
      durable_ = std::max(durable_, upto);
      ++syncs_;
    } else if (error_.is_ok()) {
      error_ = st.with_context("sync of the write-ahead log failed; what is on disk is unknown until the database is opened again");
    }
    cv_.notify_all();
  }
}

bool GroupCommitter::failed() const {
  std::lock_guard lock(mu_);
  return !error_.is_ok();
}

uint64_t GroupCommitter::syncs() const {
  std::lock_guard lock(mu_);
  return syncs_;
}

uint64_t GroupCommitter::durable() const {
  std::lock_guard lock(mu_);
  return durable_;
}

uint64_t GroupCommitter::followers() const {
  std::lock_guard lock(mu_);
  return followers_;
}

}  // namespace penstock::meta
