// ByteBuffer: a std::vector<uint8_t> whose resize() leaves new bytes uninitialized. For buffers
// that I/O fills right after sizing them (request messages and reply bulk in the RPC server,
// chunk reads):
// zero-filling a 1 MiB buffer that a read() overwrites at once cost ~5 % of a data server's CPU.
// Its storage of 64 KiB or more starts on a page boundary, so a received write payload goes to an
// O_DIRECT descriptor as it is, and an O_DIRECT read lands in a reply's bulk without a bounce copy.
// Everything else about it is std::vector (value-initialization with an explicit value, e.g.
// assign(n, 0) or resize(n, 0), still writes that value).
// Thread-safety: as std::vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <string_view>
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

// DefaultInitAllocator whose storage of kAlignFrom bytes or more is page-aligned. Aligned by hand
// over malloc (4 KiB more per buffer, at most 6 %), not with aligned operator new: glibc served
// 4 MiB write payloads aligned that way with fresh mmaps, and their page faults took 10 % of the
// machine's CPU in a ckpt-write profile, more than the copy they were to save.
template <class T>
struct PageAlignedAllocator : DefaultInitAllocator<T> {
  template <class U>
  struct rebind {
    using other = PageAlignedAllocator<U>;
  };
  PageAlignedAllocator() = default;
  template <class U>
  PageAlignedAllocator(const PageAlignedAllocator<U>&) noexcept {}

  static constexpr size_t kAlignFrom = 64 << 10;
  static constexpr size_t kPage = 4096;
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kAlignFrom) return std::allocator<T>::allocate(n);
    void* raw = std::malloc(bytes + kPage);
    if (raw == nullptr) throw std::bad_alloc();
    // At least one pointer's room below the aligned start holds what malloc returned.
    const uintptr_t start = (reinterpret_cast<uintptr_t>(raw) + sizeof(void*) + kPage - 1) / kPage * kPage;
    reinterpret_cast<void**>(start)[-1] = raw;
    return reinterpret_cast<T*>(start);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kAlignFrom) return std::allocator<T>::deallocate(p, n);
    std::free(reinterpret_cast<void**>(p)[-1]);
  }
};

using ByteBuffer = std::vector<uint8_t, PageAlignedAllocator<uint8_t>>;

// The bytes of a string (an encoded message, a string field that carries another message), as the
// codec and the transports take them.
inline std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace penstock
