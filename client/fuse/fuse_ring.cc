#include "client/fuse/fuse_ring.h"

#include <liburing.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <fstream>
#include <functional>
#include <future>
#include <system_error>
#include <thread>
#include <vector>

#include "client/fuse/mount_options.h"  // count_cpu_list
#include "client/fuse/notifier.h"
#include "client/fuse/wake_signal.h"
#include "common/base/log.h"

namespace penstock::fuse {
namespace {

// The kernel's FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, protocol 7.42). Debian 12's
// linux-libc-dev (6.1) predates it, so the layout is spelled out here and checked by size.
constexpr uint64_t kFuseOverIoUring = 1ULL << 41;  // INIT flag, bit 9 of flags2
constexpr uint32_t kCmdRegister = 1;
constexpr uint32_t kCmdCommitAndFetch = 2;
constexpr size_t kOpInSize = 128;

struct RingEntInOut {
  uint64_t flags;
  uint64_t commit_id;    // the request's unique, echoed in the commit
  uint32_t payload_sz;   // bytes of the payload buffer in use, either way
  uint32_t padding;
  uint64_t reserved;
};
struct RingReqHeader {
  char in_out[128];  // fuse_in_header on fetch, fuse_out_header on commit
  char op_in[kOpInSize];  // the request's first argument (its per-op struct)
  RingEntInOut ent;
};
struct RingCmdReq {  // in the command area of a 128-byte SQE
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(RingEntInOut) == 32 && sizeof(RingReqHeader) == 288 && sizeof(RingCmdReq) == 24);

constexpr const char* kEnableParam = "/sys/module/fuse/parameters/enable_uring";
// Bytes kept in front of each payload buffer, where a request's fuse_in_header and per-op struct
// are written so that header, struct and payload lie in one piece as libfuse expects.
constexpr size_t kFront = 4096;
static_assert(kFront >= sizeof(fuse_in_header) + kOpInSize);

// One ring entry: the buffers the kernel copies one request into and one reply out of.
struct Entry {
  RingReqHeader header{};
  char* block = nullptr;   // kFront + payload bytes
  uint64_t unique = 0;     // of the request being served (its replies carry it)
  uint64_t commit_id = 0;  // what the commit names it by (the kernel's ring_ent_in_out)
  uint32_t opcode = 0;
  bool replied = false;
  std::vector<std::function<void()>> after_reply;  // run once the commit is in
  char* payload() const { return block + kFront; }
};

// What the custom io (which libfuse calls without our context) shares with FuseRing.
struct Shared {
  std::atomic<bool> want_ring{false};   // add FUSE_OVER_IO_URING to the INIT reply if offered
  std::atomic<bool> offered{false};     // the kernel's INIT request offered it
  std::atomic<bool> init_answered{false};
  std::atomic<bool> init_patched{false};
  std::atomic<size_t> payload_size{0};  // what each entry's payload buffer must hold
};
Shared g_shared;

thread_local Entry* tls_entry = nullptr;  // the ring request this thread serves, if any

// Copies a reply libfuse writes for the ring request this thread serves into its entry.
ssize_t capture_reply(Entry* e, const struct iovec* iov, int count) {
  auto* oh = reinterpret_cast<fuse_out_header*>(e->header.in_out);
  std::memcpy(oh, iov[0].iov_base, sizeof(fuse_out_header));
  size_t used = 0;
  const size_t room = g_shared.payload_size.load(std::memory_order_relaxed);
  for (int i = 1; i < count; ++i) {
    const char* src = static_cast<const char*>(iov[i].iov_base);
    const bool inside = src >= e->payload() && src < e->payload() + room;
    if (inside && src != e->payload() + used) {
      // Only a piece built in place (op_read's direct bytes) may come from the payload buffer: one
      // elsewhere there could already be overwritten by the pieces copied before it.
      PENSTOCK_LOG(Error) << "FUSE ring: a reply piece lies in the ring buffer out of place; answering EIO";
      oh->error = -EIO;
      used = 0;
      break;
    }
    if (used + iov[i].iov_len > room) {
      PENSTOCK_LOG(Error) << "FUSE reply of " << used + iov[i].iov_len << " bytes does not fit the ring's "
                          << room << "-byte buffer; answering EIO";
      oh->error = -EIO;
      used = 0;
      break;
    }
    if (iov[i].iov_base != e->payload() + used) std::memmove(e->payload() + used, iov[i].iov_base, iov[i].iov_len);
    used += iov[i].iov_len;
  }
  oh->len = static_cast<uint32_t>(sizeof(fuse_out_header) + used);
  e->header.ent = RingEntInOut{0, e->commit_id, static_cast<uint32_t>(used), 0, 0};
  e->replied = true;
  return static_cast<ssize_t>(sizeof(fuse_out_header) + used);
}

ssize_t ring_io_writev(int fd, struct iovec* iov, int count, void* /*userdata*/) {
  if (count > 0 && iov[0].iov_len >= sizeof(fuse_out_header)) {
    const auto* oh = static_cast<const fuse_out_header*>(iov[0].iov_base);
    Entry* e = tls_entry;
    if (e != nullptr && oh->unique == e->unique && oh->unique != 0 && !e->replied) {
      return capture_reply(e, iov, count);
    }
    if (!g_shared.init_answered.load(std::memory_order_acquire) && count >= 2 &&
        iov[1].iov_len >= offsetof(fuse_init_out, unused)) {
      // The first reply of a session answers FUSE_INIT.
      auto* out = static_cast<fuse_init_out*>(iov[1].iov_base);
      if (g_shared.want_ring.load() && g_shared.offered.load() && (out->flags & FUSE_INIT_EXT) != 0 &&
          oh->error == 0) {
        out->flags2 |= static_cast<uint32_t>(kFuseOverIoUring >> 32);
        const size_t pages = (out->flags & FUSE_MAX_PAGES) != 0 ? out->max_pages : 32;
        size_t need = std::max<size_t>({8192, out->max_write, pages * static_cast<size_t>(getpagesize())});
        g_shared.payload_size.store(need);
        g_shared.init_patched.store(true);
      }
      g_shared.init_answered.store(true, std::memory_order_release);
    }
  }
  return ::writev(fd, iov, count);
}

ssize_t ring_io_read(int fd, void* buf, size_t len, void* /*userdata*/) {
  const ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(fuse_in_header) + offsetof(fuse_init_in, unused)) &&
      !g_shared.init_answered.load(std::memory_order_acquire)) {
    const auto* in = static_cast<const fuse_in_header*>(buf);
    if (in->opcode == FUSE_INIT) {
      const auto* arg = reinterpret_cast<const fuse_init_in*>(in + 1);
      const bool ext = (arg->flags & FUSE_INIT_EXT) != 0;
      g_shared.offered.store(ext && (arg->flags2 & static_cast<uint32_t>(kFuseOverIoUring >> 32)) != 0);
    }
  }
  return n;
}

const fuse_custom_io kRingIo = {ring_io_writev, ring_io_read, nullptr, nullptr};

// How many CPUs are possible (0 when the kernel does not say): the kernel makes that many queues
// and picks the queue of a request by the CPU its caller runs on.
int possible_cpus() {
  std::ifstream in("/sys/devices/system/cpu/possible");
  std::string text;
  std::getline(in, text);
  return count_cpu_list(text);
}

// Queues one FUSE ring command (REGISTER with `bufs`, or COMMIT_AND_FETCH) on `ring`; false when
// the submission queue is full, which cannot happen with one command in flight per ring.
bool queue_cmd(io_uring* ring, int fuse_fd, uint32_t cmd_op, uint64_t commit_id, int qid, struct iovec* bufs) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) return false;
  std::memset(sqe, 0, 128);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = fuse_fd;
  sqe->cmd_op = cmd_op;
  RingCmdReq req{};
  req.commit_id = commit_id;
  req.qid = static_cast<uint16_t>(qid);
  std::memcpy(sqe->cmd, &req, sizeof(req));
  if (bufs != nullptr) {
    sqe->addr = reinterpret_cast<uint64_t>(bufs);
    sqe->len = 2;
  }
  return true;
}

}  // namespace

struct FuseRing::Impl {
  fuse_session* se = nullptr;
  int fuse_fd = -1;  // our own descriptor of the session's /dev/fuse: libfuse closes its one at unmount
  // Made by prepare(), kept until start() is done: the ring that sends the kernel back to
  // /dev/fuse when a queue gets no entry, made while io_uring was known to work.
  io_uring fallback{};
  bool has_fallback = false;
  int queues = 0;
  int per_queue = 0;
  std::atomic<bool> stopping{false};
  // What ring threads hand over once their commit is in (after_reply): a ring thread's entry is
  // armed again by then, so it must not itself wait for the kernel.
  Notifier notifier{"fuse-ring-note"};
  std::vector<std::thread> workers;

  // One thread, one io_uring, one entry of queue `qid`. Registers the entry, tells `registered`
  // how that went (0 or -errno), then serves requests until the connection ends or stop().
  void serve(int qid, bool pin, std::promise<int> registered) {
    const std::string name = "fuse-ring-" + std::to_string(qid);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(qid, &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    // stop()'s wake-up signal is blocked while this thread serves a request and let in only while
    // it waits for the next (io_uring_wait_cqes' sigmask): it cannot cut into an op, and one sent
    // before the wait is delivered as the wait begins.
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, kWakeSignal);
    pthread_sigmask(SIG_BLOCK, &wake, nullptr);
    sigset_t waiting;
    pthread_sigmask(SIG_BLOCK, nullptr, &waiting);
    sigdelset(&waiting, kWakeSignal);

    io_uring ring{};
    io_uring_params params{};
    params.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    int rc = io_uring_queue_init_params(2, &ring, &params);
    if (rc == -EINVAL) {  // a kernel without DEFER_TASKRUN (it then has no FUSE ring either)
      params = io_uring_params{};
      params.flags = IORING_SETUP_SQE128;
      rc = io_uring_queue_init_params(2, &ring, &params);
    }
    if (rc < 0) {
      registered.set_value(rc);
      return;
    }
    Entry e;
    const size_t payload = g_shared.payload_size.load();
    void* mem = nullptr;
    if (posix_memalign(&mem, 4096, kFront + payload) != 0) {
      io_uring_queue_exit(&ring);
      registered.set_value(-ENOMEM);
      return;
    }
    e.block = static_cast<char*>(mem);
    struct iovec bufs[2] = {{&e.header, sizeof(e.header)}, {e.payload(), payload}};

    int complaints = 0;
    auto complain = [&](const std::string& what) {
      if (++complaints <= 10 || complaints % 1000 == 0) {
        PENSTOCK_LOG(Error) << "FUSE ring queue " << qid << ": " << what << " (" << complaints << " so far)";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(complaints, 100)));
    };
    // Submits what is queued, retrying until the kernel has taken it (or stop()): a command left in
    // the queue would go out later beside the next one, and an entry never sent leaves its queue
    // a waiter short. False only when stopping.
    auto submit_queued = [&]() {
      while (io_uring_sq_ready(&ring) > 0) {
        if (stopping.load(std::memory_order_acquire)) return false;
        const int n = io_uring_submit(&ring);
        if (n < 0 && n != -EINTR) complain(std::string("submitting a ring command failed: ") + std::strerror(-n));
      }
      return true;
    };
    rc = queue_cmd(&ring, fuse_fd, kCmdRegister, 0, qid, bufs) ? io_uring_submit(&ring) : -EBUSY;
    if (rc >= 0) {
      io_uring_cqe* cqe = nullptr;
      // A refused register completes during the submit; an accepted one only with a request.
      if (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe->res < 0) {
        rc = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
      } else {
        rc = 0;
      }
    }
    registered.set_value(rc < 0 ? rc : 0);
    // Once the kernel uses the ring, a queue without a waiting entry leaves its CPU's callers
    // hanging, so this thread leaves only when the connection ended or stop() asks; anything else
    // it meets is logged and the entry registered again.
    bool serving = rc >= 0;
    while (serving && !stopping.load(std::memory_order_acquire)) {
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_wait_cqes(&ring, &cqe, 1, nullptr, &waiting);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        complain(std::string("waiting for a request failed: ") + std::strerror(-rc));
        continue;
      }
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (res < 0) {
        if (connection_ended(res) || stopping.load()) break;
        // The old kernel entry stays behind without a command; registering the buffers again
        // gives this thread a new one.
        complain(std::string("the kernel refused a register or reply (") + std::strerror(-res) +
                 "); registering the entry again");
        if (queue_cmd(&ring, fuse_fd, kCmdRegister, 0, qid, bufs)) serving = submit_queued();
        continue;
      }
      handle(&e);
      if (!queue_cmd(&ring, fuse_fd, kCmdCommitAndFetch, e.commit_id, qid, nullptr)) {
        complain("no room for the reply in the submission queue");
        continue;
      }
      serving = submit_queued();
      // The commit was handled during the submit, so the reply has reached the kernel. What waits
      // for that runs on the notifier thread: this thread's entry is armed again, and a request
      // that lands in it must not wait behind a notification that waits for that request's locks.
      if (!e.after_reply.empty()) {
        if (serving) notifier.post(std::move(e.after_reply));
        e.after_reply.clear();
      }
    }
    io_uring_queue_exit(&ring);
    std::free(e.block);
  }

  // Errors with which the kernel completes a ring command once the connection is gone (unmount,
  // abort through /sys/fs/fuse/connections, the daemon's own teardown).
  static bool connection_ended(int res) {
    return res == -ENOTCONN || res == -ECANCELED || res == -ENODEV || res == -ECONNABORTED ||
           res == -EOPNOTSUPP;
  }

  // Serves the request in `e`: lays it out as /dev/fuse would deliver it, lets libfuse decode and
  // answer it, and makes sure the entry holds a reply.
  void handle(Entry* e) {
    const auto* ih = reinterpret_cast<const fuse_in_header*>(e->header.in_out);
    const uint32_t payload = e->header.ent.payload_sz;
    e->unique = ih->unique;
    e->commit_id = e->header.ent.commit_id;
    e->opcode = ih->opcode;
    e->replied = false;
    const size_t room = g_shared.payload_size.load(std::memory_order_relaxed);
    if (ih->len < sizeof(fuse_in_header) + payload || ih->len - sizeof(fuse_in_header) - payload > kOpInSize ||
        payload > room) {
      PENSTOCK_LOG(Error) << "FUSE ring: request " << ih->unique << " (opcode " << ih->opcode << ") has length "
                          << ih->len << " with a " << payload << "-byte payload; answering EIO";
      reply_error(e, EIO);
      return;
    }
    const size_t op_in = ih->len - sizeof(fuse_in_header) - payload;
    char* start = e->payload() - op_in - sizeof(fuse_in_header);
    std::memcpy(start, ih, sizeof(fuse_in_header));
    std::memcpy(start + sizeof(fuse_in_header), e->header.op_in, op_in);
    fuse_buf buf{};
    buf.mem = start;
    buf.size = ih->len;
    buf.fd = -1;
    tls_entry = e;
    fuse_session_process_buf(se, &buf);
    tls_entry = nullptr;
    if (!e->replied) {
      PENSTOCK_LOG(Error) << "FUSE ring: request " << e->unique << " (opcode " << ih->opcode
                          << ") got no reply; answering EIO";
      reply_error(e, EIO);
    }
  }

  static void reply_error(Entry* e, int err) {
    fuse_out_header oh{};
    oh.len = sizeof(oh);
    oh.error = -err;
    oh.unique = e->unique;
    struct iovec iov = {&oh, sizeof(oh)};
    capture_reply(e, &iov, 1);
  }

  // A register the kernel must refuse (a header buffer too small): it then gives up the ring for
  // this connection and serves /dev/fuse again.
  void refuse_ring(int qid) {
    if (!has_fallback) return;
    char header[8];
    char payload[8];
    struct iovec bufs[2] = {{header, sizeof(header)}, {payload, sizeof(payload)}};
    if (!queue_cmd(&fallback, fuse_fd, kCmdRegister, 0, qid, bufs)) return;
    for (int attempt = 0; attempt < 50; ++attempt) {
      const int rc = io_uring_submit_and_wait(&fallback, 1);
      if (rc >= 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    PENSTOCK_LOG(Error) << "FUSE ring: cannot send the kernel back to /dev/fuse; requests to this mount will wait "
                           "until it is unmounted (fusermount3 -u)";
  }

  void drop_fallback() {
    if (has_fallback) io_uring_queue_exit(&fallback);
    has_fallback = false;
  }

  // Wakes every thread and waits for it, then for the notifier.
  void join_all() {
    stopping.store(true, std::memory_order_release);
    for (std::thread& t : workers) {
      // A thread waiting for a request returns from the wait with EINTR and sees `stopping`; one
      // busy with a request gets the signal when it next waits. One that already ended (the kernel
      // closed the connection) is not joined yet, so its handle is still valid for the signal.
      pthread_kill(t.native_handle(), kWakeSignal);
      t.join();
    }
    workers.clear();
    notifier.stop();
  }
};

FuseRing::FuseRing(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FuseRing::~FuseRing() { stop(); }

uint8_t* ring_reply_buffer(size_t size) {
  Entry* e = tls_entry;
  if (e == nullptr || e->opcode != FUSE_READ || size > g_shared.payload_size.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  return reinterpret_cast<uint8_t*>(e->payload());
}

bool on_ring_thread() { return tls_entry != nullptr; }

namespace {
// after_reply's thread for /dev/fuse request threads (stop_after_reply).
Notifier& dev_notifier() {
  static Notifier n("fuse-note");
  return n;
}
}  // namespace

void after_reply(std::function<void()> fn) {
  if (Entry* e = tls_entry; e != nullptr) {
    e->after_reply.push_back(std::move(fn));
  } else {
    std::vector<std::function<void()>> fns;
    fns.push_back(std::move(fn));
    dev_notifier().post(std::move(fns));
  }
}

void stop_after_reply() { dev_notifier().stop(); }

std::unique_ptr<FuseRing> FuseRing::prepare(const std::string& mode, int threads_per_queue, std::string* why_not) {
  if (mode == "off") {
    *why_not = "--fuse-uring off";
    return nullptr;
  }
  std::string value;
  {
    std::ifstream in(kEnableParam);
    if (!in) {
      *why_not = "this kernel has no FUSE over io_uring (Linux 6.14+ built with CONFIG_FUSE_IO_URING)";
      return nullptr;
    }
    std::getline(in, value);
  }
  if (value != "Y" && value != "1") {
    if (mode != "on") {
      *why_not = std::string("the fuse module's enable_uring is off (echo Y > ") + kEnableParam +
                 " as root, or mount with --fuse-uring on)";
      return nullptr;
    }
    std::ofstream out(kEnableParam);
    out << "Y\n";
    out.flush();
    if (!out) {
      *why_not = std::string("cannot switch on ") + kEnableParam + " (needs root): " + std::strerror(errno);
      return nullptr;
    }
    PENSTOCK_LOG(Info) << "switched on FUSE over io_uring in the kernel (" << kEnableParam << " = Y)";
  }
  // io_uring may be switched off (kernel.io_uring_disabled) or filtered (seccomp): find out now,
  // before the INIT reply asks the kernel for a ring.
  const int queues = possible_cpus();
  if (queues <= 0) {
    // A guess below the kernel's count would leave a queue without entries: every request would wait.
    *why_not = "cannot read /sys/devices/system/cpu/possible (the kernel makes one queue per possible CPU)";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  io_uring_params params{};
  params.flags = IORING_SETUP_SQE128;
  if (int rc = io_uring_queue_init_params(2, &impl->fallback, &params); rc < 0) {
    *why_not = std::string("io_uring is not available to this process: ") + std::strerror(-rc);
    return nullptr;
  }
  impl->has_fallback = true;
  impl->queues = queues;
  impl->per_queue = std::max(threads_per_queue, 1);
  return std::unique_ptr<FuseRing>(new FuseRing(std::move(impl)));
}

bool FuseRing::attach(fuse_session* se, std::string* why_not) {
  const int fd = fuse_session_fd(se);
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (own < 0) {
    *why_not = std::string("cannot duplicate the /dev/fuse descriptor: ") + std::strerror(errno);
    return false;
  }
  if (int rc = fuse_session_custom_io(se, &kRingIo, fd); rc != 0) {
    close(own);
    *why_not = "libfuse refused the custom io (" + std::to_string(rc) + ")";
    return false;
  }
  install_wake_signal();  // stop() wakes a thread waiting in io_uring_enter with it
  impl_->se = se;
  impl_->fuse_fd = own;
  g_shared.want_ring.store(true);
  return true;
}

bool FuseRing::start(std::string* why_not) {
  Impl& m = *impl_;
  // Whatever happens below, no later INIT reply (libfuse's loop answers INIT when serve_init could
  // not) may ask the kernel for a ring nobody serves.
  g_shared.want_ring.store(false);
  if (m.se == nullptr) {
    *why_not = "not attached to a session";
    return false;
  }
  if (!g_shared.init_answered.load()) {
    *why_not = "the INIT request was not answered yet";
    return false;
  }
  if (!g_shared.init_patched.load()) {
    *why_not = g_shared.offered.load() ? "the INIT reply could not ask for it"
                                       : "the kernel did not offer it in FUSE_INIT";
    return false;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool know_allowed = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
  std::vector<int> ok_per_queue(static_cast<size_t>(m.queues), 0);
  int first_error = 0;
  for (int q = 0; q < m.queues; ++q) {
    const bool pin = know_allowed && q < CPU_SETSIZE && CPU_ISSET(q, &allowed);
    // A CPU this process may not run on (offline, or outside its cpuset) still needs an entry
    // before the kernel uses the ring; its callers are other processes, so one thread serves it.
    const int threads = pin || !know_allowed ? m.per_queue : 1;
    for (int t = 0; t < threads; ++t) {
      std::promise<int> registered;
      std::future<int> result = registered.get_future();
      try {
        m.workers.emplace_back([&m, q, pin, p = std::move(registered)]() mutable { m.serve(q, pin, std::move(p)); });
      } catch (const std::system_error&) {
        if (first_error == 0) first_error = -EAGAIN;
        break;  // no more threads for this queue
      }
      const int rc = result.get();
      if (rc == 0) {
        ++ok_per_queue[static_cast<size_t>(q)];
      } else if (first_error == 0) {
        first_error = rc;
      }
    }
  }
  for (int q = 0; q < m.queues; ++q) {
    if (ok_per_queue[static_cast<size_t>(q)] != 0) continue;
    // The kernel holds every request until each queue has an entry.
    m.refuse_ring(q);
    m.drop_fallback();
    m.join_all();
    *why_not = "queue " + std::to_string(q) + " could not register a ring entry: " +
               std::strerror(first_error < 0 ? -first_error : EIO);
    return false;
  }
  m.drop_fallback();
  return true;
}

void FuseRing::stop() {
  if (!impl_) return;
  impl_->join_all();
  impl_->drop_fallback();
  if (impl_->fuse_fd >= 0) close(impl_->fuse_fd);
  impl_->fuse_fd = -1;
}

int FuseRing::queues() const { return impl_->queues; }
int FuseRing::threads() const { return static_cast<int>(impl_->workers.size()); }

}  // namespace penstock::fuse
