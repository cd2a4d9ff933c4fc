// Strong ID types: an InodeId is never silently a ChainId. 64-bit values, 0 means "none".
// Thread-safety: value types.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>

namespace penstock {

template <class Tag>
struct StrongId {
  uint64_t value = 0;

  constexpr StrongId() = default;
  constexpr explicit StrongId(uint64_t v) : value(v) {}
  constexpr bool valid() const { return value != 0; }
  constexpr auto operator<=>(const StrongId&) const = default;
  std::string to_string() const { return std::to_string(value); }
};

struct InodeTag {};
struct ChainTag {};
struct TargetTag {};
struct NodeTag {};
struct SessionTag {};

using InodeId = StrongId<InodeTag>;     // 1 is the root directory
using ChainId = StrongId<ChainTag>;     // a replication chain (v0: one target each)
using TargetId = StrongId<TargetTag>;   // one chunk directory served by a data server
using NodeId = StrongId<NodeTag>;       // one data server process
using SessionId = StrongId<SessionTag>; // one client mount's session at the meta server

inline constexpr InodeId kRootInode{1};

}  // namespace penstock

template <class Tag>
struct std::hash<penstock::StrongId<Tag>> {
  size_t operator()(const penstock::StrongId<Tag>& id) const noexcept {
    return std::hash<uint64_t>()(id.value);
  }
};
