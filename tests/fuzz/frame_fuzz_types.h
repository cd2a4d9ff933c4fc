// The decoders the frame fuzz target drives: every request and response type of both services,
// numbered in a fixed order so that the first byte of a fuzz input selects one (the seed corpus
// generator uses the same numbering). Append only: reordering would invalidate the corpus.
#pragma once

#include <cstddef>
#include <tuple>

#include "common/proto/data_service.h"
#include "common/proto/meta_service.h"

namespace penstock::fuzz {

namespace m = ::penstock::proto::meta;
namespace d = ::penstock::proto::data;

using FuzzMethods = std::tuple<
    m::RegisterSession, m::Heartbeat, m::CloseSession, m::Lookup, m::GetAttr, m::SetAttr, m::Create, m::Mknod,
    m::Mkdir, m::Unlink, m::Rmdir, m::Rename, m::Link, m::Symlink, m::Readlink, m::ReadDir, m::StatFs,
    m::GetXattr, m::SetXattr, m::ListXattr, m::RemoveXattr, m::Open, m::Release, m::ReportSize, m::GetLayout,
    m::SetLayout, m::GetClusterMap, m::RegisterNode, m::NodeHeartbeat,
    d::Write, d::Read, d::Truncate, d::Remove, d::Sync, m::ReleaseMany, d::DropCaches, m::DropCaches, d::ListInodes, m::Scrub, m::DirLease,
    m::CreateBatch, m::ReclaimOpens, m::LookupOpen, m::Replay, d::Stats, m::ServerStats>;

inline constexpr size_t kFuzzMethodCount = std::tuple_size_v<FuzzMethods>;
// Selector s picks method s / 2 % kFuzzMethodCount, its request when s is even, its response when odd.
inline constexpr size_t kFuzzSelectorCount = 2 * kFuzzMethodCount;

// Calls f.template operator()<M>() for the method with index i.
template <class F, size_t I = 0>
void with_method(size_t i, F&& f) {
  if constexpr (I < kFuzzMethodCount) {
    if (i == I) {
      f.template operator()<std::tuple_element_t<I, FuzzMethods>>();
      return;
    }
    with_method<F, I + 1>(i, std::forward<F>(f));
  }
}

}  // namespace penstock::fuzz
