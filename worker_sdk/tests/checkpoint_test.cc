#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dist/sdk/checkpoint.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dist-ckpt-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripsExactly) {
  Checkpoint c;
  c.step = 1234;
  c.tensors["w1"] = {1.5f, -0.0f, std::nanf(""), 3.4028235e38f};
  c.tensors["momentum/w1"] = std::vector<float>(100000, 0.125f);
  c.tensors["empty"] = {};
  save_checkpoint(dir_ / "ckpt.bin", c);
  const auto back = load_checkpoint(dir_ / "ckpt.bin");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 1234u);
  ASSERT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(std::memcmp(back->tensors.at("w1").data(), c.tensors.at("w1").data(), 16), 0)
      << "bit-identical, NaN and -0 included";
  EXPECT_EQ(back->tensors.at("momentum/w1"), c.tensors.at("momentum/w1"));
  EXPECT_TRUE(back->tensors.at("empty").empty());
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "ckpt.bin") << "no temporary file left behind";
  }
}

TEST_F(CheckpointTest, AMissingDirectoryIsMadeFirst) {
  Checkpoint c;
  c.step = 7;
  c.tensors["w"] = {1.0f, 2.0f};
  const fs::path nested = dir_ / "not" / "yet";
  save_checkpoint(nested / "ckpt.bin", c);
  const auto back = load_checkpoint(nested / "ckpt.bin");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 7u);
  EXPECT_EQ(back->tensors.at("w"), c.tensors.at("w"));
}

TEST_F(CheckpointTest, AMissingFileIsNoCheckpoint) {
  EXPECT_EQ(load_checkpoint(dir_ / "none.bin"), std::nullopt);
}

TEST_F(CheckpointTest, DamagedFilesAreRefusedWithTheirPath) {
  Checkpoint c;
  c.step = 7;
  c.tensors["w"] = std::vector<float>(64, 1.0f);
  save_checkpoint(dir_ / "good.bin", c);
  std::ifstream in(dir_ / "good.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const std::pair<const char*, std::string> damaged[] = {
      {"truncated", bytes.substr(0, bytes.size() / 2)},
      {"flipped bit",
       [&] {
         std::string b = bytes;
         b[40] ^= 1;
         return b;
       }()},
      {"not a checkpoint", std::string(100, 'x')},
  };
  for (const auto& [name, content] : damaged) {
    SCOPED_TRACE(name);
    std::ofstream(dir_ / "bad.bin", std::ios::binary) << content;
    try {
      load_checkpoint(dir_ / "bad.bin");
      FAIL() << "must be refused";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.bin"), std::string::npos) << e.what();
    }
  }
}

TEST_F(CheckpointTest, BlobsRoundTripAndAreCoveredByTheChecksum) {
  Checkpoint c;
  c.step = 9;
  c.tensors["w"] = {1.0f, 2.0f};
  c.blobs["ddp"] = std::string(
      "state\0with\xff"
      "bytes",
      16);
  c.blobs["empty"] = "";
  save_checkpoint(dir_ / "blobs.bin", c);
  const auto back = load_checkpoint(dir_ / "blobs.bin");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tensors, c.tensors);
  EXPECT_EQ(back->blobs, c.blobs);

  std::ifstream in(dir_ / "blobs.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[bytes.size() - 12] ^= 1;  // inside the last blob
  std::ofstream(dir_ / "blobs.bin", std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THROW(load_checkpoint(dir_ / "blobs.bin"), CheckpointError);
}

TEST_F(CheckpointTest, ACheckpointWithoutBlobsKeepsTheFirstFormat) {
  Checkpoint c;
  c.tensors["w"] = {1.0f};
  save_checkpoint(dir_ / "v1.bin", c);
  std::ifstream in(dir_ / "v1.bin", std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  EXPECT_EQ(magic, "DISTCKP1") << "readable by the SDK before blobs";
  EXPECT_TRUE(load_checkpoint(dir_ / "v1.bin")->blobs.empty());
}

TEST_F(CheckpointTest, ReplacingKeepsEitherTheOldOrTheNewCheckpoint) {
  Checkpoint a, b;
  a.step = 1;
  a.tensors["w"] = {1.0f};
  b.step = 2;
  b.tensors["w"] = {2.0f};
  save_checkpoint(dir_ / "c.bin", a);
  save_checkpoint(dir_ / "c.bin", b);
  EXPECT_EQ(load_checkpoint(dir_ / "c.bin")->step, 2u);
}

// A directory that cannot be made (a file stands where it would go; root may write anywhere else).
TEST_F(CheckpointTest, AnUnwritableDirectoryIsAClearError) {
  std::ofstream(dir_ / "a-file") << "not a directory";
  try {
    save_checkpoint(dir_ / "a-file" / "dir" / "c.bin", Checkpoint{});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dist::sdk
