#include "server/meta/scrub.h"

#include <string>
#include <vector>

#include "common/base/log.h"

namespace penstock::meta {

namespace {

// Removals and numbers never handed out are logged by name this many times a pass, then only
// counted in the pass's summary.
constexpr uint64_t kLoggedPerPass = 16;

// Logs a problem of the pass and keeps it for the reply (the first kMaxScrubErrors of them).
void note_error(pm::ScrubResp* resp, const std::string& line) {
  PENSTOCK_LOG(Warn) << "scrub: " << line;
  if (resp->errors.size() < pm::kMaxScrubErrors) resp->errors.push_back(line);
}

}  // namespace

Scrubber::Scrubber(MetaService& service, ChunkLister& lister, ChunkRemover& remover, ScrubOptions options)
    : service_(service), lister_(lister), remover_(remover), options_(options) {}

Scrubber::~Scrubber() { stop(); }

Result<pm::ScrubResp> Scrubber::run(bool dry_run, bool wait_for_running) {
  std::unique_lock pass(run_mu_, std::defer_lock);
  if (wait_for_running) {
    pass.lock();
  } else if (!pass.try_lock()) {
    return Status(Code::kBusy, "a scrub pass is running; penstock-meta's log reports its end, then run it again");
  }
  if (stopping_.load()) return Status(Code::kUnavailable, "penstock-meta is stopping; no scrub pass now");
  const auto started = std::chrono::steady_clock::now();
  pm::ScrubResp resp;
  for (const MetaService::ScrubTarget& target : service_.scrub_targets()) {
    if (!target.online) {
      ++resp.targets_failed;
      note_error(&resp, "target " + target.id.to_string() + (target.address.empty() ? "" : " at " + target.address) +
                            " is offline: not scrubbed (run the scrub again once it is back)");
      continue;
    }
    PENSTOCK_ASSIGN_OR_RETURN(bool listed, scrub_target(target, dry_run, &resp));
    ++(listed ? resp.targets : resp.targets_failed);
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  PENSTOCK_LOG(Info) << "scrub" << (dry_run ? " (dry run)" : "") << ": " << resp.targets << " target(s) in " << ms
                     << " ms, " << resp.inodes << " inode(s) with chunks, " << resp.orphans << " orphan(s), "
                     << resp.removed << " removed, " << resp.unknown << " never handed out, " << resp.targets_failed
                     << " target(s) not scrubbed";
  return resp;
}

bool Scrubber::stopped(const std::string& where, pm::ScrubResp* resp) const {
  if (!stopping_.load()) return false;
  note_error(resp, "penstock-meta is stopping: " + where + " not scrubbed to the end");
  return true;
}

Result<bool> Scrubber::scrub_target(const MetaService::ScrubTarget& target, bool dry_run, pm::ScrubResp* resp) {
  const std::string where = "target " + target.id.to_string() + " at " + target.address;
  for (uint32_t bucket = 0; bucket < proto::data::kListBuckets; ++bucket) {
    const uint32_t page_size =
        options_.page == 0 || options_.page > proto::data::kMaxListInodes ? proto::data::kMaxListInodes : options_.page;
    proto::data::ListInodesReq req{target.id, bucket, InodeId(), page_size};
    for (;;) {
      if (stopped(where, resp)) return false;
      auto page = lister_.list_inodes(target.address, req);
      if (!page.has_value()) {
        note_error(resp, page.error().to_string() + " (" + where + " not scrubbed to the end)");
        return false;
      }
      if (page->inodes.size() > req.max) {
        note_error(resp, where + " listed " + std::to_string(page->inodes.size()) + " inodes for a page of " +
                             std::to_string(req.max) + " (not scrubbed to the end)");
        return false;
      }
      std::vector<InodeId> orphans;
      for (InodeId ino : page->inodes) {
        // A reply out of order (or repeating itself) would never end the bucket.
        if (ino.value <= req.after.value || ino.value % proto::data::kListBuckets != bucket) {
          note_error(resp, where + " listed inode " + ino.to_string() + " out of order in bucket " +
                               std::to_string(bucket) + " (not scrubbed to the end)");
          return false;
        }
        req.after = ino;
        ++resp->inodes;
        PENSTOCK_ASSIGN_OR_RETURN(MetaService::ChunkOwner owner, service_.chunk_owner(ino));
        if (owner == MetaService::ChunkOwner::kNeverIssued) {
          if (++resp->unknown <= kLoggedPerPass) {
            PENSTOCK_LOG(Warn) << "scrub: " << where << " holds chunks of inode " << ino.to_string()
                             << ", a number this namespace never handed out: left alone (is the metadata "
                                "database older than the data, e.g. restored from a backup?)"
                               << (resp->unknown == kLoggedPerPass ? " (further ones: see the summary)" : "");
          }
        } else if (owner == MetaService::ChunkOwner::kOrphan) {
          orphans.push_back(ino);
        }
      }
      resp->orphans += orphans.size();
      if (!orphans.empty() && !dry_run) {
        // Every unlink that made one of them absent is applied; after this sync no crash takes it
        // back, so no chunk goes for a file a restart would bring back.
        PENSTOCK_RETURN_IF_ERROR(service_.sync_log().with_context("sync before scrub removals"));
        for (InodeId ino : orphans) {
          if (stopped(where, resp)) return false;
          Status st = remover_.remove(target.address, target.id, ino);
          if (st.is_ok()) {
            // The first ones by name; the rest only in the pass's summary.
            if (++resp->removed <= kLoggedPerPass) {
              PENSTOCK_LOG(Info) << "scrub: removed the chunks of inode " << ino.to_string() << " on " << where
                                 << ": no file has that inode"
                                 << (resp->removed == kLoggedPerPass ? " (further removals: see the summary)" : "");
            }
          } else {
            note_error(resp, st.to_string());
          }
        }
      }
      if (!page->more) break;
      if (page->inodes.empty()) {
        note_error(resp, where + " said more inodes follow in bucket " + std::to_string(bucket) +
                             " but listed none (not scrubbed to the end)");
        return false;
      }
    }
  }
  return true;
}

void Scrubber::start() {
  std::lock_guard lock(mu_);
  if (started_) return;
  started_ = true;
  stop_requested_ = false;
  stopping_ = false;
  service_.set_scrub_runner([this](const pm::ScrubReq& req) { return run(req.dry_run, /*wait_for_running=*/false); });
  if (options_.interval.count() > 0) thread_ = std::thread([this] { loop(); });
}

void Scrubber::stop() {
  {
    std::lock_guard lock(mu_);
    if (!started_) return;
    started_ = false;
    stop_requested_ = true;
    stopping_ = true;
  }
  service_.set_scrub_runner(nullptr);
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scrubber::loop() {
  std::unique_lock lock(mu_);
  auto wait = options_.first_delay;
  while (!cv_.wait_for(lock, wait, [this] { return stop_requested_; })) {
    lock.unlock();
    auto r = run(/*dry_run=*/false);
    if (!r.has_value() && !stopping_.load()) {
      PENSTOCK_LOG(Error) << "scrub pass failed: " << r.error().to_string();
    }
    lock.lock();
    wait = options_.interval;
  }
}

}  // namespace penstock::meta
