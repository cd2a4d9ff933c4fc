// ByteBuffer: a std::vector<uint8_t> whose resize() leaves new bytes uninitialized. For buffers
// that I/O fills right after sizing them (request and reply bulk in the RPC server, chunk reads):
// zero-filling a 1 MiB buffer that a read() overwrites at once cost ~5 % of a data server's CPU.
// Everything else about it is std::vector (value-initialization with an explicit value, e.g.
// assign(n, 0) or resize(n, 0), still writes that value).
// Thread-safety: as std::vector.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace penstock {

// std::allocator that default-initializes (for uint8_t: leaves uninitialized) instead of
// value-initializing when an element is constructed without arguments.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}

  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    std::allocator_traits<std::allocator<T>>::construct(static_cast<std::allocator<T>&>(*this), p,
                                                        std::forward<Args>(args)...);
  }
};

using ByteBuffer = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

}  // namespace penstock
