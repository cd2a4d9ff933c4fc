// SlotAllocator: hands out contiguous runs of fixed-size slots of one registered region (the
// staging pools of the RDMA transport). First fit from a rotating hint; O(slots) worst case, which
// is cheap for the few hundred slots a pool has. Pure bookkeeping, no memory of its own.
// Thread-safety: none; the owner serializes calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace penstock::net::rdma {

class SlotAllocator {
 public:
  // REQUIRES: slot_bytes > 0.
  SlotAllocator(size_t slots, size_t slot_bytes) : used_(slots, 0), slot_bytes_(slot_bytes) {}

  // The first slot of a free run that holds `bytes` (>= 1), marked used; nullopt when no run is
  // free now or `bytes` is more than the whole region.
  std::optional<size_t> allocate(size_t bytes);
  // Returns the run that allocate(bytes) gave at `first`. REQUIRES: exactly that run.
  void release(size_t first, size_t bytes);

  size_t slots_for(size_t bytes) const { return (bytes + slot_bytes_ - 1) / slot_bytes_; }
  size_t capacity_bytes() const { return used_.size() * slot_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t used_slots() const { return used_count_; }

 private:
  std::vector<uint8_t> used_;
  size_t slot_bytes_;
  size_t hint_ = 0;
  size_t used_count_ = 0;
};

}  // namespace penstock::net::rdma
