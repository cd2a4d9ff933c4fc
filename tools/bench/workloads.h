// The workloads of penstock-bench (docs/bench.md, /work/shared/WORKLOADS.md): their options,
// their flags, and the code that runs each one against a directory with plain POSIX I/O.
// Ownership: a Workload is a static table entry; Options and RunResult are values owned by the
// caller. Thread-safety: run() may start threads and fork processes internally, but one run must
// not overlap another in the same process (the rank processes share the progress counters).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"
#include "tools/bench/runtime.h"

namespace CLI {
class App;
}

namespace penstock::bench {

// Every flag of every workload. Each workload registers only the flags it uses and sets their
// defaults when it registers them (the same flag can default differently per workload).
struct Options {
  bool json = false;
  bool drop_caches = false;
  uint64_t seed = 1;
  bool keep = false;  // train-small: keep the files it made
  // Checkpoints (ckpt-write, ckpt-restore, restore-fanout, mixed).
  int ranks = 4;
  uint64_t size = 1ULL << 30;
  uint64_t block = 1ULL << 20;
  double params = 175e9;
  double interval_min = 30;
  bool cleanup = false;
  // Datasets (train-seq, train-rand, mixed, accel, train-small).
  int files = 32;
  uint64_t file_size = 128ULL << 20;
  int threads = 4;
  uint64_t record_min = 64ULL << 10;
  uint64_t record_max = 256ULL << 10;
  uint64_t sample = 128ULL << 10;
  double seconds = 20;
  int dirs = 20;
  // meta
  int procs = 4;
  // mixed
  double warmup = 5;
  // accel
  int batch = 32;
  double compute_ms = 50;
  int steps = 100;
  int prefetch = 2;
};

// One figure of a run.
struct Metric {
  std::string name;   // snake_case, stable: it is the JSON "metric"
  double value = 0;
  std::string unit;   // "GB/s" (1e9 bytes/s), "MB/s" (1e6), "ms", "s", "ops/s", "%", ...
  bool plot = true;   // drawn by compare --plot
  bool lower_is_better = false;
};

struct RunResult {
  std::vector<Metric> metrics;
  std::vector<std::string> notes;  // sentences printed under the human table
};

// Where and how one run happens.
struct RunContext {
  std::string dir;             // the directory under test (exists)
  Progress* progress;          // never null
  bool keep_checkpoint = true; // ckpt-write: false removes its checkpoint (compare's earlier runs)
};

struct Workload {
  std::string_view name;
  std::string_view summary;
  // Registers the workload's flags on `app`, bound to `o`, setting their defaults.
  void (*add_flags)(CLI::App& app, Options& o);
  // Checks flag combinations after parsing; kInvalid with advice.
  Status (*validate)(const Options& o);
  // "4 ranks x 1 GiB, 1 MiB writes": the sizes, for titles.
  std::string (*describe)(const Options& o);
  // Runs once on ctx.dir. Errors: I/O failures, verification failures (kCorrupt), bad setup.
  Result<RunResult> (*run)(const RunContext& ctx, const Options& o);
};

// All workloads in the order of the help text.
const std::vector<Workload>& workloads();
// The workload called `name`, or nullptr.
const Workload* find_workload(std::string_view name);

// Ok when `dir` exists and is a directory; otherwise an error saying what to do.
Status check_target_dir(const std::string& dir);

// Registers the flags every workload has (--json, --drop-caches, --seed).
void add_common_flags(CLI::App& app, Options& o);

}  // namespace penstock::bench
