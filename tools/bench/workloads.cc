#include "tools/bench/workloads.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>

#include "tools/bench/pattern.h"
#include "tools/bench/units.h"

namespace penstock::bench {
namespace {

// File ids: the kind of file in the top byte, its index below, so no two files of one run share
// an id and a block found in the wrong kind of file is reported as such.
constexpr uint64_t kCkptIdBase = 0x01ULL << 56;
constexpr uint64_t kTrainIdBase = 0x02ULL << 56;
constexpr uint64_t kSmallIdBase = 0x03ULL << 56;

constexpr double kBytesPerParam = 14;  // weights + optimizer state in mixed precision (Adam)
constexpr double kBudgetShare = 0.05;  // a checkpoint may take 5% of the interval

// ------------------------------------------------------------------------------------ flags

// "1G", "128M", "100K", "1536": the shortest exact form, for flag defaults.
std::string size_flag_text(uint64_t v) {
  static const char* const kSuffix[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kSuffix[u];
}

void add_size(CLI::App& app, const std::string& flag, uint64_t* target, const std::string& desc) {
  app.add_option_function<std::string>(
         flag,
         [target, flag](const std::string& text) {
           Result<uint64_t> r = parse_size(text);
           if (!r.has_value()) throw CLI::ValidationError(flag, r.error().message());
           *target = *r;
         },
         desc + " [bytes; K/M/G/T suffixes are powers of 1024]")
      ->type_name("SIZE")
      ->default_str(size_flag_text(*target));
}

void add_int(CLI::App& app, const std::string& flag, int* target, const std::string& desc, int lo, int hi) {
  app.add_option(flag, *target, desc)->capture_default_str()->check(CLI::Range(lo, hi));
}

void add_double(CLI::App& app, const std::string& flag, double* target, const std::string& desc) {
  app.add_option(flag, *target, desc)->capture_default_str()->check(CLI::PositiveNumber);
}

void add_ckpt_flags(CLI::App& app, Options& o, int default_ranks, const char* verb) {
  o.ranks = default_ranks;
  add_int(app, "--ranks", &o.ranks, "rank processes (forked) [count]", 1, 1024);
  add_size(app, "--size", &o.size, "checkpoint shard size per rank");
  add_size(app, "--block", &o.block, std::string("size of each sequential ") + verb);
}

void add_model_flags(CLI::App& app, Options& o) {
  add_double(app, "--params", &o.params,
             "model parameters for the checkpoint-time estimate, at 14 bytes/parameter [count]");
}

void add_dataset_flags(CLI::App& app, Options& o) {
  add_int(app, "--files", &o.files, "record shard files in the dataset [count]", 1, 1 << 20);
  add_size(app, "--file-size", &o.file_size, "size of each record shard file");
  add_int(app, "--threads", &o.threads, "reader threads [count]", 1, 1024);
}

void add_sample_flag(CLI::App& app, Options& o) {
  add_size(app, "--sample", &o.sample, "size of each sample read");
}

// ---------------------------------------------------------------------------------- helpers

Status check_positive(uint64_t v, const char* flag) {
  if (v == 0) return make_error(Code::kInvalid, std::string(flag) + " must be above 0");
  return Status::ok();
}

double gbps(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
double mbps(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0; }
double per_s(uint64_t n, double seconds) { return seconds > 0 ? static_cast<double>(n) / seconds : 0; }

Status maybe_drop_caches(const Options& o, const std::string& dir) {
  if (!o.drop_caches) return Status::ok();
  return drop_caches(dir);
}

// Runs fn(tid, stop) on n threads; the first error sets stop and is returned.
Status run_threads(int n, const std::function<Status(int, const std::atomic<bool>&)>& fn) {
  std::atomic<bool> stop{false};
  std::mutex mu;
  Status first = Status::ok();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      Status s = fn(t, stop);
      if (!s.is_ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.is_ok()) first = s;
        stop.store(true);
      }
    });
  }
  for (auto& th : threads) th.join();
  return first;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }
  // Closes and reports the error of close (which can carry a deferred write error).
  Status close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return errno_status("close " + path, errno);
    return Status::ok();
  }

 private:
  int fd_;
};

Result<Fd> open_file(const std::string& path, int flags, mode_t mode = 0644) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return errno_status("open " + path, errno);
  return Fd(fd);
}

// Creates (or truncates) `path` with `size` bytes of file `id`'s pattern, written sequentially in
// `block`-sized writes; fsync before close when `sync`.
Status write_pattern_file(const std::string& path, uint64_t id, uint64_t size, uint64_t block, bool sync,
                          Progress* progress, int extra_flags = O_TRUNC) {
  PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(path, O_WRONLY | O_CREAT | extra_flags));
  AlignedBuffer buf(static_cast<size_t>(std::min<uint64_t>(block, std::max<uint64_t>(size, 1))));
  uint64_t off = 0;
  while (off < size) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    fill_pattern(id, off, buf.data(), n);
    PENSTOCK_RETURN_IF_ERROR(write_all(fd.get(), buf.data(), n, path, off));
    off += n;
    progress->add(n, 1);
  }
  if (sync && ::fsync(fd.get()) != 0) return errno_status("fsync " + path, errno);
  return fd.close(path);
}

// Reads `path` sequentially in `block`-sized reads, verifying every byte; the file must hold
// exactly `size` bytes.
Status read_verify_file(const std::string& path, uint64_t id, uint64_t size, uint64_t block,
                        Progress* progress) {
  PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(path, O_RDONLY));
  AlignedBuffer buf(static_cast<size_t>(block));
  uint64_t off = 0;
  for (;;) {
    PENSTOCK_ASSIGN_OR_RETURN(size_t n, read_full(fd.get(), buf.data(), buf.size(), path, off, false));
    if (n == 0) break;
    if (off + n > size) {
      return make_error(Code::kCorrupt, "verification failed: " + path + " is longer than the " +
                                            std::to_string(size) + " bytes written (read up to offset " +
                                            std::to_string(off + n) + ")");
    }
    PENSTOCK_RETURN_IF_ERROR(verify_pattern(id, off, buf.data(), n, path));
    off += n;
    progress->add(n, 1);
    if (n < buf.size()) break;
  }
  if (off != size) {
    return make_error(Code::kCorrupt, "verification failed: " + path + " ends at offset " +
                                          std::to_string(off) + ", expected " + std::to_string(size) +
                                          " bytes (lost data)");
  }
  return fd.close(path);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

Status check_target_dir(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return errno_status(dir + " cannot be used (create the directory or mount the file system first)", errno);
  }
  if (!S_ISDIR(st.st_mode)) return make_error(Code::kNotDir, dir + " is not a directory");
  return Status::ok();
}

namespace {

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// ------------------------------------------------------------------------------ checkpoints

std::string shard_path(const std::string& ckpt, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/rank-%05d.shard", rank);
  return ckpt + buf;
}

// The newest complete checkpoint under dir with at least `ranks` shards of `size` bytes.
Result<std::string> find_checkpoint(const std::string& dir, int ranks, uint64_t size) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return errno_status("opendir " + dir, errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("ckpt-", 0) == 0) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.rbegin(), names.rend());
  for (const std::string& name : names) {
    const std::string ckpt = dir + "/" + name;
    if (!exists(ckpt + "/.complete")) continue;
    bool ok = true;
    for (int r = 0; r < ranks && ok; ++r) {
      Result<uint64_t> s = file_size(shard_path(ckpt, r));
      ok = s.has_value() && *s == size;
    }
    if (ok) return ckpt;
  }
  return make_error(Code::kNotFound, "no complete checkpoint with " + std::to_string(ranks) + " shards of " +
                                         format_size(size) + " in " + dir);
}

struct CkptStats {
  std::string path;
  uint64_t bytes = 0;
  double seconds = 0;
  double slowest_rank_gbps = 0;
  double cpu_seconds = -1;  // busy CPU of the whole machine over the burst; < 0 when unknown
};

// Busy CPU seconds of the machine between construction and elapsed() (/proc/stat); < 0 when
// /proc/stat cannot be read.
class CpuMeter {
 public:
  CpuMeter() : start_(machine_busy_cpu_seconds()) {}
  double elapsed() const {
    Result<double> now = machine_busy_cpu_seconds();
    if (!start_.has_value() || !now.has_value()) return -1;
    return std::max(0.0, *now - *start_);
  }

 private:
  Result<double> start_;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Adds cpu_s_per_gib (and its explanation) when the CPU time is known.
void add_cpu_metric(const CkptStats& st, RunResult* r) {
  if (st.cpu_seconds < 0 || st.bytes == 0) {
    r->notes.push_back("cpu_s_per_gib is missing: /proc/stat could not be read.");
    return;
  }
  r->metrics.push_back({"cpu_s_per_gib", st.cpu_seconds / (static_cast<double>(st.bytes) / kGiB), "CPU-s/GiB", true, true});
  r->notes.push_back("cpu_s_per_gib is machine-wide: busy CPU time (user+nice+system+irq+softirq+steal, /proc/stat) "
                     "of every process on this host during the transfer (the bench ranks, and the client and "
                     "servers when the cluster is local), per GiB moved: " +
                     format_number(st.cpu_seconds, 2) + " CPU-s for " +
                     format_number(static_cast<double>(st.bytes) / kGiB, 2) + " GiB.");
}

CkptStats aggregate(const std::vector<RankReport>& reports) {
  CkptStats st;
  double t0 = 1e300;
  double t1 = 0;
  st.slowest_rank_gbps = 1e300;
  for (const RankReport& r : reports) {
    st.bytes += r.bytes;
    t0 = std::min(t0, r.t_start);
    t1 = std::max(t1, r.t_end);
    st.slowest_rank_gbps = std::min(st.slowest_rank_gbps, gbps(r.bytes, r.t_end - r.t_start));
  }
  st.seconds = reports.empty() ? 0 : t1 - t0;
  if (reports.empty()) st.slowest_rank_gbps = 0;
  return st;
}

// A checkpoint write split in two so a workload can prepare it (fork the ranks, create the
// directory, check every rank sees it) and fire it later (mixed).
class CkptBurst {
 public:
  CkptBurst(const std::string& dir, int ranks, uint64_t size, uint64_t block, Progress* progress)
      : ranks_(ranks), size_(size), block_(block), progress_(progress) {
    path_ = dir + "/" + timestamp_name("ckpt");
  }

  // Forks the ranks; rank 0 creates the checkpoint directory, the others are released right
  // after its mkdir returned and must see it; then every rank waits at the start line.
  Status prepare() {
    const std::string path = path_;
    PENSTOCK_RETURN_IF_ERROR(group_.spawn(ranks_, [this, path](int rank, Barrier& barrier) -> Result<RankReport> {
      if (rank == 0 && ::mkdir(path.c_str(), 0755) != 0) {
        return errno_status("rank 0: mkdir of checkpoint directory " + path, errno);
      }
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      if (rank != 0) {
        struct stat st;
        if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
          const int err = errno;
          return make_error(Code::kNotFound,
                            "checkpoint directory " + path + " created by rank 0 is not visible to rank " +
                                std::to_string(rank) + " right after mkdir returned (stat: " +
                                (err != 0 ? std::strerror(err) : "not a directory") +
                                "): the file system does not show a new directory to other processes at once");
        }
      }
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      RankReport rep;
      rep.t_start = now_seconds();
      PENSTOCK_RETURN_IF_ERROR(write_pattern_file(shard_path(path, rank), kCkptIdBase | static_cast<uint64_t>(rank),
                                                  size_, block_, true, progress_));
      rep.t_end = now_seconds();
      rep.bytes = size_;
      rep.ops = (size_ + block_ - 1) / block_;
      return rep;
    }));
    PENSTOCK_RETURN_IF_ERROR(group_.wait_barrier().status());  // rank 0's mkdir has returned
    PENSTOCK_RETURN_IF_ERROR(group_.release());
    PENSTOCK_RETURN_IF_ERROR(group_.wait_barrier().status());  // everyone at the start line
    return Status::ok();
  }

  // Starts every rank at once and waits for all of them (write, fsync, close).
  Result<CkptStats> go(const std::string& label) {
    progress_->start(label, static_cast<uint64_t>(ranks_) * size_);
    CpuMeter cpu;
    Status s = group_.release();
    Result<std::vector<RankReport>> reports = s.is_ok() ? group_.finish() : Result<std::vector<RankReport>>(s);
    const double cpu_seconds = cpu.elapsed();
    progress_->stop();
    if (!reports.has_value()) {
      (void)remove_tree(path_);
      return reports.error();
    }
    CkptStats st = aggregate(*reports);
    st.path = path_;
    st.cpu_seconds = cpu_seconds;
    std::ofstream marker(path_ + "/.complete");
    marker << "ranks=" << ranks_ << " size=" << size_ << "\n";
    marker.close();
    if (!marker) return make_error(Code::kIo, "cannot write " + path_ + "/.complete");
    return st;
  }

  const std::string& path() const { return path_; }

 private:
  int ranks_;
  uint64_t size_;
  uint64_t block_;
  Progress* progress_;
  std::string path_;
  ProcessGroup group_;
};

Result<CkptStats> write_checkpoint(const RunContext& ctx, int ranks, uint64_t size, uint64_t block) {
  CkptBurst burst(ctx.dir, ranks, size, block, ctx.progress);
  PENSTOCK_RETURN_IF_ERROR(burst.prepare());
  return burst.go("ckpt-write");
}

// The newest suitable checkpoint, written first when there is none.
Result<std::string> checkpoint_for_reading(const RunContext& ctx, int ranks, uint64_t size, uint64_t block) {
  Result<std::string> found = find_checkpoint(ctx.dir, ranks, size);
  if (found.has_value()) return found;
  if (found.error().code() != Code::kNotFound) return found.error();
  std::fprintf(stderr, "penstock-bench: %s; writing one first (not timed)\n", found.error().message().c_str());
  PENSTOCK_ASSIGN_OR_RETURN(CkptStats st, write_checkpoint(ctx, ranks, size, block));
  return st.path;
}

// Reads shards with `ranks` processes; rank r reads shard shard_of(r). Every byte is verified.
Result<CkptStats> read_checkpoint(const RunContext& ctx, const Options& o, const std::string& ckpt, int ranks,
                                  const std::function<int(int)>& shard_of, const std::string& label) {
  ProcessGroup group;
  Progress* progress = ctx.progress;
  const uint64_t size = o.size;
  const uint64_t block = o.block;
  PENSTOCK_RETURN_IF_ERROR(group.spawn(ranks, [&](int rank, Barrier& barrier) -> Result<RankReport> {
    PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
    const int shard = shard_of(rank);
    RankReport rep;
    rep.t_start = now_seconds();
    PENSTOCK_RETURN_IF_ERROR(read_verify_file(shard_path(ckpt, shard), kCkptIdBase | static_cast<uint64_t>(shard),
                                              size, block, progress));
    rep.t_end = now_seconds();
    rep.bytes = size;
    rep.ops = (size + block - 1) / block;
    return rep;
  }));
  PENSTOCK_RETURN_IF_ERROR(group.wait_barrier().status());
  progress->start(label, static_cast<uint64_t>(ranks) * size);
  CpuMeter cpu;
  Status s = group.release();
  Result<std::vector<RankReport>> reports = s.is_ok() ? group.finish() : Result<std::vector<RankReport>>(s);
  const double cpu_seconds = cpu.elapsed();
  progress->stop();
  if (!reports.has_value()) return reports.error();
  CkptStats st = aggregate(*reports);
  st.path = ckpt;
  st.cpu_seconds = cpu_seconds;
  return st;
}

std::string model_text(double params) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", params);
  return buf;
}

// ---------------------------------------------------------------------------------- datasets

struct Dataset {
  std::vector<std::string> paths;
  uint64_t file_size = 0;
  static uint64_t id(size_t i) { return kTrainIdBase | i; }
};

std::string dataset_dir(const std::string& dir, const Options& o) {
  return dir + "/bench-train-" + std::to_string(o.files) + "x" + std::to_string(o.file_size);
}

// The record-shard dataset of --files x --file-size, created (in parallel, fsynced) if missing.
// A ".complete" marker is written last, so an interrupted creation is redone.
Result<Dataset> ensure_dataset(const RunContext& ctx, const Options& o) {
  Dataset ds;
  ds.file_size = o.file_size;
  const std::string root = dataset_dir(ctx.dir, o);
  for (int i = 0; i < o.files; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "/shard-%06d.rec", i);
    ds.paths.push_back(root + buf);
  }
  bool complete = exists(root + "/.complete");
  for (size_t i = 0; i < ds.paths.size() && complete; ++i) {
    Result<uint64_t> s = file_size(ds.paths[i]);
    complete = s.has_value() && *s == o.file_size;
  }
  if (complete) return ds;
  std::fprintf(stderr, "penstock-bench: creating dataset %s (%d x %s; once, reused by train-seq, train-rand, mixed, accel)\n",
               root.c_str(), o.files, format_size(o.file_size).c_str());
  ::unlink((root + "/.complete").c_str());
  PENSTOCK_RETURN_IF_ERROR(make_dirs(root));
  std::atomic<size_t> next{0};
  ctx.progress->start("create dataset", static_cast<uint64_t>(o.files) * o.file_size);
  Status s = run_threads(o.threads, [&](int, const std::atomic<bool>& stop) -> Status {
    for (size_t i = next++; i < ds.paths.size() && !stop.load(); i = next++) {
      PENSTOCK_RETURN_IF_ERROR(write_pattern_file(ds.paths[i], Dataset::id(i), o.file_size, 1 << 20, true, ctx.progress));
    }
    return Status::ok();
  });
  ctx.progress->stop();
  PENSTOCK_RETURN_IF_ERROR(s);
  std::ofstream marker(root + "/.complete");
  marker << "files=" << o.files << " file_size=" << o.file_size << "\n";
  marker.close();
  if (!marker) return make_error(Code::kIo, "cannot write " + root + "/.complete");
  return ds;
}

Status validate_dataset(const Options& o) {
  PENSTOCK_RETURN_IF_ERROR(check_positive(o.file_size, "--file-size"));
  return Status::ok();
}

Status validate_samples(const Options& o) {
  PENSTOCK_RETURN_IF_ERROR(validate_dataset(o));
  PENSTOCK_RETURN_IF_ERROR(check_positive(o.sample, "--sample"));
  if (o.sample > o.file_size) {
    return make_error(Code::kInvalid, "--sample (" + format_size(o.sample) + ") is larger than --file-size (" +
                                          format_size(o.file_size) + "): lower --sample or raise --file-size");
  }
  return Status::ok();
}

// Open descriptors of every dataset file, shared by the reader threads (pread is thread-safe).
Result<std::vector<Fd>> open_dataset(const Dataset& ds) {
  std::vector<Fd> fds;
  for (const std::string& p : ds.paths) {
    PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(p, O_RDONLY));
    fds.push_back(std::move(fd));
  }
  return fds;
}

// A random, 4 KiB-aligned sample position in the dataset.
struct SamplePos {
  size_t file;
  uint64_t offset;
};

SamplePos random_sample(std::mt19937_64& rng, const Dataset& ds, uint64_t sample) {
  const uint64_t slots = (ds.file_size - sample) / kPatternBlock + 1;
  SamplePos p;
  p.file = static_cast<size_t>(rng() % ds.paths.size());
  p.offset = (rng() % slots) * kPatternBlock;
  return p;
}

Status read_sample(const Dataset& ds, const std::vector<Fd>& fds, const SamplePos& p, uint64_t sample,
                   std::byte* buf) {
  PENSTOCK_ASSIGN_OR_RETURN(size_t n, read_full(fds[p.file].get(), buf, sample, ds.paths[p.file], p.offset, true));
  if (n != sample) {
    return make_error(Code::kCorrupt, "verification failed: " + ds.paths[p.file] + " ends early: read of " +
                                          std::to_string(sample) + " bytes at offset " + std::to_string(p.offset) +
                                          " returned " + std::to_string(n));
  }
  return Status::ok();
}

// Threads reading random samples until stopped; records (start time, latency) of each read.
class RandomReaders {
 public:
  struct Sample {
    double start;
    double latency;
  };

  RandomReaders(const Dataset& ds, const std::vector<Fd>& fds, const Options& o, Progress* progress)
      : ds_(ds), fds_(fds), o_(o), progress_(progress) {}
  ~RandomReaders() { stop_and_join(); }

  void start() {
    for (int t = 0; t < o_.threads; ++t) {
      threads_.emplace_back([this, t] {
        std::mt19937_64 rng(o_.seed * 1000003 + static_cast<uint64_t>(t));
        AlignedBuffer buf(static_cast<size_t>(o_.sample));
        std::vector<Sample> mine;
        Status s = Status::ok();
        while (!stop_.load(std::memory_order_relaxed)) {
          const SamplePos p = random_sample(rng, ds_, o_.sample);
          const double t0 = now_seconds();
          s = read_sample(ds_, fds_, p, o_.sample, buf.data());
          const double t1 = now_seconds();
          if (s.is_ok()) s = verify_pattern(Dataset::id(p.file), p.offset, buf.data(), o_.sample, ds_.paths[p.file]);
          if (!s.is_ok()) break;
          mine.push_back({t0, t1 - t0});
          progress_->add(o_.sample, 1);
        }
        std::lock_guard<std::mutex> lock(mu_);
        samples_.insert(samples_.end(), mine.begin(), mine.end());
        if (!s.is_ok() && error_.is_ok()) {
          error_ = s;
          failed_.store(true);
        }
      });
    }
  }

  // Sleeps up to `seconds`, returning early when a reader failed.
  void run_for(double seconds) const {
    const double end = now_seconds() + seconds;
    while (!failed_.load() && now_seconds() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(
          20, std::max<int64_t>(1, static_cast<int64_t>((end - now_seconds()) * 1000)))));
    }
  }

  void stop_and_join() {
    stop_.store(true);
    for (auto& th : threads_) th.join();
    threads_.clear();
  }

  bool failed() const { return failed_.load(); }
  // After stop_and_join: the first error, and every sample.
  const Status& error() const { return error_; }
  std::vector<Sample>& samples() { return samples_; }

 private:
  const Dataset& ds_;
  const std::vector<Fd>& fds_;
  const Options& o_;
  Progress* progress_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  Status error_ = Status::ok();
  std::vector<Sample> samples_;
};

// ================================================================================ ckpt-write

void ckpt_write_flags(CLI::App& app, Options& o) {
  add_ckpt_flags(app, o, 4, "write");
  add_model_flags(app, o);
  add_double(app, "--interval-min", &o.interval_min, "checkpoint interval judged against the 5% budget [minutes]");
  app.add_flag("--cleanup", o.cleanup, "remove the checkpoint after the run (default: keep it for ckpt-restore)");
}

Status validate_ckpt(const Options& o) {
  PENSTOCK_RETURN_IF_ERROR(check_positive(o.size, "--size"));
  PENSTOCK_RETURN_IF_ERROR(check_positive(o.block, "--block"));
  return Status::ok();
}

std::string describe_ckpt_write(const Options& o) {
  return std::to_string(o.ranks) + " ranks x " + format_size(o.size) + " shards, " + format_size(o.block) + " writes";
}

Result<RunResult> run_ckpt_write(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(CkptStats st, write_checkpoint(ctx, o.ranks, o.size, o.block));
  if (o.cleanup || !ctx.keep_checkpoint) PENSTOCK_RETURN_IF_ERROR(remove_tree(st.path));
  const double rate = gbps(st.bytes, st.seconds);
  const double model_bytes = o.params * kBytesPerParam;
  const double ckpt_s = rate > 0 ? model_bytes / (rate * 1e9) : 0;
  const double min_interval_min = ckpt_s / kBudgetShare / 60;
  const double share = ckpt_s / (o.interval_min * 60) * 100;
  const bool fits = share <= kBudgetShare * 100;
  RunResult r;
  r.metrics = {
      {"write_throughput", rate, "GB/s"},
      {"seconds", st.seconds, "s", true, true},
      {"slowest_rank_throughput", st.slowest_rank_gbps, "GB/s"},
      {"model_checkpoint_seconds", ckpt_s, "s", true, true},
      {"min_interval_for_5pct", min_interval_min, "min", false, true},
      {"share_of_interval", share, "%", false, true},
      {"fits_5pct_budget", fits ? 1.0 : 0.0, "bool", false},
  };
  add_cpu_metric(st, &r);
  r.notes.push_back("A " + model_text(o.params) + "-parameter model is " + format_number(model_bytes / 1e12, 2) +
                    " TB at 14 bytes/parameter: at " + format_number(rate, 2) + " GB/s it checkpoints in " +
                    format_number(ckpt_s, 0) + " s (" + format_number(ckpt_s / 60, 1) + " min).");
  r.notes.push_back("At a " + format_number(o.interval_min, 1) + "-minute interval that is " + format_number(share, 1) +
                    "% of the time: " + (fits ? "within" : "OVER") + " the 5% budget; 5% needs an interval of at least " +
                    format_number(min_interval_min, 1) + " min.");
  if (!(o.cleanup || !ctx.keep_checkpoint)) r.notes.push_back("Checkpoint kept in " + st.path + " (--cleanup removes it).");
  return r;
}

// ============================================================================== ckpt-restore

void ckpt_restore_flags(CLI::App& app, Options& o) {
  add_ckpt_flags(app, o, 4, "read");
  add_model_flags(app, o);
}

std::string describe_ckpt_restore(const Options& o) {
  return std::to_string(o.ranks) + " ranks x " + format_size(o.size) + " shards, " + format_size(o.block) + " reads";
}

Result<RunResult> run_ckpt_restore(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(std::string ckpt, checkpoint_for_reading(ctx, o.ranks, o.size, o.block));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  PENSTOCK_ASSIGN_OR_RETURN(CkptStats st, read_checkpoint(ctx, o, ckpt, o.ranks, [](int r) { return r; }, "ckpt-restore"));
  const double rate = gbps(st.bytes, st.seconds);
  const double restore_s = rate > 0 ? o.params * kBytesPerParam / (rate * 1e9) : 0;
  RunResult r;
  r.metrics = {
      {"read_throughput", rate, "GB/s"},
      {"seconds", st.seconds, "s", true, true},
      {"slowest_rank_throughput", st.slowest_rank_gbps, "GB/s"},
      {"model_restore_seconds", restore_s, "s", true, true},
  };
  add_cpu_metric(st, &r);
  r.notes.push_back("Read and verified " + ckpt + ".");
  r.notes.push_back("A " + model_text(o.params) + "-parameter model (14 bytes/parameter) restores in " +
                    format_number(restore_s, 0) + " s at this rate.");
  return r;
}

// ============================================================================ restore-fanout

void fanout_flags(CLI::App& app, Options& o) { add_ckpt_flags(app, o, 8, "read"); }

std::string describe_fanout(const Options& o) {
  return std::to_string(o.ranks) + " ranks reading one " + format_size(o.size) + " shard, " + format_size(o.block) +
         " reads";
}

Result<RunResult> run_fanout(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(std::string ckpt, checkpoint_for_reading(ctx, 1, o.size, o.block));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  PENSTOCK_ASSIGN_OR_RETURN(CkptStats st, read_checkpoint(ctx, o, ckpt, o.ranks, [](int) { return 0; }, "restore-fanout"));
  RunResult r;
  r.metrics = {
      {"read_throughput", gbps(st.bytes, st.seconds), "GB/s"},
      {"seconds", st.seconds, "s", true, true},
      {"slowest_rank_throughput", st.slowest_rank_gbps, "GB/s"},
  };
  add_cpu_metric(st, &r);
  r.notes.push_back("Every rank read and verified " + shard_path(ckpt, 0) + ".");
  return r;
}

// ================================================================================= train-seq

void train_seq_flags(CLI::App& app, Options& o) {
  add_dataset_flags(app, o);
  add_size(app, "--record-min", &o.record_min, "smallest record");
  add_size(app, "--record-max", &o.record_max, "largest record");
  app.add_option("--seed", o.seed, "seed of the record sizes [integer]")->capture_default_str();
}

Status validate_train_seq(const Options& o) {
  PENSTOCK_RETURN_IF_ERROR(validate_dataset(o));
  PENSTOCK_RETURN_IF_ERROR(check_positive(o.record_min, "--record-min"));
  if (o.record_min > o.record_max) return make_error(Code::kInvalid, "--record-min is above --record-max");
  return Status::ok();
}

std::string describe_train_seq(const Options& o) {
  return std::to_string(o.files) + " files x " + format_size(o.file_size) + ", " + std::to_string(o.threads) +
         " threads, " + format_size(o.record_min) + "-" + format_size(o.record_max) + " records";
}

Result<RunResult> run_train_seq(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(Dataset ds, ensure_dataset(ctx, o));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> records{0};
  ctx.progress->start("train-seq", static_cast<uint64_t>(o.files) * o.file_size);
  const double t0 = now_seconds();
  Status s = run_threads(o.threads, [&](int, const std::atomic<bool>& stop) -> Status {
    AlignedBuffer buf(static_cast<size_t>(o.record_max));
    for (size_t i = next++; i < ds.paths.size() && !stop.load(); i = next++) {
      // Record sizes depend on the file only, so every run reads the same records.
      std::mt19937_64 rng(o.seed * 1000003 + i);
      std::uniform_int_distribution<uint64_t> size_dist(o.record_min, o.record_max);
      PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(ds.paths[i], O_RDONLY));
      uint64_t off = 0;
      while (off < ds.file_size) {
        const size_t want = static_cast<size_t>(std::min(size_dist(rng), ds.file_size - off));
        PENSTOCK_ASSIGN_OR_RETURN(size_t n, read_full(fd.get(), buf.data(), want, ds.paths[i], off, false));
        if (n != want) {
          return make_error(Code::kCorrupt, "verification failed: " + ds.paths[i] + " ends at offset " +
                                                std::to_string(off + n) + ", expected " +
                                                std::to_string(ds.file_size) + " bytes");
        }
        PENSTOCK_RETURN_IF_ERROR(verify_pattern(Dataset::id(i), off, buf.data(), n, ds.paths[i]));
        off += n;
        records.fetch_add(1, std::memory_order_relaxed);
        ctx.progress->add(n, 1);
        if (stop.load(std::memory_order_relaxed)) break;
      }
      PENSTOCK_RETURN_IF_ERROR(fd.close(ds.paths[i]));
    }
    return Status::ok();
  });
  const double secs = now_seconds() - t0;
  ctx.progress->stop();
  PENSTOCK_RETURN_IF_ERROR(s);
  const uint64_t bytes = static_cast<uint64_t>(o.files) * o.file_size;
  RunResult r;
  r.metrics = {
      {"throughput", mbps(bytes, secs), "MB/s"},
      {"records_per_s", per_s(records.load(), secs), "records/s"},
      {"seconds", secs, "s", true, true},
      {"records", static_cast<double>(records.load()), "records", false},
  };
  return r;
}

// ================================================================================ train-rand

void train_rand_flags(CLI::App& app, Options& o) {
  add_dataset_flags(app, o);
  add_sample_flag(app, o);
  add_double(app, "--seconds", &o.seconds, "how long to read [seconds]");
  app.add_option("--seed", o.seed, "seed of the sample positions [integer]")->capture_default_str();
}

std::string describe_train_rand(const Options& o) {
  return std::to_string(o.files) + " files x " + format_size(o.file_size) + ", " + std::to_string(o.threads) +
         " threads, " + format_size(o.sample) + " samples, " + format_number(o.seconds, 1) + " s";
}

Result<RunResult> run_train_rand(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(Dataset ds, ensure_dataset(ctx, o));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  PENSTOCK_ASSIGN_OR_RETURN(std::vector<Fd> fds, open_dataset(ds));
  RandomReaders readers(ds, fds, o, ctx.progress);
  ctx.progress->start("train-rand", 0);
  const double t0 = now_seconds();
  readers.start();
  readers.run_for(o.seconds);
  readers.stop_and_join();
  const double secs = now_seconds() - t0;
  ctx.progress->stop();
  PENSTOCK_RETURN_IF_ERROR(readers.error());
  std::vector<double> lat;
  lat.reserve(readers.samples().size());
  for (const auto& s : readers.samples()) lat.push_back(s.latency * 1e3);
  const uint64_t n = lat.size();
  RunResult r;
  r.metrics = {
      {"samples_per_s", per_s(n, secs), "samples/s"},
      {"throughput", mbps(n * o.sample, secs), "MB/s"},
      {"p50_latency", percentile(lat, 0.50), "ms", true, true},
      {"p99_latency", percentile(lat, 0.99), "ms", true, true},
      {"samples", static_cast<double>(n), "samples", false},
  };
  return r;
}

// =============================================================================== train-small

void train_small_flags(CLI::App& app, Options& o) {
  o.files = 20000;
  o.file_size = 100ULL << 10;
  add_int(app, "--files", &o.files, "small files to create and read [count]", 1, 100000000);
  add_size(app, "--file-size", &o.file_size, "size of each small file");
  add_int(app, "--dirs", &o.dirs, "directories the files are spread over [count]", 1, 1000000);
  add_int(app, "--threads", &o.threads, "threads creating and reading files [count]", 1, 1024);
  app.add_option("--seed", o.seed, "seed of the shuffled read order [integer]")->capture_default_str();
  app.add_flag("--keep", o.keep, "keep the files (default: remove them after the run)");
}

std::string describe_train_small(const Options& o) {
  return std::to_string(o.files) + " files x " + format_size(o.file_size) + " in " + std::to_string(o.dirs) +
         " dirs, " + std::to_string(o.threads) + " threads";
}

Result<RunResult> run_train_small(const RunContext& ctx, const Options& o) {
  const std::string root = ctx.dir + "/" + timestamp_name("bench-small");
  std::vector<std::string> paths;
  paths.reserve(static_cast<size_t>(o.files));
  for (int i = 0; i < o.files; ++i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "/d%04d/f%08d", i % o.dirs, i);
    paths.push_back(root + buf);
  }
  PENSTOCK_RETURN_IF_ERROR(make_dirs(root));
  auto body = [&]() -> Result<RunResult> {
    for (int d = 0; d < o.dirs; ++d) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "/d%04d", d);
      if (::mkdir((root + buf).c_str(), 0755) != 0) return errno_status("mkdir " + root + buf, errno);
    }
    const size_t fsize = static_cast<size_t>(o.file_size);
    // Create.
    std::atomic<size_t> next{0};
    ctx.progress->start("train-small create", static_cast<uint64_t>(o.files) * o.file_size);
    double t0 = now_seconds();
    Status s = run_threads(o.threads, [&](int, const std::atomic<bool>& stop) -> Status {
      AlignedBuffer buf(fsize);
      for (size_t i = next++; i < paths.size() && !stop.load(); i = next++) {
        PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(paths[i], O_WRONLY | O_CREAT | O_EXCL));
        fill_pattern(kSmallIdBase | i, 0, buf.data(), fsize);
        PENSTOCK_RETURN_IF_ERROR(write_all(fd.get(), buf.data(), fsize, paths[i], 0));
        PENSTOCK_RETURN_IF_ERROR(fd.close(paths[i]));
        ctx.progress->add(fsize, 1);
      }
      return Status::ok();
    });
    const double create_s = now_seconds() - t0;
    ctx.progress->stop();
    PENSTOCK_RETURN_IF_ERROR(s);
    PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
    // Read in a shuffled order.
    std::vector<size_t> order(paths.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::mt19937_64 rng(o.seed);
    std::shuffle(order.begin(), order.end(), rng);
    next = 0;
    ctx.progress->start("train-small read", static_cast<uint64_t>(o.files) * o.file_size);
    t0 = now_seconds();
    s = run_threads(o.threads, [&](int, const std::atomic<bool>& stop) -> Status {
      AlignedBuffer buf(fsize + 1);
      for (size_t k = next++; k < order.size() && !stop.load(); k = next++) {
        const size_t i = order[k];
        PENSTOCK_ASSIGN_OR_RETURN(Fd fd, open_file(paths[i], O_RDONLY));
        PENSTOCK_ASSIGN_OR_RETURN(size_t n, read_full(fd.get(), buf.data(), fsize + 1, paths[i], 0, false));
        if (n != fsize) {
          return make_error(Code::kCorrupt, "verification failed: " + paths[i] + " holds " + std::to_string(n) +
                                                " bytes, expected " + std::to_string(fsize));
        }
        PENSTOCK_RETURN_IF_ERROR(verify_pattern(kSmallIdBase | i, 0, buf.data(), n, paths[i]));
        PENSTOCK_RETURN_IF_ERROR(fd.close(paths[i]));
        ctx.progress->add(n, 1);
      }
      return Status::ok();
    });
    const double read_s = now_seconds() - t0;
    ctx.progress->stop();
    PENSTOCK_RETURN_IF_ERROR(s);
    const uint64_t bytes = static_cast<uint64_t>(o.files) * o.file_size;
    RunResult r;
    r.metrics = {
        {"create_files_per_s", per_s(static_cast<uint64_t>(o.files), create_s), "files/s"},
        {"read_files_per_s", per_s(static_cast<uint64_t>(o.files), read_s), "files/s"},
        {"create_throughput", mbps(bytes, create_s), "MB/s", false},
        {"read_throughput", mbps(bytes, read_s), "MB/s"},
        {"create_seconds", create_s, "s", false, true},
        {"read_seconds", read_s, "s", false, true},
    };
    return r;
  };
  Result<RunResult> r = body();
  if (!o.keep || !r.has_value()) {
    const Status rm = remove_tree(root);
    if (r.has_value() && !rm.is_ok()) return rm;
  } else {
    r->notes.push_back("Files kept in " + root + ".");
  }
  return r;
}

// ====================================================================================== meta

void meta_flags(CLI::App& app, Options& o) {
  o.files = 10000;
  add_int(app, "--procs", &o.procs, "processes (forked) working in the one shared directory [count]", 1, 1024);
  add_int(app, "--files", &o.files, "empty files each process creates, stats and unlinks [count]", 1, 100000000);
}

std::string describe_meta(const Options& o) {
  return std::to_string(o.procs) + " processes x " + std::to_string(o.files) + " files in one directory";
}

Result<RunResult> run_meta(const RunContext& ctx, const Options& o) {
  const std::string root = ctx.dir + "/" + timestamp_name("bench-meta");
  if (::mkdir(root.c_str(), 0755) != 0) return errno_status("mkdir " + root, errno);
  const int files = o.files;
  const uint64_t expect_entries = static_cast<uint64_t>(o.procs) * static_cast<uint64_t>(files);
  Progress* progress = ctx.progress;
  auto body = [&]() -> Result<RunResult> {
    ProcessGroup group;
    PENSTOCK_RETURN_IF_ERROR(group.spawn(o.procs, [&](int rank, Barrier& barrier) -> Result<RankReport> {
      auto name = [&](int i) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "/p%04d-f%08d", rank, i);
        return root + buf;
      };
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      for (int i = 0; i < files; ++i) {
        const std::string p = name(i);
        const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) return errno_status("create " + p, errno);
        if (::close(fd) != 0) return errno_status("close " + p, errno);
        progress->add(0, 1);
      }
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      for (int i = 0; i < files; ++i) {
        const std::string p = name(i);
        struct stat st;
        if (::stat(p.c_str(), &st) != 0) return errno_status("stat " + p, errno);
        if (!S_ISREG(st.st_mode) || st.st_size != 0) {
          return make_error(Code::kCorrupt, "verification failed: " + p + " is not an empty regular file (size " +
                                                std::to_string(st.st_size) + ")");
        }
        progress->add(0, 1);
      }
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      DIR* d = ::opendir(root.c_str());
      if (d == nullptr) return errno_status("opendir " + root, errno);
      uint64_t seen = 0;
      errno = 0;
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++seen;
        progress->add(0, 1);
      }
      const int err = errno;
      ::closedir(d);
      if (err != 0) return errno_status("readdir " + root, err);
      if (seen != expect_entries) {
        return make_error(Code::kCorrupt, "verification failed: listing " + root + " from process " +
                                              std::to_string(rank) + " shows " + std::to_string(seen) +
                                              " entries, expected " + std::to_string(expect_entries));
      }
      PENSTOCK_RETURN_IF_ERROR(barrier.arrive_and_wait());
      for (int i = 0; i < files; ++i) {
        const std::string p = name(i);
        if (::unlink(p.c_str()) != 0) return errno_status("unlink " + p, errno);
        progress->add(0, 1);
      }
      RankReport rep;
      rep.t_end = now_seconds();
      rep.ops = static_cast<uint64_t>(files);
      return rep;
    }));
    double phase_s[4];
    const char* const labels[] = {"meta create", "meta stat", "meta list", "meta unlink"};
    PENSTOCK_RETURN_IF_ERROR(group.wait_barrier().status());
    for (int phase = 0; phase < 3; ++phase) {
      if (phase > 0) PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));  // stat and list start cold
      progress->start(labels[phase], 0);
      const double t0 = now_seconds();
      PENSTOCK_RETURN_IF_ERROR(group.release());
      Result<double> t1 = group.wait_barrier();
      progress->stop();
      PENSTOCK_RETURN_IF_ERROR(t1.status());
      phase_s[phase] = *t1 - t0;
    }
    progress->start(labels[3], 0);
    const double t0 = now_seconds();
    PENSTOCK_RETURN_IF_ERROR(group.release());
    Result<std::vector<RankReport>> reports = group.finish();
    progress->stop();
    if (!reports.has_value()) return reports.error();
    double t1 = t0;
    for (const RankReport& rep : *reports) t1 = std::max(t1, rep.t_end);
    phase_s[3] = t1 - t0;
    RunResult r;
    r.metrics = {
        {"create_ops_per_s", per_s(expect_entries, phase_s[0]), "ops/s"},
        {"stat_ops_per_s", per_s(expect_entries, phase_s[1]), "ops/s"},
        {"list_entries_per_s", per_s(expect_entries * static_cast<uint64_t>(o.procs), phase_s[2]), "entries/s"},
        {"unlink_ops_per_s", per_s(expect_entries, phase_s[3]), "ops/s"},
    };
    r.notes.push_back("list: each process read the whole directory of " + std::to_string(expect_entries) +
                      " entries once.");
    return r;
  };
  Result<RunResult> r = body();
  if (r.has_value()) {
    if (::rmdir(root.c_str()) != 0) return errno_status("rmdir " + root + " (should be empty after unlink)", errno);
  } else {
    (void)remove_tree(root);
  }
  return r;
}

// ===================================================================================== mixed

void mixed_flags(CLI::App& app, Options& o) {
  add_dataset_flags(app, o);
  add_sample_flag(app, o);
  add_ckpt_flags(app, o, 4, "checkpoint write");
  add_double(app, "--warmup", &o.warmup, "training reads alone before the checkpoint burst [seconds]");
  app.add_option("--seed", o.seed, "seed of the sample positions [integer]")->capture_default_str();
}

Status validate_mixed(const Options& o) {
  PENSTOCK_RETURN_IF_ERROR(validate_samples(o));
  return validate_ckpt(o);
}

std::string describe_mixed(const Options& o) {
  return std::to_string(o.threads) + " threads x " + format_size(o.sample) + " samples over " + std::to_string(o.files) +
         " x " + format_size(o.file_size) + "; burst of " + std::to_string(o.ranks) + " ranks x " + format_size(o.size) +
         " after " + format_number(o.warmup, 1) + " s";
}

Result<RunResult> run_mixed(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(Dataset ds, ensure_dataset(ctx, o));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  PENSTOCK_ASSIGN_OR_RETURN(std::vector<Fd> fds, open_dataset(ds));
  // Fork the checkpoint ranks before any reader thread exists.
  CkptBurst burst(ctx.dir, o.ranks, o.size, o.block, ctx.progress);
  PENSTOCK_RETURN_IF_ERROR(burst.prepare());
  RandomReaders readers(ds, fds, o, ctx.progress);
  const double t_begin = now_seconds();
  readers.start();
  ctx.progress->start("mixed warm-up", 0);
  readers.run_for(o.warmup);
  ctx.progress->stop();
  if (readers.failed()) {
    readers.stop_and_join();
    return readers.error();
  }
  const double t_burst = now_seconds();
  Result<CkptStats> st = burst.go("mixed checkpoint burst");
  const double t_burst_end = now_seconds();
  readers.stop_and_join();
  (void)remove_tree(burst.path());
  PENSTOCK_RETURN_IF_ERROR(readers.error());
  if (!st.has_value()) return st.error();
  std::vector<double> before;
  std::vector<double> during;
  for (const auto& s : readers.samples()) {
    if (s.start >= t_begin && s.start < t_burst) before.push_back(s.latency * 1e3);
    else if (s.start >= t_burst && s.start < t_burst_end) during.push_back(s.latency * 1e3);
  }
  const double before_s = t_burst - t_begin;
  const double during_s = t_burst_end - t_burst;
  const double n_before = static_cast<double>(before.size());
  const double n_during = static_cast<double>(during.size());
  const double p99_before = percentile(before, 0.99);
  const double p99_during = percentile(during, 0.99);
  RunResult r;
  r.metrics = {
      {"p50_latency_before", percentile(before, 0.50), "ms", true, true},
      {"p50_latency_during", percentile(during, 0.50), "ms", true, true},
      {"p99_latency_before", p99_before, "ms", true, true},
      {"p99_latency_during", p99_during, "ms", true, true},
      {"p99_slowdown", p99_before > 0 ? p99_during / p99_before : 0, "x", true, true},
      {"samples_per_s_before", before_s > 0 ? n_before / before_s : 0, "samples/s"},
      {"samples_per_s_during", during_s > 0 ? n_during / during_s : 0, "samples/s"},
      {"ckpt_write_throughput", gbps(st->bytes, st->seconds), "GB/s"},
      {"ckpt_seconds", st->seconds, "s", false, true},
  };
  r.notes.push_back("before: the " + format_number(before_s, 1) + " s warm-up; during: the " + format_number(during_s, 1) +
                    " s checkpoint burst (" + std::to_string(during.size()) + " samples). The checkpoint is removed.");
  if (during.size() < 100) {
    r.notes.push_back("Few samples during the burst: raise --size or --ranks for a steadier p99.");
  }
  return r;
}

// ===================================================================================== accel

void accel_flags(CLI::App& app, Options& o) {
  add_dataset_flags(app, o);
  add_sample_flag(app, o);
  add_int(app, "--batch", &o.batch, "samples per batch [count]", 1, 1 << 20);
  add_double(app, "--compute-ms", &o.compute_ms, "emulated compute per step [milliseconds]");
  add_int(app, "--steps", &o.steps, "training steps [count]", 1, 100000000);
  add_int(app, "--prefetch", &o.prefetch, "batches each reader may prepare ahead [count]", 1, 1024);
  app.add_option("--seed", o.seed, "seed of the sample positions [integer]")->capture_default_str();
}

std::string describe_accel(const Options& o) {
  return std::to_string(o.threads) + " readers, batch " + std::to_string(o.batch) + " x " + format_size(o.sample) +
         ", " + format_number(o.compute_ms, 1) + " ms compute, " + std::to_string(o.steps) + " steps";
}

Result<RunResult> run_accel(const RunContext& ctx, const Options& o) {
  PENSTOCK_ASSIGN_OR_RETURN(Dataset ds, ensure_dataset(ctx, o));
  PENSTOCK_RETURN_IF_ERROR(maybe_drop_caches(o, ctx.dir));
  PENSTOCK_ASSIGN_OR_RETURN(std::vector<Fd> fds, open_dataset(ds));
  const int steps = o.steps;
  const int window = o.threads * o.prefetch;  // batches in flight or ready, like a PyTorch DataLoader
  std::mutex mu;
  std::condition_variable cv;
  int next_batch = 0;   // guarded by mu
  int consumed = 0;     // guarded by mu
  bool stop = false;    // guarded by mu
  Status error = Status::ok();  // guarded by mu
  std::vector<bool> ready(static_cast<size_t>(steps), false);  // guarded by mu
  std::vector<std::thread> workers;
  ctx.progress->start("accel", static_cast<uint64_t>(steps) * static_cast<uint64_t>(o.batch) * o.sample);
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&] {
      AlignedBuffer buf(static_cast<size_t>(o.sample));
      for (;;) {
        int idx;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || next_batch >= steps || next_batch < consumed + window; });
          if (stop || next_batch >= steps) return;
          idx = next_batch++;
        }
        Status s = Status::ok();
        for (int k = 0; k < o.batch && s.is_ok(); ++k) {
          std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(idx) * 65537 + static_cast<uint64_t>(k));
          const SamplePos p = random_sample(rng, ds, o.sample);
          s = read_sample(ds, fds, p, o.sample, buf.data());
          if (s.is_ok()) s = verify_pattern(Dataset::id(p.file), p.offset, buf.data(), o.sample, ds.paths[p.file]);
          if (s.is_ok()) ctx.progress->add(o.sample, 1);
        }
        std::lock_guard<std::mutex> lock(mu);
        if (!s.is_ok()) {
          if (error.is_ok()) error = s;
          stop = true;
        } else {
          ready[static_cast<size_t>(idx)] = true;
        }
        cv.notify_all();
      }
    });
  }
  const double t0 = now_seconds();
  double compute_s = 0;
  double stall_s = 0;
  for (int step = 0; step < steps; ++step) {
    const double w0 = now_seconds();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || ready[static_cast<size_t>(step)]; });
      if (stop) break;
      consumed = step + 1;
    }
    cv.notify_all();
    const double c0 = now_seconds();
    stall_s += c0 - w0;
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.compute_ms));
    compute_s += now_seconds() - c0;
  }
  const double wall_s = now_seconds() - t0;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (auto& w : workers) w.join();
  ctx.progress->stop();
  PENSTOCK_RETURN_IF_ERROR(error);
  const double au = wall_s > 0 ? compute_s / wall_s * 100 : 0;
  const uint64_t samples = static_cast<uint64_t>(steps) * static_cast<uint64_t>(o.batch);
  RunResult r;
  r.metrics = {
      {"accelerator_utilization", au, "%"},
      {"meets_mlperf_90pct", au >= 90 ? 1.0 : 0.0, "bool", false},
      {"stall_seconds", stall_s, "s", true, true},
      {"wall_seconds", wall_s, "s", false, true},
      {"samples_per_s", per_s(samples, wall_s), "samples/s"},
      {"throughput", mbps(samples * o.sample, wall_s), "MB/s"},
  };
  r.notes.push_back("Accelerator utilization " + format_number(au, 1) + "% (compute " + format_number(compute_s, 2) +
                    " s of " + format_number(wall_s, 2) + " s wall): " +
                    (au >= 90 ? "meets" : "BELOW") + " the MLPerf Storage bar of 90%.");
  return r;
}

Status validate_none(const Options&) { return Status::ok(); }

}  // namespace

void add_common_flags(CLI::App& app, Options& o) {
  app.add_flag("--json", o.json, "print one JSON object per result line instead of the table");
  app.add_flag("--drop-caches", o.drop_caches,
               "start every read phase cold: sync; on a Penstock mount also drop the mount's chunk cache, the "
               "meta server's record cache and every data server's caches (setxattr user.penstock.drop_caches: "
               "root or the mount's owner); "
               "then write 3 to /proc/sys/vm/drop_caches (root)");
}

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> all = {
      {"ckpt-write", "R rank processes each write a checkpoint shard, fsync, close (aggregate GB/s)",
       ckpt_write_flags, validate_ckpt, describe_ckpt_write, run_ckpt_write},
      {"ckpt-restore", "R rank processes read their shards back, verified (aggregate GB/s)", ckpt_restore_flags,
       validate_ckpt, describe_ckpt_restore, run_ckpt_restore},
      {"restore-fanout", "R rank processes all read the same shard (aggregate GB/s)", fanout_flags, validate_ckpt,
       describe_fanout, run_fanout},
      {"train-seq", "readers take whole record shards and read 64-256 KiB records in order (MB/s, records/s)",
       train_seq_flags, validate_train_seq, describe_train_seq, run_train_seq},
      {"train-rand", "random 128 KiB sample reads over the dataset (samples/s, p50/p99 latency)", train_rand_flags,
       validate_samples, describe_train_rand, run_train_rand},
      {"train-small", "create many small files, then read them whole in shuffled order (files/s)",
       train_small_flags, [](const Options& o) { return check_positive(o.file_size, "--file-size"); },
       describe_train_small, run_train_small},
      {"meta", "P processes create, stat, list, unlink empty files in one directory (ops/s per phase)", meta_flags,
       validate_none, describe_meta, run_meta},
      {"mixed", "train-rand runs while a ckpt-write burst happens (p99 before vs during, ckpt GB/s)", mixed_flags,
       validate_mixed, describe_mixed, run_mixed},
      {"accel", "data loader emulation: accelerator utilization of compute vs waiting for batches", accel_flags,
       validate_samples, describe_accel, run_accel},
  };
  return all;
}

const Workload* find_workload(std::string_view name) {
  for (const Workload& w : workloads()) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

}  // namespace penstock::bench
