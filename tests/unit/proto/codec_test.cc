// The message codec: round trips of the real service messages and rejection of malformed bytes.
#include "common/proto/codec.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/base/bytes.h"
#include "common/proto/data_service.h"
#include "common/proto/meta_service.h"
#include "common/proto/types.h"

namespace penstock::proto {
namespace {

template <class I>
void append_raw(std::string& out, I v) {
  char buf[sizeof(I)];
  std::memcpy(buf, &v, sizeof(I));
  out.append(buf, sizeof(I));
}

// Encodes, decodes, re-encodes: the bytes must be identical. Then every strict prefix must be
// rejected with kProtocol, and every single-byte corruption must decode or fail cleanly.
template <class T>
T round_trip(const T& msg) {
  const std::string wire = encode(msg);
  auto back = decode<T>(bytes_of(wire));
  EXPECT_TRUE(back.has_value()) << back.status().to_string();
  if (!back.has_value()) return T{};
  EXPECT_EQ(encode(*back), wire);
  for (size_t cut = 0; cut < wire.size(); ++cut) {
    auto r = decode<T>(bytes_of(wire).first(cut));
    EXPECT_FALSE(r.has_value()) << "prefix of " << cut << " of " << wire.size() << " bytes decoded";
    if (!r.has_value()) {
      EXPECT_EQ(r.error().code(), Code::kProtocol);
    }
  }
  std::string extended = wire + '\0';
  auto trailing = decode<T>(bytes_of(extended));
  EXPECT_FALSE(trailing.has_value());
  if (!trailing.has_value()) {
    EXPECT_EQ(trailing.error().code(), Code::kProtocol);
  }
  if (wire.size() <= 4096) {
    for (size_t i = 0; i < wire.size(); ++i) {
      for (uint8_t x : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
        std::string bad = wire;
        bad[i] = static_cast<char>(static_cast<uint8_t>(bad[i]) ^ x);
        auto r = decode<T>(bytes_of(bad));
        if (!r.has_value()) {
          EXPECT_EQ(r.error().code(), Code::kProtocol);
        }
      }
    }
  }
  return *back;
}

InodeAttr sample_attr(uint64_t ino) {
  InodeAttr a;
  a.ino = InodeId{ino};
  a.mode = 0100644;
  a.nlink = 2;
  a.uid = 1000;
  a.gid = 1001;
  a.rdev = 0x0803;
  a.size = (5ull << 32) + 17;
  a.atime_ns = -1;
  a.mtime_ns = 1'700'000'000'123'456'789;
  a.ctime_ns = INT64_MIN;
  a.generation = UINT64_MAX;
  a.layout.chunk_size = 1u << 20;
  a.layout.stripe_count = 3;
  a.layout.seed = 0xdeadbeef;
  a.layout.chains = {ChainId{1}, ChainId{2}, ChainId{UINT64_MAX}};
  return a;
}

// ByteBuffer (the RPC bulk buffers) is std::vector with default-initialized growth: what it holds
// survives growth, and explicit values are still written.
TEST(ByteBufferTest, KeepsBytesAcrossGrowthAndHonoursExplicitValues) {
  ByteBuffer b;
  b.assign({1, 2, 3});
  b.resize(1u << 20);  // the new bytes are the caller's to fill
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[2], 3);
  b.resize(3);
  b.resize(10, 0xAB);
  EXPECT_EQ(b[3], 0xAB);
  EXPECT_EQ(b[9], 0xAB);
  ByteBuffer zeros(5, 0);
  EXPECT_EQ(std::vector<uint8_t>(zeros.begin(), zeros.end()), std::vector<uint8_t>(5, 0));
}

TEST(CodecTest, ScalarsStringsAndIdsRoundTrip) {
  meta::LookupReq req;
  req.parent = InodeId{42};
  req.name = std::string("na\0me", 5) + std::string(300, 'z');
  auto back = round_trip(req);
  EXPECT_EQ(back.parent, InodeId{42});
  EXPECT_EQ(back.name, req.name);

  meta::SetAttrReq set;
  set.ino = InodeId{7};
  set.valid = meta::kSetMode | meta::kSetSize | meta::kSetMtimeNow;
  set.mode = 0755;
  set.size = UINT64_MAX;
  set.atime_ns = INT64_MIN;
  set.mtime_ns = INT64_MAX;
  set.caller = Caller{3, 4};
  auto s = round_trip(set);
  EXPECT_EQ(s.size, UINT64_MAX);
  EXPECT_EQ(s.atime_ns, INT64_MIN);
  EXPECT_EQ(s.caller.gid, 4u);
}

TEST(CodecTest, NestedOptionalAndVectorsRoundTrip) {
  meta::ReadDirResp resp;
  resp.eof = true;
  for (int i = 0; i < 5; ++i) {
    meta::DirEntry e;
    e.name = "entry-" + std::to_string(i);
    e.ino = InodeId{static_cast<uint64_t>(100 + i)};
    e.mode = 040755;
    if (i % 2 == 0) e.attr = sample_attr(100 + static_cast<uint64_t>(i));
    resp.entries.push_back(e);
  }
  auto back = round_trip(resp);
  ASSERT_EQ(back.entries.size(), 5u);
  EXPECT_TRUE(back.eof);
  EXPECT_TRUE(back.entries[0].attr.has_value());
  EXPECT_FALSE(back.entries[1].attr.has_value());
  EXPECT_EQ(back.entries[4].attr->layout.chains.back(), ChainId{UINT64_MAX});
  EXPECT_EQ(back.entries[2].attr->mtime_ns, 1'700'000'000'123'456'789);
  EXPECT_EQ(back.entries[3].name, "entry-3");

  meta::ReadDirResp empty;
  auto e = round_trip(empty);
  EXPECT_TRUE(e.entries.empty());
  EXPECT_FALSE(e.eof);
}

TEST(CodecTest, ClusterMapAndRegistrationRoundTrip) {
  meta::ClusterMapResp resp;
  resp.map.version = 9;
  resp.map.nodes = {NodeInfo{NodeId{1}, "127.0.0.1:7001", true, 123}, NodeInfo{NodeId{2}, "[::1]:7002", false, -5}};
  resp.map.targets = {TargetInfo{TargetId{10}, NodeId{1}, "/srv/t0", 1ull << 40, 1ull << 39, true}};
  resp.map.chains = {ChainInfo{ChainId{100}, {TargetId{10}}}, ChainInfo{ChainId{101}, {}}};
  auto back = round_trip(resp);
  EXPECT_EQ(back.map.version, 9u);
  ASSERT_EQ(back.map.nodes.size(), 2u);
  EXPECT_EQ(back.map.nodes[1].address, "[::1]:7002");
  EXPECT_EQ(back.map.nodes[1].last_heartbeat_ns, -5);
  EXPECT_EQ(back.map.targets[0].capacity_bytes, 1ull << 40);
  EXPECT_TRUE(back.map.chains[1].targets.empty());

  meta::RegisterNodeReq reg;
  reg.node_uuid = "0123456789abcdef0123456789abcdef";
  reg.address = "10.0.0.1:7000";
  reg.targets = {meta::TargetReport{"u1", "/a", 1, 2}, meta::TargetReport{"u2", "/b", 3, 4}};
  auto r = round_trip(reg);
  EXPECT_EQ(r.targets[1].path, "/b");
  meta::RegisterNodeResp reg_resp{NodeId{5}, {TargetId{1}, TargetId{2}}, 77};
  EXPECT_EQ(round_trip(reg_resp).targets[1], TargetId{2});
  meta::NodeHeartbeatReq hb{NodeId{5}, reg.targets};
  EXPECT_EQ(round_trip(hb).targets.size(), 2u);
}

TEST(CodecTest, EveryMetaMessageRoundTrips) {
  round_trip(meta::RegisterSessionReq{"mount-a", "gpu-host-1"});
  round_trip(meta::RegisterSessionResp{SessionId{3}, 4, 5'000'000'000});
  round_trip(meta::SessionReq{SessionId{3}});
  round_trip(meta::HeartbeatResp{12});
  EXPECT_EQ(round_trip(meta::AttrResp{sample_attr(9)}).attr.generation, UINT64_MAX);
  round_trip(meta::InodeReq{InodeId{1}});
  round_trip(meta::CreateReq{InodeId{1}, "f", 0644, Caller{1, 2}, SessionId{8}});
  round_trip(meta::MknodReq{InodeId{1}, "fifo", 010644, 0, Caller{}});
  round_trip(meta::MkdirReq{InodeId{1}, "d", 0755, Caller{5, 6}});
  round_trip(meta::NameReq{InodeId{1}, "x"});
  EXPECT_EQ(round_trip(meta::UnlinkResp{sample_attr(4)}).parent.mtime_ns, sample_attr(4).mtime_ns);
  auto dirs = round_trip(meta::DirsResp{{sample_attr(4), sample_attr(5)}, InodeId{77}});
  ASSERT_EQ(dirs.dirs.size(), 2u);
  EXPECT_EQ(dirs.dirs[1].mtime_ns, sample_attr(5).mtime_ns);
  EXPECT_EQ(dirs.removed, InodeId{77});
  EXPECT_TRUE(round_trip(meta::DirsResp{}).dirs.empty());
  auto rn = round_trip(meta::RenameReq{InodeId{1}, "a", InodeId{2}, "b", meta::kRenameExchange});
  EXPECT_EQ(rn.flags, static_cast<uint32_t>(meta::kRenameExchange));
  round_trip(meta::LinkReq{InodeId{3}, InodeId{1}, "hard"});
  round_trip(meta::SymlinkReq{InodeId{1}, "l", std::string(4095, 't'), Caller{}});
  round_trip(meta::ReadlinkResp{"../target"});
  round_trip(meta::ReadDirReq{InodeId{1}, "after-me", 128, true});
  round_trip(meta::StatFsResp{1, 2, 3, 4, 4096, 255});
  round_trip(meta::GetXattrReq{InodeId{1}, "user.k"});
  round_trip(meta::GetXattrResp{std::string("\0\1\2", 3)});
  round_trip(meta::SetXattrReq{InodeId{1}, "user.k", "v", 1});
  round_trip(meta::ListXattrResp{{"user.a", "user.b", ""}});
  round_trip(meta::OpenReq{InodeId{1}, SessionId{2}, 0101});
  round_trip(meta::ReleaseReq{InodeId{1}, SessionId{2}});
  round_trip(meta::ReportSizeReq{InodeId{1}, 1ull << 50, 99});
  round_trip(meta::LayoutResp{sample_attr(1).layout});
  round_trip(meta::SetLayoutReq{InodeId{1}, 1u << 22, 4});
  round_trip(Empty{});
}

TEST(CodecTest, EveryDataMessageRoundTrips) {
  data::ChunkKey key{ChainId{1}, TargetId{2}, InodeId{3}, (1ull << 40) + 1, 4u << 20};
  auto w = round_trip(data::WriteReq{key, 4096});
  EXPECT_EQ(w.key.chunk_index, (1ull << 40) + 1);
  EXPECT_EQ(w.offset, 4096u);
  round_trip(data::WriteResp{4u << 20});
  auto r = round_trip(data::ReadReq{key, 1, UINT32_MAX});
  EXPECT_EQ(r.length, UINT32_MAX);
  EXPECT_FALSE(r.sequential);
  r = round_trip(data::ReadReq{key, 1, 4096, true, true});
  EXPECT_TRUE(r.verify_at_client);
  EXPECT_TRUE(r.sequential);
  round_trip(data::ReadResp{17});
  round_trip(data::TruncateReq{TargetId{2}, InodeId{3}, 12345, 1u << 16});
  round_trip(data::RemoveReq{TargetId{2}, InodeId{3}});
  round_trip(data::SyncReq{TargetId{2}, InodeId{3}});
  round_trip(data::DropCachesReq{});
  round_trip(data::DropCachesReq{{TargetId{2}, TargetId{9}}});
  round_trip(data::DropCachesResp{3, 1000, 12});
  data::StatsResp stats{123456, {}, {}, 0xfeedface12345678};
  data::TargetCounters c;
  uint64_t v = 1;
  c.visit_fields([&](auto&... f) { ((f = v++ * 1000003), ...); });  // each field a value of its own
  stats.targets.push_back(data::TargetStats{TargetId{4}, c});
  stats.targets.push_back(data::TargetStats{TargetId{9}, data::TargetCounters{}});
  const data::StatsResp back = round_trip(stats);
  ASSERT_EQ(back.targets.size(), 2u);
  EXPECT_EQ(back.uptime_ms, 123456u);
  EXPECT_EQ(back.instance, 0xfeedface12345678u);
  EXPECT_EQ(back.targets[0].target, TargetId{4});
  EXPECT_EQ(back.targets[0].counters.reads, 1000003u);
  EXPECT_EQ(back.targets[0].counters.no_space, 13u * 1000003u);
  EXPECT_EQ(back.targets[1].counters.reads, 0u);
  EXPECT_EQ(encode(data::TargetCounters{}).size(), 13u * 8u);
  stats.methods.push_back(MethodStats{"Read", 7, 1, 900});
  const data::StatsResp with_methods = round_trip(stats);
  ASSERT_EQ(with_methods.methods.size(), 1u);
  EXPECT_EQ(with_methods.methods[0].name, "Read");
  EXPECT_EQ(with_methods.methods[0].calls, 7u);
  EXPECT_EQ(with_methods.methods[0].errors, 1u);
  EXPECT_EQ(with_methods.methods[0].busy_us, 900u);
  const meta::ServerStatsResp m =
      round_trip(meta::ServerStatsResp{5, {MethodStats{"Create", 3, 0, 40}, MethodStats{}}, 77});
  EXPECT_EQ(m.instance, 77u);
  ASSERT_EQ(m.methods.size(), 2u);
  EXPECT_EQ(m.uptime_ms, 5u);
  EXPECT_EQ(m.methods[0].name, "Create");
  EXPECT_EQ(m.methods[1].name, "");
}

TEST(CodecTest, EmptyMessage) {
  EXPECT_TRUE(encode(Empty{}).empty());
  EXPECT_TRUE(decode<Empty>({}).has_value());
  const uint8_t one = 0;
  auto r = decode<Empty>(std::span<const uint8_t>(&one, 1));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
  EXPECT_NE(r.error().message().find("trailing"), std::string::npos);
}

TEST(CodecTest, StringLengthPastTheEnd) {
  std::string wire;
  append_raw<uint64_t>(wire, 1);    // parent
  append_raw<uint32_t>(wire, 100);  // name length
  wire += "abc";
  auto r = decode<meta::LookupReq>(bytes_of(wire));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
  EXPECT_NE(r.error().message().find("past the end"), std::string::npos) << r.error().message();
}

TEST(CodecTest, StringOverFieldLimitIsRejectedEvenWhenBytesArePresent) {
  std::string wire;
  append_raw<uint32_t>(wire, kMaxFieldBytes + 1);
  wire.append(kMaxFieldBytes + 1, 'v');
  auto r = decode<meta::ReadlinkResp>(bytes_of(wire));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
  EXPECT_NE(r.error().message().find("1 MiB"), std::string::npos) << r.error().message();

  std::string ok;
  append_raw<uint32_t>(ok, kMaxFieldBytes);
  ok.append(kMaxFieldBytes, 'v');
  auto good = decode<meta::ReadlinkResp>(bytes_of(ok));
  ASSERT_TRUE(good.has_value()) << good.error().to_string();
  EXPECT_EQ(good->target.size(), kMaxFieldBytes);
}

TEST(CodecTest, HugeElementCountsAreRejectedWithoutAllocating) {
  for (uint32_t count : {UINT32_MAX, 1u << 31, 5u}) {
    std::string wire;
    append_raw<uint32_t>(wire, count);  // entries
    wire.append(4, '\0');               // fewer bytes than `count` elements need
    auto r = decode<meta::ReadDirResp>(bytes_of(wire));
    ASSERT_FALSE(r.has_value()) << count;
    EXPECT_EQ(r.error().code(), Code::kProtocol);
  }
  std::string names;
  append_raw<uint32_t>(names, UINT32_MAX);
  auto r = decode<meta::ListXattrResp>(bytes_of(names));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
}

TEST(CodecTest, TheSmallestEncodingOfAMessageIsTheSumOfItsFields) {
  EXPECT_EQ(min_wire_bytes<TargetId>(), 8u);
  EXPECT_EQ(min_wire_bytes<std::string>(), 4u);
  EXPECT_EQ(min_wire_bytes<std::optional<uint64_t>>(), 1u);
  // uuid, path (4 each), capacity, free (8 each), fs_id (4), has_chunks (1).
  EXPECT_EQ(min_wire_bytes<meta::TargetReport>(), 29u);
  EXPECT_EQ(encode(meta::TargetReport{}).size(), min_wire_bytes<meta::TargetReport>());
}

// A count each of whose elements could have one byte of the rest, but not their smallest
// encoding, is refused before anything is allocated for it: with one byte per element assumed,
// 16 MiB of message could ask for 16M elements of 120 bytes each (2 GB) before failing.
TEST(CodecTest, ACountIsCheckedAgainstTheSmallestEncodingOfItsElements) {
  for (uint32_t n : {4u, 1000u}) {
    std::string wire;
    append_raw<uint64_t>(wire, 7);                     // node
    append_raw<uint32_t>(wire, n);                     // targets
    wire.append(n == 4u ? 29 * 4 - 1 : 1000, '\0');  // n bytes and more, not n reports
    auto r = decode<meta::NodeHeartbeatReq>(bytes_of(wire));
    ASSERT_FALSE(r.has_value()) << n;
    EXPECT_EQ(r.error().code(), Code::kProtocol);
    EXPECT_NE(r.error().message().find("element count"), std::string::npos) << r.error().message();
  }
  std::string ids;
  append_raw<uint32_t>(ids, 2);
  ids.append(15, '\0');  // two TargetIds need 16
  auto r = decode<data::DropCachesReq>(bytes_of(ids));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("element count"), std::string::npos) << r.error().message();
  ids.push_back('\0');
  auto ok = decode<data::DropCachesReq>(bytes_of(ids));
  ASSERT_TRUE(ok.has_value()) << ok.error().to_string();
  EXPECT_EQ(ok->targets.size(), 2u);
}

TEST(CodecTest, BoolMustBeZeroOrOne) {
  meta::ScrubReq req{true};  // a message whose last byte is a bool
  std::string wire = encode(req);
  ASSERT_EQ(static_cast<uint8_t>(wire.back()), 1);
  for (uint8_t v : {uint8_t{2}, uint8_t{0x80}, uint8_t{0xff}}) {
    wire.back() = static_cast<char>(v);
    auto r = decode<meta::ScrubReq>(bytes_of(wire));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), Code::kProtocol);
    EXPECT_NE(r.error().message().find("bool"), std::string::npos);
  }
  wire.back() = 0;
  auto ok = decode<meta::ScrubReq>(bytes_of(wire));
  ASSERT_TRUE(ok.has_value());
  EXPECT_FALSE(ok->dry_run);
}

TEST(CodecTest, OptionalFlagMustBeZeroOrOne) {
  meta::DirEntry e{"n", InodeId{2}, 0, std::nullopt};
  std::string wire = encode(e);
  wire.back() = 2;  // the optional's presence byte is last
  auto r = decode<meta::DirEntry>(bytes_of(wire));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
}

struct WithFileType {
  FileType type = FileType::kRegular;
  uint32_t after = 0;
  PENSTOCK_FIELDS(type, after);
};

TEST(CodecTest, EnumOutOfRangeIsRejected) {
  for (uint8_t v = 1; v <= 7; ++v) {
    WithFileType m{static_cast<FileType>(v), 5};
    auto back = round_trip(m);
    EXPECT_EQ(back.type, static_cast<FileType>(v));
  }
  for (uint8_t v : {uint8_t{8}, uint8_t{0x7f}, uint8_t{0xff}}) {
    std::string wire = encode(WithFileType{});
    wire[0] = static_cast<char>(v);
    auto r = decode<WithFileType>(bytes_of(wire));
    ASSERT_FALSE(r.has_value()) << int{v};
    EXPECT_EQ(r.error().code(), Code::kProtocol);
    EXPECT_NE(r.error().message().find("enum"), std::string::npos);
  }
}

TEST(CodecTest, TrailingBytesAreRejected) {
  std::string wire = encode(data::SyncReq{TargetId{1}, InodeId{2}});
  wire += "x";
  auto r = decode<data::SyncReq>(bytes_of(wire));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kProtocol);
}

TEST(CodecTest, ArbitraryBytesNeverCrashAnyDecoder) {
  // A deterministic pseudo-random sweep; every decoder must either succeed or say kProtocol.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto check = [](auto tag, std::span<const uint8_t> in) {
    using T = decltype(tag);
    auto r = decode<T>(in);
    if (!r.has_value()) {
      EXPECT_EQ(r.error().code(), Code::kProtocol);
    }
  };
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> buf(next() % 200);
    for (auto& b : buf) {
      uint64_t v = next();
      // Small values make counts and lengths plausible, so decoders go deep.
      b = static_cast<uint8_t>((v & 3) == 0 ? (v >> 8) : (v >> 8) % 3);
    }
    std::span<const uint8_t> in(buf);
    check(meta::ReadDirResp{}, in);
    check(meta::ClusterMapResp{}, in);
    check(meta::RegisterNodeReq{}, in);
    check(meta::AttrResp{}, in);
    check(meta::ListXattrResp{}, in);
    check(data::ReadReq{}, in);
    check(data::WriteReq{}, in);
  }
}

}  // namespace
}  // namespace penstock::proto
