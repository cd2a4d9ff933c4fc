// Output of penstock-bench: the human table and JSON lines of one run, and the summary table,
// JSON lines and SVG bar chart of a `compare` (per-metric medians over interleaved runs).
// Ownership: plain values. Thread-safety: pure functions; the printers write to the given stream.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/workloads.h"

namespace penstock::bench {

// "2.31", "12.5", "1234", "0.0123": about three significant digits; bools as yes/no.
std::string format_value(double value, std::string_view unit);

// One JSON object {"workload":…,"dir":…,"metric":…,"value":…,"unit":…} plus `extra` (already
// JSON: `,"runs":3`) before the closing brace. Strings are escaped; non-finite values print 0.
std::string json_line(std::string_view workload, std::string_view dir, const Metric& m, std::string_view extra = "");

// The table of one run: a header naming the workload, dir and sizes; metric, value, unit; notes.
void print_table(std::FILE* out, std::string_view workload, const std::string& dir, const std::string& sizes,
                 const RunResult& r);
// One json_line per metric.
void print_json(std::FILE* out, std::string_view workload, const std::string& dir, const RunResult& r);

// The medians of a compare run.
struct CompareResult {
  std::string workload;
  std::string sizes;                       // Workload::describe
  int runs = 0;                            // runs per directory
  std::vector<std::string> dirs;           // in command-line order; the first is the baseline
  std::vector<Metric> metrics;             // name, unit and flags; value unused
  std::vector<std::vector<double>> median; // [metric][dir]
};

// The median of `values` (mean of the middle two for an even count). REQUIRES: not empty.
double median(std::vector<double> values);

// Ratio of dir d to the baseline (dir 0) for metric m; 0 when the baseline is 0.
double ratio(const CompareResult& c, size_t m, size_t d);

void print_compare_table(std::FILE* out, const CompareResult& c);
// One json_line per (metric, dir) of the medians, with "runs" and "ratio" (to the first dir) added.
void print_compare_json(std::FILE* out, const CompareResult& c);

// A self-contained SVG: one panel per plotted metric, a bar per directory (one colour each, a
// legend), value labels on the bars, ratio labels under them, title with the workload and sizes.
std::string render_svg(const CompareResult& c);

}  // namespace penstock::bench
