#include "train/checkpointing.h"

#include <algorithm>
#include <new>

#include <fmt/format.h>

#include "tensor/device_memory.h"

namespace tessera {

namespace {
const char* norm_name(Norm n) { return n == Norm::kRMSNorm ? "rmsnorm" : "layernorm"; }
const char* positions_name(Positions p) { return p == Positions::kRope ? "rope" : "learned"; }
const char* mlp_name(Mlp m) { return m == Mlp::kSwiGLU ? "swiglu" : "gelu"; }
const char* scaling_name(RopeScaling::Kind k) {
  return k == RopeScaling::Kind::kLinear ? "linear" : k == RopeScaling::Kind::kLlama3 ? "llama3" : "none";
}
}  // namespace

nlohmann::json model_config_json(const GPTConfig& c) {
  nlohmann::json j = {{"layers", c.layers}, {"heads", c.heads}, {"dim", c.channels}, {"vocab", c.vocab},
                      {"context", c.context}};
  if (c.gpt2()) return j;  // GPT-2's manifests stay as they were
  j["kv_heads"] = c.kv();
  j["head_dim"] = c.hs();
  j["mlp_hidden"] = c.ffn();
  j["norm"] = norm_name(c.norm);
  j["norm_eps"] = c.norm_eps;
  j["positions"] = positions_name(c.positions);
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = {{"type", scaling_name(c.rope_scaling.kind)},
                       {"factor", c.rope_scaling.factor},
                       {"low_freq_factor", c.rope_scaling.low_freq_factor},
                       {"high_freq_factor", c.rope_scaling.high_freq_factor},
                       {"original_context", c.rope_scaling.original_context}};
  j["mlp"] = mlp_name(c.mlp);
  j["qkv_bias"] = c.qkv_bias;
  j["bias"] = c.bias;
  j["tied_head"] = c.tied_head;
  return j;
}

Result<GPTConfig> model_config_from_json(const nlohmann::json& j) {
  GPTConfig c;
  try {
    c.layers = j.at("layers").get<int>();
    c.heads = j.at("heads").get<int>();
    c.channels = j.at("dim").get<int>();
    c.vocab = j.at("vocab").get<int>();
    c.context = j.at("context").get<int>();
    // Absent: GPT-2's (manifests written before the Llama family).
    c.kv_heads = j.value("kv_heads", 0);
    c.head_dim = j.value("head_dim", 0);
    c.mlp_hidden = j.value("mlp_hidden", 0);
    c.norm = j.value("norm", std::string("layernorm")) == "rmsnorm" ? Norm::kRMSNorm : Norm::kLayerNorm;
    c.norm_eps = j.value("norm_eps", 1e-5f);
    c.positions = j.value("positions", std::string("learned")) == "rope" ? Positions::kRope : Positions::kLearned;
    c.rope_theta = j.value("rope_theta", 10000.0);
    if (j.contains("rope_scaling")) {
      const nlohmann::json& r = j["rope_scaling"];
      const std::string type = r.value("type", std::string("none"));
      c.rope_scaling.kind = type == "linear"   ? RopeScaling::Kind::kLinear
                            : type == "llama3" ? RopeScaling::Kind::kLlama3
                                               : RopeScaling::Kind::kNone;
      c.rope_scaling.factor = r.value("factor", 1.0);
      c.rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
      c.rope_scaling.original_context = r.value("original_context", 8192);
    }
    c.mlp = j.value("mlp", std::string("gelu")) == "swiglu" ? Mlp::kSwiGLU : Mlp::kGelu;
    c.qkv_bias = j.value("qkv_bias", true);
    c.bias = j.value("bias", true);
    c.tied_head = j.value("tied_head", true);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("the manifest's model config is incomplete: {}", e.what()));
  }
  RETURN_IF_ERROR(c.validate());
  return c;
}

namespace {

// Float range [begin, end) of tensor id in the flat arena.
std::pair<int64_t, int64_t> flat_range(const Arena& a, int id) {
  const int64_t begin = static_cast<int64_t>(a.offset(id) / sizeof(float));
  return {begin, begin + a.tensor(id).numel()};
}

// The part [a, b) of tensor id's flat range, as a slice of its global tensor.
TensorSlice sub_slice(const GPT& model, int id, int64_t a, int64_t b, int64_t begin, int64_t end) {
  TensorSlice t = param_slice(model.config(), model.shard(), id);
  if (a != begin || b != end) {
    t.flat_begin = a - begin;
    t.flat_end = b - begin;
  }
  return t;
}

}  // namespace

Result<std::vector<ckpt::SavePiece>> checkpoint_pieces(GPT& model, const ShardedAdamW& opt, int dp_rank, int zero,
                                                       CheckpointMirror* mirror) {
  std::vector<ckpt::SavePiece> pieces;
  const Arena* host_params = &model.params();
  ShardedAdamW::State st = opt.state();
  if (model.device() != Device::kCPU) {
    // Copy only what this rank saves (below): parameters on dp rank 0,
    // moments there or, with ZeRO, on every dp rank.
    CHECK(mirror != nullptr);
    if (!mirror->params.allocated()) {
      Result<Arena> host = model.params().try_clone_layout(Device::kCPU);
      if (!host.ok()) return host.status().With("the checkpoint's host copy of the parameters");
      mirror->params = std::move(host).value();
    }
    if (dp_rank == 0) RETURN_IF_ERROR(mirror->params.try_copy_from(model.params()).With("checkpoint: parameters"));
    const size_t n = static_cast<size_t>(st.hi - st.lo);
    try {
      mirror->m.resize(n);
      mirror->v.resize(n);
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted(fmt::format(
          "cannot allocate the checkpoint's {:.1f} MB host copy of the AdamW moments: out of memory",
          2.0 * static_cast<double>(n) * sizeof(float) / 1e6));
    }
    if (zero == 1 || dp_rank == 0) {
      RETURN_IF_ERROR(try_copy_to_host(model.device(), mirror->m.data(), st.m, n * sizeof(float))
                          .With("checkpoint: AdamW first moments"));
      RETURN_IF_ERROR(try_copy_to_host(model.device(), mirror->v.data(), st.v, n * sizeof(float))
                          .With("checkpoint: AdamW second moments"));
    }
    host_params = &mirror->params;
    st.m = mirror->m.data();
    st.v = mirror->v.data();
  }
  const Arena& arena = *host_params;
  for (int id = 0; id < kNumParams; id++) {
    const auto [begin, end] = flat_range(arena, id);
    if (begin == end || !model.counts_in_norm(id)) continue;  // absent, or another rank's copy
    const std::string name = param_name(id);
    if (dp_rank == 0)
      pieces.push_back({"param/" + name, param_slice(model.config(), model.shard(), id), arena.tensor(id).f32()});
    if (zero == 0 && dp_rank != 0) continue;
    const int64_t a = std::max(begin, st.lo), b = std::min(end, st.hi);
    if (a >= b) continue;
    const TensorSlice t = sub_slice(model, id, a, b, begin, end);
    pieces.push_back({"adam_m/" + name, t, st.m + (a - st.lo)});
    pieces.push_back({"adam_v/" + name, t, st.v + (a - st.lo)});
  }
  return pieces;
}

Result<ResumeState> load_checkpoint(const ckpt::Checkpoint& ck, GPT& model, ShardedAdamW& opt) {
  if (!ck.config().contains("model"))
    return Status::Corruption(fmt::format("{}: the manifest has no model config", ck.dir()));
  ASSIGN_OR_RETURN(GPTConfig saved, model_config_from_json(ck.config()["model"]));
  const GPTConfig& want = model.config();
  if (!(saved == want))
    return Status::InvalidArgument(fmt::format("{} holds a model {} but the config asks for {}", ck.dir(),
                                               saved.str(), want.str()));
  const Arena& arena = model.params();
  const ShardedAdamW::State st = opt.state();
  // Reads a block into n floats at dst on the model's device (through a
  // host buffer for a device).
  const Device device = model.device();
  std::vector<float> host;
  auto read = [&](const std::string& name, const TensorSlice& t, float* dst, int64_t n) -> Status {
    if (device == Device::kCPU) return ck.read(name, t, std::span<float>(dst, static_cast<size_t>(n)));
    host.resize(static_cast<size_t>(n));
    RETURN_IF_ERROR(ck.read(name, t, std::span<float>(host.data(), host.size())));
    RETURN_IF_ERROR(try_copy_to_device(device, dst, host.data(), host.size() * sizeof(float)));
    return Status::OK();
  };
  for (int id = 0; id < kNumParams; id++) {
    const auto [begin, end] = flat_range(arena, id);
    if (begin == end) continue;
    const std::string name = param_name(id);
    Tensor p = arena.tensor(id);
    RETURN_IF_ERROR(read("param/" + name, param_slice(want, model.shard(), id), p.f32(), p.numel()));
    const int64_t a = std::max(begin, st.lo), b = std::min(end, st.hi);
    if (a >= b) continue;
    const TensorSlice t = sub_slice(model, id, a, b, begin, end);
    RETURN_IF_ERROR(read("adam_m/" + name, t, st.m + (a - st.lo), b - a));
    RETURN_IF_ERROR(read("adam_v/" + name, t, st.v + (a - st.lo), b - a));
  }
  ASSIGN_OR_RETURN(std::string state, ck.state(0));
  ResumeState r;
  try {
    nlohmann::json j = nlohmann::json::parse(state);
    r.step = j.at("step").get<int64_t>();
    r.adam_t = j.at("adam_t").get<int>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("{}: rank 0's training state is unreadable: {}", ck.dir(), e.what()));
  }
  if (r.step != ck.step())
    return Status::Corruption(
        fmt::format("{}: the manifest says step {} but rank 0's state says {}", ck.dir(), ck.step(), r.step));
  opt.set_steps(r.adam_t);
  return r;
}

Result<std::unique_ptr<GPT>> load_whole_model(const ckpt::Checkpoint& ck) {
  if (!ck.config().contains("model"))
    return Status::Corruption(fmt::format("{}: the manifest has no model config", ck.dir()));
  ASSIGN_OR_RETURN(GPTConfig c, model_config_from_json(ck.config()["model"]));
  // Weights only: export and serving need no gradients.
  ASSIGN_OR_RETURN(std::unique_ptr<GPT> model, GPT::create(c, Backend::kCPU, ModelShard{}, nullptr, ModelUse::kInference));
  for (int id = 0; id < kNumParams; id++) {
    Tensor p = model->params().tensor(id);
    if (p.numel() == 0) continue;  // a tensor this configuration lacks
    RETURN_IF_ERROR(ck.read(std::string("param/") + param_name(id), param_slice(c, ModelShard{}, id),
                            std::span<float>(p.f32(), static_cast<size_t>(p.numel()))));
  }
  return model;
}

}  // namespace tessera
