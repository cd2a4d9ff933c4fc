// transport_bench: bytes moved per CPU-second for 1 MiB reads and writes, RDMA vs TCP, same
// workload, side by side (docs/performance.md, "RDMA vs TCP (soft-RoCE)"). Not a test: a figure.
//
// One process runs the RpcServer (TCP + RDMA listener) and the client. A read asks the server for
// 1 MiB (the handler copies it from a preallocated buffer into the response bulk, as the data
// server does); a write sends 1 MiB (the handler only counts it). `--depth`
// calls are kept in flight. CPU is measured twice: the process (getrusage: client + server
// threads, including kernel time spent in their system calls) and the whole machine (/proc/stat,
// all CPUs: also the kernel's softirq and rxe work that no process is charged for — the fair
// figure for soft-RoCE, which runs its "NIC" on the CPU).
//
// usage: transport_bench [--host IP] [--seconds S] [--depth D] [--size BYTES]
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/log.h"
#include "common/net/channel_factory.h"
#include "common/net/rdma/rdma_transport.h"
#include "common/proto/codec.h"
#include "common/proto/method.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"

namespace penstock {
namespace {

using namespace std::chrono_literals;

struct BenchReadReq {
  uint32_t length = 0;
  PENSTOCK_FIELDS(length);
};
struct BenchWriteResp {
  uint32_t received = 0;
  PENSTOCK_FIELDS(received);
};
PENSTOCK_METHOD(BenchRead, proto::ServiceId::kData, 1100, BenchReadReq, proto::Empty);
PENSTOCK_METHOD(BenchWrite, proto::ServiceId::kData, 1101, proto::Empty, BenchWriteResp);

double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Busy CPU-seconds of the whole machine so far (all CPUs; idle and iowait excluded).
double machine_cpu_s() {
  std::ifstream f("/proc/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream in(line);
  std::string cpu;
  uint64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(user + nice + sys + irq + softirq + steal) / hz;
}

struct Figures {
  double seconds = 0;
  uint64_t bytes = 0;
  double proc_cpu = 0;
  double machine_cpu = 0;
  int errors = 0;
};

Figures run(rpc::RpcClient& client, bool read, size_t size, int depth, double seconds) {
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(depth),
                                            std::vector<uint8_t>(size, 0x5a));
  std::mutex mu;
  std::condition_variable cv;
  int inflight = 0;
  uint64_t bytes = 0;
  int errors = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  const double p0 = process_cpu_s();
  const double m0 = machine_cpu_s();
  std::vector<int> free_slots;
  for (int i = 0; i < depth; ++i) free_slots.push_back(i);
  std::unique_lock<std::mutex> lock(mu);
  while (std::chrono::steady_clock::now() < end) {
    cv.wait(lock, [&] { return !free_slots.empty(); });
    const int slot = free_slots.back();
    free_slots.pop_back();
    ++inflight;
    lock.unlock();
    rpc::CallOptions opts;
    opts.timeout = 60s;
    auto& buf = buffers[static_cast<size_t>(slot)];
    auto done = [&, slot](bool ok) {
      std::lock_guard<std::mutex> g(mu);
      if (ok)
        bytes += size;
      else
        ++errors;
      --inflight;
      free_slots.push_back(slot);
      cv.notify_all();
    };
    if (read) {
      opts.bulk_in = buf;
      client.call_async<BenchRead>(BenchReadReq{static_cast<uint32_t>(size)}, opts,
                                   [done](Result<proto::Empty> r) { done(r.has_value()); });
    } else {
      opts.bulk_out = buf;
      client.call_async<BenchWrite>(proto::Empty{}, opts,
                                    [done](Result<BenchWriteResp> r) { done(r.has_value()); });
    }
    lock.lock();
  }
  cv.wait(lock, [&] { return inflight == 0; });
  Figures f;
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  f.proc_cpu = process_cpu_s() - p0;
  f.machine_cpu = machine_cpu_s() - m0;
  f.bytes = bytes;
  f.errors = errors;
  return f;
}

int main_impl(int argc, char** argv) {
  std::string host = "127.0.0.1";
  double seconds = 5;
  int depth = 8;
  size_t size = 1u << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--host")
      host = next();
    else if (a == "--seconds")
      seconds = std::atof(next().c_str());
    else if (a == "--depth")
      depth = std::atoi(next().c_str());
    else if (a == "--size")
      size = static_cast<size_t>(std::atoll(next().c_str()));
    else {
      std::fprintf(stderr,
                   "usage: transport_bench [--host IP] [--seconds S] [--depth D] [--size BYTES]\n"
                   "  RDMA needs an RDMA device reaching IP (in the test VM: --host $RDMAVM_IP)\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  set_log_level(LogLevel::kWarn);
  std::vector<uint8_t> source(size);
  for (size_t i = 0; i < size; ++i) source[i] = static_cast<uint8_t>(i * 7);
  rpc::ServerOptions so;
  so.listen = net::Endpoint{host, 0};
  so.worker_threads = 2;
  so.io_threads = 1;
  so.rdma = rpc::RdmaMode::kAuto;
  rpc::RpcServer server(so);
  server.handle<BenchRead>(
      [&](const BenchReadReq& req, rpc::RequestContext& ctx) -> Result<proto::Empty> {
        const size_t n = std::min<size_t>(req.length, source.size());
        ctx.bulk_out().assign(source.begin(), source.begin() + static_cast<long>(n));
        return proto::Empty{};
      });
  server.handle<BenchWrite>(
      [](const proto::Empty&, rpc::RequestContext& ctx) -> Result<BenchWriteResp> {
        BenchWriteResp r;
        r.received = static_cast<uint32_t>(ctx.bulk_in().size());
        return r;
      });
  Status st = server.start();
  if (!st.is_ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("transport_bench: %zu-byte calls, %d in flight, %.0f s per run, host %s, %ld CPUs\n",
              size, depth, seconds, host.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "| transport | op | MB/s | process CPU-s | machine CPU-s | MB per process CPU-s | MB per "
      "machine CPU-s |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  int failures = 0;
  for (net::TransportKind kind : {net::TransportKind::kTcp, net::TransportKind::kRdma}) {
    if (kind == net::TransportKind::kRdma && server.rdma_port() == 0) {
      std::printf("| rdma | - | no RDMA device reaches %s | | | | |\n", host.c_str());
      continue;
    }
    net::IoRuntime runtime(1);
    net::ChannelOptions co;
    co.transport = kind;
    co.tcp.connections = 1;
    auto ch = net::make_channel(runtime, net::Endpoint{host, server.port()}, co);
    if (!ch.has_value()) {
      std::fprintf(stderr, "transport_bench: %s\n", ch.error().to_string().c_str());
      return 1;
    }
    rpc::RpcClient client(*ch, 60s);
    for (bool read : {true, false}) {
      run(client, read, size, depth, 0.5);  // warm up (connection, pools, page faults)
      Figures f = run(client, read, size, depth, seconds);
      failures += f.errors;
      const double mb = static_cast<double>(f.bytes) / 1e6;
      std::printf("| %s | %s | %.1f | %.2f | %.2f | %.1f | %.1f |\n",
                  std::string(net::transport_name(kind)).c_str(),
                  read ? "read 1 MiB" : "write 1 MiB", mb / f.seconds, f.proc_cpu, f.machine_cpu,
                  f.proc_cpu > 0 ? mb / f.proc_cpu : 0.0,
                  f.machine_cpu > 0 ? mb / f.machine_cpu : 0.0);
      std::fflush(stdout);
    }
  }
  server.stop();
  if (failures > 0) {
    std::fprintf(stderr, "transport_bench: %d calls failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace penstock

int main(int argc, char** argv) { return penstock::main_impl(argc, argv); }
