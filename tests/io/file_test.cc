#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "io/safetensors.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A fresh folder under the test temp dir.
std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/file_test_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A FIFO with no writer: a plain open() for reading would block forever, so
// returning at all is half of what these tests check.
TEST(OpenRegularFile, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = fresh_dir("fifo") + "/weights.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  Result<UniqueFd> fd = open_regular_file(fifo);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(fd.status().message(), fifo + ": is a FIFO, not a regular file"));
  EXPECT_TRUE(contains(read_file(fifo).status().message(), "is a FIFO"));
  EXPECT_TRUE(contains(check_regular_file(fifo).message(), "is a FIFO"));
}

TEST(OpenRegularFile, FolderAndDeviceAreRefusedByKind) {
  const std::string dir = fresh_dir("kinds");
  EXPECT_TRUE(contains(open_regular_file(dir).status().message(), dir + ": is a folder, not a regular file"));
  EXPECT_TRUE(contains(open_regular_file("/dev/null").status().message(),
                       "/dev/null: is a character device, not a regular file"));
}

TEST(OpenRegularFile, MissingIsNotFound) {
  Result<UniqueFd> fd = open_regular_file(fresh_dir("missing") + "/none.bin");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kNotFound);
}

// A regular file opens in blocking mode (O_NONBLOCK is only for the open)
// and reads as usual; a symlink to it is followed.
TEST(OpenRegularFile, RegularFileAndSymlinkOpenBlocking) {
  const std::string dir = fresh_dir("regular");
  std::ofstream(dir + "/a.bin") << "hello";
  fs::create_symlink(dir + "/a.bin", dir + "/link.bin");
  for (const std::string& path : {dir + "/a.bin", dir + "/link.bin"}) {
    Result<UniqueFd> fd = open_regular_file(path);
    ASSERT_TRUE(fd.ok()) << fd.status().message();
    EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
    char buf[8] = {};
    EXPECT_EQ(::read(fd->get(), buf, sizeof(buf)), 5);
    EXPECT_EQ(std::string(buf), "hello");
  }
}

TEST(UniqueFd, MoveTransfersOwnership) {
  const std::string dir = fresh_dir("move");
  std::ofstream(dir + "/a.bin") << "x";
  Result<UniqueFd> opened = open_regular_file(dir + "/a.bin");
  ASSERT_TRUE(opened.ok());
  UniqueFd a = std::move(opened).value();
  const int raw = a.get();
  UniqueFd b = std::move(a);
  EXPECT_EQ(a.get(), -1);
  EXPECT_EQ(b.get(), raw);
  EXPECT_EQ(b.close(), 0);
  EXPECT_EQ(b.get(), -1);
}

TEST(CheckWritableFolder, CreatesMissingFoldersAndLeavesNoProbe) {
  const std::string dir = fresh_dir("create") + "/a/b/c";
  ASSERT_TRUE(check_writable_folder(dir).ok());
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));  // the probe file was removed
  EXPECT_TRUE(check_writable_folder(dir).ok());  // and an existing one passes
}

TEST(CheckWritableFolder, PathOfAFileIsRefused) {
  const std::string file = fresh_dir("file") + "/plain";
  std::ofstream(file) << "x";
  Status st = check_writable_folder(file);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), file + ": is a regular file, not a folder"));
}

TEST(CheckWritableFolder, EmptyPathIsRefused) {
  Status st = check_writable_folder("");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "empty path"));
}

TEST(CheckWritableFolder, UncreatableFolderIsRefused) {
  const std::string file = fresh_dir("uncreatable") + "/plain";
  std::ofstream(file) << "x";
  Status st = check_writable_folder(file + "/sub");
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(st.message(), file + "/sub: cannot create the folder"));
}

// A folder that exists but takes no new files (even for root: /proc/self).
TEST(CheckWritableFolder, FolderThatTakesNoFilesIsRefused) {
  Status st = check_writable_folder("/proc/self");
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(st.message(), "/proc/self: cannot create files in the folder"));
  if (::geteuid() != 0) {  // permission bits do not stop root
    const std::string ro = fresh_dir("readonly");
    ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
    EXPECT_TRUE(contains(check_writable_folder(ro).message(), ro + ": cannot create files in the folder"));
    ::chmod(ro.c_str(), 0755);
  }
}

TEST(CheckWritableFile, FolderOrFifoTargetIsRefused) {
  const std::string dir = fresh_dir("target");
  EXPECT_TRUE(contains(check_writable_file(dir).message(), dir + ": is a folder, not a regular file"));
  ASSERT_EQ(::mkfifo((dir + "/out.safetensors").c_str(), 0644), 0);
  EXPECT_TRUE(contains(check_writable_file(dir + "/out.safetensors").message(), "is a FIFO, not a regular file"));
  EXPECT_TRUE(check_writable_file(dir + "/new/model.safetensors").ok());
  EXPECT_TRUE(fs::is_directory(dir + "/new"));
}

TEST(CheckOpenableForWriting, CreatesTheFolderAndRefusesAFolder) {
  const std::string dir = fresh_dir("log");
  EXPECT_TRUE(check_openable_for_writing(dir + "/logs/m.jsonl").ok());
  EXPECT_TRUE(fs::exists(dir + "/logs/m.jsonl"));
  EXPECT_TRUE(contains(check_openable_for_writing(dir).message(), dir + ": cannot open for writing"));
  std::ofstream(dir + "/plain") << "x";
  EXPECT_TRUE(contains(check_openable_for_writing(dir + "/plain/m.jsonl").message(), "cannot create the folder"));
}

}  // namespace
}  // namespace tessera::io
