#include "client/fuse/wake_signal.h"

namespace penstock::fuse {
namespace {

void no_op_signal(int) {}

}  // namespace

void install_wake_signal() {
  struct sigaction sa {};
  sa.sa_handler = no_op_signal;  // no SA_RESTART: the blocked call returns EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(kWakeSignal, &sa, nullptr);
}

}  // namespace penstock::fuse
