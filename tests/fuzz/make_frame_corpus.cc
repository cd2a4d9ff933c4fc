// Writes the seed corpus of frame_fuzz: for every request and response type of both services a
// real encoded frame (selector byte + header + message), once with default fields and once with
// every field populated (strings, vectors of two, optionals present), plus a few broken frames.
// Usage: make_frame_corpus OUT_DIR   (the committed corpus is tests/fuzz/corpus/frame/)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>

#include "common/proto/codec.h"
#include "common/proto/frame.h"
#include "tests/fuzz/frame_fuzz_types.h"

namespace {

using namespace penstock;

template <class T>
void fill(T& v, int depth) {
  if constexpr (std::is_same_v<T, bool>) {
    v = true;
  } else if constexpr (std::is_integral_v<T>) {
    v = static_cast<T>(depth * 7 + 3);
  } else if constexpr (std::is_enum_v<T>) {
    v = static_cast<T>(1);
  } else if constexpr (proto::IsStrongId<T>::value) {
    v = T{static_cast<uint64_t>(depth + 1)};
  } else if constexpr (std::is_same_v<T, std::string>) {
    v = "seed-" + std::to_string(depth);
  } else if constexpr (proto::IsVector<T>::value) {
    v.resize(2);
    for (auto& e : v) fill(e, depth + 1);
  } else if constexpr (proto::IsOptional<T>::value) {
    v.emplace();
    fill(*v, depth + 1);
  } else {
    v.visit_fields([&](auto&... f) { (fill(f, depth + 1), ...); });
  }
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
std::string frame(uint8_t selector, proto::FrameKind kind, proto::ServiceId service, uint16_t method, const T& msg) {
  const std::string body = proto::encode(msg);
  proto::FrameHeader h;
  h.kind = kind;
  h.service = service;
  h.method = method;
  h.request_id = 1;
  h.message_len = static_cast<uint32_t>(body.size());
  auto hb = proto::encode_header(h);
  std::string out(1, static_cast<char>(selector));
  out.append(reinterpret_cast<const char*>(hb.data()), hb.size());
  out += body;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s OUT_DIR\nwrites the frame_fuzz seed corpus into OUT_DIR\n", argv[0]);
    return argc != 2 ? 2 : 0;
  }
  const std::filesystem::path dir = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", argv[1], ec.message().c_str());
    return 1;
  }
  size_t written = 0;
  for (size_t i = 0; i < fuzz::kFuzzMethodCount; ++i) {
    fuzz::with_method(i, [&]<class M>() {
      const auto req_sel = static_cast<uint8_t>(2 * i);
      const auto resp_sel = static_cast<uint8_t>(2 * i + 1);
      const std::string name(M::kName);
      typename M::Request req{};
      typename M::Response resp{};
      write_file(dir / (name + "_req_default"), frame(req_sel, proto::FrameKind::kRequest, M::kService, M::kId, req));
      write_file(dir / (name + "_resp_default"), frame(resp_sel, proto::FrameKind::kResponse, M::kService, M::kId, resp));
      fill(req, 0);
      fill(resp, 0);
      write_file(dir / (name + "_req_full"), frame(req_sel, proto::FrameKind::kRequest, M::kService, M::kId, req));
      write_file(dir / (name + "_resp_full"), frame(resp_sel, proto::FrameKind::kResponse, M::kService, M::kId, resp));
      written += 4;
    });
  }
  // A few broken frames so the corpus starts on the error paths too.
  std::string good = frame(0, proto::FrameKind::kRequest, proto::ServiceId::kMeta, 1, proto::meta::RegisterSessionReq{"a", "b"});
  std::string bad_magic = good;
  bad_magic[1] = 'X';
  write_file(dir / "broken_magic", bad_magic);
  write_file(dir / "broken_truncated_header", good.substr(0, 20));
  write_file(dir / "broken_truncated_message", good.substr(0, good.size() - 1));
  write_file(dir / "broken_trailing", good + "zz");
  std::string bad_len = good;
  bad_len[1 + 24 + 3] = '\x7f';  // message_len far over the limit
  write_file(dir / "broken_message_len", bad_len);
  written += 5;
  std::printf("wrote %zu seed inputs to %s\n", written, argv[1]);
  return 0;
}
