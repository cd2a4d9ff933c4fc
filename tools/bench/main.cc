// penstock-bench: the AI storage workloads of docs/bench.md, run against any directory with plain
// POSIX I/O, alone or side by side (`compare`). Exit status: 0 success, 1 error, 2 verification
// failure (a byte read back was not the byte written).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/bench/report.h"
#include "tools/bench/workloads.h"

namespace penstock::bench {
namespace {

constexpr int kExitError = 1;
constexpr int kExitCorrupt = 2;

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "penstock-bench: AI storage workloads against any directory (a Penstock mount, a local\n"
               "directory, another file system's mount), with every byte read verified.\n\n"
               "Usage:\n"
               "  penstock-bench WORKLOAD DIR [flags]\n"
               "  penstock-bench compare WORKLOAD DIR1 DIR2 ... [--runs N] [--plot FILE.svg] [workload flags]\n"
               "  penstock-bench WORKLOAD --help       flags of one workload, with units and defaults\n\n"
               "Workloads:\n");
  for (const Workload& w : workloads()) {
    std::fprintf(out, "  %-15.*s %.*s\n", static_cast<int>(w.name.size()), w.name.data(),
                 static_cast<int>(w.summary.size()), w.summary.data());
  }
  std::fprintf(out,
               "\nEvery workload takes --json (one JSON object per result) and --drop-caches (cold reads;\n"
               "needs root). Sizes take K/M/G/T suffixes (powers of 1024); GB/s and MB/s are 10^9 and\n"
               "10^6 bytes/s. Exit status: 0 ok, 1 error, 2 verification failure.\n\n"
               "Examples:\n"
               "  penstock-bench ckpt-write /mnt/penstock --ranks 8 --size 2G\n"
               "  penstock-bench compare train-rand /mnt/penstock /mnt/nfs --runs 3 --plot rand.svg\n");
}

int exit_code_for(const Status& s) { return s.code() == Code::kCorrupt ? kExitCorrupt : kExitError; }

// Parses argv (argv[0] is the program-name slot) with `app`; returns -1 to go on, else an exit code.
int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

int run_single(const Workload& w, int argc, char** argv) {
  Options o;
  std::string dir;
  CLI::App app(std::string(w.summary), "penstock-bench " + std::string(w.name));
  app.add_option("DIR", dir, "directory to run in: a Penstock mount, a local directory, any mount")->required();
  add_common_flags(app, o);
  w.add_flags(app, o);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  Status s = w.validate(o);
  if (s.is_ok()) s = check_target_dir(dir);
  if (!s.is_ok()) {
    std::fprintf(stderr, "penstock-bench %.*s: %s\n", static_cast<int>(w.name.size()), w.name.data(), s.message().c_str());
    return kExitError;
  }
  Progress progress(isatty(STDERR_FILENO) == 1);
  RunContext ctx{dir, &progress, true};
  Result<RunResult> r = w.run(ctx, o);
  if (!r.has_value()) {
    std::fprintf(stderr, "penstock-bench %.*s on %s FAILED: %s\n", static_cast<int>(w.name.size()), w.name.data(),
                 dir.c_str(), r.error().to_string().c_str());
    return exit_code_for(r.error());
  }
  if (const int drops = penstock_cache_drops(); drops > 0) {
    r->notes.push_back("--drop-caches: Penstock caches dropped " + std::to_string(drops) +
                       " time(s) (the mount's chunk cache, the meta server's record and block caches, and every data "
                       "server's open files and page cache), "
                       "besides the kernel page cache.");
  }
  if (o.json) {
    print_json(stdout, w.name, dir, *r);
  } else {
    print_table(stdout, w.name, dir, w.describe(o), *r);
  }
  return 0;
}

int run_compare(int argc, char** argv) {
  // argv[0] is "compare", argv[1] the workload.
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "Usage: penstock-bench compare WORKLOAD DIR1 DIR2 ... [--runs N] [--plot FILE.svg] [workload flags]\n"
                 "Runs WORKLOAD on the directories interleaved (DIR1 DIR2 ... DIR1 DIR2 ..., N runs each), prints the\n"
                 "median of every metric per directory and its ratio to DIR1, and with --plot writes an SVG bar\n"
                 "chart. `penstock-bench compare WORKLOAD --help` lists the workload's flags.\n");
    return argc < 2 ? kExitError : 0;
  }
  const Workload* w = find_workload(argv[1]);
  if (w == nullptr) {
    std::fprintf(stderr, "penstock-bench compare: unknown workload '%s': run penstock-bench --help for the list\n", argv[1]);
    return kExitError;
  }
  Options o;
  std::vector<std::string> dirs;
  int runs = 3;
  std::string plot;
  CLI::App app("Runs " + std::string(w->name) + " on every DIR interleaved and compares the medians",
               "penstock-bench compare " + std::string(w->name));
  app.add_option("DIR", dirs, "directories to compare; the first is the baseline of the ratios")->required();
  app.add_option("--runs", runs, "runs per directory, interleaved [count]")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--plot", plot, "write an SVG bar chart of the medians to this file [path]");
  add_common_flags(app, o);
  w->add_flags(app, o);
  if (const int rc = parse(app, argc - 1, argv + 1); rc >= 0) return rc;
  Status s = w->validate(o);
  for (size_t d = 0; d < dirs.size() && s.is_ok(); ++d) s = check_target_dir(dirs[d]);
  if (!s.is_ok()) {
    std::fprintf(stderr, "penstock-bench compare %.*s: %s\n", static_cast<int>(w->name.size()), w->name.data(),
                 s.message().c_str());
    return kExitError;
  }
  Progress progress(isatty(STDERR_FILENO) == 1);
  CompareResult c;
  c.workload = std::string(w->name);
  c.sizes = w->describe(o);
  c.runs = runs;
  c.dirs = dirs;
  std::vector<std::vector<std::vector<double>>> values;  // [metric][dir][run]
  for (int run = 0; run < runs; ++run) {
    for (size_t d = 0; d < dirs.size(); ++d) {
      std::fprintf(stderr, "penstock-bench compare: run %d/%d on %s\n", run + 1, runs, dirs[d].c_str());
      RunContext ctx{dirs[d], &progress, run == runs - 1};
      Result<RunResult> r = w->run(ctx, o);
      if (!r.has_value()) {
        std::fprintf(stderr, "penstock-bench compare %.*s: run %d on %s FAILED: %s\n", static_cast<int>(w->name.size()),
                     w->name.data(), run + 1, dirs[d].c_str(), r.error().to_string().c_str());
        return exit_code_for(r.error());
      }
      if (c.metrics.empty()) {
        c.metrics = r->metrics;
        values.assign(c.metrics.size(), std::vector<std::vector<double>>(dirs.size()));
      }
      std::string summary;
      for (size_t m = 0; m < c.metrics.size() && m < r->metrics.size(); ++m) {
        values[m][d].push_back(r->metrics[m].value);
        if (r->metrics[m].plot) summary += "  " + r->metrics[m].name + "=" + format_value(r->metrics[m].value, r->metrics[m].unit) + " " + r->metrics[m].unit;
      }
      std::fprintf(stderr, "   %s\n", summary.c_str());
    }
  }
  c.median.assign(c.metrics.size(), std::vector<double>(dirs.size()));
  for (size_t m = 0; m < c.metrics.size(); ++m) {
    for (size_t d = 0; d < dirs.size(); ++d) c.median[m][d] = median(values[m][d]);
  }
  if (o.json) {
    print_compare_json(stdout, c);
  } else {
    print_compare_table(stdout, c);
    for (const Metric& m : c.metrics) {
      if (m.name == "cpu_s_per_gib") {
        std::fprintf(stdout, "cpu_s_per_gib is machine-wide: busy CPU of every process on this host (bench ranks, "
                             "and client and servers when the cluster is local) per GiB moved.\n");
      }
    }
    if (penstock_cache_drops() > 0) {
      std::fprintf(stdout, "--drop-caches: Penstock caches (mount chunk cache, meta server, data servers) dropped %d time(s).\n",
                   penstock_cache_drops());
    }
  }
  if (!plot.empty()) {
    std::ofstream out(plot);
    out << render_svg(c);
    out.close();
    if (!out) {
      std::fprintf(stderr, "penstock-bench compare: cannot write the plot to %s: check the path\n", plot.c_str());
      return kExitError;
    }
    std::fprintf(stderr, "penstock-bench compare: plot written to %s\n", plot.c_str());
  }
  return 0;
}

int bench_main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return kExitError;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    print_usage(stdout);
    return 0;
  }
  if (first == "compare") return run_compare(argc - 1, argv + 1);
  const Workload* w = find_workload(first);
  if (w == nullptr) {
    std::fprintf(stderr, "penstock-bench: unknown workload '%s': run penstock-bench --help for the list\n", first.c_str());
    return kExitError;
  }
  return run_single(*w, argc - 1, argv + 1);
}

}  // namespace
}  // namespace penstock::bench

int main(int argc, char** argv) { return penstock::bench::bench_main(argc, argv); }
