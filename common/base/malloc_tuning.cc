#include "common/base/malloc_tuning.h"

#include <malloc.h>

namespace penstock {

void keep_large_buffers_mapped() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace penstock
