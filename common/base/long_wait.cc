#include "common/base/long_wait.h"

namespace penstock {
namespace {

thread_local LongWaitHook t_hook = nullptr;
thread_local void* t_arg = nullptr;

}  // namespace

void set_long_wait_hook(LongWaitHook hook, void* arg) {
  t_hook = hook;
  t_arg = arg;
}

void before_long_wait() {
  if (t_hook != nullptr) t_hook(t_arg);
}

}  // namespace penstock
