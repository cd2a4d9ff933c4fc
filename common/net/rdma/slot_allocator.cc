#include "common/net/rdma/slot_allocator.h"

#include <algorithm>

#include "common/base/status.h"

namespace penstock::net::rdma {

std::optional<size_t> SlotAllocator::allocate(size_t bytes) {
  const size_t n = slots_for(bytes == 0 ? 1 : bytes);
  const size_t total = used_.size();
  if (n > total || n > total - used_count_) return std::nullopt;
  // Two passes: from the hint to the end, then from the start (a run never wraps).
  for (int pass = 0; pass < 2; ++pass) {
    size_t i = pass == 0 ? hint_ : 0;
    const size_t end = pass == 0 ? total : std::min(total, hint_ + n);
    while (i + n <= end) {
      size_t run = 0;
      while (run < n && used_[i + run] == 0) ++run;
      if (run == n) {
        for (size_t k = 0; k < n; ++k) used_[i + k] = 1;
        used_count_ += n;
        hint_ = (i + n) % total;
        return i;
      }
      i += run + 1;
    }
  }
  return std::nullopt;
}

void SlotAllocator::release(size_t first, size_t bytes) {
  const size_t n = slots_for(bytes == 0 ? 1 : bytes);
  PENSTOCK_CHECK(first + n <= used_.size());
  for (size_t k = 0; k < n; ++k) {
    PENSTOCK_CHECK(used_[first + k] == 1);
    used_[first + k] = 0;
  }
  used_count_ -= n;
}

}  // namespace penstock::net::rdma
