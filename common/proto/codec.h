// The message codec: how every RPC message struct becomes bytes and back.
//
// A message is a plain struct that lists its fields once with PENSTOCK_FIELDS(a, b, c). The codec
// walks those fields in order; nothing else in the tree writes message bytes by hand.
// Encoding (all little-endian, see docs/wire-format.md):
//   bool, integers, enums  fixed width of the C++ type
//   StrongId               u64
//   std::string            u32 length + bytes
//   std::vector<T>         u32 count + each element
//   std::optional<T>       u8 present + T
//   nested message         its fields in order
// Decoding is bounds-checked everywhere: a length past the end, a count that cannot fit in the
// remaining bytes, a bool that is not 0/1, an enum out of range or trailing bytes give
// Code::kProtocol, never a crash or an over-allocation.
// Thread-safety: Encoder/Decoder are single-threaded value objects.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/ids.h"
#include "common/base/result.h"

// Declares the wire fields of a message struct, in wire order. Append new fields at the end only.
#define PENSTOCK_FIELDS(...)                                   \
  template <class Visitor>                                     \
  void visit_fields(Visitor&& v) { v(__VA_ARGS__); }           \
  template <class Visitor>                                     \
  void visit_fields(Visitor&& v) const { v(__VA_ARGS__); }

namespace penstock::proto {

// Largest string or byte field accepted from a peer (xattr values, symlink targets, names).
inline constexpr uint32_t kMaxFieldBytes = 1u << 20;

template <class T>
concept Message = requires(T& t) { t.visit_fields([](auto&...) {}); };

template <class T>
struct IsStrongId : std::false_type {};
template <class Tag>
struct IsStrongId<StrongId<Tag>> : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

// Enums used in messages must define kMaxValue-bounded values via this trait (default: any).
template <class E>
struct EnumLimit {
  static constexpr uint64_t kMax = UINT64_MAX;
};

// The fewest bytes an encoded T takes. A vector's count is checked against it, so that a count
// cannot make the decoder expect more elements than the rest of the message could hold.
template <class T>
size_t min_wire_bytes() {
  if constexpr (std::is_same_v<T, bool> || IsOptional<T>::value) {
    return 1;
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    return sizeof(T);
  } else if constexpr (IsStrongId<T>::value) {
    return sizeof(uint64_t);
  } else if constexpr (std::is_same_v<T, std::string> || IsVector<T>::value) {
    return sizeof(uint32_t);
  } else {
    static_assert(Message<T>, "type has no wire encoding");
    static const size_t bytes = [] {
      size_t sum = 0;
      T{}.visit_fields([&](const auto&... f) { sum = (size_t{0} + ... + min_wire_bytes<std::remove_cvref_t<decltype(f)>>()); });
      return sum;
    }();
    return bytes;
  }
}

class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  template <class T>
  void put(const T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      put_raw<uint8_t>(v ? 1 : 0);
    } else if constexpr (std::is_integral_v<T>) {
      put_raw<T>(v);
    } else if constexpr (std::is_enum_v<T>) {
      put_raw<std::underlying_type_t<T>>(static_cast<std::underlying_type_t<T>>(v));
    } else if constexpr (IsStrongId<T>::value) {
      put_raw<uint64_t>(v.value);
    } else if constexpr (std::is_same_v<T, std::string>) {
      put_raw<uint32_t>(static_cast<uint32_t>(v.size()));
      out_->append(v);
    } else if constexpr (IsVector<T>::value) {
      put_raw<uint32_t>(static_cast<uint32_t>(v.size()));
      for (const auto& e : v) put(e);
    } else if constexpr (IsOptional<T>::value) {
      put_raw<uint8_t>(v.has_value() ? 1 : 0);
      if (v) put(*v);
    } else {
      static_assert(Message<T>, "type has no wire encoding");
      v.visit_fields([&](const auto&... f) { (put(f), ...); });
    }
  }

 private:
  template <class I>
  void put_raw(I v) {
    static_assert(std::endian::native == std::endian::little, "big-endian hosts need byte swaps");
    char buf[sizeof(I)];
    std::memcpy(buf, &v, sizeof(I));
    out_->append(buf, sizeof(I));
  }

  std::string* out_;
};

class Decoder {
 public:
  explicit Decoder(std::span<const uint8_t> in) : in_(in) {}

  // Decodes into `v`; on failure returns kProtocol naming the field position, `v` is unspecified.
  template <class T>
  Status get(T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      uint8_t b = 0;
      PENSTOCK_RETURN_IF_ERROR(get_raw(b));
      if (b > 1) return fail("bool is not 0 or 1");
      v = b == 1;
    } else if constexpr (std::is_integral_v<T>) {
      PENSTOCK_RETURN_IF_ERROR(get_raw(v));
    } else if constexpr (std::is_enum_v<T>) {
      std::underlying_type_t<T> raw{};
      PENSTOCK_RETURN_IF_ERROR(get_raw(raw));
      if (static_cast<uint64_t>(raw) > EnumLimit<T>::kMax) return fail("enum value out of range");
      v = static_cast<T>(raw);
    } else if constexpr (IsStrongId<T>::value) {
      PENSTOCK_RETURN_IF_ERROR(get_raw(v.value));
    } else if constexpr (std::is_same_v<T, std::string>) {
      uint32_t n = 0;
      PENSTOCK_RETURN_IF_ERROR(get_raw(n));
      if (n > kMaxFieldBytes) return fail("string longer than the 1 MiB field limit");
      if (n > remaining()) return fail("string length past the end of the message");
      v.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
      pos_ += n;
    } else if constexpr (IsVector<T>::value) {
      uint32_t n = 0;
      PENSTOCK_RETURN_IF_ERROR(get_raw(n));
      // A count of more elements than the rest could hold is a lie. Elements are added as they
      // decode, so memory grows with the bytes really sent, never with the count alone.
      using Element = typename T::value_type;
      const size_t min_bytes = std::max<size_t>(1, min_wire_bytes<Element>());
      if (n > remaining() / min_bytes) return fail("element count past the end of the message");
      v.clear();
      v.reserve(std::min<size_t>(n, kReserveElements));
      for (uint32_t i = 0; i < n; ++i) PENSTOCK_RETURN_IF_ERROR(get(v.emplace_back()));
    } else if constexpr (IsOptional<T>::value) {
      uint8_t present = 0;
      PENSTOCK_RETURN_IF_ERROR(get_raw(present));
      if (present > 1) return fail("optional flag is not 0 or 1");
      if (present == 1) {
        v.emplace();
        PENSTOCK_RETURN_IF_ERROR(get(*v));
      } else {
        v.reset();
      }
    } else {
      static_assert(Message<T>, "type has no wire encoding");
      Status st;
      v.visit_fields([&](auto&... f) { ((st.is_ok() ? (st = get(f), 0) : 0), ...); });
      return st;
    }
    return Status::ok();
  }

  size_t remaining() const { return in_.size() - pos_; }

 private:
  template <class I>
  Status get_raw(I& v) {
    if (remaining() < sizeof(I)) return fail("message truncated");
    std::memcpy(&v, in_.data() + pos_, sizeof(I));
    pos_ += sizeof(I);
    return Status::ok();
  }
  Status fail(const char* what) const {
    return Status(Code::kProtocol, std::string(what) + " at byte " + std::to_string(pos_));
  }

  static constexpr size_t kReserveElements = 1024;  // reserved for a vector up front, at most

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

// Encodes a whole message into a fresh string.
template <Message T>
std::string encode(const T& msg) {
  std::string out;
  Encoder(&out).put(msg);
  return out;
}

using penstock::bytes_of;  // common/base/bytes.h

// Decodes a whole message; bytes left over after the last field are an error.
template <Message T>
Result<T> decode(std::span<const uint8_t> bytes) {
  T msg{};
  Decoder d(bytes);
  PENSTOCK_RETURN_IF_ERROR(d.get(msg));
  if (d.remaining() != 0) return Status(Code::kProtocol, "trailing bytes after the message");
  return msg;
}

}  // namespace penstock::proto
