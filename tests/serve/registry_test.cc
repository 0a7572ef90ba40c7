// The model registry on disk (serve/registry.h) and the catalog that serves
// its promoted version (serve/registry_catalog.h): publish, list, promote,
// remove, leftovers of killed adds, corrupt and incomplete versions, and a
// hot promote through a real server in-process. The CLI and a real `tessera
// serve` under load are in tests/cli/registry.sh.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "nn/gpt.h"
#include "nn/gpt2_weights.h"
#include "obs/metrics.h"
#include "serve/engine.h"
#include "serve/registry.h"
#include "serve/registry_catalog.h"
#include "serve/server.h"
#include "aborting.h"

namespace tessera::serve {
namespace {

using testing_util::make_gpt;
namespace fs = std::filesystem;
using json = nlohmann::json;

class ModelRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("tessera_registry_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    auto reg = ModelRegistry::open(root_.string(), /*create_root=*/true);
    ASSERT_TRUE(reg.ok()) << reg.status().message();
    reg_ = std::make_unique<ModelRegistry>(std::move(*reg));
  }
  void TearDown() override { fs::remove_all(root_); }

  // A version of `name` holding a tiny model (fp32), seeded so versions differ.
  int add(const std::string& name, int seed = 1) {
    auto staged = reg_->stage(name);
    EXPECT_TRUE(staged.ok()) << staged.status().message();
    auto model = make_gpt(GPTConfig{1, 2, 32, 256, 32}, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference);
    model->init_weights(seed);
    EXPECT_TRUE(save_hf(*model, staged->dir() + "/" + kRegistryFp32File).ok());
    VersionManifest m;
    m.source = "test";
    m.dtypes = {"fp32"};
    auto v = reg_->publish(*staged, m);
    EXPECT_TRUE(v.ok()) << v.status().message();
    return v.ok() ? *v : 0;
  }
  std::vector<int> listed(const std::string& name) {
    std::vector<int> out;
    auto vs = reg_->versions(name);
    EXPECT_TRUE(vs.ok()) << vs.status().message();
    if (vs.ok())
      for (const VersionInfo& v : *vs)
        if (v.complete) out.push_back(v.version);
    return out;
  }
  static void flip_byte(const fs::path& p, uint64_t offset) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }

  fs::path root_;
  std::unique_ptr<ModelRegistry> reg_;
};

TEST_F(ModelRegistryTest, PublishListPromoteRemove) {
  EXPECT_EQ(add("tiny"), 1);
  EXPECT_EQ(add("tiny", 2), 2);
  EXPECT_EQ(listed("tiny"), (std::vector<int>{1, 2}));
  auto names = reg_->names();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"tiny"});

  auto m = reg_->manifest("tiny", 2);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->name, "tiny");
  EXPECT_EQ(m->version, 2);
  ASSERT_NE(m->file(kRegistryFp32File), nullptr);
  ASSERT_NE(m->file(kRegistryConfigFile), nullptr);
  EXPECT_EQ(m->file(kRegistryFp32File)->dtype, "fp32");
  EXPECT_TRUE(reg_->verify(*m).ok());

  auto none = reg_->promoted("tiny");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(reg_->promote("tiny", 2).ok());
  EXPECT_EQ(reg_->promoted("tiny")->value(), 2);

  const Status refused = reg_->remove("tiny", 2);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("promoted"), std::string::npos) << refused.message();
  ASSERT_TRUE(reg_->remove("tiny", 1).ok());
  EXPECT_EQ(listed("tiny"), std::vector<int>{2});
  // The number of a removed version is not reused while a later one exists.
  EXPECT_EQ(add("tiny"), 3);
}

TEST_F(ModelRegistryTest, UnknownNameAndVersionAreNotFound) {
  add("tiny");
  EXPECT_EQ(reg_->versions("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg_->manifest("tiny", 9).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg_->promote("tiny", 9).code(), StatusCode::kNotFound);
  EXPECT_EQ(reg_->remove("tiny", 9).code(), StatusCode::kNotFound);
  EXPECT_EQ(ModelRegistry::open((root_ / "missing").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(ModelRegistryTest, TempFolderOfAKilledAddIsNeverListedAndIsCleanedByTheNextAdd) {
  add("tiny");
  // What an add killed before its rename leaves: its pid is gone.
  const fs::path stale = root_ / "tiny" / ".tmp-2147483646-0";
  fs::create_directories(stale);
  std::ofstream(stale / kRegistryFp32File) << "half";
  EXPECT_EQ(listed("tiny"), std::vector<int>{1});
  EXPECT_EQ(add("tiny"), 2);
  EXPECT_FALSE(fs::exists(stale));
}

TEST_F(ModelRegistryTest, StagedVersionThatIsNotPublishedIsRemoved) {
  std::string dir;
  {
    auto staged = reg_->stage("tiny");
    ASSERT_TRUE(staged.ok());
    dir = staged->dir();
    EXPECT_TRUE(fs::is_directory(dir));
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(listed("tiny").empty());
}

TEST_F(ModelRegistryTest, CorruptByteIsRefusedNamingTheFile) {
  add("tiny");
  flip_byte(root_ / "tiny" / "1" / kRegistryFp32File, 200);
  auto m = reg_->manifest("tiny", 1);
  ASSERT_TRUE(m.ok());
  const Status st = reg_->verify(*m);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("tiny/1/model.safetensors: xxh64 is"), std::string::npos) << st.message();
  EXPECT_EQ(reg_->promote("tiny", 1).code(), StatusCode::kCorruption);
  // Only the files asked for are read.
  EXPECT_TRUE(reg_->verify(*m, {kRegistryConfigFile}).ok());
}

TEST_F(ModelRegistryTest, TruncatedAndMissingFilesAreRefused) {
  add("tiny");
  fs::resize_file(root_ / "tiny" / "1" / kRegistryFp32File, 100);
  auto m = reg_->manifest("tiny", 1);
  ASSERT_TRUE(m.ok());
  EXPECT_NE(reg_->verify(*m).message().find("truncated"), std::string::npos);
  fs::remove(root_ / "tiny" / "1" / kRegistryFp32File);
  const Status st = reg_->verify(*m);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("model.safetensors: missing"), std::string::npos) << st.message();
}

TEST_F(ModelRegistryTest, VersionWithoutManifestIsIncomplete) {
  add("tiny");
  fs::create_directories(root_ / "tiny" / "7");
  auto vs = reg_->versions("tiny");
  ASSERT_TRUE(vs.ok());
  ASSERT_EQ(vs->size(), 2u);
  EXPECT_FALSE((*vs)[1].complete);
  const Status st = reg_->manifest("tiny", 7).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("tiny/7: incomplete version (no manifest.json)"), std::string::npos) << st.message();
  // The next add goes past it.
  EXPECT_EQ(add("tiny"), 8);
}

TEST_F(ModelRegistryTest, EditedManifestIsRefused) {
  add("tiny");
  const fs::path p = root_ / "tiny" / "1" / kRegistryManifestFile;
  std::ifstream in(p);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find("\"source\": \"test\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 16, "\"source\": \"evil\"");
  std::ofstream(p) << text;
  const Status st = reg_->manifest("tiny", 1).status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("manifest.json: its contents hash to"), std::string::npos) << st.message();
}

TEST_F(ModelRegistryTest, NamesAndRefs) {
  EXPECT_TRUE(check_model_name("gpt2-small.v2_x").ok());
  for (const char* bad : {"", ".hidden", "a/b", "a:b", "-x", "a b"})
    EXPECT_EQ(check_model_name(bad).code(), StatusCode::kInvalidArgument) << bad;
  auto r = parse_model_ref("tiny:12");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->name, "tiny");
  EXPECT_EQ(r->version.value(), 12);
  EXPECT_FALSE(parse_model_ref("tiny")->version.has_value());
  for (const char* bad : {"tiny:", "tiny:0", "tiny:x", "tiny:01", ":3"})
    EXPECT_FALSE(parse_model_ref(bad).ok()) << bad;
  EXPECT_EQ(reg_->stage("../x").status().code(), StatusCode::kInvalidArgument);
}

// What `registry add` writes (write_version): the fp32 weights, the source
// folder's tokenizer files, the quantized tier asked for, and a manifest
// that publishes and verifies.
class WriteVersionTest : public ModelRegistryTest {
 protected:
  // A weights file in a folder with a tokenizer.json and a
  // generation_config.json beside it, as `add --from FILE` names one.
  std::string source_file() {
    const fs::path dir = root_.string() + "-src";
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << "{\"model\": {}}";
    std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": 1}";
    return (dir / "model.safetensors").string();
  }
  void TearDown() override {
    fs::remove_all(root_.string() + "-src");
    ModelRegistryTest::TearDown();
  }
  static std::unique_ptr<GPT> tiny_model() {
    auto m = make_gpt(GPTConfig{1, 2, 64, 256, 32}, Backend::kCPU, ModelShard{}, nullptr,
                                   ModelUse::kInference);
    m->init_weights(3);
    return m;
  }
};

TEST_F(WriteVersionTest, Fp32WithTheSourceFoldersTokenizerFiles) {
  auto model = tiny_model();
  auto staged = reg_->stage("tiny");
  ASSERT_TRUE(staged.ok()) << staged.status().message();
  std::vector<std::string> steps;
  const std::string from = source_file();
  auto man = write_version(*model, *staged, VersionSource{from, ""},
                           [&](const std::string& s) { steps.push_back(s); });
  ASSERT_TRUE(man.ok()) << man.status().message();
  EXPECT_EQ(steps, (std::vector<std::string>{"writing the fp32 weights", "quantizing", ""}));
  EXPECT_EQ(man->dtypes, std::vector<std::string>{"fp32"});
  EXPECT_EQ(man->source, fs::absolute(from).lexically_normal().string());
  EXPECT_EQ(man->model, (json{{"n_layer", 1}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"n_positions", 32}}));
  EXPECT_TRUE(fs::exists(fs::path(staged->dir()) / kRegistryFp32File));
  EXPECT_TRUE(fs::exists(fs::path(staged->dir()) / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(fs::path(staged->dir()) / "generation_config.json"));
  EXPECT_FALSE(fs::exists(fs::path(staged->dir()) / "tokenizer_config.json"));

  auto v = reg_->publish(*staged, *man);
  ASSERT_TRUE(v.ok()) << v.status().message();
  auto m = reg_->manifest("tiny", *v);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NE(m->file("tokenizer.json"), nullptr);
  EXPECT_EQ(m->source, man->source);
  EXPECT_TRUE(reg_->verify(*m).ok());
}

TEST_F(WriteVersionTest, Int8QuantizesTheModelAndWritesBothTiers) {
  auto model = tiny_model();
  auto staged = reg_->stage("tiny");
  ASSERT_TRUE(staged.ok());
  std::vector<std::string> steps;
  auto man = write_version(*model, *staged, VersionSource{source_file(), "int8"},
                           [&](const std::string& s) { steps.push_back(s); });
  ASSERT_TRUE(man.ok()) << man.status().message();
  EXPECT_EQ(steps, (std::vector<std::string>{"writing the fp32 weights", "quantizing", "writing the int8 weights"}));
  EXPECT_EQ(man->dtypes, (std::vector<std::string>{"fp32", "int8"}));
  EXPECT_TRUE(model->int8());
  EXPECT_TRUE(fs::exists(fs::path(staged->dir()) / kRegistryInt8File));
  ASSERT_TRUE(reg_->publish(*staged, *man).ok());
}

TEST_F(WriteVersionTest, Int4WritesTheGgufFile) {
  auto model = tiny_model();
  auto staged = reg_->stage("tiny");
  ASSERT_TRUE(staged.ok());
  auto man = write_version(*model, *staged, VersionSource{source_file(), "int4"});
  ASSERT_TRUE(man.ok()) << man.status().message();
  EXPECT_EQ(man->dtypes, (std::vector<std::string>{"fp32", "int4"}));
  EXPECT_TRUE(fs::exists(fs::path(staged->dir()) / kRegistryInt4File));
  EXPECT_FALSE(model->int8());
}

TEST_F(WriteVersionTest, TokenizerFileThatIsNoRegularFileIsRefused) {
  auto model = tiny_model();
  const std::string from = source_file();
  fs::create_directories(fs::path(from).parent_path() / "tokenizer_config.json");
  auto staged = reg_->stage("tiny");
  ASSERT_TRUE(staged.ok());
  auto man = write_version(*model, *staged, VersionSource{from, ""});
  ASSERT_FALSE(man.ok());
  EXPECT_NE(man.status().message().find("tokenizer_config.json"), std::string::npos) << man.status().message();
}

TEST(RegistryManifest, ModelFieldsNameTheShapeBeyondGpt2) {
  const GPTConfig gpt2{2, 4, 64, 300, 32};
  EXPECT_EQ(manifest_model_fields(gpt2),
            (json{{"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 300}, {"n_positions", 32}}));
  GPTConfig llama = gpt2;
  llama.norm = Norm::kRMSNorm;
  llama.positions = Positions::kRope;
  llama.mlp = Mlp::kSwiGLU;
  llama.kv_heads = 2;
  llama.bias = llama.qkv_bias = false;
  const json j = manifest_model_fields(llama);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["shape"], llama.str());
}

// A real server over a RegistryCatalog: requests keep succeeding while
// version 2 is promoted; later ones report it; version 1 is then unloaded.
TEST_F(ModelRegistryTest, HotPromoteSwapsTheServedVersion) {
  add("tiny", 1);
  add("tiny", 2);
  ASSERT_TRUE(reg_->promote("tiny", 1).ok());
  obs::Registry metrics;
  std::mutex log_mu;
  std::vector<std::string> log;
  RegistryCatalog::Options ro;
  ro.name = "tiny";
  ro.poll_s = 0.05;
  auto catalog = RegistryCatalog::open(
      *reg_, ro,
      [&metrics](const std::string& path, const std::string& id) -> Result<std::shared_ptr<ServedModel>> {
        ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, load_gpt2(path, nullptr, Backend::kCPU, ModelUse::kInference));
        auto served = std::make_shared<ServedModel>();
        served->id = id;
        served->owned_tokenizer = std::make_unique<data::ByteTokenizer>();
        served->tokenizer = served->owned_tokenizer.get();
        ASSIGN_OR_RETURN(served->owned_engine, Engine::create(std::move(model), EngineOptions{}, metrics));
        served->engine = served->owned_engine.get();
        return served;
      },
      [&](const std::string& line) {
        std::lock_guard<std::mutex> lock(log_mu);
        log.push_back(line);
      });
  ASSERT_TRUE(catalog.ok()) << catalog.status().message();
  EXPECT_EQ((*catalog)->current_version(), 1);

  ServerOptions so;
  so.port = 0;
  so.model_name = "tiny";
  Server server(so, metrics);
  ASSERT_TRUE(server.start(8).ok());
  server.set_models(*catalog);
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(30, 0);
  auto ask = [&](const std::string& model) {
    json body = {{"prompt", "ab"}, {"max_tokens", 4}, {"ignore_eos", true}};
    if (!model.empty()) body["model"] = model;
    return c.Post("/v1/completions", body.dump(), "application/json");
  };
  auto first = ask("tiny");
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(json::parse(first->body)["model"], "tiny:1");
  auto pinned = ask("tiny:2");
  ASSERT_TRUE(pinned);
  EXPECT_EQ(pinned->status, 404) << pinned->body;

  // Clients keep asking while version 2 is promoted.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::thread client([&] {
    httplib::Client cc("127.0.0.1", server.port());
    cc.set_read_timeout(30, 0);
    while (!stop) {
      auto r = cc.Post("/v1/completions", R"({"prompt":"xy","max_tokens":8,"ignore_eos":true})", "application/json");
      (r && r->status == 200 ? ok : bad)++;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(reg_->promote("tiny", 2).ok());
  for (int i = 0; i < 200 && (*catalog)->current_version() != 2; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*catalog)->current_version(), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  client.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(bad.load(), 0);

  auto later = ask("");
  ASSERT_TRUE(later);
  ASSERT_EQ(later->status, 200) << later->body;
  EXPECT_EQ(json::parse(later->body)["model"], "tiny:2");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json data = json::parse(models->body)["data"];
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0]["id"], "tiny");
  EXPECT_EQ(data[1]["id"], "tiny:2");

  // Version 1's last request ended: the watcher reports it unloaded.
  bool unloaded = false;
  for (int i = 0; i < 100 && !unloaded; i++) {
    {
      std::lock_guard<std::mutex> lock(log_mu);
      for (const std::string& line : log) unloaded = unloaded || line == "tiny:1 unloaded";
    }
    if (!unloaded) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(unloaded);
  EXPECT_TRUE(server.shutdown());
  server.wait();
}

// A corrupt version promoted while serving is refused in one log line
// naming the file; the current version keeps serving.
TEST_F(ModelRegistryTest, CorruptPromotedVersionIsRefusedWhileServing) {
  add("tiny", 1);
  add("tiny", 2);
  ASSERT_TRUE(reg_->promote("tiny", 1).ok());
  std::mutex log_mu;
  std::vector<std::string> log;
  obs::Registry metrics;
  RegistryCatalog::Options ro;
  ro.name = "tiny";
  ro.poll_s = 0.02;
  auto catalog = RegistryCatalog::open(
      *reg_, ro,
      [&metrics](const std::string& path, const std::string& id) -> Result<std::shared_ptr<ServedModel>> {
        ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, load_gpt2(path, nullptr, Backend::kCPU, ModelUse::kInference));
        auto served = std::make_shared<ServedModel>();
        served->id = id;
        served->owned_tokenizer = std::make_unique<data::ByteTokenizer>();
        served->tokenizer = served->owned_tokenizer.get();
        ASSIGN_OR_RETURN(served->owned_engine, Engine::create(std::move(model), EngineOptions{}, metrics));
        served->engine = served->owned_engine.get();
        return served;
      },
      [&](const std::string& line) {
        std::lock_guard<std::mutex> lock(log_mu);
        log.push_back(line);
      });
  ASSERT_TRUE(catalog.ok()) << catalog.status().message();
  flip_byte(root_ / "tiny" / "2" / kRegistryFp32File, 300);
  // promote() verifies and would refuse; write the pointer as a hand edit would.
  std::ofstream(root_ / "tiny" / kRegistryPromotedFile) << "2\n";
  bool refused = false;
  for (int i = 0; i < 100 && !refused; i++) {
    {
      std::lock_guard<std::mutex> lock(log_mu);
      for (const std::string& line : log)
        refused = refused || (line.find("cannot load tiny:2: ") != std::string::npos &&
                                 line.find("tiny/2/model.safetensors: xxh64 is") != std::string::npos);
    }
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(refused);
  EXPECT_EQ((*catalog)->current_version(), 1);
  EXPECT_TRUE((*catalog)->drain(5));
}

}  // namespace
}  // namespace tessera::serve
