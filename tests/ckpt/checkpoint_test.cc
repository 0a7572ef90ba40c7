// Sharded checkpoints (src/ckpt): round trips, resharding between layouts,
// ZeRO flat ranges, padding, corruption, failing writes, publishing and
// pruning. Multi-rank cases run ranks as threads (comm/local/thread_communicator.h); the MPI
// version is tests/comm/mpi_checkpoint.cc.
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpointer.h"
#include "ckpt/dir_lock.h"
#include "ckpt/reshard.h"
#include "comm/local/thread_communicator.h"
#include "comm/local/self_communicator.h"
#include "io/safetensors.h"

namespace tessera::ckpt {
namespace {

namespace fs = std::filesystem;
using comm::run_ranks;

testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// Element i of test tensor `seed`: distinct, exact in float.
std::vector<float> tensor_data(const Shape& s, int seed) {
  std::vector<float> v(s.numel());
  for (size_t i = 0; i < v.size(); i++) v[i] = seed * 1000.0f + static_cast<float>(i) * 0.25f;
  return v;
}

TensorSlice slice(Shape global, Shape view, std::vector<int64_t> begin, std::vector<int64_t> size,
                  int64_t flat_begin = 0, int64_t flat_end = -1) {
  TensorSlice s;
  s.global = global;
  s.view = view;
  s.begin = std::move(begin);
  s.size = std::move(size);
  s.flat_begin = flat_begin;
  s.flat_end = flat_end;
  return s;
}
// Rows [r0, r1) / columns [c0, c1) of a 2-D tensor, viewed as itself.
TensorSlice rows(Shape g, int64_t r0, int64_t r1) { return slice(g, g, {r0, 0}, {r1 - r0, g[1]}); }
TensorSlice cols(Shape g, int64_t c0, int64_t c1) { return slice(g, g, {0, c0}, {g[0], c1 - c0}); }

// What a rank holding slice s stores, taken from the whole tensor (whose
// row-major order is s.view's).
std::vector<float> stored_part(const std::vector<float>& whole, const TensorSlice& s) {
  std::vector<float> block(s.block_numel());
  gather_block(whole.data(), s, block.data());
  const int64_t end = s.flat_end < 0 ? s.block_numel() : s.flat_end;
  return std::vector<float>(block.begin() + s.flat_begin, block.begin() + end);
}

// The pieces of one save, owning their data.
struct Pieces {
  std::vector<std::vector<float>> storage;
  std::vector<SavePiece> list;
  void add(const std::string& name, const TensorSlice& s, const std::vector<float>& whole) {
    storage.push_back(stored_part(whole, s));
    list.push_back({name, s, storage.back().data()});
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Blocks the shard writes while closed (manifest and latest pass).
class GateEnv : public Env {
 public:
  explicit GateEnv(bool open) : open_(open) {}
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override {
    if (path.ends_with(".safetensors")) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    }
    return posix_env().write_file(path, pieces);
  }
  void set_open(bool open) {
    std::lock_guard lock(mu_);
    open_ = open;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_;
};

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(testing::TempDir()) / ("tessera_ckpt_" + std::string(info->name()) + "_" +
                                           std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    world_ = comm::self_communicator();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string root() const { return dir_.string(); }
  fs::path step_dir(int64_t step) const { return dir_ / step_dir_name(step); }
  CheckpointerOptions options(Env* env = nullptr) const {
    CheckpointerOptions o;
    o.dir = root();
    o.env = env;
    return o;
  }
  // save() then poll(world, true): the result of that poll.
  PollResult save_now(Checkpointer& c, comm::Communicator& w, int64_t step, const Pieces& p,
                      std::string_view state = "{}") {
    Result<bool> started = c.save(w, step, p.list, state);
    EXPECT_TRUE(started.ok() && *started) << started.status().message();
    Result<PollResult> r = c.poll(w, true);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : PollResult{};
  }
  PollResult save_now(Checkpointer& c, int64_t step, const Pieces& p, std::string_view state = "{}") {
    return save_now(c, *world_, step, p, state);
  }
  // One whole tensor "w" of shape s, published at `step`.
  Checkpoint save_whole(const Shape& s, int64_t step = 10) {
    Checkpointer c(options());
    Pieces p;
    p.add("w", TensorSlice::whole(s), tensor_data(s, 1));
    EXPECT_EQ(save_now(c, step, p).state, SaveState::kPublished);
    Result<Checkpoint> ck = Checkpoint::open(root());
    EXPECT_TRUE(ck.ok()) << ck.status().message();
    return std::move(ck).value();
  }

  fs::path dir_;
  std::unique_ptr<comm::Communicator> world_;
};

// ---- reshard core ----

// Random blocks and flat ranges on both sides against an element-by-element oracle.
TEST(CheckpointReshard, CopyIntersectionMatchesElementwiseOracle) {
  std::mt19937 rng(7);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint32_t>(n)); };
  for (int trial = 0; trial < 500; trial++) {
    const Shape view{1 + pick(4), 1 + pick(5), 1 + pick(6)};
    auto random_slice = [&] {
      TensorSlice s = slice(view, view, {0, 0, 0}, {0, 0, 0});
      for (int d = 0; d < 3; d++) {
        s.begin[d] = pick(view[d]);
        s.size[d] = pick(view[d] - s.begin[d] + 1);
      }
      const int64_t n = s.block_numel();
      if (rng() % 2) {
        s.flat_begin = pick(n + 1);
        s.flat_end = s.flat_begin + pick(n - s.flat_begin + 1);
      }
      return s;
    };
    const TensorSlice have = random_slice(), want = random_slice();
    const std::vector<float> whole = tensor_data(view, 3);
    const std::vector<float> have_data = stored_part(whole, have);
    std::vector<float> out(want.numel(), -1.0f);
    std::vector<uint8_t> covered(want.numel(), 0);
    const int64_t copied = copy_intersection(have, have_data, want, out, covered);
    // Oracle: element k of want is copied iff its coordinate is in have's stored part.
    const std::vector<float> want_all = stored_part(whole, want);
    std::vector<uint8_t> in_have(whole.size(), 0);
    {
      std::vector<float> idx(whole.size());
      for (size_t i = 0; i < idx.size(); i++) idx[i] = static_cast<float>(i);
      for (float i : stored_part(idx, have)) in_have[static_cast<size_t>(i)] = 1;
    }
    int64_t expect_copied = 0;
    for (int64_t k = 0; k < want.numel(); k++) {
      const size_t global = static_cast<size_t>((want_all[k] - 3000.0f) / 0.25f);
      const bool expect = in_have[global] != 0;
      expect_copied += expect;
      ASSERT_EQ(covered[k], expect) << "trial " << trial << " element " << k;
      if (expect) ASSERT_EQ(out[k], want_all[k]) << "trial " << trial << " element " << k;
      else ASSERT_EQ(out[k], -1.0f) << "trial " << trial << " element " << k;
    }
    EXPECT_EQ(copied, expect_copied);
    EXPECT_EQ(intersection_size(have, want), expect_copied);
  }
}

TEST(CheckpointReshard, ZeroOutsideCoversExactlyThePaddedPart) {
  const Shape stored{5, 4}, padded{8, 6};
  TensorSlice want = slice(padded, padded, {3, 1}, {5, 5}, 2, 21);
  std::vector<float> out(want.numel(), 7.0f);
  std::vector<uint8_t> covered(want.numel(), 0);
  const int64_t zeroed = zero_outside(stored, want, out, covered);
  int64_t expect = 0;
  for (int64_t k = 0; k < want.numel(); k++) {
    const int64_t f = want.flat_begin + k, r = 3 + f / 5, c = 1 + f % 5;
    const bool outside = r >= 5 || c >= 4;
    expect += outside;
    EXPECT_EQ(covered[k], outside) << k;
    EXPECT_EQ(out[k], outside ? 0.0f : 7.0f) << k;
  }
  EXPECT_EQ(zeroed, expect);
}

// ---- round trip ----

TEST_F(CheckpointTest, RoundTripsWholeTensorsAndState) {
  CheckpointerOptions o = options();
  o.config = {{"n_layer", 2}, {"lr", 0.5}};
  o.layout = {{"dp", 1}, {"tp", 1}};
  Checkpointer c(o);
  const Shape a{3, 5}, b{7};
  Pieces p;
  p.add("param/a", TensorSlice::whole(a), tensor_data(a, 1));
  p.add("param/b", TensorSlice::whole(b), tensor_data(b, 2));
  p.add("adam_m/a", TensorSlice::whole(a), tensor_data(a, 3));
  const std::string state = R"({"rng":[1,2,3],"loader":{"shard":0,"pos":1234}})";
  PollResult r = save_now(c, 50, p, state);
  ASSERT_EQ(r.state, SaveState::kPublished) << r.error.message();
  EXPECT_EQ(r.step, 50);
  EXPECT_GT(r.stats.bytes_rank, 0u);
  EXPECT_EQ(r.stats.bytes_rank, r.stats.bytes_total);
  EXPECT_EQ(r.stats.bytes_rank, fs::file_size(step_dir(50) / "shard-00000.safetensors"));
  EXPECT_GE(r.stats.write_s, 0.0);
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000050\n");
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000050"));
  EXPECT_EQ(c.poll(*world_, true)->state, SaveState::kIdle);

  for (const std::string& path : {root(), step_dir(50).string()}) {
    Result<Checkpoint> ck = Checkpoint::open(path);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    EXPECT_EQ(ck->step(), 50);
    EXPECT_EQ(ck->world_size(), 1);
    EXPECT_EQ(ck->config(), o.config);
    EXPECT_EQ(ck->layout(), o.layout);
    EXPECT_EQ(ck->names(), (std::vector<std::string>{"adam_m/a", "param/a", "param/b"}));
    EXPECT_EQ(*ck->global_shape("param/b"), b);
    EXPECT_EQ(*ck->state(0), state);
    EXPECT_TRUE(ck->verify().ok()) << ck->verify().message();
    std::vector<float> out(a.numel());
    ASSERT_TRUE(ck->read("adam_m/a", TensorSlice::whole(a), out).ok());
    EXPECT_EQ(out, tensor_data(a, 3));
    EXPECT_EQ(ck->read("nope", TensorSlice::whole(a), out).code(), StatusCode::kNotFound);
  }
  // A shard is an ordinary safetensors file.
  auto st = io::SafetensorsFile::open((step_dir(50) / "shard-00000.safetensors").string());
  ASSERT_TRUE(st.ok()) << st.status().message();
  std::vector<float> b_out(b.numel());
  ASSERT_TRUE(st->read_f32("param/b", b_out).ok());
  EXPECT_EQ(b_out, tensor_data(b, 2));
  EXPECT_EQ(st->metadata().at("tessera_state"), state);
}

// ---- resharding ----

// A staging buffer the host cannot give is a Status naming it (the trainer
// makes it every rank's error before training), not std::bad_alloc. In a
// forked child whose address space is capped, whatever the overcommit policy.
TEST_F(CheckpointTest, StagingTheHostCannotGiveIsResourceExhausted) {
  EXPECT_EXIT(
      {
        rlimit lim{};
        lim.rlim_cur = lim.rlim_max = rlim_t{64} << 30;
        setrlimit(RLIMIT_AS, &lim);
        Checkpointer c(options());
        const Status st = c.reserve_staging(size_t{1} << 36);  // 256 GiB of floats
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        if (st.code() != StatusCode::kResourceExhausted || c.staging_bytes() != 0) std::exit(1);
        std::exit(c.reserve_staging(1024).ok() && c.staging_bytes() == 4096 ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "resource exhausted: cannot allocate the 274877.9 MB checkpoint staging buffer: out of memory");
}

TEST_F(CheckpointTest, ReshardsTwoRowBlocksIntoColumnBlocksAndFlatRanges) {
  const Shape w{8, 6};
  // A QKV-like weight (L, 3C, C) = (2, 12, 4) viewed (L, 3, C, C): saved split
  // by heads (dim 2), read split by layers (dim 0).
  const Shape qkv{2, 12, 4}, qkv_view{2, 3, 4, 4};
  run_ranks(2, [&](comm::Communicator& world) {
    const int r = world.rank();
    Checkpointer c(options());
    Pieces p;
    p.add("w", rows(w, 4 * r, 4 * r + 4), tensor_data(w, 1));
    p.add("qkv", slice(qkv, qkv_view, {0, 0, 2 * r, 0}, {2, 3, 2, 4}), tensor_data(qkv, 2));
    Result<bool> started = c.save(world, 20, p.list, fmt::format("{{\"rank\":{}}}", r));
    EXPECT_TRUE(started.ok() && *started);
    Result<PollResult> res = c.poll(world, true);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->state, SaveState::kPublished) << res->error.message();
  });
  Result<Checkpoint> ck = Checkpoint::open(root());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->world_size(), 2);
  EXPECT_EQ(*ck->state(1), "{\"rank\":1}");
  ASSERT_TRUE(ck->verify().ok());
  const std::vector<float> whole = tensor_data(w, 1);
  // Four uneven column blocks, then flat ranges of the whole and of a column block.
  const int64_t edges[] = {0, 2, 3, 5, 6};
  for (int k = 0; k < 4; k++) {
    const TensorSlice want = cols(w, edges[k], edges[k + 1]);
    std::vector<float> out(want.numel(), -1.0f);
    ASSERT_TRUE(ck->read("w", want, out).ok());
    EXPECT_EQ(out, stored_part(whole, want)) << "column block " << k;
  }
  for (const TensorSlice& want : {slice(w, w, {0, 0}, {8, 6}, 5, 37), slice(w, w, {0, 2}, {8, 3}, 3, 10)}) {
    std::vector<float> out(want.numel(), -1.0f);
    ASSERT_TRUE(ck->read("w", want, out).ok());
    EXPECT_EQ(out, stored_part(whole, want));
  }
  for (int layer = 0; layer < 2; layer++) {
    const TensorSlice want = slice(qkv, qkv_view, {layer, 0, 0, 0}, {1, 3, 4, 4});
    std::vector<float> out(want.numel());
    ASSERT_TRUE(ck->read("qkv", want, out).ok());
    EXPECT_EQ(out, stored_part(tensor_data(qkv, 2), want)) << "layer " << layer;
  }
}

TEST_F(CheckpointTest, AssemblesZeroFlatRangePiecesIntoBlocks) {
  const Shape m{7, 6};  // 42 elements, split unevenly by flat range as ZeRO-1 does
  const int64_t cut[] = {0, 10, 30, 42};
  run_ranks(3, [&](comm::Communicator& world) {
    const int r = world.rank();
    Checkpointer c(options());
    Pieces p;
    p.add("adam_m/w", slice(m, m, {0, 0}, {7, 6}, cut[r], cut[r + 1]), tensor_data(m, 4));
    ASSERT_TRUE(c.save(world, 30, p.list, "{}").ok());
    EXPECT_EQ(c.poll(world, true)->state, SaveState::kPublished);
  });
  Result<Checkpoint> ck = Checkpoint::open(root());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const std::vector<float> whole = tensor_data(m, 4);
  for (const TensorSlice& want : {rows(m, 2, 5), TensorSlice::whole(m), cols(m, 1, 4), slice(m, m, {1, 0}, {6, 6}, 7, 29)}) {
    std::vector<float> out(want.numel(), -1.0f);
    Status st = ck->read("adam_m/w", want, out);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(out, stored_part(whole, want));
  }
}

TEST_F(CheckpointTest, ReadsOnlyPiecesThatHoldWantedElements) {
  const Shape m{6, 5};  // ZeRO: every piece's block is the whole tensor
  const int64_t cut[] = {0, 10, 20, 30};
  run_ranks(3, [&](comm::Communicator& world) {
    const int r = world.rank();
    Checkpointer c(options());
    Pieces p;
    p.add("m", slice(m, m, {0, 0}, {6, 5}, cut[r], cut[r + 1]), tensor_data(m, 1));
    ASSERT_TRUE(c.save(world, 10, p.list, "{}").ok());
    EXPECT_EQ(c.poll(world, true)->state, SaveState::kPublished);
  });
  // Rank 2's piece is damaged; a reader that never needs it never notices.
  const fs::path shard2 = step_dir(10) / "shard-00002.safetensors";
  {
    std::fstream f(shard2, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  Checkpoint ck = *Checkpoint::open(step_dir(10).string() + "/");
  const std::vector<float> whole = tensor_data(m, 1);
  for (const TensorSlice& want : {slice(m, m, {0, 0}, {6, 5}, 0, 20), rows(m, 0, 4)}) {
    std::vector<float> out(want.numel());
    Status st = ck.read("m", want, out);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(out, stored_part(whole, want));
  }
  std::vector<float> out(30);
  Status st = ck.read("m", TensorSlice::whole(m), out);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), shard2.string()));
}

TEST_F(CheckpointTest, ZeroFillsBeyondTheStoredExtent) {
  const Shape stored{5, 4}, padded{8, 4};  // e.g. a vocabulary padded from 5 to 8 rows
  Checkpoint ck = save_whole(stored);
  const std::vector<float> whole = tensor_data(stored, 1);
  std::vector<float> out(padded.numel(), NAN);
  ASSERT_TRUE(ck.read("w", TensorSlice::whole(padded), out).ok());
  for (int64_t i = 0; i < padded.numel(); i++) EXPECT_EQ(out[i], i < stored.numel() ? whole[i] : 0.0f) << i;
  // A padded rank's row block, flat sub-range included.
  const TensorSlice want = slice(padded, padded, {3, 0}, {5, 4}, 2, 15);
  std::vector<float> part(want.numel(), NAN);
  ASSERT_TRUE(ck.read("w", want, part).ok());
  for (int64_t k = 0; k < want.numel(); k++) {
    const int64_t i = 3 * 4 + 2 + k;
    EXPECT_EQ(part[k], i < stored.numel() ? whole[i] : 0.0f) << k;
  }
}

TEST_F(CheckpointTest, UncoveredElementIsAnErrorNamingTheTensor) {
  const Shape s{4, 4};
  Checkpointer c(options());
  Pieces p;
  p.add("w", rows(s, 0, 3), tensor_data(s, 1));  // row 3 was never saved
  ASSERT_EQ(save_now(c, 10, p).state, SaveState::kPublished);
  Checkpoint ck = *Checkpoint::open(root());
  std::vector<float> out(16);
  Status st = ck.read("w", TensorSlice::whole(s), out);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), "tensor 'w'"));
  EXPECT_TRUE(contains(st.message(), "element (3, 0)"));
  std::vector<float> three(12);
  EXPECT_TRUE(ck.read("w", rows(s, 0, 3), three).ok());
}

TEST_F(CheckpointTest, BadWantedSliceIsInvalidArgument) {
  Checkpoint ck = save_whole(Shape{4, 4});
  std::vector<float> out(16);
  EXPECT_EQ(ck.read("w", TensorSlice::whole(Shape{16}), std::span(out)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ck.read("w", TensorSlice::whole(Shape{4, 4}), std::span(out).first(15)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ck.read("w", slice(Shape{4, 4}, Shape{4, 4}, {2, 0}, {3, 4}), out).code(), StatusCode::kInvalidArgument);
}

// ---- corruption ----

TEST_F(CheckpointTest, TruncatedShardIsRefused) {
  Checkpoint ck = save_whole(Shape{16, 16});
  const fs::path shard = step_dir(10) / "shard-00000.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 10);
  Status st = ck.verify();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), shard.string()));
  EXPECT_TRUE(contains(st.message(), "truncated"));
  std::vector<float> out(256);
  st = ck.read("w", TensorSlice::whole(Shape{16, 16}), out);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), shard.string()));
  EXPECT_TRUE(contains(st.message(), "past the end of the file"));
}

TEST_F(CheckpointTest, FlippedBitIsRefusedNamingFileAndChecksums) {
  Checkpoint ck = save_whole(Shape{16, 16});
  const fs::path shard = step_dir(10) / "shard-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-7, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(-7, std::ios::end);
    f.write(&byte, 1);
  }
  Status st = ck.verify();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), shard.string()));
  EXPECT_TRUE(contains(st.message(), "manifest says " + hex64(ck.manifest().shards[0].xxh64)));
  std::vector<float> out(256);
  st = ck.read("w", TensorSlice::whole(Shape{16, 16}), out);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), shard.string()));
  EXPECT_TRUE(contains(st.message(), "piece 'w' xxh64 is"));
  EXPECT_TRUE(contains(st.message(), hex64(ck.manifest().shards[0].pieces[0].xxh64)));
}

TEST_F(CheckpointTest, MissingOrGarbledManifestIsReported) {
  Result<Checkpoint> none = Checkpoint::open(root());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(none.status().message(), "not a checkpoint"));

  save_whole(Shape{2, 2});
  const fs::path manifest = step_dir(10) / "manifest.json";
  const std::string good = read_text(manifest);
  auto open_with = [&](const std::string& text) {
    std::ofstream(manifest, std::ios::trunc) << text;
    return Checkpoint::open(root()).status();
  };
  Status st = open_with("{\"format\": \"tessera-checkpoint\", ");
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), manifest.string() + ": not valid JSON"));

  nlohmann::json j = nlohmann::json::parse(good);
  auto with = [&](auto edit) {
    nlohmann::json k = j;
    edit(k);
    return open_with(k.dump());
  };
  st = with([](nlohmann::json& k) { k["shards"][0]["pieces"][0].erase("view"); });
  EXPECT_TRUE(contains(st.message(), "piece 0 'w': \"view\" is missing")) << st.message();
  st = with([](nlohmann::json& k) { k["version"] = 99; });
  EXPECT_TRUE(contains(st.message(), "format version 99 is not supported"));
  st = with([](nlohmann::json& k) { k["shards"][0]["file"] = "../../etc/passwd"; });
  EXPECT_TRUE(contains(st.message(), "is not a plain file name"));
  st = with([](nlohmann::json& k) { k["shards"][0]["pieces"][0]["begin"] = {1, 0}; });
  EXPECT_TRUE(contains(st.message(), "lies outside view")) << st.message();
  st = with([](nlohmann::json& k) { k["step"] = 11; });
  EXPECT_TRUE(contains(st.message(), "says step 11 but lies in folder step-00000010"));
  st = with([](nlohmann::json& k) { k["world_size"] = 2; });
  EXPECT_TRUE(contains(st.message(), "1 shards listed for a world of 2 ranks"));
  EXPECT_TRUE(open_with(good).ok());

  std::ofstream(dir_ / "latest", std::ios::trunc) << "../elsewhere\n";
  st = Checkpoint::open(root()).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), (dir_ / "latest").string()));
}

// The manifest checks itself: a one-bit change that still reads well (a
// model dimension, a piece's checksum, a piece dropped) is refused at open;
// verify recomputes every piece's checksum.
TEST_F(CheckpointTest, ManifestChecksumCatchesEditsThatReadWell) {
  save_whole(Shape{4, 4});
  const fs::path manifest = step_dir(10) / "manifest.json";
  const std::string good = read_text(manifest);
  const nlohmann::json j = nlohmann::json::parse(good);
  ASSERT_TRUE(j.contains("manifest_xxh64"));
  auto open_with = [&](const nlohmann::json& k) {
    std::ofstream(manifest, std::ios::trunc) << k.dump(1);
    return Checkpoint::open(root()).status();
  };
  for (auto edit : std::vector<std::function<void(nlohmann::json&)>>{
           [](nlohmann::json& k) { k["config"]["dim"] = 120; },
           [](nlohmann::json& k) { k["shards"][0]["pieces"][0]["xxh64"] = "0000000000000001"; },
           [](nlohmann::json& k) { k["shards"][0]["pieces"] = nlohmann::json::array(); },
       }) {
    nlohmann::json k = j;
    edit(k);
    const Status st = open_with(k);
    EXPECT_EQ(st.code(), StatusCode::kCorruption);
    EXPECT_TRUE(contains(st.message(), "edited or corrupted")) << st.message();
    EXPECT_TRUE(contains(st.message(), manifest.string())) << st.message();
  }
  // A manifest written before the checksum existed still opens.
  nlohmann::json old = j;
  old.erase("manifest_xxh64");
  EXPECT_TRUE(open_with(old).ok());
  // A wrong piece checksum under a consistent manifest: verify finds it.
  nlohmann::json k = j;
  k["shards"][0]["pieces"][0]["xxh64"] = "0000000000000001";
  k["manifest_xxh64"] = hex64(manifest_content_xxh64(k));
  ASSERT_TRUE(open_with(k).ok());
  Result<Checkpoint> ck = Checkpoint::open(root());
  ASSERT_TRUE(ck.ok());
  const Status st = ck->verify();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_TRUE(contains(st.message(), "piece 'w' xxh64 is")) << st.message();
  std::ofstream(manifest, std::ios::trunc) << good;
  EXPECT_TRUE(Checkpoint::open(root())->verify().ok());
}

// ---- failing writes ----

// A disk that fails while `err` is set (a test's fault plan sets
// CheckpointerOptions::fault_errno for a whole run; this one flips mid-run).
class FlakyDisk : public Env {
 public:
  int err = 0;
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override {
    if (err == 0) return posix_env().write_file(path, pieces);
    FaultEnv fault(posix_env(), err);
    return fault.write_file(path, pieces);
  }
};

TEST_F(CheckpointTest, FailedWriteIsReportedAndLatestIsKept) {
  FlakyDisk disk;
  CheckpointerOptions o = options();
  o.env = &disk;
  Checkpointer c(o);
  const Shape s{32, 8};
  Pieces p;
  p.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  ASSERT_EQ(save_now(c, 10, p).state, SaveState::kPublished);

  disk.err = EIO;
  PollResult r = save_now(c, 20, p);
  disk.err = 0;
  ASSERT_EQ(r.state, SaveState::kFailed);
  EXPECT_EQ(r.step, 20);
  EXPECT_EQ(r.error.code(), StatusCode::kIOError);
  const std::string& msg = r.error.message();
  EXPECT_TRUE(contains(msg, "checkpoint step 20: rank 0: "));
  EXPECT_TRUE(contains(msg, ".tmp-step-00000020/shard-00000.safetensors: write failed: "));
  EXPECT_TRUE(contains(msg, std::strerror(EIO)));
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000020"));
  EXPECT_FALSE(fs::exists(step_dir(20)));
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000010\n");
  Result<Checkpoint> ck = Checkpoint::open(root());
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(ck->step(), 10);
  EXPECT_TRUE(ck->verify().ok());

  // Training goes on: the next save publishes.
  EXPECT_EQ(save_now(c, 30, p).state, SaveState::kPublished);
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000030\n");
}

TEST_F(CheckpointTest, TheFaultErrnoOptionFailsEveryShardWrite) {
  CheckpointerOptions o = options();
  o.fault_errno = ENOSPC;
  Checkpointer c(o);
  const Shape s{8, 8};
  Pieces p;
  p.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  PollResult r = save_now(c, 10, p);
  ASSERT_EQ(r.state, SaveState::kFailed);
  EXPECT_TRUE(contains(r.error.message(), std::strerror(ENOSPC))) << r.error.message();
  EXPECT_FALSE(fs::exists(step_dir(10)));
}

TEST_F(CheckpointTest, FailureOnOneRankIsReportedOnEveryRank) {
  const Shape s{12, 4};
  FaultEnv full_disk(posix_env(), ENOSPC);
  run_ranks(3, [&](comm::Communicator& world) {
    const int r = world.rank();
    Checkpointer c(options(r == 1 ? static_cast<Env*>(&full_disk) : &posix_env()));
    Pieces p;
    p.add("w", rows(s, 4 * r, 4 * r + 4), tensor_data(s, 1));
    ASSERT_TRUE(c.save(world, 10, p.list, "{}").ok());
    Result<PollResult> res = c.poll(world, true);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_EQ(res->state, SaveState::kFailed);
    EXPECT_TRUE(contains(res->error.message(), "checkpoint step 10: rank 1: "));
    EXPECT_TRUE(contains(res->error.message(), "shard-00001.safetensors: write failed: No space left on device"));
  });
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000010"));
  EXPECT_FALSE(fs::exists(step_dir(10)));
  EXPECT_FALSE(fs::exists(dir_ / "latest"));
}

TEST_F(CheckpointTest, UnwritableFolderIsReported) {
  std::ofstream(dir_ / "a_file") << "x";
  CheckpointerOptions o = options();
  o.dir = (dir_ / "a_file" / "ckpt").string();
  Checkpointer c(o);
  Pieces p;
  p.add("w", TensorSlice::whole(Shape{2}), tensor_data(Shape{2}, 1));
  PollResult r = save_now(c, 10, p);
  EXPECT_EQ(r.state, SaveState::kFailed);
  EXPECT_TRUE(contains(r.error.message(), "rank 0: "));
  EXPECT_TRUE(contains(r.error.message(), "cannot create folder"));
}

TEST_F(CheckpointTest, BadPiecesFailTheSaveNotTheProcess) {
  Checkpointer c(options());
  const Shape s{4, 4};
  Pieces dup;
  dup.add("w", rows(s, 0, 2), tensor_data(s, 1));
  dup.add("w", rows(s, 2, 4), tensor_data(s, 1));
  PollResult r = save_now(c, 10, dup);
  EXPECT_EQ(r.state, SaveState::kFailed);
  EXPECT_EQ(r.error.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(r.error.message(), "two pieces named 'w'"));
  Pieces outside;
  outside.add("w", rows(s, 0, 2), tensor_data(s, 1));
  outside.list[0].slice.begin[0] = 3;
  r = save_now(c, 20, outside);
  EXPECT_EQ(r.state, SaveState::kFailed);
  EXPECT_TRUE(contains(r.error.message(), "piece 'w': block [3, 5) in dimension 0 lies outside view (4, 4)"));
  EXPECT_FALSE(fs::exists(dir_ / "latest"));
}

// ---- publishing, pruning, busy ----

TEST_F(CheckpointTest, PollNeverPublishesBeforeEveryRankIsDurable) {
  const Shape s{8, 8};
  GateEnv slow(/*open=*/false);  // rank 1's disk, stuck until rank 1 opens it
  run_ranks(2, [&](comm::Communicator& world) {
    const int r = world.rank();
    Checkpointer c(options(r == 1 ? static_cast<Env*>(&slow) : &posix_env()));
    Pieces p;
    p.add("w", rows(s, 4 * r, 4 * r + 4), tensor_data(s, 1));
    ASSERT_TRUE(c.save(world, 10, p.list, "{}").ok());
    for (int i = 0; i < 20; i++) {
      Result<PollResult> res = c.poll(world, false);
      ASSERT_TRUE(res.ok());
      EXPECT_EQ(res->state, SaveState::kPending) << "poll " << i;
      EXPECT_FALSE(fs::exists(step_dir(10)));
      EXPECT_FALSE(fs::exists(dir_ / "latest"));
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // rank 0's writer finishes meanwhile
    }
    if (r == 1) slow.set_open(true);
    Result<PollResult> res = c.poll(world, true);
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(res->state, SaveState::kPublished);
    EXPECT_EQ(res->stats.bytes_total, fs::file_size(step_dir(10) / "shard-00000.safetensors") +
                                          fs::file_size(step_dir(10) / "shard-00001.safetensors"));
  });
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000010\n");
}

TEST_F(CheckpointTest, KeepPrunesOldestOnlyAfterPublish) {
  GateEnv gate(/*open=*/true);
  CheckpointerOptions o = options(&gate);
  o.keep = 2;
  Checkpointer c(o);
  Pieces p;
  p.add("w", TensorSlice::whole(Shape{4}), tensor_data(Shape{4}, 1));
  ASSERT_EQ(save_now(c, 10, p).state, SaveState::kPublished);
  ASSERT_EQ(save_now(c, 20, p).state, SaveState::kPublished);
  fs::create_directories(dir_ / ".tmp-step-00000015");  // left by a crash
  gate.set_open(false);
  ASSERT_TRUE(*c.save(*world_, 30, p.list, "{}"));
  EXPECT_EQ(c.poll(*world_, false)->state, SaveState::kPending);
  EXPECT_TRUE(fs::exists(step_dir(10)));  // nothing pruned while the new one is unpublished
  EXPECT_TRUE(fs::exists(step_dir(20)));
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000020\n");
  gate.set_open(true);
  EXPECT_EQ(c.poll(*world_, true)->state, SaveState::kPublished);
  EXPECT_FALSE(fs::exists(step_dir(10)));
  EXPECT_TRUE(fs::exists(step_dir(20)));
  EXPECT_TRUE(fs::exists(step_dir(30)));
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000015"));
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000030\n");
}

TEST_F(CheckpointTest, OnBusySkipSkipsWhileASaveIsPending) {
  GateEnv gate(/*open=*/false);
  CheckpointerOptions o = options(&gate);
  o.on_busy = OnBusy::kSkip;
  Checkpointer c(o);
  Pieces p;
  p.add("w", TensorSlice::whole(Shape{4}), tensor_data(Shape{4}, 1));
  EXPECT_TRUE(*c.save(*world_, 10, p.list, "{}"));
  EXPECT_FALSE(*c.save(*world_, 20, p.list, "{}"));  // skipped: 10 is still being written
  EXPECT_TRUE(c.pending());
  gate.set_open(true);
  PollResult r = *c.poll(*world_, true);
  EXPECT_EQ(r.state, SaveState::kPublished);
  EXPECT_EQ(r.step, 10);
  EXPECT_FALSE(fs::exists(step_dir(20)));
  EXPECT_EQ(c.poll(*world_, true)->state, SaveState::kIdle);
}

TEST_F(CheckpointTest, OnBusyWaitFinishesThePreviousSaveFirst) {
  GateEnv gate(/*open=*/false);
  CheckpointerOptions o = options(&gate);
  o.on_busy = OnBusy::kWait;
  Checkpointer c(o);
  Pieces p;
  p.add("w", TensorSlice::whole(Shape{4}), tensor_data(Shape{4}, 1));
  EXPECT_TRUE(*c.save(*world_, 10, p.list, "{}"));
  // The gate stays shut 300 ms after the opener starts; the save below must
  // count at least 50 ms of it as stall even if this thread is descheduled
  // for a while before it calls save() (a loaded machine).
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gate.set_open(true);
  });
  EXPECT_TRUE(*c.save(*world_, 20, p.list, "{}"));  // blocks until 10 is published
  opener.join();
  PollResult first = *c.poll(*world_, true);
  EXPECT_EQ(first.state, SaveState::kPublished);
  EXPECT_EQ(first.step, 10);
  PollResult second = *c.poll(*world_, true);
  EXPECT_EQ(second.state, SaveState::kPublished);
  EXPECT_EQ(second.step, 20);
  EXPECT_GE(second.stats.stall_ms, 50.0);  // the wait is the stall
  EXPECT_TRUE(fs::exists(step_dir(10)));
  EXPECT_TRUE(fs::exists(step_dir(20)));
}

TEST_F(CheckpointTest, ResavingAPublishedStepReplacesIt) {
  Checkpointer c(options());
  const Shape s{3};
  Pieces first, second;
  first.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  second.add("w", TensorSlice::whole(s), tensor_data(s, 2));
  ASSERT_EQ(save_now(c, 10, first).state, SaveState::kPublished);
  ASSERT_EQ(save_now(c, 10, second).state, SaveState::kPublished);
  std::vector<float> out(3);
  ASSERT_TRUE(Checkpoint::open(root())->read("w", TensorSlice::whole(s), out).ok());
  EXPECT_EQ(out, tensor_data(s, 2));
  EXPECT_FALSE(fs::exists(dir_ / ".old-step-00000010"));
}

// Fails the write of `latest` (its .tmp file) with ENOSPC, after half of it
// is written; everything else goes to disk.
class FullAtLatestEnv : public Env {
 public:
  Status write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces) override {
    if (fail_ && path.ends_with("/latest.tmp")) return FaultEnv(posix_env(), ENOSPC).write_file(path, pieces);
    return posix_env().write_file(path, pieces);
  }
  bool fail_ = false;
};

// Issue #18 item 8: on ENOSPC exactly at `latest`, the new step folder was
// published but never pruned (nothing names it), keeping the disk full.
TEST_F(CheckpointTest, FullDiskAtLatestTakesTheNewStepFolderBack) {
  FullAtLatestEnv env;
  CheckpointerOptions o = options(&env);
  o.keep = 1;
  Checkpointer c(o);
  const Shape s{16, 4};
  Pieces p;
  p.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  ASSERT_EQ(save_now(c, 10, p).state, SaveState::kPublished);
  env.fail_ = true;
  PollResult r = save_now(c, 20, p);
  ASSERT_EQ(r.state, SaveState::kFailed);
  EXPECT_TRUE(contains(r.error.message(), "checkpoint step 20: "));
  EXPECT_TRUE(contains(r.error.message(), std::strerror(ENOSPC)));
  EXPECT_FALSE(fs::exists(step_dir(20)));
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-step-00000020"));
  EXPECT_FALSE(fs::exists(dir_ / "latest.tmp"));
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000010\n");
  EXPECT_TRUE(Checkpoint::open(root())->verify().ok());
  env.fail_ = false;
  EXPECT_EQ(save_now(c, 30, p).state, SaveState::kPublished);
  EXPECT_FALSE(fs::exists(step_dir(10)));  // keep = 1 prunes as before
  EXPECT_EQ(read_text(dir_ / "latest"), "step-00000030\n");
}

// Re-saving the step `latest` names, with the disk full at `latest`: the
// step folder it replaced is put back.
TEST_F(CheckpointTest, FullDiskAtLatestWhileResavingKeepsTheOldStep) {
  FullAtLatestEnv env;
  Checkpointer c(options(&env));
  const Shape s{3};
  Pieces first, second;
  first.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  second.add("w", TensorSlice::whole(s), tensor_data(s, 2));
  ASSERT_EQ(save_now(c, 10, first).state, SaveState::kPublished);
  env.fail_ = true;
  ASSERT_EQ(save_now(c, 10, second).state, SaveState::kFailed);
  EXPECT_FALSE(fs::exists(dir_ / ".old-step-00000010"));
  Result<Checkpoint> ck = Checkpoint::open(root());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_TRUE(ck->verify().ok());
  std::vector<float> out(3);
  ASSERT_TRUE(ck->read("w", TensorSlice::whole(s), out).ok());
  EXPECT_EQ(out, tensor_data(s, 1));
}

// ---- the folder lock (issue #18 item 4) ----

TEST_F(CheckpointTest, SecondLockIsRefusedNamingTheHolder) {
  Result<DirLock> first = DirLock::acquire(root(), "alpha", "node7");
  ASSERT_TRUE(first.ok()) << first.status().message();
  // flock locks belong to open file descriptions: a second open conflicts
  // even in this process, as another job's would.
  Result<DirLock> second = DirLock::acquire(root(), "beta", "node8");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  const std::string& msg = second.status().message();
  EXPECT_TRUE(contains(msg, root() + " is locked by job alpha on host node7 (pid " + std::to_string(::getpid())));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  // The refused one leaves the holder's line alone.
  EXPECT_TRUE(contains(read_text(dir_ / kLockFile), "\"job\":\"alpha\""));
}

TEST_F(CheckpointTest, ReleasedLockIsTakenWithoutATakeover) {
  { ASSERT_TRUE(DirLock::acquire(root(), "alpha", "node7").ok()); }
  EXPECT_EQ(read_text(dir_ / kLockFile), "");  // emptied on release
  std::string took_over = "unset";
  Result<DirLock> again = DirLock::acquire(root(), "beta", "node8", &took_over);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(took_over, "");
  EXPECT_TRUE(contains(read_text(dir_ / kLockFile), "\"job\":\"beta\""));
}

TEST_F(CheckpointTest, StaleLockOfADeadHolderIsTakenOver) {
  // What a holder killed with -9 leaves: its line, and no lock (the kernel
  // drops a flock with its last descriptor).
  std::ofstream(dir_ / kLockFile) << R"({"job":"alpha","host":"node7","pid":999999,"since":"2024-01-01 00:00:00"})"
                                  << "\n";
  std::string took_over;
  Result<DirLock> lock = DirLock::acquire(root(), "beta", "node8", &took_over);
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  EXPECT_EQ(took_over, "job alpha on host node7 (pid 999999, since 2024-01-01 00:00:00)");
  EXPECT_TRUE(contains(read_text(dir_ / kLockFile), "\"host\":\"node8\""));
}

TEST_F(CheckpointTest, LockInAFolderThatIsNotThereIsAnIOError) {
  Result<DirLock> lock = DirLock::acquire(root() + "/missing", "a", "h");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(contains(lock.status().message(), "/missing/LOCK: cannot open the lock file: "));
}

TEST_F(CheckpointTest, StagingBufferIsKeptBetweenSaves) {
  Checkpointer c(options());
  const Shape s{64, 64};
  Pieces p;
  p.add("w", TensorSlice::whole(s), tensor_data(s, 1));
  ASSERT_EQ(save_now(c, 10, p).state, SaveState::kPublished);
  const size_t staged = c.staging_bytes();
  EXPECT_EQ(staged, s.numel() * sizeof(float));
  Pieces smaller;
  smaller.add("w", rows(s, 0, 8), tensor_data(s, 1));
  ASSERT_EQ(save_now(c, 20, smaller).state, SaveState::kPublished);
  EXPECT_EQ(c.staging_bytes(), staged);
}

}  // namespace
}  // namespace tessera::ckpt
