// Integration test of penstock-bench: runs the real binary ($PENSTOCK_BENCH, set by meson) with
// tiny sizes against temporary local directories, parses its JSON lines, checks that a corrupted
// byte fails the run with exit status 2, and that compare writes medians, ratios and a plot.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;

struct RunOutput {
  int status = -1;  // exit status
  std::string out;
  std::string err;
};

std::string read_file(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
  }
  return s;
}

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("PENSTOCK_BENCH");
    ASSERT_NE(bin, nullptr) << "set PENSTOCK_BENCH to the penstock-bench binary (meson test does)";
    bin_ = bin;
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr ? tmp : "/tmp") + "/penstock-bench-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    a_ = root_ + "/a";
    b_ = root_ + "/b";
    fs::create_directories(a_);
    fs::create_directories(b_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
  }

  // Runs penstock-bench with `args` (no shell), capturing stdout and stderr.
  RunOutput run(const std::vector<std::string>& args) {
    const std::string out_path = root_ + "/stdout";
    const std::string err_path = root_ + "/stderr";
    const pid_t pid = fork();
    if (pid == 0) {
      const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> argv;
      argv.push_back(bin_.data());
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(bin_.c_str(), argv.data());
      _exit(127);
    }
    RunOutput r;
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    r.out = read_file(out_path);
    r.err = read_file(err_path);
    return r;
  }

  std::string bin_;
  std::string root_;
  std::string a_;
  std::string b_;
};

// A strict parser for the flat JSON objects penstock-bench prints: string and number values.
// Returns false on any syntax error.
bool parse_flat_json(const std::string& line, std::map<std::string, std::string>* out) {
  size_t i = 0;
  auto ws = [&] {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
  };
  auto str = [&](std::string* s) {
    if (i >= line.size() || line[i] != '"') return false;
    ++i;
    while (i < line.size() && line[i] != '"') {
      if (line[i] == '\\') {
        if (++i >= line.size()) return false;
        if (line[i] == 'u') {
          if (i + 4 >= line.size()) return false;
          s->push_back('?');
          i += 5;
          continue;
        }
        const char c = line[i];
        if (c != '"' && c != '\\' && c != '/' && c != 'n' && c != 't' && c != 'r' && c != 'b' && c != 'f') return false;
      }
      s->push_back(line[i++]);
    }
    if (i >= line.size()) return false;
    ++i;
    return true;
  };
  ws();
  if (i >= line.size() || line[i++] != '{') return false;
  for (;;) {
    ws();
    std::string key;
    if (!str(&key)) return false;
    ws();
    if (i >= line.size() || line[i++] != ':') return false;
    ws();
    std::string value;
    if (i < line.size() && line[i] == '"') {
      if (!str(&value)) return false;
    } else {
      const size_t start = i;
      while (i < line.size() && (std::isdigit(static_cast<unsigned char>(line[i])) || line[i] == '-' ||
                                 line[i] == '+' || line[i] == '.' || line[i] == 'e' || line[i] == 'E')) {
        ++i;
      }
      value = line.substr(start, i - start);
      char* end = nullptr;
      std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size()) return false;
    }
    (*out)[key] = value;
    ws();
    if (i < line.size() && line[i] == ',') {
      ++i;
      continue;
    }
    if (i < line.size() && line[i] == '}') {
      ++i;
      ws();
      return i == line.size();
    }
    return false;
  }
}

std::vector<std::map<std::string, std::string>> parse_lines(const std::string& text) {
  std::vector<std::map<std::string, std::string>> rows;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    std::map<std::string, std::string> row;
    EXPECT_TRUE(parse_flat_json(line, &row)) << "not JSON: " << line;
    for (const char* key : {"workload", "dir", "metric", "value", "unit"}) {
      EXPECT_TRUE(row.count(key)) << "missing " << key << " in " << line;
    }
    rows.push_back(row);
  }
  return rows;
}

double value_of(const std::vector<std::map<std::string, std::string>>& rows, const std::string& metric,
                const std::string& dir = "") {
  for (const auto& r : rows) {
    if (r.at("metric") == metric && (dir.empty() || r.at("dir") == dir)) return std::strtod(r.at("value").c_str(), nullptr);
  }
  ADD_FAILURE() << "no metric " << metric << " for dir '" << dir << "'";
  return -1;
}

TEST_F(BenchTest, CheckpointWriteRestoreAndCorruption) {
  RunOutput w = run({"ckpt-write", a_, "--size", "4M", "--ranks", "2", "--json"});
  ASSERT_EQ(0, w.status) << w.err;
  auto rows = parse_lines(w.out);
  ASSERT_EQ(8u, rows.size()) << w.out;
  EXPECT_EQ("ckpt-write", rows[0].at("workload"));
  EXPECT_EQ(a_, rows[0].at("dir"));
  EXPECT_GT(value_of(rows, "write_throughput"), 0);
  EXPECT_GT(value_of(rows, "seconds"), 0);
  // Machine CPU per GiB: may round to 0 for a run this short (10 ms clock ticks), never negative.
  EXPECT_GE(value_of(rows, "cpu_s_per_gib"), 0);

  RunOutput r = run({"ckpt-restore", a_, "--size", "4M", "--ranks", "2", "--json"});
  ASSERT_EQ(0, r.status) << r.err;
  EXPECT_GT(value_of(parse_lines(r.out), "read_throughput"), 0);
  EXPECT_GE(value_of(parse_lines(r.out), "cpu_s_per_gib"), 0);
  // The human table names the metric and says it is machine-wide.
  RunOutput human = run({"ckpt-restore", a_, "--size", "4M", "--ranks", "2"});
  ASSERT_EQ(0, human.status) << human.err;
  EXPECT_NE(std::string::npos, human.out.find("CPU-s/GiB")) << human.out;
  EXPECT_NE(std::string::npos, human.out.find("machine-wide")) << human.out;

  // Flip one byte of rank 1's shard: the restore must fail, naming the file and the offset.
  std::string shard;
  for (const auto& e : fs::directory_iterator(a_)) {
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) shard = e.path().string() + "/rank-00001.shard";
  }
  ASSERT_FALSE(shard.empty());
  {
    const int fd = ::open(shard.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char c = 0;
    ASSERT_EQ(1, pread(fd, &c, 1, 1234567));
    c ^= 0x20;
    ASSERT_EQ(1, pwrite(fd, &c, 1, 1234567));
    ::close(fd);
  }
  RunOutput bad = run({"ckpt-restore", a_, "--size", "4M", "--ranks", "2", "--json"});
  EXPECT_EQ(2, bad.status) << bad.err;
  EXPECT_NE(std::string::npos, bad.err.find(shard)) << bad.err;
  EXPECT_NE(std::string::npos, bad.err.find("offset 1234567")) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << "a failed run must not score: " << bad.out;
}

TEST_F(BenchTest, CompareWritesMediansRatiosAndPlot) {
  const std::string svg = root_ + "/ckpt.svg";
  RunOutput c = run({"compare", "ckpt-write", a_, b_, "--runs", "2", "--size", "1M", "--ranks", "2", "--json",
                     "--plot", svg});
  ASSERT_EQ(0, c.status) << c.err;
  auto rows = parse_lines(c.out);
  ASSERT_EQ(16u, rows.size()) << c.out;  // 8 metrics x 2 dirs
  for (const auto& r : rows) {
    EXPECT_EQ("2", r.at("runs"));
    ASSERT_TRUE(r.count("ratio"));
    // (A 0 baseline gives ratio 0: a bool, and CPU that rounds to 0 ticks on a 1 MiB run.)
    if (r.at("dir") == a_ && r.at("metric") != "fits_5pct_budget" && r.at("metric") != "cpu_s_per_gib") {
      EXPECT_EQ("1", r.at("ratio")) << r.at("metric");
    }
  }
  EXPECT_GT(value_of(rows, "write_throughput", a_), 0);
  EXPECT_GT(value_of(rows, "write_throughput", b_), 0);
  const std::string plot = read_file(svg);
  EXPECT_EQ(0u, plot.rfind("<svg", 0));
  EXPECT_NE(std::string::npos, plot.find(b_));
  // compare keeps only the last run's checkpoint in each directory.
  int ckpts = 0;
  for (const auto& e : fs::directory_iterator(a_)) ckpts += e.path().filename().string().rfind("ckpt-", 0) == 0;
  EXPECT_EQ(1, ckpts);
}

TEST_F(BenchTest, EveryWorkloadRunsWithTinySizes) {
  const std::vector<std::string> data = {"--files", "3", "--file-size", "1M", "--threads", "2"};
  auto with = [&](std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    args.push_back("--json");
    return args;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with({"restore-fanout", a_, "--size", "2M", "--ranks", "3"}, {}), "read_throughput"},
      {with({"train-seq", a_}, data), "records_per_s"},
      {with({"train-rand", a_, "--seconds", "0.3"}, data), "p99_latency"},
      {with({"train-small", a_, "--files", "60", "--file-size", "9K", "--dirs", "4"}, {}), "read_files_per_s"},
      {with({"meta", a_, "--procs", "2", "--files", "50"}, {}), "unlink_ops_per_s"},
      {with({"mixed", a_, "--warmup", "0.3", "--size", "2M", "--ranks", "2"}, data), "ckpt_write_throughput"},
      {with({"accel", a_, "--steps", "4", "--batch", "4", "--compute-ms", "1"}, data), "accelerator_utilization"},
  };
  for (const auto& [args, metric] : cases) {
    RunOutput r = run(args);
    ASSERT_EQ(0, r.status) << args[0] << ": " << r.err;
    auto rows = parse_lines(r.out);
    EXPECT_GT(value_of(rows, metric), 0) << args[0];
  }
  // train-small and meta clean up after themselves; the dataset and the fanout checkpoint stay.
  for (const auto& e : fs::directory_iterator(a_)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.rfind("bench-train-", 0) == 0 || name.rfind("ckpt-", 0) == 0) << name;
  }
}

TEST_F(BenchTest, RejectsBadFlagsAndMissingDirectory) {
  EXPECT_NE(0, run({"ckpt-write", a_, "--size", "4Q"}).status);
  RunOutput missing = run({"ckpt-write", root_ + "/nope", "--size", "1M"});
  EXPECT_EQ(1, missing.status);
  EXPECT_NE(std::string::npos, missing.err.find("nope"));
  EXPECT_EQ(0, run({"--help"}).status);
  for (const char* w : {"ckpt-write", "ckpt-restore", "restore-fanout", "train-seq", "train-rand", "train-small", "meta",
                        "mixed", "accel"}) {
    RunOutput h = run({w, "--help"});
    EXPECT_EQ(0, h.status) << w;
    EXPECT_NE(std::string::npos, h.out.find("--json")) << w;
  }
}

}  // namespace
