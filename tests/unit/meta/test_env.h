// Shared fixtures of the meta unit tests: temp directories and the two Store backends the typed
// suites run over (in-memory and RocksDB in a temp dir removed afterwards).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/proto/meta_service.h"
#include "server/meta/cached_store.h"
#include "server/meta/rocksdb_store.h"
#include "server/meta/schema.h"
#include "server/meta/store.h"

namespace penstock::meta::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "penstock-meta-test-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct MemoryBackend {
  static constexpr bool kDurable = false;
  std::shared_ptr<MemoryStore> mem = std::make_shared<MemoryStore>();
  // The in-memory store "reopens" as the same object: nothing is lost, like a clean restart.
  std::shared_ptr<Store> open() { return mem; }
};

struct RocksBackend {
  static constexpr bool kDurable = true;
  TempDir dir;
  std::shared_ptr<Store> open() {
    // Without the per-write fsync: the suites check logic and clean-restart persistence, and 10,000
    // synced creates would take a minute. Durable by default is checked in store_test.cc.
    RocksDbOptions options;
    options.sync = false;
    auto s = RocksDbStore::open(dir.path() + "/db", options);
    if (!s.has_value()) {
      ADD_FAILURE() << s.error().to_string();
      return nullptr;
    }
    return std::shared_ptr<Store>(std::move(s).value().release());
  }
};

// RocksDB behind penstock-meta's record cache (inode and directory-entry records), as the daemon
// runs it, with a small capacity so that the suites also evict.
struct CachedRocksBackend {
  static constexpr bool kDurable = true;
  RocksBackend rocks;
  std::shared_ptr<Store> open() {
    std::shared_ptr<Store> inner = rocks.open();
    if (inner == nullptr) return nullptr;
    CachedStoreOptions options;
    options.capacity_bytes = 64 << 10;
    options.prefixes = {std::string(schema::kInodePrefix), std::string(schema::kDentryPrefix)};
    // The cache goes first, then the database it borrows (the deleter holds the last reference).
    return std::shared_ptr<Store>(new CachedStore(inner.get(), options), [inner](CachedStore* c) { delete c; });
  }
};

// prefix followed by the decimal i ("f" + std::to_string(i) trips gcc 12's -Wrestrict false
// positive at -O3).
inline std::string numbered(std::string_view prefix, long i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

// A create of a 0644 file by uid 1000, gid 100; with `session` valid the file is opened for it.
inline proto::meta::CreateReq create_req(InodeId parent, const std::string& name, SessionId session = SessionId()) {
  proto::meta::CreateReq req;
  req.parent = parent;
  req.name = name;
  req.mode = 0644;
  req.caller = proto::Caller{1000, 100};
  req.session = session;
  return req;
}

template <class T>
Code code_of(const Result<T>& r) {
  return r.status().code();
}
inline Code code_of(const Status& s) { return s.code(); }

}  // namespace penstock::meta::testing

#define EXPECT_CODE(expr, c) EXPECT_EQ(::penstock::code_name(::penstock::meta::testing::code_of(expr)), ::penstock::code_name(c))
#define ASSERT_OK(expr)                                                      \
  do {                                                                       \
    auto penstock_st_ = ::penstock::detail::to_status(expr);                 \
    ASSERT_TRUE(penstock_st_.is_ok()) << penstock_st_.to_string();           \
  } while (0)
