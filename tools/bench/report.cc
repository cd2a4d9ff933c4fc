#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tools/bench/units.h"

namespace penstock::bench {
namespace {

std::string json_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(ch);
    }
  }
  return out;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "0";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string pad(const std::string& s, size_t width) {
  // Count UTF-8 code points so the columns line up with non-ASCII text.
  size_t len = 0;
  for (char c : s) len += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return len >= width ? s : s + std::string(width - len, ' ');
}

// The last path component (the whole path when that is empty), cut to `max` characters.
std::string short_name(const std::string& dir, size_t max) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const size_t slash = d.rfind('/');
  std::string name = slash == std::string::npos || slash + 1 >= d.size() ? d : d.substr(slash + 1);
  max = std::max<size_t>(max, 4);
  if (name.size() > max) name = name.substr(0, max - 1) + "\xE2\x80\xA6";
  return name;
}

// " x " between counts and sizes becomes a multiplication sign for the chart.
std::string times_sign(std::string s) {
  for (size_t pos = s.find(" x "); pos != std::string::npos; pos = s.find(" x ", pos)) {
    s.replace(pos + 1, 1, "\xC3\x97");
    pos += 3;
  }
  return s;
}

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 10 ? "%.1fx" : "%.2fx", r);
  return buf;
}

}  // namespace

std::string format_value(double value, std::string_view unit) {
  if (unit == "bool") return value != 0 ? "yes" : "no";
  const double a = std::fabs(value);
  if (a >= 1000) return format_number(value, 0);
  if (a >= 100) return format_number(value, 1);
  if (a >= 1) return format_number(value, 2);
  if (a >= 0.01) return format_number(value, 3);
  if (a == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", value);
  return buf;
}

std::string json_line(std::string_view workload, std::string_view dir, const Metric& m, std::string_view extra) {
  return "{\"workload\":\"" + json_escape(workload) + "\",\"dir\":\"" + json_escape(dir) + "\",\"metric\":\"" +
         json_escape(m.name) + "\",\"value\":" + json_number(m.value) + ",\"unit\":\"" + json_escape(m.unit) + "\"" +
         std::string(extra) + "}";
}

void print_table(std::FILE* out, std::string_view workload, const std::string& dir, const std::string& sizes,
                 const RunResult& r) {
  size_t w = 6;
  for (const Metric& m : r.metrics) w = std::max(w, m.name.size());
  std::fprintf(out, "%.*s on %s (%s)\n", static_cast<int>(workload.size()), workload.data(), dir.c_str(), sizes.c_str());
  std::fprintf(out, "  %s  %12s  %s\n", pad("metric", w).c_str(), "value", "unit");
  for (const Metric& m : r.metrics) {
    std::fprintf(out, "  %s  %12s  %s\n", pad(m.name, w).c_str(), format_value(m.value, m.unit).c_str(),
                 m.unit == "bool" ? "" : m.unit.c_str());
  }
  for (const std::string& n : r.notes) std::fprintf(out, "  %s\n", n.c_str());
  std::fflush(out);
}

void print_json(std::FILE* out, std::string_view workload, const std::string& dir, const RunResult& r) {
  for (const Metric& m : r.metrics) std::fprintf(out, "%s\n", json_line(workload, dir, m).c_str());
  std::fflush(out);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double ratio(const CompareResult& c, size_t m, size_t d) {
  const double base = c.median[m][0];
  return base != 0 ? c.median[m][d] / base : 0;
}

void print_compare_table(std::FILE* out, const CompareResult& c) {
  std::fprintf(out, "compare %s: %s; median of %d run%s per directory, ratio to %s\n", c.workload.c_str(),
               c.sizes.c_str(), c.runs, c.runs == 1 ? "" : "s", c.dirs[0].c_str());
  size_t wm = 6;
  size_t wu = 4;
  for (const Metric& m : c.metrics) {
    wm = std::max(wm, m.name.size());
    wu = std::max(wu, m.unit.size());
  }
  std::vector<std::vector<std::string>> cells(c.metrics.size(), std::vector<std::string>(c.dirs.size()));
  std::vector<size_t> wd(c.dirs.size());
  for (size_t d = 0; d < c.dirs.size(); ++d) wd[d] = c.dirs[d].size();
  for (size_t m = 0; m < c.metrics.size(); ++m) {
    for (size_t d = 0; d < c.dirs.size(); ++d) {
      std::string cell = format_value(c.median[m][d], c.metrics[m].unit);
      if (d > 0 && c.metrics[m].unit != "bool") cell += " (" + ratio_text(ratio(c, m, d)) + ")";
      cells[m][d] = cell;
      wd[d] = std::max(wd[d], cell.size());
    }
  }
  std::string header = "  " + pad("metric", wm) + "  " + pad("unit", wu);
  for (size_t d = 0; d < c.dirs.size(); ++d) header += "  " + pad(c.dirs[d], wd[d]);
  std::fprintf(out, "%s\n", header.c_str());
  for (size_t m = 0; m < c.metrics.size(); ++m) {
    std::string line = "  " + pad(c.metrics[m].name, wm) + "  " + pad(c.metrics[m].unit == "bool" ? "" : c.metrics[m].unit, wu);
    for (size_t d = 0; d < c.dirs.size(); ++d) line += "  " + pad(cells[m][d], wd[d]);
    std::fprintf(out, "%s\n", line.c_str());
  }
  std::fflush(out);
}

void print_compare_json(std::FILE* out, const CompareResult& c) {
  for (size_t m = 0; m < c.metrics.size(); ++m) {
    for (size_t d = 0; d < c.dirs.size(); ++d) {
      Metric mm = c.metrics[m];
      mm.value = c.median[m][d];
      const std::string extra = ",\"runs\":" + std::to_string(c.runs) + ",\"ratio\":" + json_number(ratio(c, m, d));
      std::fprintf(out, "%s\n", json_line(c.workload, c.dirs[d], mm, extra).c_str());
    }
  }
  std::fflush(out);
}

std::string render_svg(const CompareResult& c) {
  static const char* const kColors[] = {"#3366cc", "#ee7733", "#2ca02c", "#cc3344", "#8e63b8",
                                        "#8c564b", "#e377c2", "#17becf"};
  const size_t ndirs = c.dirs.size();
  std::vector<size_t> plotted;
  for (size_t m = 0; m < c.metrics.size(); ++m) {
    if (c.metrics[m].plot) plotted.push_back(m);
  }
  // One row up to four panels; beyond that rows of three (5, 6, 9) or four (7, 8, 10+).
  const size_t n = std::max<size_t>(plotted.size(), 1);
  const int cols = static_cast<int>(n <= 4 ? n : (n % 3 == 0 || n == 5) ? 3 : 4);
  const int rows = static_cast<int>((plotted.size() + static_cast<size_t>(cols) - 1) / static_cast<size_t>(cols));
  const int panel_w = std::max(250, 70 + static_cast<int>(ndirs) * 78);
  const int panel_h = 290;
  const int gap = 18;
  const int margin = 24;
  const int legend_row_h = 22;
  const int title_h = 78 + static_cast<int>(ndirs) * legend_row_h;
  const int width = margin * 2 + cols * panel_w + (cols - 1) * gap;
  const int height = title_h + rows * panel_h + std::max(0, rows - 1) * gap + margin + 22;

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  s << "<text x=\"" << margin << "\" y=\"34\" font-size=\"20\" font-weight=\"bold\" fill=\"#222\">penstock-bench "
    << xml_escape(c.workload) << "</text>\n";
  s << "<text x=\"" << margin << "\" y=\"56\" font-size=\"13\" fill=\"#444\">" << xml_escape(times_sign(c.sizes)) << " \xE2\x80\x94 median of "
    << c.runs << " interleaved run" << (c.runs == 1 ? "" : "s") << " per directory; ratios are to the first</text>\n";
  for (size_t d = 0; d < ndirs; ++d) {
    const int y = 72 + static_cast<int>(d) * legend_row_h;
    s << "<rect x=\"" << margin << "\" y=\"" << y << "\" width=\"14\" height=\"14\" rx=\"2\" fill=\"" << kColors[d % 8]
      << "\"/>\n";
    s << "<text x=\"" << margin + 22 << "\" y=\"" << y + 12 << "\" font-size=\"13\" fill=\"#222\">" << xml_escape(c.dirs[d])
      << (d == 0 ? "  (baseline)" : "") << "</text>\n";
  }

  for (size_t i = 0; i < plotted.size(); ++i) {
    const size_t m = plotted[i];
    const Metric& metric = c.metrics[m];
    const int px = margin + static_cast<int>(i % static_cast<size_t>(cols)) * (panel_w + gap);
    const int py = title_h + static_cast<int>(i / static_cast<size_t>(cols)) * (panel_h + gap);
    s << "<rect x=\"" << px << "\" y=\"" << py << "\" width=\"" << panel_w << "\" height=\"" << panel_h
      << "\" rx=\"6\" fill=\"#f7f7f9\" stroke=\"#dddde3\"/>\n";
    s << "<text x=\"" << px + 12 << "\" y=\"" << py + 22 << "\" font-size=\"14\" font-weight=\"bold\" fill=\"#222\">"
      << xml_escape(metric.name) << "</text>\n";
    s << "<text x=\"" << px + 12 << "\" y=\"" << py + 40 << "\" font-size=\"11.5\" fill=\"#666\">" << xml_escape(metric.unit)
      << (metric.lower_is_better ? " \xE2\x80\x94 lower is better" : " \xE2\x80\x94 higher is better") << "</text>\n";
    const int plot_top = py + 70;
    const int base_y = py + panel_h - 58;
    const int plot_left = px + 16;
    const int plot_w = panel_w - 32;
    double vmax = 0;
    for (size_t d = 0; d < ndirs; ++d) vmax = std::max(vmax, c.median[m][d]);
    if (vmax <= 0) vmax = 1;
    const double slot = static_cast<double>(plot_w) / static_cast<double>(ndirs);
    const double bar_w = std::min(56.0, slot * 0.66);
    s << "<line x1=\"" << plot_left << "\" y1=\"" << base_y << "\" x2=\"" << plot_left + plot_w << "\" y2=\"" << base_y
      << "\" stroke=\"#999\" stroke-width=\"1\"/>\n";
    for (size_t d = 0; d < ndirs; ++d) {
      const double v = c.median[m][d];
      const double h = std::max(1.0, (std::max(v, 0.0) / vmax) * (base_y - plot_top));
      const double cx = plot_left + slot * (static_cast<double>(d) + 0.5);
      s << "<rect x=\"" << format_number(cx - bar_w / 2, 1) << "\" y=\"" << format_number(base_y - h, 1) << "\" width=\""
        << format_number(bar_w, 1) << "\" height=\"" << format_number(h, 1) << "\" rx=\"2\" fill=\"" << kColors[d % 8]
        << "\"/>\n";
      s << "<text x=\"" << format_number(cx, 1) << "\" y=\"" << format_number(base_y - h - 6, 1)
        << "\" font-size=\"12.5\" font-weight=\"bold\" text-anchor=\"middle\" fill=\"#222\">"
        << xml_escape(format_value(v, metric.unit)) << "</text>\n";
      std::string label;
      std::string colour = "#666";
      if (d == 0) {
        label = "baseline";
      } else {
        const double r = ratio(c, m, d);
        label = ratio_text(r);
        const bool better = metric.lower_is_better ? r < 0.98 : r > 1.02;
        const bool worse = metric.lower_is_better ? r > 1.02 : r < 0.98;
        colour = better ? "#1a7f37" : worse ? "#c62828" : "#666";
      }
      s << "<text x=\"" << format_number(cx, 1) << "\" y=\"" << base_y + 20
        << "\" font-size=\"12.5\" font-weight=\"bold\" text-anchor=\"middle\" fill=\"" << colour << "\">" << label
        << "</text>\n";
      s << "<text x=\"" << format_number(cx, 1) << "\" y=\"" << base_y + 37
        << "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">"
        << xml_escape(short_name(c.dirs[d], static_cast<size_t>(slot / 7))) << "</text>\n";
    }
  }
  s << "<text x=\"" << margin << "\" y=\"" << height - 12 << "\" font-size=\"11\" fill=\"#888\">"
    << "GB/s and MB/s are 10^9 and 10^6 bytes per second; ratio colours: green better, red worse than the baseline</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace penstock::bench
