// Fuzz target for every decoder of network bytes: the frame header and every request and response
// message of both services. Input: [selector u8][32-byte frame header][message bytes...].
// Invariants checked besides "no crash": a decoded header re-encodes to the same 32 bytes, and a
// decoded message re-encodes to exactly the input bytes (the encoding is canonical).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "common/proto/codec.h"
#include "common/proto/frame.h"
#include "tests/fuzz/frame_fuzz_types.h"

namespace {

[[noreturn]] void invariant_broken(const char* what) {
  std::fprintf(stderr, "frame_fuzz: invariant broken: %s\n", what);
  std::abort();
}

template <class T>
void decode_one(std::span<const uint8_t> msg) {
  auto r = penstock::proto::decode<T>(msg);
  if (!r.has_value()) {
    if (r.error().code() != penstock::Code::kProtocol) invariant_broken("decode failed with a code other than kProtocol");
    return;
  }
  const std::string again = penstock::proto::encode(*r);
  if (again.size() != msg.size() || std::memcmp(again.data(), msg.data(), msg.size()) != 0) {
    invariant_broken("decoded message does not re-encode to the input bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace penstock;
  if (size < 1) return 0;
  const size_t selector = data[0] % fuzz::kFuzzSelectorCount;
  std::span<const uint8_t> rest(data + 1, size - 1);
  const size_t header_bytes = rest.size() < proto::kFrameHeaderSize ? rest.size() : proto::kFrameHeaderSize;
  auto header = proto::decode_header(rest.first(header_bytes));
  if (header.has_value()) {
    if (header_bytes != proto::kFrameHeaderSize) invariant_broken("a truncated header decoded");
    auto again = proto::encode_header(*header);
    if (std::memcmp(again.data(), rest.data(), proto::kFrameHeaderSize) != 0) {
      invariant_broken("decoded header does not re-encode to the input bytes");
    }
  } else if (header.error().code() != Code::kProtocol) {
    invariant_broken("decode_header failed with a code other than kProtocol");
  }
  std::span<const uint8_t> message = rest.subspan(header_bytes);
  fuzz::with_method(selector / 2, [&]<class M>() {
    if (selector % 2 == 0) {
      decode_one<typename M::Request>(message);
    } else {
      decode_one<typename M::Response>(message);
    }
  });
  return 0;
}
