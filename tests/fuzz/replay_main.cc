// Replays a fuzz corpus through LLVMFuzzerTestOneInput without libFuzzer, so every build (gcc
// included) runs every decoder over the committed seeds. Usage: frame_fuzz_replay CORPUS_DIR...
// Exits non-zero when a directory is missing or empty (a test that checks nothing must fail).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s CORPUS_DIR...\nfeeds every file of each directory to the fuzz target\n",
                 argv[0]);
    return argc < 2 ? 2 : 0;
  }
  size_t total = 0;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    std::filesystem::directory_iterator it(argv[i], ec);
    if (ec) {
      std::fprintf(stderr, "cannot read corpus directory %s: %s\n", argv[i], ec.message().c_str());
      return 1;
    }
    size_t files = 0;
    for (const auto& entry : it) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++files;
    }
    if (files == 0) {
      std::fprintf(stderr, "corpus directory %s has no files\n", argv[i]);
      return 1;
    }
    total += files;
  }
  std::printf("replayed %zu inputs\n", total);
  return 0;
}
