#include "server/meta/namespace.h"

#include <sys/stat.h>

#include <future>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

using testing::MemoryBackend;
using testing::CachedRocksBackend;
using testing::RocksBackend;

constexpr int64_t kStart = 1'700'000'000'000'000'000;

// The namespace suite, run over every Store implementation.
template <class B>
class NamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = backend_.open();
    ASSERT_NE(store_, nullptr);
    reopen();
    add_node("node-a", "127.0.0.1:7700", {"t1", "t2"});
    add_node("node-b", "127.0.0.1:7701", {"t3", "t4"});
  }

  void reopen() {
    svc_.reset();
    MetaOptions o;
    o.now = [this] { return now_; };
    o.seed = 42;
    o.inode_batch = 16;
    o.session_lease_ns = 30'000'000'000;
    o.node_timeout_ns = 10'000'000'000;
    auto s = MetaService::open(store_.get(), o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
  }

  pm::RegisterNodeResp add_node(const std::string& uuid, const std::string& addr, std::vector<std::string> targets) {
    pm::RegisterNodeReq req;
    req.node_uuid = uuid;
    req.address = addr;
    for (auto& t : targets) req.targets.push_back(pm::TargetReport{t, "/data/" + t, 1000, 400});
    auto r = svc_->register_node(req);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? *r : pm::RegisterNodeResp{};
  }

  Result<pm::AttrResp> create(InodeId parent, const std::string& name, SessionId session = SessionId()) {
    return svc_->create(testing::create_req(parent, name, session));
  }
  InodeId must_create(InodeId parent, const std::string& name, SessionId session = SessionId()) {
    auto r = create(parent, name, session);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  }
  Result<pm::AttrResp> mkdir(InodeId parent, const std::string& name) {
    return svc_->mkdir(pm::MkdirReq{parent, name, 0755, proto::Caller{1000, 100}});
  }
  InodeId must_mkdir(InodeId parent, const std::string& name) {
    auto r = mkdir(parent, name);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  }
  proto::InodeAttr attr(InodeId ino) {
    auto r = svc_->get_attr(pm::InodeReq{ino});
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr : proto::InodeAttr{};
  }
  Result<pm::AttrResp> lookup(InodeId parent, const std::string& name) {
    return svc_->lookup(pm::LookupReq{parent, name});
  }
  Status unlink(InodeId parent, const std::string& name) { return svc_->unlink(pm::NameReq{parent, name}).status(); }
  Status rmdir(InodeId parent, const std::string& name) { return svc_->rmdir(pm::NameReq{parent, name}).status(); }
  Status rename(InodeId p, const std::string& n, InodeId np, const std::string& nn, uint32_t flags = 0) {
    return svc_->rename(pm::RenameReq{p, n, np, nn, flags}).status();
  }
  std::vector<std::string> names(InodeId dir) {
    std::vector<std::string> out;
    pm::ReadDirReq req{dir, "", 0, false};
    for (;;) {
      auto r = svc_->read_dir(req);
      EXPECT_TRUE(r.has_value()) << r.error().to_string();
      if (!r.has_value()) return out;
      for (auto& e : r->entries) out.push_back(e.name);
      if (r->eof || r->entries.empty()) return out;
      req.after = r->entries.back().name;
    }
  }
  SessionId new_session() {
    auto r = svc_->register_session(pm::RegisterSessionReq{"test", "host"});
    EXPECT_TRUE(r.has_value());
    return r.has_value() ? r->session : SessionId();
  }

  B backend_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<MetaService> svc_;
  int64_t now_ = kStart;
};

using Backends = ::testing::Types<MemoryBackend, RocksBackend, CachedRocksBackend>;
TYPED_TEST_SUITE(NamespaceTest, Backends);

TYPED_TEST(NamespaceTest, RootDirectoryExists) {
  auto a = this->attr(kRootInode);
  EXPECT_EQ(a.ino, kRootInode);
  EXPECT_EQ(a.mode, static_cast<uint32_t>(S_IFDIR | 0755));
  EXPECT_EQ(a.nlink, 2u);
  EXPECT_EQ(a.uid, 0u);
  EXPECT_EQ(a.layout.chunk_size, 4u << 20);
  EXPECT_EQ(a.layout.stripe_count, 0u);
  EXPECT_TRUE(a.layout.chains.empty());
}

TYPED_TEST(NamespaceTest, CreateThenLookupAndGetAttr) {
  this->now_ += 5;
  auto r = this->create(kRootInode, "f");
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  const auto& a = r->attr;
  EXPECT_GT(a.ino.value, kRootInode.value);
  EXPECT_EQ(a.mode, static_cast<uint32_t>(S_IFREG | 0644));
  EXPECT_EQ(a.nlink, 1u);
  EXPECT_EQ(a.uid, 1000u);
  EXPECT_EQ(a.gid, 100u);
  EXPECT_EQ(a.size, 0u);
  EXPECT_EQ(a.mtime_ns, this->now_);
  EXPECT_EQ(a.ctime_ns, this->now_);
  EXPECT_EQ(a.atime_ns, this->now_);
  EXPECT_EQ(a.layout.chunk_size, 4u << 20);
  EXPECT_EQ(a.layout.stripe_count, 4u);
  EXPECT_EQ(a.layout.chains.size(), 4u);
  EXPECT_LT(a.layout.seed, 4u);
  auto l = this->lookup(kRootInode, "f");
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->attr.ino, a.ino);
  EXPECT_EQ(this->attr(a.ino).mode, a.mode);
  EXPECT_EQ(this->attr(kRootInode).mtime_ns, this->now_);
  EXPECT_CODE(this->create(kRootInode, "f"), Code::kExists);
  EXPECT_CODE(this->mkdir(kRootInode, "f"), Code::kExists);
  EXPECT_CODE(this->lookup(kRootInode, "g"), Code::kNotFound);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{InodeId(999999)}), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, BadNamesAreRejectedByEveryOperation) {
  InodeId f = this->must_create(kRootInode, "f");
  const std::vector<std::string> bad = {"", ".", "..", "a/b", std::string("a\0b", 3)};
  std::string long_name(256, 'x');
  for (const auto& n : bad) {
    SCOPED_TRACE("name '" + n + "'");
    EXPECT_CODE(this->create(kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->mkdir(kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->lookup(kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->unlink(kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->rmdir(kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, n), Code::kInvalid);
    EXPECT_CODE(this->svc_->link(pm::LinkReq{f, kRootInode, n}), Code::kInvalid);
    EXPECT_CODE(this->svc_->symlink(pm::SymlinkReq{kRootInode, n, "t", {}}), Code::kInvalid);
  }
  EXPECT_CODE(this->create(kRootInode, long_name), Code::kNameTooLong);
  EXPECT_CODE(this->mkdir(kRootInode, long_name), Code::kNameTooLong);
  EXPECT_CODE(this->lookup(kRootInode, long_name), Code::kNameTooLong);
  EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, long_name), Code::kNameTooLong);
  std::string max_name(255, 'y');
  ASSERT_OK(this->create(kRootInode, max_name));
  ASSERT_OK(this->lookup(kRootInode, max_name));
}

TYPED_TEST(NamespaceTest, ParentMissingOrNotADirectory) {
  InodeId f = this->must_create(kRootInode, "f");
  InodeId missing(123456);
  EXPECT_CODE(this->create(missing, "x"), Code::kNotFound);
  EXPECT_CODE(this->mkdir(missing, "x"), Code::kNotFound);
  EXPECT_CODE(this->lookup(missing, "x"), Code::kNotFound);
  EXPECT_CODE(this->unlink(missing, "x"), Code::kNotFound);
  EXPECT_CODE(this->create(f, "x"), Code::kNotDir);
  EXPECT_CODE(this->mkdir(f, "x"), Code::kNotDir);
  EXPECT_CODE(this->lookup(f, "x"), Code::kNotDir);
  EXPECT_CODE(this->unlink(f, "x"), Code::kNotDir);
  EXPECT_CODE(this->rmdir(f, "x"), Code::kNotDir);
  EXPECT_CODE(this->rename(kRootInode, "f", f, "x"), Code::kNotDir);
  EXPECT_CODE(this->svc_->read_dir(pm::ReadDirReq{f, "", 10, false}), Code::kNotDir);
  EXPECT_CODE(this->svc_->symlink(pm::SymlinkReq{f, "s", "t", {}}), Code::kNotDir);
}

TYPED_TEST(NamespaceTest, MkdirRmdirKeepNlink) {
  EXPECT_EQ(this->attr(kRootInode).nlink, 2u);
  InodeId a = this->must_mkdir(kRootInode, "a");
  auto aa = this->attr(a);
  EXPECT_EQ(aa.mode, static_cast<uint32_t>(S_IFDIR | 0755));
  EXPECT_EQ(aa.nlink, 2u);
  EXPECT_EQ(this->attr(kRootInode).nlink, 3u);
  InodeId b = this->must_mkdir(a, "b");
  this->must_create(a, "file");
  EXPECT_EQ(this->attr(a).nlink, 3u);
  EXPECT_EQ(this->attr(kRootInode).nlink, 3u);
  EXPECT_CODE(this->rmdir(kRootInode, "a"), Code::kNotEmpty);
  EXPECT_CODE(this->rmdir(a, "file"), Code::kNotDir);
  EXPECT_CODE(this->rmdir(a, "nope"), Code::kNotFound);
  ASSERT_OK(this->rmdir(a, "b"));
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{b}), Code::kNotFound);
  EXPECT_EQ(this->attr(a).nlink, 2u);
  ASSERT_OK(this->unlink(a, "file"));
  ASSERT_OK(this->rmdir(kRootInode, "a"));
  EXPECT_EQ(this->attr(kRootInode).nlink, 2u);
  EXPECT_CODE(this->lookup(kRootInode, "a"), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, UnlinkErrorsAndEffects) {
  this->must_mkdir(kRootInode, "d");
  EXPECT_CODE(this->unlink(kRootInode, "d"), Code::kIsDir);
  EXPECT_CODE(this->unlink(kRootInode, "nope"), Code::kNotFound);
  InodeId f = this->must_create(kRootInode, "f");
  this->now_ += 100;
  auto r = this->svc_->unlink(pm::NameReq{kRootInode, "f"});
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_CODE(this->lookup(kRootInode, "f"), Code::kNotFound);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{f}), Code::kNotFound);
  EXPECT_EQ(this->attr(kRootInode).mtime_ns, this->now_);
  EXPECT_EQ(this->attr(kRootInode).ctime_ns, this->now_);
  // The reply carries the parent as it is now (the mount answers the kernel's next GETATTR of it).
  EXPECT_EQ(proto::encode(r->parent), proto::encode(this->attr(kRootInode)));
}

// Rmdir and rename answer every directory they changed, as it is after the change, and the one
// they removed: the mount answers the kernel's next GETATTR of those directories with them.
TYPED_TEST(NamespaceTest, RmdirAndRenameAnswerTheDirectoriesTheyChanged) {
  // The encoded attributes of `dirs`, in order, as the server has them now.
  auto now_of = [&](std::initializer_list<InodeId> dirs) {
    std::vector<std::string> out;
    for (InodeId d : dirs) out.push_back(proto::encode(this->attr(d)));
    return out;
  };
  auto encoded = [](const pm::DirsResp& r) {
    std::vector<std::string> out;
    for (const auto& a : r.dirs) out.push_back(proto::encode(a));
    return out;
  };
  InodeId a = this->must_mkdir(kRootInode, "a");
  InodeId b = this->must_mkdir(kRootInode, "b");
  InodeId sub = this->must_mkdir(a, "sub");
  InodeId gone = this->must_mkdir(a, "gone");
  this->must_create(a, "f");

  this->now_ += 10;
  auto rm = this->svc_->rmdir(pm::NameReq{a, "gone"});
  ASSERT_TRUE(rm.has_value()) << rm.error().to_string();
  EXPECT_EQ(encoded(*rm), now_of({a}));
  EXPECT_EQ(this->attr(a).nlink, 3u);  // ".", its name, and "sub"'s ".."
  EXPECT_EQ(this->attr(a).mtime_ns, this->now_);
  EXPECT_EQ(rm->removed, gone);

  // A file within one directory: only that directory changes.
  this->now_ += 10;
  auto file = this->svc_->rename(pm::RenameReq{a, "f", a, "g"});
  ASSERT_TRUE(file.has_value()) << file.error().to_string();
  EXPECT_EQ(encoded(*file), now_of({a}));
  EXPECT_FALSE(file->removed.valid());

  // A directory to another parent: itself (ctime, ".."), both parents (nlink, mtime).
  this->now_ += 10;
  auto moved = this->svc_->rename(pm::RenameReq{a, "sub", b, "sub"});
  ASSERT_TRUE(moved.has_value()) << moved.error().to_string();
  EXPECT_EQ(encoded(*moved), now_of({sub, a, b}));
  EXPECT_EQ(this->attr(a).nlink, 2u);
  EXPECT_EQ(this->attr(b).nlink, 3u);
  EXPECT_EQ(this->attr(sub).ctime_ns, this->now_);

  // Over an empty directory: the replaced one is named as removed.
  InodeId empty = this->must_mkdir(a, "empty");
  this->now_ += 10;
  auto over = this->svc_->rename(pm::RenameReq{b, "sub", a, "empty"});
  ASSERT_TRUE(over.has_value()) << over.error().to_string();
  EXPECT_EQ(encoded(*over), now_of({sub, b, a}));
  EXPECT_EQ(over->removed, empty);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{empty}), Code::kNotFound);

  // An exchange of two directories in two parents: both, and both parents.
  InodeId other = this->must_mkdir(b, "other");
  this->now_ += 10;
  auto swapped = this->svc_->rename(pm::RenameReq{a, "empty", b, "other", pm::kRenameExchange});
  ASSERT_TRUE(swapped.has_value()) << swapped.error().to_string();
  EXPECT_EQ(encoded(*swapped), now_of({other, sub, a, b}));
  EXPECT_FALSE(swapped->removed.valid());

  // A file over a file: only the directory.
  this->must_create(a, "victim");
  this->now_ += 10;
  auto file_over = this->svc_->rename(pm::RenameReq{a, "g", a, "victim"});
  ASSERT_TRUE(file_over.has_value()) << file_over.error().to_string();
  EXPECT_EQ(encoded(*file_over), now_of({a}));
  EXPECT_FALSE(file_over->removed.valid());

  // A directory over an empty one in the same parent: itself and the parent, one link fewer.
  InodeId e2 = this->must_mkdir(b, "e2");
  const uint32_t b_links = this->attr(b).nlink;
  this->now_ += 10;
  auto same_parent = this->svc_->rename(pm::RenameReq{b, "other", b, "e2"});
  ASSERT_TRUE(same_parent.has_value()) << same_parent.error().to_string();
  EXPECT_EQ(encoded(*same_parent), now_of({sub, b}));  // b/other is `sub` since the exchange
  EXPECT_EQ(same_parent->removed, e2);
  EXPECT_EQ(this->attr(b).nlink, b_links - 1);

  // A file exchanged with a directory of another parent: the directory and both parents, whose
  // link counts follow the directory.
  const uint32_t a_links = this->attr(a).nlink;
  this->now_ += 10;
  auto mixed = this->svc_->rename(pm::RenameReq{a, "victim", b, "e2", pm::kRenameExchange});
  ASSERT_TRUE(mixed.has_value()) << mixed.error().to_string();
  EXPECT_EQ(encoded(*mixed), now_of({sub, a, b}));
  EXPECT_EQ(this->attr(a).nlink, a_links + 1);
  EXPECT_EQ(this->attr(b).nlink, b_links - 2);

  // Two links of one inode: nothing changes, nothing is named.
  InodeId h = this->must_create(a, "h");
  ASSERT_TRUE(this->svc_->link(pm::LinkReq{h, a, "h2"}).has_value());
  auto same = this->svc_->rename(pm::RenameReq{a, "h", a, "h2"});
  ASSERT_TRUE(same.has_value()) << same.error().to_string();
  EXPECT_TRUE(same->dirs.empty());
  EXPECT_FALSE(same->removed.valid());
}

TYPED_TEST(NamespaceTest, HardLinks) {
  InodeId d = this->must_mkdir(kRootInode, "d");
  InodeId f = this->must_create(kRootInode, "f");
  EXPECT_CODE(this->svc_->link(pm::LinkReq{d, kRootInode, "dl"}), Code::kNotPermitted);
  EXPECT_CODE(this->svc_->link(pm::LinkReq{f, kRootInode, "d"}), Code::kExists);
  EXPECT_CODE(this->svc_->link(pm::LinkReq{InodeId(99999), kRootInode, "x"}), Code::kNotFound);
  this->now_ += 7;
  auto l = this->svc_->link(pm::LinkReq{f, d, "g"});
  ASSERT_TRUE(l.has_value()) << l.error().to_string();
  EXPECT_EQ(l->attr.nlink, 2u);
  EXPECT_EQ(l->attr.ctime_ns, this->now_);
  EXPECT_EQ(this->lookup(d, "g")->attr.ino, f);
  EXPECT_EQ(this->attr(d).nlink, 2u);  // a file link is not a subdirectory
  ASSERT_OK(this->unlink(kRootInode, "f"));
  EXPECT_EQ(this->attr(f).nlink, 1u);
  ASSERT_OK(this->unlink(d, "g"));
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{f}), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, SymlinkAndReadlink) {
  auto s = this->svc_->symlink(pm::SymlinkReq{kRootInode, "s", "../some/where", proto::Caller{5, 6}});
  ASSERT_TRUE(s.has_value()) << s.error().to_string();
  EXPECT_EQ(s->attr.mode, static_cast<uint32_t>(S_IFLNK | 0777));
  EXPECT_EQ(s->attr.size, 13u);
  EXPECT_EQ(s->attr.uid, 5u);
  EXPECT_TRUE(s->attr.layout.chains.empty());
  auto rl = this->svc_->readlink(pm::InodeReq{s->attr.ino});
  ASSERT_TRUE(rl.has_value());
  EXPECT_EQ(rl->target, "../some/where");
  ASSERT_OK(this->svc_->symlink(pm::SymlinkReq{kRootInode, "max", std::string(4095, 'a'), {}}));
  EXPECT_CODE(this->svc_->symlink(pm::SymlinkReq{kRootInode, "big", std::string(4096, 'a'), {}}), Code::kNameTooLong);
  EXPECT_CODE(this->svc_->symlink(pm::SymlinkReq{kRootInode, "empty", "", {}}), Code::kNotFound);
  EXPECT_CODE(this->svc_->symlink(pm::SymlinkReq{kRootInode, "s", "x", {}}), Code::kExists);
  InodeId f = this->must_create(kRootInode, "f");
  EXPECT_CODE(this->svc_->readlink(pm::InodeReq{f}), Code::kInvalid);
  EXPECT_CODE(this->svc_->readlink(pm::InodeReq{InodeId(77777)}), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, MknodTypes) {
  auto fifo = this->svc_->mknod(pm::MknodReq{kRootInode, "fifo", S_IFIFO | 0600, 0, {}});
  ASSERT_TRUE(fifo.has_value()) << fifo.error().to_string();
  EXPECT_EQ(fifo->attr.mode, static_cast<uint32_t>(S_IFIFO | 0600));
  EXPECT_TRUE(fifo->attr.layout.chains.empty());
  auto sock = this->svc_->mknod(pm::MknodReq{kRootInode, "sock", S_IFSOCK | 0600, 0, {}});
  ASSERT_TRUE(sock.has_value());
  auto chr = this->svc_->mknod(pm::MknodReq{kRootInode, "chr", S_IFCHR | 0600, 0x0103, {}});
  ASSERT_TRUE(chr.has_value());
  EXPECT_EQ(chr->attr.rdev, 0x0103u);
  auto reg = this->svc_->mknod(pm::MknodReq{kRootInode, "reg", 0644, 0, {}});
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->attr.mode, static_cast<uint32_t>(S_IFREG | 0644));
  EXPECT_EQ(reg->attr.layout.chains.size(), 4u);
  EXPECT_CODE(this->svc_->mknod(pm::MknodReq{kRootInode, "dir", S_IFDIR | 0755, 0, {}}), Code::kNotPermitted);
  EXPECT_CODE(this->svc_->mknod(pm::MknodReq{kRootInode, "lnk", S_IFLNK | 0777, 0, {}}), Code::kInvalid);
  EXPECT_CODE(this->svc_->mknod(pm::MknodReq{kRootInode, "fifo", S_IFIFO | 0600, 0, {}}), Code::kExists);
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"chr", "fifo", "reg", "sock"}));
  ASSERT_OK(this->unlink(kRootInode, "fifo"));
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{fifo->attr.ino}), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, SetgidDirectoryPassesGroupDown) {
  InodeId d = this->must_mkdir(kRootInode, "d");
  pm::SetAttrReq sa;
  sa.ino = d;
  sa.valid = pm::kSetMode | pm::kSetGid;
  sa.mode = 02775;
  sa.gid = 77;
  ASSERT_OK(this->svc_->set_attr(sa));
  auto f = this->create(d, "f");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->attr.gid, 77u);
  auto sub = this->mkdir(d, "sub");
  ASSERT_TRUE(sub.has_value());
  EXPECT_EQ(sub->attr.gid, 77u);
  EXPECT_NE(sub->attr.mode & S_ISGID, 0u);
}

// ---- rename ----

TYPED_TEST(NamespaceTest, RenameFileWithinAndAcrossDirectories) {
  InodeId d1 = this->must_mkdir(kRootInode, "d1");
  InodeId d2 = this->must_mkdir(kRootInode, "d2");
  InodeId f = this->must_create(d1, "f");
  this->now_ += 10;
  ASSERT_OK(this->rename(d1, "f", d1, "g"));
  EXPECT_CODE(this->lookup(d1, "f"), Code::kNotFound);
  EXPECT_EQ(this->lookup(d1, "g")->attr.ino, f);
  EXPECT_EQ(this->attr(f).ctime_ns, this->now_);
  this->now_ += 10;
  ASSERT_OK(this->rename(d1, "g", d2, "h"));
  EXPECT_EQ(this->lookup(d2, "h")->attr.ino, f);
  EXPECT_TRUE(this->names(d1).empty());
  EXPECT_EQ(this->attr(d1).mtime_ns, this->now_);
  EXPECT_EQ(this->attr(d2).mtime_ns, this->now_);
  EXPECT_EQ(this->attr(d1).ctime_ns, this->now_);
  EXPECT_EQ(this->attr(d2).ctime_ns, this->now_);
  EXPECT_EQ(this->attr(d1).nlink, 2u);
  EXPECT_EQ(this->attr(d2).nlink, 2u);
  EXPECT_CODE(this->rename(d1, "missing", d2, "x"), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, RenameReplacesFile) {
  InodeId a = this->must_create(kRootInode, "a");
  InodeId b = this->must_create(kRootInode, "b");
  ASSERT_OK(this->rename(kRootInode, "a", kRootInode, "b"));
  EXPECT_EQ(this->lookup(kRootInode, "b")->attr.ino, a);
  EXPECT_CODE(this->lookup(kRootInode, "a"), Code::kNotFound);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{b}), Code::kNotFound);
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"b"}));
}

TYPED_TEST(NamespaceTest, RenameReplacingOneOfSeveralLinksKeepsTheInode) {
  InodeId a = this->must_create(kRootInode, "a");
  InodeId b = this->must_create(kRootInode, "b");
  ASSERT_OK(this->svc_->link(pm::LinkReq{b, kRootInode, "b2"}));
  ASSERT_OK(this->rename(kRootInode, "a", kRootInode, "b"));
  EXPECT_EQ(this->attr(b).nlink, 1u);
  EXPECT_EQ(this->lookup(kRootInode, "b2")->attr.ino, b);
  EXPECT_EQ(this->lookup(kRootInode, "b")->attr.ino, a);
}

TYPED_TEST(NamespaceTest, RenameDirectoryUpdatesParentLinkCounts) {
  InodeId d1 = this->must_mkdir(kRootInode, "d1");
  InodeId d2 = this->must_mkdir(kRootInode, "d2");
  InodeId sub = this->must_mkdir(d1, "sub");
  this->must_create(sub, "inside");
  EXPECT_EQ(this->attr(d1).nlink, 3u);
  ASSERT_OK(this->rename(d1, "sub", d2, "moved"));
  EXPECT_EQ(this->attr(d1).nlink, 2u);
  EXPECT_EQ(this->attr(d2).nlink, 3u);
  EXPECT_EQ(this->attr(kRootInode).nlink, 4u);
  EXPECT_EQ(this->lookup(d2, "moved")->attr.ino, sub);
  EXPECT_EQ(this->names(sub), (std::vector<std::string>{"inside"}));
  // The moved directory's parent pointer follows: moving d2 under the moved dir is a cycle.
  EXPECT_CODE(this->rename(kRootInode, "d2", sub, "x"), Code::kInvalid);
}

TYPED_TEST(NamespaceTest, RenameDirectoryOverEmptyDirectoryReplacesIt) {
  InodeId a = this->must_mkdir(kRootInode, "a");
  InodeId b = this->must_mkdir(kRootInode, "b");
  EXPECT_EQ(this->attr(kRootInode).nlink, 4u);
  ASSERT_OK(this->rename(kRootInode, "a", kRootInode, "b"));
  EXPECT_EQ(this->lookup(kRootInode, "b")->attr.ino, a);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{b}), Code::kNotFound);
  EXPECT_EQ(this->attr(kRootInode).nlink, 3u);
  // Across directories.
  InodeId d = this->must_mkdir(kRootInode, "d");
  InodeId e = this->must_mkdir(d, "e");
  ASSERT_OK(this->rename(kRootInode, "b", d, "e"));
  EXPECT_EQ(this->lookup(d, "e")->attr.ino, a);
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{e}), Code::kNotFound);
  EXPECT_EQ(this->attr(d).nlink, 3u);
  EXPECT_EQ(this->attr(kRootInode).nlink, 3u);
}

TYPED_TEST(NamespaceTest, RenameErrorCases) {
  InodeId d = this->must_mkdir(kRootInode, "d");
  InodeId full = this->must_mkdir(kRootInode, "full");
  this->must_create(full, "x");
  this->must_create(kRootInode, "f");
  InodeId sub = this->must_mkdir(d, "sub");
  EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, "d"), Code::kIsDir);      // file over dir
  EXPECT_CODE(this->rename(kRootInode, "d", kRootInode, "f"), Code::kNotDir);     // dir over file
  EXPECT_CODE(this->rename(kRootInode, "d", kRootInode, "full"), Code::kNotEmpty);
  EXPECT_CODE(this->rename(kRootInode, "d", d, "x"), Code::kInvalid);             // into itself
  EXPECT_CODE(this->rename(kRootInode, "d", sub, "x"), Code::kInvalid);           // into its subtree
  EXPECT_CODE(this->rename(d, "sub", kRootInode, "d"), Code::kNotEmpty);          // over its own parent
  EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, "g", 1u << 5), Code::kInvalid);
  EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, "g", pm::kRenameNoReplace | pm::kRenameExchange),
              Code::kInvalid);
  // Nothing changed.
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"d", "f", "full"}));
  EXPECT_EQ(this->attr(kRootInode).nlink, 4u);
}

TYPED_TEST(NamespaceTest, RenameNoReplace) {
  InodeId a = this->must_create(kRootInode, "a");
  this->must_create(kRootInode, "b");
  EXPECT_CODE(this->rename(kRootInode, "a", kRootInode, "b", pm::kRenameNoReplace), Code::kExists);
  ASSERT_OK(this->rename(kRootInode, "a", kRootInode, "c", pm::kRenameNoReplace));
  EXPECT_EQ(this->lookup(kRootInode, "c")->attr.ino, a);
}

TYPED_TEST(NamespaceTest, RenameExchange) {
  InodeId d1 = this->must_mkdir(kRootInode, "d1");
  InodeId f = this->must_create(kRootInode, "f");
  InodeId sub = this->must_mkdir(d1, "sub");
  EXPECT_CODE(this->rename(kRootInode, "f", kRootInode, "missing", pm::kRenameExchange), Code::kNotFound);
  // File <-> directory across parents: the parents' link counts follow the directory.
  ASSERT_OK(this->rename(kRootInode, "f", d1, "sub", pm::kRenameExchange));
  EXPECT_EQ(this->lookup(kRootInode, "f")->attr.ino, sub);
  EXPECT_EQ(this->lookup(d1, "sub")->attr.ino, f);
  EXPECT_EQ(this->attr(d1).nlink, 2u);
  EXPECT_EQ(this->attr(kRootInode).nlink, 4u);
  // Exchanging a directory with something inside it would make a cycle.
  this->must_create(sub, "inner");
  EXPECT_CODE(this->rename(kRootInode, "f", sub, "inner", pm::kRenameExchange), Code::kInvalid);
  // Same directory exchange.
  InodeId x = this->must_create(kRootInode, "x");
  ASSERT_OK(this->rename(kRootInode, "x", kRootInode, "d1", pm::kRenameExchange));
  EXPECT_EQ(this->lookup(kRootInode, "d1")->attr.ino, x);
  EXPECT_EQ(this->lookup(kRootInode, "x")->attr.ino, d1);
  EXPECT_EQ(this->attr(kRootInode).nlink, 4u);
}

TYPED_TEST(NamespaceTest, RenameOntoItselfOrAnotherLinkOfSameInodeIsANoOp) {
  InodeId f = this->must_create(kRootInode, "f");
  ASSERT_OK(this->svc_->link(pm::LinkReq{f, kRootInode, "g"}));
  auto before = this->attr(f);
  this->now_ += 1000;
  ASSERT_OK(this->rename(kRootInode, "f", kRootInode, "f"));
  ASSERT_OK(this->rename(kRootInode, "f", kRootInode, "g"));
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"f", "g"}));
  auto after = this->attr(f);
  EXPECT_EQ(after.nlink, 2u);
  EXPECT_EQ(after.ctime_ns, before.ctime_ns);
  InodeId d = this->must_mkdir(kRootInode, "d");
  ASSERT_OK(this->rename(kRootInode, "d", kRootInode, "d"));
  EXPECT_EQ(this->lookup(kRootInode, "d")->attr.ino, d);
}

// ---- readdir ----

TYPED_TEST(NamespaceTest, ReadDirPagesThroughTenThousandEntries) {
  InodeId d = this->must_mkdir(kRootInode, "big");
  std::set<std::string> want;
  for (int i = 0; i < 10000; ++i) {
    std::string n = testing::numbered("e", i * 7919 % 10000);
    if (i % 10 == 0) {
      ASSERT_TRUE(this->mkdir(d, n).has_value());
    } else {
      ASSERT_TRUE(this->svc_->symlink(pm::SymlinkReq{d, n, "t", {}}).has_value());
    }
    want.insert(n);
  }
  EXPECT_EQ(this->attr(d).nlink, 2u + 1000u);
  std::vector<std::string> got;
  pm::ReadDirReq req{d, "", 100, true};
  int pages = 0;
  for (;;) {
    auto r = this->svc_->read_dir(req);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    ++pages;
    ASSERT_LE(r->entries.size(), 100u);
    for (const auto& e : r->entries) {
      ASSERT_TRUE(e.attr.has_value());
      EXPECT_EQ(e.attr->ino, e.ino);
      EXPECT_EQ(e.mode, e.attr->mode & S_IFMT);
      got.push_back(e.name);
    }
    if (r->eof) break;
    ASSERT_EQ(r->entries.size(), 100u);
    req.after = r->entries.back().name;
  }
  EXPECT_EQ(pages, 100);
  ASSERT_EQ(got.size(), 10000u);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), want);
}

TYPED_TEST(NamespaceTest, ReadDirAfterAMissingNameAndEof) {
  InodeId d = this->must_mkdir(kRootInode, "d");
  for (const char* n : {"a", "c", "e"}) this->must_create(d, n);
  auto r = this->svc_->read_dir(pm::ReadDirReq{d, "b", 10, false});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->entries.size(), 2u);
  EXPECT_EQ(r->entries[0].name, "c");
  EXPECT_FALSE(r->entries[0].attr.has_value());
  EXPECT_EQ(r->entries[0].mode, static_cast<uint32_t>(S_IFREG));
  EXPECT_TRUE(r->eof);
  auto exact = this->svc_->read_dir(pm::ReadDirReq{d, "", 3, false});
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->entries.size(), 3u);
  EXPECT_TRUE(exact->eof);
  auto partial = this->svc_->read_dir(pm::ReadDirReq{d, "", 2, false});
  EXPECT_FALSE(partial->eof);
  auto empty = this->svc_->read_dir(pm::ReadDirReq{d, "e", 2, false});
  EXPECT_TRUE(empty->entries.empty());
  EXPECT_TRUE(empty->eof);
  EXPECT_CODE(this->svc_->read_dir(pm::ReadDirReq{InodeId(5555), "", 2, false}), Code::kNotFound);
}

// ---- xattrs ----

TYPED_TEST(NamespaceTest, XattrsWithFlags) {
  InodeId f = this->must_create(kRootInode, "f");
  auto& s = *this->svc_;
  EXPECT_CODE(s.get_xattr(pm::GetXattrReq{f, "user.a"}), Code::kNoData);
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, "user.a", "1", 2}), Code::kNoData);  // REPLACE, absent
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, "user.a", "1", 1}));                    // CREATE
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, "user.a", "2", 1}), Code::kExists);  // CREATE, present
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, "user.a", "3", 2}));                    // REPLACE
  EXPECT_EQ(s.get_xattr(pm::GetXattrReq{f, "user.a"})->value, "3");
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, "user.b", std::string(64 * 1024, 'v'), 0}));
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, "user.c", std::string(64 * 1024 + 1, 'v'), 0}), Code::kRange);
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, "user.c", "x", 3}), Code::kInvalid);
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, "", "x", 0}), Code::kRange);
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{f, std::string(256, 'n'), "x", 0}), Code::kRange);
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, "security.empty", "", 0}));
  auto list = s.list_xattr(pm::InodeReq{f});
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(list->names, (std::vector<std::string>{"security.empty", "user.a", "user.b"}));
  EXPECT_EQ(s.get_xattr(pm::GetXattrReq{f, "security.empty"})->value, "");
  ASSERT_OK(s.remove_xattr(pm::GetXattrReq{f, "user.a"}));
  EXPECT_CODE(s.remove_xattr(pm::GetXattrReq{f, "user.a"}), Code::kNoData);
  EXPECT_CODE(s.get_xattr(pm::GetXattrReq{f, "user.a"}), Code::kNoData);
  EXPECT_CODE(s.set_xattr(pm::SetXattrReq{InodeId(4444), "user.a", "1", 0}), Code::kNotFound);
  EXPECT_CODE(s.list_xattr(pm::InodeReq{InodeId(4444)}), Code::kNotFound);
  // Xattrs on directories too, and they go away with the inode.
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{kRootInode, "user.root", "r", 0}));
  ASSERT_OK(this->unlink(kRootInode, "f"));
  InodeId g = this->must_create(kRootInode, "g");
  EXPECT_TRUE(s.list_xattr(pm::InodeReq{g})->names.empty());
}

// The names of a file's xattrs fit one listing (64 KiB, as on Linux): a name that would pass it is
// refused with ENOSPC, while the listing still works and values of existing names still change.
TYPED_TEST(NamespaceTest, XattrNamesStopAtWhatOneListingHolds) {
  InodeId f = this->must_create(kRootInode, "f");
  auto& s = *this->svc_;
  const std::string stem = "user." + std::string(245, 'n');  // 250 bytes + a 5-digit number
  size_t added = 0;
  Status st;
  for (; added < 1000; ++added) {
    char num[8];
    std::snprintf(num, sizeof(num), "%05zu", added);
    st = s.set_xattr(pm::SetXattrReq{f, stem + num, "v", 0});
    if (!st.is_ok()) break;
  }
  EXPECT_EQ(st.code(), Code::kNoSpace) << st.to_string();
  EXPECT_EQ(added, pm::kMaxXattrListBytes / 256);
  auto list = s.list_xattr(pm::InodeReq{f});
  ASSERT_TRUE(list.has_value()) << list.error().to_string();
  EXPECT_EQ(list->names.size(), added);
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, stem + "00000", "new value", 2}));
  ASSERT_OK(s.remove_xattr(pm::GetXattrReq{f, stem + "00001"}));
  ASSERT_OK(s.set_xattr(pm::SetXattrReq{f, "user.short", "fits again", 0}));
}

TYPED_TEST(NamespaceTest, SetXattrUpdatesCtime) {
  InodeId f = this->must_create(kRootInode, "f");
  this->now_ += 33;
  ASSERT_OK(this->svc_->set_xattr(pm::SetXattrReq{f, "user.a", "1", 0}));
  EXPECT_EQ(this->attr(f).ctime_ns, this->now_);
}

// ---- setattr / report size ----

TYPED_TEST(NamespaceTest, SetAttrFields) {
  InodeId f = this->must_create(kRootInode, "f");
  auto& s = *this->svc_;
  uint64_t gen0 = this->attr(f).generation;
  this->now_ += 10;
  pm::SetAttrReq r;
  r.ino = f;
  r.valid = pm::kSetMode | pm::kSetUid | pm::kSetGid;
  r.mode = S_IFDIR | 04711;  // type bits in the request are ignored
  r.uid = 7;
  r.gid = 8;
  auto a = s.set_attr(r);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->attr.mode, static_cast<uint32_t>(S_IFREG | 04711));
  EXPECT_EQ(a->attr.uid, 7u);
  EXPECT_EQ(a->attr.gid, 8u);
  EXPECT_EQ(a->attr.ctime_ns, this->now_);
  EXPECT_EQ(a->attr.generation, gen0);

  this->now_ += 10;
  r = {};
  r.ino = f;
  r.valid = pm::kSetSize;
  r.size = 12345;
  a = s.set_attr(r);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->attr.size, 12345u);
  EXPECT_EQ(a->attr.mtime_ns, this->now_);
  EXPECT_EQ(a->attr.generation, gen0 + 1);
  r.size = 10;  // shrink: exact
  a = s.set_attr(r);
  EXPECT_EQ(a->attr.size, 10u);
  EXPECT_EQ(a->attr.generation, gen0 + 2);
  EXPECT_EQ(this->attr(f).size, 10u);

  r = {};
  r.ino = f;
  r.valid = pm::kSetAtime | pm::kSetMtime;
  r.atime_ns = 111;
  r.mtime_ns = 222;
  this->now_ += 10;
  a = s.set_attr(r);
  EXPECT_EQ(a->attr.atime_ns, 111);
  EXPECT_EQ(a->attr.mtime_ns, 222);
  EXPECT_EQ(a->attr.ctime_ns, this->now_);
  r.valid = pm::kSetAtimeNow | pm::kSetMtimeNow | pm::kSetAtime | pm::kSetMtime;
  this->now_ += 10;
  a = s.set_attr(r);
  EXPECT_EQ(a->attr.atime_ns, this->now_);
  EXPECT_EQ(a->attr.mtime_ns, this->now_);

  InodeId d = this->must_mkdir(kRootInode, "d");
  r = {};
  r.ino = d;
  r.valid = pm::kSetSize;
  EXPECT_CODE(s.set_attr(r), Code::kIsDir);
  auto sym = s.symlink(pm::SymlinkReq{kRootInode, "s", "t", {}});
  r.ino = sym->attr.ino;
  EXPECT_CODE(s.set_attr(r), Code::kInvalid);
  r.ino = f;
  r.valid = 1u << 20;
  EXPECT_CODE(s.set_attr(r), Code::kInvalid);
  r.ino = InodeId(98765);
  r.valid = pm::kSetMode;
  EXPECT_CODE(s.set_attr(r), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, ReportSizeTakesTheMaximum) {
  InodeId f = this->must_create(kRootInode, "f");
  auto& s = *this->svc_;
  uint64_t gen = this->attr(f).generation;
  auto a = s.report_size(pm::ReportSizeReq{f, 5000, 777});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->attr.size, 5000u);
  EXPECT_EQ(a->attr.mtime_ns, 777);
  EXPECT_EQ(a->attr.generation, gen + 1);
  // mtime 0: a setattr set it after the writes (futimens before close); it stays.
  a = s.report_size(pm::ReportSizeReq{f, 100, 0});
  EXPECT_EQ(a->attr.size, 5000u);
  EXPECT_EQ(a->attr.mtime_ns, 777);
  EXPECT_EQ(a->attr.generation, gen + 2);
  EXPECT_CODE(s.report_size(pm::ReportSizeReq{kRootInode, 1, 0}), Code::kIsDir);
  EXPECT_CODE(s.report_size(pm::ReportSizeReq{InodeId(31337), 1, 0}), Code::kNotFound);
}

// ---- layouts and chains ----

TYPED_TEST(NamespaceTest, LayoutInheritanceAndValidation) {
  auto& s = *this->svc_;
  InodeId d = this->must_mkdir(kRootInode, "d");
  InodeId f0 = this->must_create(kRootInode, "f0");
  EXPECT_CODE(s.set_layout(pm::SetLayoutReq{f0, 1u << 20, 1}), Code::kNotDir);
  EXPECT_CODE(s.set_layout(pm::SetLayoutReq{d, 3u << 20, 1}), Code::kInvalid);
  EXPECT_CODE(s.set_layout(pm::SetLayoutReq{d, 32u << 10, 1}), Code::kInvalid);
  EXPECT_CODE(s.set_layout(pm::SetLayoutReq{d, 128u << 20, 1}), Code::kInvalid);
  EXPECT_CODE(s.set_layout(pm::SetLayoutReq{InodeId(4242), 1u << 20, 1}), Code::kNotFound);
  ASSERT_OK(s.set_layout(pm::SetLayoutReq{d, 1u << 20, 2}));
  auto dl = s.get_layout(pm::InodeReq{d});
  ASSERT_TRUE(dl.has_value());
  EXPECT_EQ(dl->layout.chunk_size, 1u << 20);
  EXPECT_EQ(dl->layout.stripe_count, 2u);
  // Subdirectories inherit the directory layout; files get it with chains picked.
  InodeId sub = this->must_mkdir(d, "sub");
  EXPECT_EQ(this->attr(sub).layout.chunk_size, 1u << 20);
  EXPECT_EQ(this->attr(sub).layout.stripe_count, 2u);
  auto f = this->create(sub, "f");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->attr.layout.chunk_size, 1u << 20);
  EXPECT_EQ(f->attr.layout.stripe_count, 2u);
  ASSERT_EQ(f->attr.layout.chains.size(), 2u);
  EXPECT_NE(f->attr.layout.chains[0], f->attr.layout.chains[1]);
  EXPECT_LT(f->attr.layout.seed, 2u);
  EXPECT_EQ(s.get_layout(pm::InodeReq{f->attr.ino})->layout.chains, f->attr.layout.chains);
  // Existing files keep their layout.
  EXPECT_EQ(this->attr(f0).layout.chunk_size, 4u << 20);
  // More stripes than chains: capped at the number of usable chains.
  ASSERT_OK(s.set_layout(pm::SetLayoutReq{d, 1u << 20, 64}));
  auto g = this->create(d, "g");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->attr.layout.stripe_count, 4u);
  std::set<ChainId> distinct(g->attr.layout.chains.begin(), g->attr.layout.chains.end());
  EXPECT_EQ(distinct.size(), 4u);
}

TYPED_TEST(NamespaceTest, ChainSelectionRotatesOverOnlineChains) {
  auto& s = *this->svc_;
  ASSERT_OK(s.set_layout(pm::SetLayoutReq{kRootInode, 4u << 20, 1}));
  std::map<ChainId, int> uses;
  for (int i = 0; i < 40; ++i) {
    auto f = this->create(kRootInode, testing::numbered("f", i));
    ASSERT_TRUE(f.has_value());
    ASSERT_EQ(f->attr.layout.chains.size(), 1u);
    EXPECT_EQ(f->attr.layout.seed, 0u);
    uses[f->attr.layout.chains[0]]++;
  }
  ASSERT_EQ(uses.size(), 4u);
  for (auto& [c, n] : uses) EXPECT_EQ(n, 10) << "chain " << c.value;
  // node-b stops heart-beating: after the timeout only node-a's chains are used.
  this->now_ += 11'000'000'000;
  ASSERT_OK(s.node_heartbeat(pm::NodeHeartbeatReq{NodeId(1), {{"t1", "", 1000, 400}, {"t2", "", 1000, 400}}}));
  ASSERT_OK(s.expire());
  auto map = s.get_cluster_map();
  std::set<ChainId> online_chains;
  for (const auto& t : map->map.targets) {
    if (t.online) online_chains.insert(ChainId(t.id.value));
  }
  EXPECT_EQ(online_chains.size(), 2u);
  for (int i = 0; i < 10; ++i) {
    auto f = this->create(kRootInode, testing::numbered("g", i));
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(online_chains.count(f->attr.layout.chains[0]), 1u);
  }
  // Everything offline: creating a file fails; directories, FIFOs and symlinks still work.
  this->now_ += 11'000'000'000;
  ASSERT_OK(s.expire());
  auto f = this->create(kRootInode, "nochain");
  EXPECT_CODE(f, Code::kUnavailable);
  EXPECT_NE(f.status().message().find("start penstock-data"), std::string::npos);
  EXPECT_CODE(this->lookup(kRootInode, "nochain"), Code::kNotFound);
  ASSERT_OK(this->mkdir(kRootInode, "dir-ok"));
  ASSERT_OK(s.mknod(pm::MknodReq{kRootInode, "fifo-ok", S_IFIFO | 0644, 0, {}}));
  ASSERT_OK(s.symlink(pm::SymlinkReq{kRootInode, "sym-ok", "x", {}}));
}

// ---- cluster map and statfs ----

TYPED_TEST(NamespaceTest, ClusterRegistrationIsStableAndVersioned) {
  auto& s = *this->svc_;
  auto m0 = s.get_cluster_map();
  ASSERT_TRUE(m0.has_value());
  EXPECT_EQ(m0->map.nodes.size(), 2u);
  EXPECT_EQ(m0->map.targets.size(), 4u);
  EXPECT_EQ(m0->map.chains.size(), 4u);
  for (const auto& c : m0->map.chains) {
    ASSERT_EQ(c.targets.size(), 1u);
    EXPECT_EQ(c.targets[0].value, c.id.value);
  }
  // Re-register node-a from a new address with one more target: same ids, new address, new version.
  auto r = this->add_node("node-a", "127.0.0.1:9999", {"t2", "t1", "t5"});
  EXPECT_EQ(r.node, NodeId(1));
  ASSERT_EQ(r.targets.size(), 3u);
  EXPECT_EQ(r.targets[0], TargetId(2));
  EXPECT_EQ(r.targets[1], TargetId(1));
  EXPECT_EQ(r.targets[2], TargetId(5));
  EXPECT_GT(r.map_version, m0->map.version);
  auto m1 = s.get_cluster_map();
  EXPECT_EQ(m1->map.version, r.map_version);
  EXPECT_EQ(m1->map.nodes[0].address, "127.0.0.1:9999");
  EXPECT_EQ(m1->map.chains.size(), 5u);
  EXPECT_EQ(*s.target_address(TargetId(5)), "127.0.0.1:9999");
  EXPECT_EQ(*s.target_address(TargetId(3)), "127.0.0.1:7701");
  EXPECT_CODE(s.target_address(TargetId(77)), Code::kNotFound);
  EXPECT_CODE(s.register_node(pm::RegisterNodeReq{"", "127.0.0.1:1", {}}), Code::kInvalid);
  EXPECT_CODE(s.register_node(pm::RegisterNodeReq{"n", "no-port", {}}), Code::kInvalid);
  EXPECT_CODE(s.register_node(pm::RegisterNodeReq{"n", "127.0.0.1:1", {{"x", "", 0, 0}, {"x", "", 0, 0}}}),
              Code::kInvalid);
  EXPECT_CODE(s.node_heartbeat(pm::NodeHeartbeatReq{NodeId(42), {}}), Code::kNotFound);
  EXPECT_CODE(s.node_heartbeat(pm::NodeHeartbeatReq{NodeId(1), {{"t3", "", 0, 0}}}), Code::kNotFound);
}

TYPED_TEST(NamespaceTest, TargetsOfAnotherFileSystemAreRefused) {
  auto& s = *this->svc_;
  const std::string id = s.fs_id();
  ASSERT_EQ(id.size(), 32u);
  auto r = this->add_node("node-z", "127.0.0.1:9000", {"tz"});
  EXPECT_EQ(r.fs_id, id);  // what the data server stamps into its new target
  const size_t targets = s.get_cluster_map()->map.targets.size();
  // A target stamped by another file system: refused, and not in the map.
  pm::RegisterNodeReq foreign{"node-f", "127.0.0.1:9001", {{"tf", "/f", 1000, 400, std::string(32, 'a')}}};
  auto refused = s.register_node(foreign);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.status().code(), Code::kInvalid);
  EXPECT_NE(refused.status().message().find("belongs to file system " + std::string(32, 'a')), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(s.get_cluster_map()->map.targets.size(), targets);
  // Unstamped, from before ids: taken when this meta knows it or it is empty, refused when it holds
  // chunks this meta never registered.
  pm::RegisterNodeReq unknown{"node-u", "127.0.0.1:9002", {{"tu", "/u", 1000, 400, "", /*has_chunks=*/true}}};
  auto refused_unknown = s.register_node(unknown);
  ASSERT_FALSE(refused_unknown.has_value());
  EXPECT_EQ(refused_unknown.status().code(), Code::kInvalid);
  EXPECT_NE(refused_unknown.status().message().find("never registered"), std::string::npos);
  EXPECT_EQ(s.get_cluster_map()->map.targets.size(), targets);
  ASSERT_OK(s.register_node(pm::RegisterNodeReq{"node-z", "127.0.0.1:9000", {{"tz", "/z", 1000, 400, "", true}}}));
  ASSERT_OK(s.register_node(pm::RegisterNodeReq{"node-e", "127.0.0.1:9003", {{"te", "/e", 1000, 400, "", false}}}));
  // Stamped with this one: welcome. The id survives a restart.
  ASSERT_OK(s.register_node(pm::RegisterNodeReq{"node-z", "127.0.0.1:9000", {{"tz", "/z", 1000, 400, id}}}));
  this->reopen();
  EXPECT_EQ(this->svc_->fs_id(), id);
}

TEST(NamespaceFileSystemId, AGarbledIdStopsTheLoad) {
  MemoryStore store;
  {
    auto s = MetaService::open(&store, MetaOptions{});
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
  }
  WriteBatch b;
  b.put(std::string(schema::kFileSystemId), schema::encode_record(schema::FileSystemRecord{"not-hex"}));
  ASSERT_OK(store.apply(b));
  auto again = MetaService::open(&store, MetaOptions{});
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.status().code(), Code::kCorrupt);
}

TYPED_TEST(NamespaceTest, NodeTimeoutAndReturn) {
  auto& s = *this->svc_;
  uint64_t v0 = s.map_version();
  this->now_ += 9'000'000'000;
  ASSERT_OK(s.expire());
  EXPECT_EQ(s.map_version(), v0);  // not yet
  ASSERT_OK(s.node_heartbeat(pm::NodeHeartbeatReq{NodeId(1), {{"t1", "", 2000, 1500}}}));
  EXPECT_EQ(s.map_version(), v0);  // still online: no change
  this->now_ += 2'000'000'000;
  ASSERT_OK(s.expire());  // node 2 is 11 s silent
  uint64_t v1 = s.map_version();
  EXPECT_EQ(v1, v0 + 1);
  auto m = s.get_cluster_map();
  EXPECT_TRUE(m->map.nodes[0].online);
  EXPECT_FALSE(m->map.nodes[1].online);
  auto hb = s.node_heartbeat(pm::NodeHeartbeatReq{NodeId(2), {{"t3", "", 1000, 400}, {"t4", "", 1000, 400}}});
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->map_version, v1 + 1);
  EXPECT_TRUE(s.get_cluster_map()->map.nodes[1].online);
  // statfs: t1 reports 2000/1500, t2 kept its registration figures 1000/400 (still online), t3/t4.
  auto fs = s.stat_fs();
  ASSERT_TRUE(fs.has_value());
  EXPECT_EQ(fs->total_bytes, 2000u + 1000 + 1000 + 1000);
  EXPECT_EQ(fs->free_bytes, 1500u + 400 + 400 + 400);
  EXPECT_EQ(fs->block_size, 4096u);
  EXPECT_EQ(fs->max_name, 255u);
}

TYPED_TEST(NamespaceTest, StatFsCountsInodes) {
  auto& s = *this->svc_;
  uint64_t used = s.stat_fs()->used_inodes;
  EXPECT_EQ(used, 1u);
  this->must_create(kRootInode, "a");
  this->must_mkdir(kRootInode, "b");
  EXPECT_EQ(s.stat_fs()->used_inodes, 3u);
  ASSERT_OK(this->unlink(kRootInode, "a"));
  ASSERT_OK(this->rmdir(kRootInode, "b"));
  EXPECT_EQ(s.stat_fs()->used_inodes, 1u);
  EXPECT_GT(s.stat_fs()->total_inodes, 1u);
}

// ---- sessions ----

TYPED_TEST(NamespaceTest, SessionsRegisterHeartbeatExpire) {
  auto& s = *this->svc_;
  auto r = s.register_session(pm::RegisterSessionReq{"mount", "gpu1"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lease_ns, 30'000'000'000);
  EXPECT_EQ(r->map_version, s.map_version());
  SessionId a = r->session;
  SessionId b = this->new_session();
  EXPECT_NE(a, b);
  this->now_ += 20'000'000'000;
  ASSERT_OK(s.heartbeat(pm::SessionReq{a}));
  this->now_ += 20'000'000'000;  // b is 40 s silent, a only 20 s
  ASSERT_OK(s.expire());
  ASSERT_OK(s.heartbeat(pm::SessionReq{a}));
  EXPECT_CODE(s.heartbeat(pm::SessionReq{b}), Code::kBadHandle);
  EXPECT_CODE(s.open_file(pm::OpenReq{kRootInode, b, 0}), Code::kBadHandle);
  EXPECT_CODE(this->create(kRootInode, "x", b), Code::kBadHandle);
  ASSERT_OK(s.close_session(pm::SessionReq{a}));
  EXPECT_CODE(s.heartbeat(pm::SessionReq{a}), Code::kBadHandle);
  EXPECT_CODE(s.close_session(pm::SessionReq{a}), Code::kBadHandle);
  EXPECT_NE(this->new_session(), a);
}

TYPED_TEST(NamespaceTest, UnlinkedButOpenFileStaysReadable) {
  auto& s = *this->svc_;
  SessionId sess = this->new_session();
  auto c = this->create(kRootInode, "f", sess);  // create also opens
  ASSERT_TRUE(c.has_value());
  InodeId f = c->attr.ino;
  ASSERT_OK(s.open_file(pm::OpenReq{f, sess, 0}));  // second open of the same session
  ASSERT_OK(s.report_size(pm::ReportSizeReq{f, 4096, 0}));
  ASSERT_OK(this->unlink(kRootInode, "f"));
  EXPECT_CODE(this->lookup(kRootInode, "f"), Code::kNotFound);
  auto a = s.get_attr(pm::InodeReq{f});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->attr.nlink, 0u);
  EXPECT_EQ(a->attr.size, 4096u);
  EXPECT_CODE(s.link(pm::LinkReq{f, kRootInode, "back"}), Code::kNotFound);
  // Another session may still open it by inode (e.g. through /proc/self/fd).
  SessionId other = this->new_session();
  ASSERT_OK(s.open_file(pm::OpenReq{f, other, 0}));
  ASSERT_OK(s.release(pm::ReleaseReq{f, sess}));
  ASSERT_OK(s.release(pm::ReleaseReq{f, sess}));
  ASSERT_OK(s.release(pm::ReleaseReq{f, sess}));  // idempotent
  ASSERT_TRUE(s.get_attr(pm::InodeReq{f}).has_value());
  ASSERT_OK(s.release(pm::ReleaseReq{f, other}));
  EXPECT_CODE(s.get_attr(pm::InodeReq{f}), Code::kNotFound);
  EXPECT_CODE(s.open_file(pm::OpenReq{f, sess, 0}), Code::kNotFound);
  auto jobs = s.gc_pending(InodeId(), 100);
  ASSERT_TRUE(jobs.has_value());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].ino, f);
  EXPECT_EQ((*jobs)[0].targets.size(), 4u);
}

// LookupOpen: the open it grants with a regular file holds that file like Open's would; other
// types, and a session the server does not know, get the lookup's answer unopened.
TYPED_TEST(NamespaceTest, LookupOpenOpensARegularFileForItsSession) {
  auto& s = *this->svc_;
  SessionId sess = this->new_session();
  InodeId f = this->must_create(kRootInode, "f");  // no session: not left open by its create
  InodeId d = this->must_mkdir(kRootInode, "d");
  auto looked = s.lookup_open(pm::LookupReq{kRootInode, "f", sess});
  ASSERT_TRUE(looked.has_value()) << looked.error().to_string();
  EXPECT_TRUE(looked->opened);
  EXPECT_EQ(looked->attr.ino, f);
  // The unlink finds the open: f stays (an orphan) until the session releases it.
  ASSERT_OK(this->unlink(kRootInode, "f"));
  auto orphan = s.get_attr(pm::InodeReq{f});
  ASSERT_TRUE(orphan.has_value());
  EXPECT_EQ(orphan->attr.nlink, 0u);
  ASSERT_OK(s.release_many(pm::ReleaseManyReq{sess, {f}}));
  EXPECT_CODE(s.get_attr(pm::InodeReq{f}), Code::kNotFound);
  EXPECT_CODE(s.lookup_open(pm::LookupReq{kRootInode, "f", sess}), Code::kNotFound);

  auto dir = s.lookup_open(pm::LookupReq{kRootInode, "d", sess});
  ASSERT_TRUE(dir.has_value());
  EXPECT_FALSE(dir->opened) << "only regular files are opened";
  EXPECT_EQ(dir->attr.ino, d);

  InodeId g = this->must_create(kRootInode, "g");
  auto stranger = s.lookup_open(pm::LookupReq{kRootInode, "g", SessionId(987654)});
  ASSERT_TRUE(stranger.has_value());
  EXPECT_FALSE(stranger->opened) << "an unknown session gets no open";
  ASSERT_OK(this->unlink(kRootInode, "g"));
  EXPECT_CODE(s.get_attr(pm::InodeReq{g}), Code::kNotFound) << "nothing held g";
}

TYPED_TEST(NamespaceTest, ReleaseManyReleasesEachListedOpenAndBoundsTheBatch) {
  auto& s = *this->svc_;
  SessionId sess = this->new_session();
  InodeId f = this->must_create(kRootInode, "f", sess);  // open 1
  InodeId g = this->must_create(kRootInode, "g", sess);
  ASSERT_OK(s.open_file(pm::OpenReq{f, sess, 0}));  // open 2 of f
  ASSERT_OK(this->unlink(kRootInode, "f"));
  ASSERT_OK(this->unlink(kRootInode, "g"));
  // f twice (both of its opens), g once, and an inode never opened: all fine.
  ASSERT_OK(s.release_many(pm::ReleaseManyReq{sess, {f, g, f, InodeId(999999)}}));
  EXPECT_CODE(s.get_attr(pm::InodeReq{f}), Code::kNotFound);
  EXPECT_CODE(s.get_attr(pm::InodeReq{g}), Code::kNotFound);
  auto jobs = s.gc_pending(InodeId(), 100);
  ASSERT_TRUE(jobs.has_value());
  EXPECT_EQ(jobs->size(), 2u);
  // Three opens, two released in one batch (applied as one transaction): one open is left, so
  // the unlinked file stays until the last release.
  InodeId k = this->must_create(kRootInode, "k", sess);
  ASSERT_OK(s.open_file(pm::OpenReq{k, sess, 0}));
  ASSERT_OK(s.open_file(pm::OpenReq{k, sess, 0}));
  ASSERT_OK(this->unlink(kRootInode, "k"));
  ASSERT_OK(s.release_many(pm::ReleaseManyReq{sess, {k, k}}));
  EXPECT_TRUE(s.get_attr(pm::InodeReq{k}).has_value()) << "an open is left";
  ASSERT_OK(s.release_many(pm::ReleaseManyReq{sess, {k}}));
  EXPECT_CODE(s.get_attr(pm::InodeReq{k}), Code::kNotFound);
  // A hostile batch past the bound is refused before anything is released.
  InodeId h = this->must_create(kRootInode, "h", sess);
  ASSERT_OK(this->unlink(kRootInode, "h"));
  std::vector<InodeId> many(pm::kMaxReleaseBatch + 1, h);
  EXPECT_CODE(s.release_many(pm::ReleaseManyReq{sess, many}), Code::kInvalid);
  EXPECT_TRUE(s.get_attr(pm::InodeReq{h}).has_value());
}

TYPED_TEST(NamespaceTest, RenameOverAnOpenFileKeepsItAsOrphan) {
  auto& s = *this->svc_;
  SessionId sess = this->new_session();
  InodeId victim = this->must_create(kRootInode, "victim", sess);
  this->must_create(kRootInode, "new");
  ASSERT_OK(this->rename(kRootInode, "new", kRootInode, "victim"));
  ASSERT_TRUE(s.get_attr(pm::InodeReq{victim}).has_value());
  EXPECT_TRUE(s.gc_pending(InodeId(), 10)->empty());
  ASSERT_OK(s.close_session(pm::SessionReq{sess}));
  EXPECT_CODE(s.get_attr(pm::InodeReq{victim}), Code::kNotFound);
  ASSERT_EQ(s.gc_pending(InodeId(), 10)->size(), 1u);
}

TYPED_TEST(NamespaceTest, GcQueuePagesInInodeOrderAndForgetsDoneJobs) {
  auto& s = *this->svc_;
  std::vector<InodeId> inos;
  for (int i = 0; i < 5; ++i) {
    std::string name = testing::numbered("f", i);
    inos.push_back(this->must_create(kRootInode, name));
    ASSERT_OK(this->unlink(kRootInode, name));
  }
  auto first = s.gc_pending(InodeId(), 2);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].ino, inos[0]);
  EXPECT_EQ((*first)[1].ino, inos[1]);
  auto next = s.gc_pending(inos[1], 2);
  ASSERT_EQ(next->size(), 2u);
  EXPECT_EQ((*next)[0].ino, inos[2]);
  EXPECT_EQ((*next)[1].ino, inos[3]);
  ASSERT_OK(s.gc_done(inos[0]));
  ASSERT_OK(s.gc_done(inos[3]));
  auto rest = s.gc_pending(InodeId(), 10);
  ASSERT_EQ(rest->size(), 3u);
  EXPECT_EQ((*rest)[0].ino, inos[1]);
  EXPECT_EQ((*rest)[1].ino, inos[2]);
  EXPECT_EQ((*rest)[2].ino, inos[4]);
  EXPECT_EQ((*rest)[2].targets.size(), 4u);
}

TYPED_TEST(NamespaceTest, RestartKeepsEverythingAndNeverReusesInodeNumbers) {
  if (!TypeParam::kDurable) GTEST_SKIP() << "the in-memory store does not survive its object";
  auto& before = *this->svc_;
  SessionId sess = this->new_session();
  InodeId d = this->must_mkdir(kRootInode, "d");
  ASSERT_OK(before.set_layout(pm::SetLayoutReq{d, 1u << 20, 2}));
  InodeId f = this->must_create(d, "f");
  ASSERT_OK(before.report_size(pm::ReportSizeReq{f, 999, 5}));
  ASSERT_OK(before.set_xattr(pm::SetXattrReq{f, "user.k", "v", 0}));
  ASSERT_OK(before.symlink(pm::SymlinkReq{d, "s", "f", {}}));
  InodeId open_orphan = this->must_create(d, "orphan", sess);
  ASSERT_OK(this->unlink(d, "orphan"));
  InodeId queued = this->must_create(d, "queued");
  ASSERT_OK(this->unlink(d, "queued"));
  auto f_attr = this->attr(f);
  uint64_t version = before.map_version();
  uint64_t max_ino = std::max({d.value, f.value, open_orphan.value, queued.value});

  // Close the service and the database, then open both again.
  this->svc_.reset();
  this->store_.reset();
  this->store_ = this->backend_.open();
  ASSERT_NE(this->store_, nullptr);
  this->reopen();
  auto& s = *this->svc_;
  EXPECT_GT(s.map_version(), version);
  EXPECT_EQ(this->names(d), (std::vector<std::string>{"f", "s"}));
  auto fa = this->attr(f);
  EXPECT_EQ(fa.size, 999u);
  EXPECT_EQ(fa.layout.chains, f_attr.layout.chains);
  EXPECT_EQ(fa.generation, f_attr.generation);
  EXPECT_EQ(s.get_xattr(pm::GetXattrReq{f, "user.k"})->value, "v");
  EXPECT_EQ(s.get_layout(pm::InodeReq{d})->layout.chunk_size, 1u << 20);
  EXPECT_EQ(this->attr(kRootInode).nlink, 3u);
  EXPECT_EQ(s.stat_fs()->used_inodes, 5u);  // root, d, f, s, the open orphan
  // The cluster map came back (all nodes offline until they heartbeat), ids stable.
  auto m = s.get_cluster_map();
  ASSERT_EQ(m->map.nodes.size(), 2u);
  EXPECT_FALSE(m->map.nodes[0].online);
  EXPECT_EQ(this->add_node("node-b", "127.0.0.1:7701", {"t3", "t4"}).node, NodeId(2));
  // New inode numbers are beyond everything handed out before.
  InodeId g = this->must_create(d, "g");
  EXPECT_GT(g.value, max_ino);
  // The GC queue survived.
  auto jobs = s.gc_pending(InodeId(), 10);
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].ino, queued);
  // The session survived with a fresh lease: the orphan stays until it expires.
  ASSERT_OK(s.heartbeat(pm::SessionReq{sess}));
  ASSERT_TRUE(s.get_attr(pm::InodeReq{open_orphan}).has_value());
  this->now_ += 31'000'000'000;
  ASSERT_OK(s.expire());
  EXPECT_CODE(s.get_attr(pm::InodeReq{open_orphan}), Code::kNotFound);
  EXPECT_EQ(s.gc_pending(InodeId(), 10)->size(), 2u);
  EXPECT_NE(this->new_session(), sess);
}

TYPED_TEST(NamespaceTest, SessionsNotHeartbeatingAfterRestartExpire) {
  SessionId sess = this->new_session();
  InodeId f = this->must_create(kRootInode, "f", sess);
  ASSERT_OK(this->unlink(kRootInode, "f"));
  this->now_ += 25'000'000'000;
  this->svc_.reset();
  this->store_.reset();
  this->store_ = this->backend_.open();
  this->reopen();  // restart: the session gets a fresh 30 s lease from now
  this->now_ += 25'000'000'000;
  ASSERT_OK(this->svc_->expire());
  ASSERT_TRUE(this->svc_->get_attr(pm::InodeReq{f}).has_value());
  this->now_ += 10'000'000'000;
  ASSERT_OK(this->svc_->expire());
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{f}), Code::kNotFound);
  EXPECT_CODE(this->svc_->heartbeat(pm::SessionReq{sess}), Code::kBadHandle);
}

// Creating or removing one name is acknowledged before its WAL sync (the store's sync_soon), but
// never with an inode number from a batch whose reservation no completed sync covers yet: the
// first create after a start and the first of each new batch sync, so a power loss may lose a
// create yet never hand its number out again. Errors and other mutations still sync; SyncLog
// (fsync, fsyncdir) syncs.
TEST(NamespaceDurability, NameChangesSkipTheSyncOnlyWithANumberFromASyncedBatch) {
  MemoryStore store;
  MetaOptions o;
  o.seed = 42;
  o.inode_batch = 4;
  auto opened = MetaService::open(&store, o);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  MetaService& svc = **opened;
  const proto::Caller caller{1000, 100};
  auto syncs_of = [&](const auto& op) {
    const uint64_t before = store.syncs();
    op();
    return store.syncs() - before;
  };
  auto mkdir = [&](const std::string& name) {
    auto r = svc.mkdir(pm::MkdirReq{kRootInode, name, 0755, caller});
    EXPECT_TRUE(r.has_value()) << name << ": " << r.error().to_string();
  };
  auto symlink = [&](const std::string& name) {
    auto r = svc.symlink(pm::SymlinkReq{kRootInode, name, "target", caller});
    EXPECT_TRUE(r.has_value()) << name << ": " << r.error().to_string();
  };
  EXPECT_EQ(syncs_of([&] { mkdir("d1"); }), 0u) << "the start synced a reservation of 4 numbers";
  EXPECT_EQ(syncs_of([&] { mkdir("d2"); }), 0u);
  EXPECT_EQ(syncs_of([&] { symlink("s3"); }), 0u);
  EXPECT_EQ(syncs_of([&] { symlink("s4"); }), 0u);
  EXPECT_EQ(syncs_of([&] { symlink("s5"); }), 1u) << "the first number beyond it: the next reservation is synced";
  EXPECT_EQ(syncs_of([&] { symlink("s6"); }), 0u);
  EXPECT_EQ(syncs_of([&] { ASSERT_OK(svc.unlink(pm::NameReq{kRootInode, "s6", SessionId()})); }), 0u);
  EXPECT_EQ(syncs_of([&] {
              EXPECT_CODE(svc.mkdir(pm::MkdirReq{kRootInode, "d1", 0755, caller}), Code::kExists);
            }),
            1u)
      << "an error waits for the sync";
  EXPECT_EQ(syncs_of([&] {
              EXPECT_CODE(svc.unlink(pm::NameReq{kRootInode, "gone", SessionId()}), Code::kNotFound);
            }),
            1u);
  EXPECT_EQ(syncs_of([&] { ASSERT_OK(svc.sync_log()); }), 1u);
  EXPECT_EQ(syncs_of([&] { ASSERT_OK(svc.rename(pm::RenameReq{kRootInode, "s5", kRootInode, "s7", 0, SessionId()})); }),
            1u);
  // A restart skips every number reserved before and syncs a new reservation while it loads.
  auto stored = store.get(schema::kNextInode);
  ASSERT_TRUE(stored.has_value() && stored->has_value());
  const uint64_t reserved_end = schema::decode_record<schema::U64Record>(**stored, "next_ino")->value;
  opened = MetaService::open(&store, o);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  MetaService& again = **opened;
  EXPECT_EQ(syncs_of([&] { ASSERT_TRUE(again.mkdir(pm::MkdirReq{kRootInode, "d8", 0755, caller}).has_value()); }), 0u);
  EXPECT_EQ(syncs_of([&] { ASSERT_TRUE(again.mkdir(pm::MkdirReq{kRootInode, "d9", 0755, caller}).has_value()); }), 0u);
  EXPECT_EQ(again.lookup(pm::LookupReq{kRootInode, "d8", SessionId()})->attr.ino.value, reserved_end)
      << "a restart must skip every number reserved before it";
}

// ---- exactly-once changes (MetaService::replay) ----

// Runs `change` (a MetaService call answering Resp) as the change a Replay carries, counting its
// runs: the encoded reply, or the error.
// `message`: the encoded request (only compared between repeats, except a Create's).
template <class Resp, class Fn>
Result<std::string> replayed(MetaService& svc, SessionId session, uint32_t slot, uint64_t seq, uint16_t method,
                             Fn change, int* runs, const std::string& message = "") {
  return svc.replay(pm::ReplayReq{session, slot, seq, method, message}, [&]() -> Result<std::string> {
    ++*runs;
    Result<Resp> r = change();
    if (!r.has_value()) return std::move(r).error();
    return proto::encode(*r);
  });
}
Result<proto::Empty> empty_or(Status st) {
  if (!st.is_ok()) return st;
  return proto::Empty{};
}

TYPED_TEST(NamespaceTest, AChangeRunsOnceAndItsRepeatGetsTheSameReply) {
  auto& s = *this->svc_;
  const SessionId sess = this->new_session();
  int runs = 0;
  auto mkdir_d = [&] { return this->mkdir(kRootInode, "d"); };
  auto first = replayed<pm::AttrResp>(s, sess, 3, 7, pm::Mkdir::kId, mkdir_d, &runs);
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  // The repeat (its reply was lost): the same reply, and nothing runs (a second mkdir of "d"
  // would fail with kExists).
  auto again = replayed<pm::AttrResp>(s, sess, 3, 7, pm::Mkdir::kId, mkdir_d, &runs);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"d"}));
  // The slot's next change runs; its error is not stored, so the slot still answers 7 from before.
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 3, 8, pm::Mkdir::kId, mkdir_d, &runs), Code::kExists);
  EXPECT_EQ(runs, 2);
  again = replayed<pm::AttrResp>(s, sess, 3, 7, pm::Mkdir::kId, mkdir_d, &runs);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *first);
  // Another slot of the same session is a slot of its own.
  auto unlink_d = [&] { return empty_or(this->rmdir(kRootInode, "d")); };
  ASSERT_TRUE(replayed<proto::Empty>(s, sess, 4, 1, pm::Rmdir::kId, unlink_d, &runs).has_value());
  ASSERT_TRUE(replayed<proto::Empty>(s, sess, 4, 1, pm::Rmdir::kId, unlink_d, &runs).has_value());
  EXPECT_EQ(runs, 3);
  EXPECT_TRUE(this->names(kRootInode).empty());
  // An older number than the slot's last, a repeat naming another method, a slot out of range and
  // number 0 run nothing.
  ASSERT_TRUE(replayed<pm::AttrResp>(s, sess, 3, 9, pm::Mkdir::kId, mkdir_d, &runs).has_value());
  EXPECT_EQ(runs, 4);
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 3, 7, pm::Mkdir::kId, mkdir_d, &runs), Code::kInvalid);
  EXPECT_CODE(replayed<proto::Empty>(s, sess, 3, 9, pm::Rmdir::kId, unlink_d, &runs), Code::kInvalid);
  EXPECT_CODE(s.replay(pm::ReplayReq{sess, 3, 9, pm::Mkdir::kId, "another request"},
                       [&]() -> Result<std::string> {
                         ++runs;
                         return std::string();
                       }),
              Code::kInvalid);
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, pm::kReplySlots, 1, pm::Mkdir::kId, mkdir_d, &runs), Code::kInvalid);
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 5, 0, pm::Mkdir::kId, mkdir_d, &runs), Code::kInvalid);
  EXPECT_EQ(runs, 4);
  // An unknown session applies nothing either.
  auto mkdir_e = [&] { return this->mkdir(kRootInode, "e"); };
  EXPECT_CODE(replayed<pm::AttrResp>(s, SessionId(999), 0, 1, pm::Mkdir::kId, mkdir_e, &runs), Code::kBadHandle);
  EXPECT_CODE(this->lookup(kRootInode, "e"), Code::kNotFound);
}

// A close's size report (ReplayInline, on an I/O thread): its repeat gets the stored reply and
// runs nothing, so a truncate that came after it is not undone (a second "size = max(size, 3 MiB)"
// would make the truncated file 3 MiB of zeros again). A repeat that comes while the slot's first
// send still runs is told kUnavailable at once instead of waiting for it (an I/O thread never waits).
TYPED_TEST(NamespaceTest, ARepeatedCloseReportDoesNotUndoALaterTruncate) {
  auto& s = *this->svc_;
  const SessionId sess = this->new_session();
  const InodeId f = this->must_create(kRootInode, "shard", sess);
  int runs = 0;
  auto report = [&] { return s.report_size_at_close(pm::ReportSizeReq{f, 3u << 20, this->now_}); };
  auto first = replayed<pm::AttrResp>(s, sess, 6, 1, pm::ReportSizeAtClose::kId, report, &runs);
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  EXPECT_EQ(this->attr(f).size, 3u << 20);
  pm::SetAttrReq truncate;
  truncate.ino = f;
  truncate.valid = pm::kSetSize;
  truncate.size = 0;
  ASSERT_TRUE(s.set_attr(truncate).has_value());
  auto again = replayed<pm::AttrResp>(s, sess, 6, 1, pm::ReportSizeAtClose::kId, report, &runs);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(this->attr(f).size, 0u) << "the repeat undid the truncate";

  // The slot's next report runs while a repeat of it comes: the repeat does not wait.
  std::promise<void> running, release;
  std::future<void> first_running = running.get_future();
  std::shared_future<void> released = release.get_future().share();
  std::thread first_send([&] {
    auto r = s.replay(pm::ReplayReq{sess, 6, 2, pm::ReportSizeAtClose::kId, ""}, [&]() -> Result<std::string> {
      running.set_value();
      released.wait();
      auto resp = report();
      if (!resp.has_value()) return std::move(resp).error();
      return proto::encode(*resp);
    }, /*may_wait=*/false);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
  });
  const bool started = first_running.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(started) << "the first send never ran its change";
  if (started) {
    const auto asked = std::chrono::steady_clock::now();
    EXPECT_CODE(s.replay(pm::ReplayReq{sess, 6, 2, pm::ReportSizeAtClose::kId, ""},
                         [&]() -> Result<std::string> {
                           ++runs;
                           return std::string();
                         }, /*may_wait=*/false),
                Code::kUnavailable);
    // Far below the 5 s a waiting repeat would have waited (the first send is still held).
    EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(4));
  }
  release.set_value();
  first_send.join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(this->attr(f).size, 3u << 20);
}

// A store whose syncs can be made to fail, as on a disk that fills or fails: the first failed
// sync is sticky, as Store requires (sync(), sync_soon() and apply() fail from then on), while the
// batches applied before it stay visible.
class FailingSyncStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override { return inner_.get(key); }
  Status apply(const WriteBatch& batch) override {
    if (failed_) return failure();
    return inner_.apply(batch);
  }
  Status sync() override { return syncs_fail_ ? fail() : inner_.sync(); }
  Status sync_soon() override { return syncs_fail_ ? fail() : inner_.sync_soon(); }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return inner_.scan(prefix, seek, fn);
  }
  std::string describe() const override { return "memory (failing syncs)"; }
  // The next sync fails, and every call after it.
  void fail_syncs() { syncs_fail_ = true; }

 private:
  static Status failure() { return Status(Code::kNoSpace, "injected: no space left on device"); }
  Status fail() {
    failed_ = true;
    return failure();
  }
  MemoryStore inner_;
  bool syncs_fail_ = false;
  bool failed_ = false;
};

// A change whose WAL sync failed was refused, yet it and its stored reply are visible in the store
// until the restart: a repeat of it (its refusal was lost on the way) must get the refusal too, not
// the stored reply, which a restart may take back.
TEST(ReplayAfterAFailedSync, TheRepeatIsRefusedAsTheFirstSendWas) {
  FailingSyncStore store;
  MetaOptions o;
  o.seed = 7;
  auto opened = MetaService::open(&store, o);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  MetaService& s = **opened;
  auto session = s.register_session(pm::RegisterSessionReq{"test", "host"});
  ASSERT_TRUE(session.has_value()) << session.error().to_string();
  const SessionId sess = session->session;
  int runs = 0;
  auto mkdir_in = [&](const std::string& name) {
    return [&s, name] { return s.mkdir(pm::MkdirReq{kRootInode, name, 0755, proto::Caller{0, 0}}); };
  };
  // Healthy: the repeat is answered from the stored reply.
  auto first = replayed<pm::AttrResp>(s, sess, 1, 1, pm::Mkdir::kId, mkdir_in("before"), &runs);
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  auto again = replayed<pm::AttrResp>(s, sess, 1, 1, pm::Mkdir::kId, mkdir_in("before"), &runs);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *first);

  store.fail_syncs();
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 2, 1, pm::Mkdir::kId, mkdir_in("after"), &runs), Code::kNoSpace);
  EXPECT_EQ(runs, 2);
  ASSERT_TRUE(s.lookup(pm::LookupReq{kRootInode, "after"}).has_value()) << "the refused mkdir is visible until a restart";
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 2, 1, pm::Mkdir::kId, mkdir_in("after"), &runs), Code::kNoSpace);
  EXPECT_EQ(runs, 2) << "the repeat ran the change again";
  // So is a repeat of a change acknowledged before the failure: whether the store still holds it
  // is known again only after the restart the failure asks for.
  EXPECT_CODE(replayed<pm::AttrResp>(s, sess, 1, 1, pm::Mkdir::kId, mkdir_in("before"), &runs), Code::kNoSpace);
  EXPECT_EQ(runs, 2);
}

TYPED_TEST(NamespaceTest, StoredRepliesSurviveARestartAndGoWithTheirSession) {
  const SessionId sess = this->new_session();
  const SessionId other = this->new_session();
  int runs = 0;
  auto create_f = [&] { return this->create(kRootInode, "f", sess); };
  const std::string create_raw = proto::encode(testing::create_req(kRootInode, "f", sess));
  auto unlink_g = [&] { return this->svc_->unlink(pm::NameReq{kRootInode, "g"}); };
  auto made = replayed<pm::AttrResp>(*this->svc_, sess, 0, 1, pm::Create::kId, create_f, &runs, create_raw);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  this->must_create(kRootInode, "g");
  auto unlinked = replayed<pm::UnlinkResp>(*this->svc_, sess, 1, 1, pm::Unlink::kId, unlink_g, &runs);
  ASSERT_TRUE(unlinked.has_value()) << unlinked.error().to_string();
  ASSERT_TRUE(replayed<pm::AttrResp>(*this->svc_, other, 0, 1, pm::Mkdir::kId,
                                     [&] { return this->mkdir(kRootInode, "o"); }, &runs)
                  .has_value());
  EXPECT_EQ(runs, 3);

  // A restart (kill -9: the replies are in the changes' own batches).
  this->svc_.reset();
  this->store_.reset();
  this->store_ = this->backend_.open();
  ASSERT_NE(this->store_, nullptr);
  this->reopen();
  auto again = replayed<pm::AttrResp>(*this->svc_, sess, 0, 1, pm::Create::kId, create_f, &runs, create_raw);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *made);
  auto unlinked_again = replayed<pm::UnlinkResp>(*this->svc_, sess, 1, 1, pm::Unlink::kId, unlink_g, &runs);
  ASSERT_TRUE(unlinked_again.has_value()) << unlinked_again.error().to_string();
  EXPECT_EQ(*unlinked_again, *unlinked) << "the stored reply, with the parent as it was then";
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(this->names(kRootInode), (std::vector<std::string>{"f", "o"}));

  // A session's end takes its replies with it; the other session's stay.
  auto stored = [&](SessionId s) {
    size_t n = 0;
    const std::string prefix = schema::reply_prefix(s);
    EXPECT_TRUE(this->store_->scan(prefix, prefix, [&](std::string_view, std::string_view) {
      ++n;
      return true;
    }).is_ok());
    return n;
  };
  EXPECT_EQ(stored(sess), 2u);
  ASSERT_OK(this->svc_->close_session(pm::SessionReq{sess}));
  EXPECT_EQ(stored(sess), 0u);
  EXPECT_EQ(stored(other), 1u);
  EXPECT_CODE(replayed<pm::AttrResp>(*this->svc_, sess, 0, 1, pm::Create::kId, create_f, &runs, create_raw),
              Code::kBadHandle);
  this->now_ += 31'000'000'000;  // `other` stops heartbeating and expires
  ASSERT_OK(this->svc_->expire());
  EXPECT_EQ(stored(other), 0u);
}

// A change whose session expires while it runs applies nothing: stored without its reply, its
// repeat could run it a second time.
TYPED_TEST(NamespaceTest, AChangeWhoseSessionExpiresWhileItRunsAppliesNothing) {
  const SessionId sess = this->new_session();
  int runs = 0;
  auto late_mkdir = [&] {
    this->now_ += 31'000'000'000;  // the lease passes while the change waits (another mount's lease)
    return this->mkdir(kRootInode, "late");
  };
  EXPECT_CODE(replayed<pm::AttrResp>(*this->svc_, sess, 0, 1, pm::Mkdir::kId, late_mkdir, &runs), Code::kBadHandle);
  EXPECT_EQ(runs, 1);
  EXPECT_CODE(this->lookup(kRootInode, "late"), Code::kNotFound);
  EXPECT_EQ(this->attr(kRootInode).nlink, 2u);
}

// A Create answered from its stored reply after a restart gives its session the open it promised:
// here the mount had already sent its (empty) list of opens, so without it the file would be
// removed at the unlink below while the mount still had it open.
TYPED_TEST(NamespaceTest, ARepeatedCreateAfterARestartHoldsItsOpenAgain) {
  const SessionId sess = this->new_session();
  int runs = 0;
  pm::CreateReq req = testing::create_req(kRootInode, "f", sess);
  const std::string raw = proto::encode(req);
  auto run_create = [&]() -> Result<std::string> {
    ++runs;
    auto r = this->svc_->create(req);
    if (!r.has_value()) return std::move(r).error();
    return proto::encode(*r);
  };
  auto made = this->svc_->replay(pm::ReplayReq{sess, 2, 1, pm::Create::kId, raw}, run_create);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  const InodeId f = proto::decode<pm::AttrResp>(proto::bytes_of(*made))->attr.ino;
  // Restart before the open was written (it is kept in memory for open_store_delay first).
  this->svc_.reset();
  this->store_.reset();
  this->store_ = this->backend_.open();
  ASSERT_NE(this->store_, nullptr);
  this->reopen();
  ASSERT_OK(this->svc_->reclaim_opens(pm::ReclaimOpensReq{sess, {}, true}));  // the mount knew of no open yet
  auto again = this->svc_->replay(pm::ReplayReq{sess, 2, 1, pm::Create::kId, raw}, run_create);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *made);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(this->svc_->replies_repeated(), 1u);
  ASSERT_OK(this->unlink(kRootInode, "f"));
  EXPECT_TRUE(this->svc_->get_attr(pm::InodeReq{f}).has_value()) << "the open the create promised was lost";
  // The mount's release of it finalizes the file as usual.
  ASSERT_OK(this->svc_->release(pm::ReleaseReq{f, sess}));
  EXPECT_CODE(this->svc_->get_attr(pm::InodeReq{f}), Code::kNotFound);
}

// A session that ended took its stored replies along: the repeat of a change it applied would run
// again and fail (the directory is gone); its sender gets kBadHandle, not that failure.
TYPED_TEST(NamespaceTest, ARepeatAfterItsSessionEndedIsBadHandleNotTheRerunsError) {
  const SessionId sess = this->new_session();
  this->must_mkdir(kRootInode, "x");
  int runs = 0;
  auto rmdir_x = [&] { return empty_or(this->rmdir(kRootInode, "x")); };
  ASSERT_TRUE(replayed<proto::Empty>(*this->svc_, sess, 0, 1, pm::Rmdir::kId, rmdir_x, &runs).has_value());
  this->now_ += 31'000'000'000;
  ASSERT_OK(this->svc_->expire());
  EXPECT_CODE(replayed<proto::Empty>(*this->svc_, sess, 0, 1, pm::Rmdir::kId, rmdir_x, &runs), Code::kBadHandle);
}

// A reply record this server cannot read (damaged, or written in another format) does not stop
// its slot: the next change runs and replaces it.
TYPED_TEST(NamespaceTest, AnUnreadableReplyRecordDoesNotStopItsSlot) {
  const SessionId sess = this->new_session();
  WriteBatch batch;
  batch.put(schema::reply_key(sess, 0), std::string("\x01\x02\x03", 3));
  ASSERT_OK(this->store_->apply(batch));
  int runs = 0;
  auto mkdir_d = [&] { return this->mkdir(kRootInode, "d"); };
  auto made = replayed<pm::AttrResp>(*this->svc_, sess, 0, 5, pm::Mkdir::kId, mkdir_d, &runs);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  auto again = replayed<pm::AttrResp>(*this->svc_, sess, 0, 5, pm::Mkdir::kId, mkdir_d, &runs);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(*again, *made);
  EXPECT_EQ(runs, 1);
}

// A store that runs a hook once, just before the first read of one key after arm(): a change that
// commits between two reads of a lock-free lookup.
class HookStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override {
    if (hook_ && key == key_) {
      auto hook = std::move(hook_);
      hook_ = nullptr;
      hook();
    }
    return inner_.get(key);
  }
  Status apply(const WriteBatch& batch) override { return inner_.apply(batch); }
  Status sync() override { return inner_.sync(); }
  Status sync_soon() override { return inner_.sync_soon(); }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return inner_.scan(prefix, seek, fn);
  }
  std::string describe() const override { return "memory (with a hook)"; }
  void arm(std::string key, std::function<void()> hook) {
    key_ = std::move(key);
    hook_ = std::move(hook);
  }

 private:
  MemoryStore inner_;
  std::string key_;
  std::function<void()> hook_;
};

// A checkpoint's "latest" replaced with os.replace() while another client opens it: the rename
// commits after the lookup read the name and before it read the inode, which the rename freed
// (no one had it open). The name existed all along, so the lookup, the lookup that opens and
// the listing with attributes must find the new file, not answer "no such entry" or skip it.
TEST(LookupDuringAReplace, TheNameIsFoundAsTheFileThatReplacedIt) {
  HookStore store;
  MetaOptions o;
  o.seed = 7;
  auto opened = MetaService::open(&store, o);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  MetaService& s = **opened;
  pm::RegisterNodeReq node;
  node.node_uuid = "node-a";
  node.address = "127.0.0.1:7700";
  node.targets.push_back(pm::TargetReport{"t1", "/data/t1", 1000, 400});
  ASSERT_TRUE(s.register_node(node).has_value());
  auto session = s.register_session(pm::RegisterSessionReq{"test", "host"});
  ASSERT_TRUE(session.has_value()) << session.error().to_string();
  auto make = [&](const std::string& name) {
    auto r = s.create(testing::create_req(kRootInode, name, SessionId()));
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  };
  int round = 0;
  auto replace_latest_then = [&](auto&& call) {
    const std::string n = std::to_string(++round);
    const InodeId old = make("latest" + n);
    const InodeId fresh = make("tmp" + n);
    store.arm(schema::inode_key(old), [&s, n] {
      ASSERT_TRUE(s.rename(pm::RenameReq{kRootInode, "tmp" + n, kRootInode, "latest" + n, 0}).is_ok());
    });
    call(fresh);
    ASSERT_FALSE(s.get_attr(pm::InodeReq{old}).has_value()) << "the replaced file was freed";
  };
  replace_latest_then([&](InodeId fresh) {
    auto r = s.lookup(pm::LookupReq{kRootInode, "latest1", session->session});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    EXPECT_EQ(r->attr.ino, fresh);
  });
  replace_latest_then([&](InodeId fresh) {
    auto r = s.lookup_open(pm::LookupReq{kRootInode, "latest2", session->session});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    EXPECT_EQ(r->attr.ino, fresh);
    EXPECT_TRUE(r->opened);
  });
  replace_latest_then([&](InodeId fresh) {
    auto r = s.read_dir(pm::ReadDirReq{kRootInode, "", 0, /*plus=*/true, session->session});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    bool found = false;
    for (const pm::DirEntry& e : r->entries) {
      if (e.name != "latest3") continue;
      found = true;
      EXPECT_EQ(e.ino, fresh);
      ASSERT_TRUE(e.attr.has_value());
      EXPECT_EQ(e.attr->ino, fresh);
    }
    EXPECT_TRUE(found) << "the listing left \"latest3\" out";
  });
}

}  // namespace
}  // namespace penstock::meta
