#include "train/config.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <variant>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "io/safetensors.h"  // io::read_file
#include "parallel/pipeline.h"

namespace tessera {

namespace {

struct Key {
  const char* name;  // "section.key"
  std::variant<int TrainConfig::*, float TrainConfig::*, std::string TrainConfig::*,
               std::function<int&(TrainConfig&)>, std::function<float&(TrainConfig&)>,
               std::function<std::string&(TrainConfig&)>, std::function<std::vector<int>&(TrainConfig&)>,
               std::function<bool&(TrainConfig&)>>
      field;
  const char* help;
  double min = -1e300;  // numeric bounds (inclusive)
  double max = 1e300;
};

template <typename T>
std::function<T&(TrainConfig&)> at(T& (*f)(TrainConfig&)) {
  return f;
}

static_assert(kMaxMicroBatches == 262144, "train.grad_accum's help names the bound");

// Keys of one model kind only (docs/dlrm.md): setting one for the other
// kind is an error naming both. Keys in neither list are shared.
const std::vector<std::string_view> kGptOnlyKeys = {
    "model.layers",     "model.heads",      "model.dim",         "model.vocab",     "model.context",
    "model.init_from",  "train.micro_batch", "train.seq",        "train.grad_accum", "train.min_lr",
    "train.warmup",     "train.grad_clip",  "train.dtype",       "train.device",    "train.eval_batches",
    "parallel.tp",      "parallel.pp",      "parallel.schedule", "parallel.stages", "parallel.zero",
    "parallel.bucket_mb", "model.arch", "model.kv_heads", "model.head_dim", "model.mlp_hidden", "model.norm",
    "model.norm_eps", "model.positions", "model.rope_theta", "model.rope_scaling", "model.rope_factor",
    "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_context", "model.mlp",
    "model.bias", "model.qkv_bias", "model.tied_head"};
const std::vector<std::string_view> kDlrmOnlyKeys = {
    "model.embedding_dim", "model.bottom",          "model.top",         "model.table_rows",
    "model.pooling",       "train.batch",           "train.table_lr",    "train.table_optimizer",
    "train.adagrad_eps",   "parallel.placement",    "data.val_rows",     "log.every"};

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"model.kind", &TrainConfig::model_kind,
       "\"gpt\" (a GPT language model) or \"dlrm\" (a recommendation model on click shards: docs/dlrm.md)"},
      {"model.layers", at<int>([](TrainConfig& c) -> int& { return c.model.layers; }), "transformer blocks (L)", 1},
      {"model.heads", at<int>([](TrainConfig& c) -> int& { return c.model.heads; }), "attention heads (NH)", 1},
      {"model.dim", at<int>([](TrainConfig& c) -> int& { return c.model.channels; }), "channels (C)", 1},
      {"model.vocab", at<int>([](TrainConfig& c) -> int& { return c.model.vocab; }),
       "vocabulary size (V); must match the tokenizer", 1},
      {"model.context", at<int>([](TrainConfig& c) -> int& { return c.model.context; }),
       "maximum sequence length (positions)", 1},
      {"model.arch", at<std::string>([](TrainConfig& c) -> std::string& { return c.model_keys.arch; }),
       "the decoder family whose defaults the keys below start from: \"gpt2\" (layernorm, learned positions, GELU, "
       "biases, tied head), \"llama\" (RMSNorm 1e-5, rotary 10000, SwiGLU, no biases, untied head) or \"qwen2\" "
       "(RMSNorm 1e-6, rotary 1e6, SwiGLU, qkv biases, tied head)"},
      {"model.kv_heads", at<int>([](TrainConfig& c) -> int& { return c.model.kv_heads; }),
       "key/value heads (grouped-query attention; divides model.heads; 0: model.heads)", 0},
      {"model.head_dim", at<int>([](TrainConfig& c) -> int& { return c.model.head_dim; }),
       "channels per head (0: model.dim / model.heads)", 0},
      {"model.mlp_hidden", at<int>([](TrainConfig& c) -> int& { return c.model.mlp_hidden; }),
       "the MLP's hidden width (0: 4 x model.dim)", 0},
      {"model.norm", at<std::string>([](TrainConfig& c) -> std::string& { return c.model_keys.norm; }),
       "\"layernorm\" or \"rmsnorm\" (empty: model.arch's)"},
      {"model.norm_eps", at<float>([](TrainConfig& c) -> float& { return c.model_keys.norm_eps; }),
       "the norm's epsilon (layernorm: 1e-5 only)", 0},
      {"model.positions", at<std::string>([](TrainConfig& c) -> std::string& { return c.model_keys.positions; }),
       "\"learned\" (GPT-2's table) or \"rope\" (rotary, Hugging Face's rotate_half layout); empty: model.arch's"},
      {"model.rope_theta", at<float>([](TrainConfig& c) -> float& { return c.model_keys.rope_theta; }),
       "the rotary base", 0},
      {"model.rope_scaling", at<std::string>([](TrainConfig& c) -> std::string& { return c.model_keys.rope_scaling; }),
       "\"none\", \"linear\" or \"llama3\" (with the rope_factor keys)"},
      {"model.rope_factor", at<float>([](TrainConfig& c) -> float& { return c.model_keys.rope_factor; }),
       "rope_scaling's factor", 1},
      {"model.rope_low_freq_factor",
       at<float>([](TrainConfig& c) -> float& { return c.model_keys.rope_low_freq_factor; }),
       "llama3 rope_scaling's low_freq_factor", 0},
      {"model.rope_high_freq_factor",
       at<float>([](TrainConfig& c) -> float& { return c.model_keys.rope_high_freq_factor; }),
       "llama3 rope_scaling's high_freq_factor", 0},
      {"model.rope_original_context",
       at<int>([](TrainConfig& c) -> int& { return c.model_keys.rope_original_context; }),
       "llama3 rope_scaling's original_max_position_embeddings", 1},
      {"model.mlp", at<std::string>([](TrainConfig& c) -> std::string& { return c.model_keys.mlp; }),
       "\"gelu\" (tanh GELU) or \"swiglu\" (gate, up, down); empty: model.arch's"},
      {"model.bias", std::function<bool&(TrainConfig&)>([](TrainConfig& c) -> bool& { return c.model_keys.bias; }),
       "biases on the attention output and the MLP (given: overrides model.arch)"},
      {"model.qkv_bias",
       std::function<bool&(TrainConfig&)>([](TrainConfig& c) -> bool& { return c.model_keys.qkv_bias; }),
       "biases on q, k and v (given: overrides model.arch)"},
      {"model.tied_head",
       std::function<bool&(TrainConfig&)>([](TrainConfig& c) -> bool& { return c.model_keys.tied_head; }),
       "the output layer is the token embedding; false: its own lm_head (given: overrides model.arch)"},
      {"model.init_from", &TrainConfig::init_from,
       "a Hugging Face model to start from (a folder or its model.safetensors: GPT-2, Llama, Mistral, Qwen2); its "
       "config.json replaces the model keys"},
      {"data.train", &TrainConfig::train_data, "training shards: a path or a glob"},
      {"data.val", &TrainConfig::val_data, "validation shards: a path or a glob"},
      {"train.micro_batch", &TrainConfig::micro_batch, "sequences per micro-step per rank (B)", 1},
      {"train.seq", &TrainConfig::seq, "tokens per sequence (T), at most model.context", 1},
      {"train.grad_accum", &TrainConfig::grad_accum, "micro-steps per optimizer step, at most 262144", 1,
       kMaxMicroBatches},
      {"train.steps", &TrainConfig::steps, "optimizer steps", 1},
      {"train.stop_at", &TrainConfig::stop_at,
       "stop after this step, with a checkpoint if checkpoint.every > 0, to --resume later (0: run all steps); at "
       "most train.steps",
       0},
      {"train.lr", at<float>([](TrainConfig& c) -> float& { return c.opt.lr; }), "peak learning rate", 0},
      {"train.min_lr", at<float>([](TrainConfig& c) -> float& { return c.opt.min_lr; }),
       "learning rate at the end of the cosine decay", 0},
      {"train.warmup", at<int>([](TrainConfig& c) -> int& { return c.opt.warmup; }),
       "linear warmup steps, at most train.steps", 0},
      {"train.weight_decay", at<float>([](TrainConfig& c) -> float& { return c.opt.weight_decay; }),
       "AdamW decoupled weight decay (2-D weights only)", 0},
      {"train.grad_clip", at<float>([](TrainConfig& c) -> float& { return c.opt.grad_clip; }),
       "maximum global gradient norm (0: no clipping)", 0},
      {"train.beta1", at<float>([](TrainConfig& c) -> float& { return c.opt.beta1; }), "AdamW beta1, in [0, 1)", 0},
      {"train.beta2", at<float>([](TrainConfig& c) -> float& { return c.opt.beta2; }), "AdamW beta2, in [0, 1)", 0},
      {"train.seed", &TrainConfig::seed, "seed for initialisation and data order", 0},
      {"train.dtype", &TrainConfig::dtype, "\"fp32\" or \"bf16\" (bf16 matmul inputs; fp32 master weights)"},
      {"train.device", &TrainConfig::device,
       "\"cpu\" or \"cuda\" (the model, optimizer and activations on the rank's GPU; data parallelism over NCCL, tp = pp = 1)"},
      {"train.eval_every", &TrainConfig::eval_every, "steps between validation passes (0: start and end only)", 0},
      {"train.eval_batches", &TrainConfig::eval_batches, "validation batches per pass", 1},
      {"parallel.dp", &TrainConfig::dp, "data-parallel ranks; dp x tp x pp must equal the ranks launched", 1},
      {"parallel.tp", &TrainConfig::tp, "tensor-parallel ranks (Megatron: heads, MLP and vocabulary split); divides model.heads", 1},
      {"parallel.pp", &TrainConfig::pp, "pipeline stages (layers split; micro-batches are train.grad_accum)", 1},
      {"parallel.schedule", &TrainConfig::schedule, "pipeline schedule: \"1f1b\" or \"gpipe\""},
      {"parallel.stages", &TrainConfig::stages,
       "layers per pipeline stage, comma-separated (\"5,7\"); empty: balanced"},
      {"parallel.zero", &TrainConfig::zero, "ZeRO stage: 0 (all-reduce) or 1 (sharded optimizer state)", 0},
      {"parallel.timeout", &TrainConfig::timeout_s,
       "seconds any collective, or start-up (MPI initialisation, the host exchange), may wait before the rank reports it and exits", 0.001},
      {"parallel.bucket_mb", &TrainConfig::bucket_mb, "gradient all-reduce bucket size in MB", 0.001},
      {"checkpoint.dir", &TrainConfig::checkpoint_dir,
       "where the final weights (and later checkpoints) go; created and checked for writing at start-up"},
      {"checkpoint.every", &TrainConfig::checkpoint_every,
       "steps between sharded checkpoints in checkpoint.dir/step-N (0: final weights only)", 0},
      {"checkpoint.keep", &TrainConfig::checkpoint_keep, "published checkpoints kept (the newest)", 1},
      {"checkpoint.on_busy", &TrainConfig::checkpoint_on_busy,
       "a save due while the previous one is still writing: \"wait\" for it or \"skip\" this one"},
      {"log.metrics", &TrainConfig::metrics, "JSON-lines metrics file (empty: none); opened at start-up"},
      {"log.metrics_port", &TrainConfig::metrics_port,
       "Prometheus GET /metrics on this port + the rank's local rank (0: off; --metrics-port sets it)", 0},
      {"log.metrics_host", &TrainConfig::metrics_host,
       "address the /metrics port binds (\"0.0.0.0\": every interface, for a Prometheus on another machine)"},
      {"log.trace", &TrainConfig::trace,
       "timeline trace folder: each rank writes trace-rank-N.json (Chrome trace events) there; empty: off (--trace sets it)"},
      {"log.link_gbps", &TrainConfig::link_gbps,
       "the inter-host link's speed in Gbit/s, which achieved bus bandwidth is compared with (0: the interface's "
       "speed from /sys/class/net, else unknown)",
       0},
      {"log.profile", &TrainConfig::profile,
       "doctor profile (tessera doctor --save) for MFU and GEMM efficiency; empty: $TESSERA_PROFILE, else MFU against the theoretical peak"},
      {"log.job", &TrainConfig::job, "the job label of every Prometheus series (empty: the config file's stem)"},
      // model.kind = "dlrm" (DlrmSettings; docs/dlrm.md).
      {"model.embedding_dim", at<int>([](TrainConfig& c) -> int& { return c.dlrm.embedding_dim; }),
       "dlrm: embedding dimension (D) of every table", 1},
      {"model.bottom", at<std::vector<int>>([](TrainConfig& c) -> std::vector<int>& { return c.dlrm.bottom; }),
       "dlrm: bottom MLP sizes, an array; the last must equal model.embedding_dim"},
      {"model.top", at<std::vector<int>>([](TrainConfig& c) -> std::vector<int>& { return c.dlrm.top; }),
       "dlrm: top MLP hidden sizes, an array (a final layer to one logit is added)"},
      {"model.table_rows", at<std::vector<int>>([](TrainConfig& c) -> std::vector<int>& { return c.dlrm.table_rows; }),
       "dlrm: rows of each table, an array: empty takes the hash sizes of data.train, one value is every table's; "
       "each at least its table's hash size"},
      {"model.pooling", at<std::string>([](TrainConfig& c) -> std::string& { return c.dlrm.pooling; }),
       "dlrm: how a bag of ids is pooled, \"sum\" or \"mean\""},
      {"data.val_rows", at<int>([](TrainConfig& c) -> int& { return c.dlrm.val_rows; }),
       "dlrm: held-out rows of data.val evaluated (exact AUC, log loss); 0: all", 0},
      {"train.batch", at<int>([](TrainConfig& c) -> int& { return c.dlrm.batch; }),
       "dlrm: samples per step (the global batch; rows in file order, wrapping at the end)", 1},
      {"train.table_lr", at<float>([](TrainConfig& c) -> float& { return c.dlrm.table_lr; }),
       "dlrm: learning rate of the tables' optimizer", 0},
      {"train.table_optimizer", at<std::string>([](TrainConfig& c) -> std::string& { return c.dlrm.table_optimizer; }),
       "dlrm: optimizer of the touched table rows, \"adagrad\" (row-wise) or \"sgd\""},
      {"train.adagrad_eps", at<float>([](TrainConfig& c) -> float& { return c.dlrm.adagrad_eps; }),
       "dlrm: row-wise Adagrad's epsilon", 0},
      {"parallel.placement", at<std::string>([](TrainConfig& c) -> std::string& { return c.dlrm.placement; }),
       "dlrm: tables over ranks, \"table\", \"row\" or \"auto\" (the planner); one rank holds every table"},
      {"log.every", at<int>([](TrainConfig& c) -> int& { return c.dlrm.log_every; }),
       "dlrm: steps between progress lines and metrics records (throughput over the interval)", 1},
  };
  return k;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); j++)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const Key* find_key(std::string_view name) {
  for (const Key& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

Status unknown_key(const std::string& where, std::string_view name) {
  const Key* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const Key& k : keys()) {
    size_t d = edit_distance(name, k.name);
    if (d < best_d) best_d = d, best = &k;
  }
  return Status::InvalidArgument(fmt::format("{}: unknown key '{}' (did you mean '{}'?)", where, name, best->name));
}

// One value, from TOML (node) or from --set text (parsed as TOML too).
Status assign(TrainConfig& c, const Key& k, const toml::node& v, const std::string& where) {
  auto type_error = [&](const char* want) {
    return Status::InvalidArgument(fmt::format("{}: '{}' must be {}", where, k.name, want));
  };
  auto check_min = [&](double x) -> Status {
    if (x < k.min) return Status::InvalidArgument(fmt::format("{}: '{}' must be >= {}, got {}", where, k.name, k.min, x));
    if (x > k.max) return Status::InvalidArgument(fmt::format("{}: '{}' must be <= {}, got {}", where, k.name, k.max, x));
    return Status::OK();
  };
  auto as_int = [&](int& dst) -> Status {
    auto x = v.value_exact<int64_t>();
    if (!x) return type_error("an integer");
    if (*x > INT32_MAX || *x < INT32_MIN) return type_error("a 32-bit integer");
    RETURN_IF_ERROR(check_min(static_cast<double>(*x)));
    dst = static_cast<int>(*x);
    return Status::OK();
  };
  auto as_float = [&](float& dst) -> Status {
    auto x = v.value<double>();  // integers are accepted for floats
    if (!x || v.is_string() || v.is_boolean()) return type_error("a number");
    RETURN_IF_ERROR(check_min(*x));
    dst = static_cast<float>(*x);
    return Status::OK();
  };
  return std::visit(
      [&](auto&& f) -> Status {
        using F = std::decay_t<decltype(f)>;
        if constexpr (std::is_same_v<F, int TrainConfig::*>) return as_int(c.*f);
        if constexpr (std::is_same_v<F, float TrainConfig::*>) return as_float(c.*f);
        if constexpr (std::is_same_v<F, std::function<int&(TrainConfig&)>>) return as_int(f(c));
        if constexpr (std::is_same_v<F, std::function<float&(TrainConfig&)>>) return as_float(f(c));
        if constexpr (std::is_same_v<F, std::string TrainConfig::*> ||
                      std::is_same_v<F, std::function<std::string&(TrainConfig&)>>) {
          auto s = v.value<std::string>();
          if (!s || !v.is_string()) return type_error("a string");
          if constexpr (std::is_same_v<F, std::string TrainConfig::*>) c.*f = *s;
          else f(c) = *s;
          return Status::OK();
        }
        if constexpr (std::is_same_v<F, std::function<bool&(TrainConfig&)>>) {
          auto b = v.value_exact<bool>();
          if (!b) return type_error("true or false");
          f(c) = *b;
          return Status::OK();
        }
        if constexpr (std::is_same_v<F, std::function<std::vector<int>&(TrainConfig&)>>) {
          const toml::array* a = v.as_array();
          if (!a) return type_error("an array of integers, e.g. [64, 16]");
          std::vector<int> out;
          for (const toml::node& e : *a) {
            auto x = e.value_exact<int64_t>();
            if (!x) return type_error("an array of integers, e.g. [64, 16]");
            if (*x < 1 || *x > INT32_MAX)
              return Status::InvalidArgument(
                  fmt::format("{}: '{}' must hold integers in [1, {}], got {}", where, k.name, INT32_MAX, *x));
            out.push_back(static_cast<int>(*x));
          }
          f(c) = std::move(out);
          return Status::OK();
        }
        return Status::Internal("unhandled key type");
      },
      k.field);
}

}  // namespace

std::string resolve_resume(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume != "auto") return resume;
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(checkpoint_dir) / "latest", ec) ? "latest" : "";
}

Result<std::vector<int>> parse_stage_counts(const std::string& s) {
  std::vector<int> out;
  if (s.empty()) return out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1000000)
      return Status::InvalidArgument(
          fmt::format("parallel.stages \"{}\": \"{}\" is not a positive layer count", s, item));
    out.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

namespace {

// model.kind = "dlrm": its keys' values (the shard-dependent checks, table
// sizes against the hash sizes, come when the trainer reads data.train).
Status validate_dlrm(const TrainConfig& c, const std::string& where) {
  auto bad = [&](std::string msg) { return Status::InvalidArgument(where + ": " + msg); };
  const DlrmSettings& d = c.dlrm;
  if (d.pooling != "sum" && d.pooling != "mean")
    return bad(fmt::format("model.pooling must be \"sum\" or \"mean\", got \"{}\"", d.pooling));
  if (d.bottom.empty()) return bad("model.bottom is empty; the bottom MLP needs at least one layer");
  if (d.bottom.back() != d.embedding_dim)
    return bad(fmt::format("model.bottom's last size ({}) must equal model.embedding_dim ({}): the bottom MLP's "
                           "output meets the embeddings in the interaction",
                           d.bottom.back(), d.embedding_dim));
  if (d.table_optimizer != "adagrad" && d.table_optimizer != "sgd")
    return bad(fmt::format("train.table_optimizer must be \"adagrad\" or \"sgd\", got \"{}\"", d.table_optimizer));
  if (d.placement != "table" && d.placement != "row" && d.placement != "auto")
    return bad(fmt::format("parallel.placement must be \"table\", \"row\" or \"auto\", got \"{}\"", d.placement));
  if (c.train_data.empty()) return bad("data.train is required (train.bin of tessera prepare --format criteo)");
  if (!(c.opt.beta1 >= 0.0f && c.opt.beta1 < 1.0f))
    return bad(fmt::format("train.beta1 must be in [0, 1), got {}", c.opt.beta1));
  if (!(c.opt.beta2 >= 0.0f && c.opt.beta2 < 1.0f))
    return bad(fmt::format("train.beta2 must be in [0, 1), got {}", c.opt.beta2));
  if (c.stop_at > c.steps)
    return bad(fmt::format("train.stop_at ({}) exceeds train.steps ({}); 0 runs all steps", c.stop_at, c.steps));
  if (c.checkpoint_dir.empty())
    return bad("checkpoint.dir is empty; it names the folder for the checkpoints");
  if (c.checkpoint_on_busy != "wait" && c.checkpoint_on_busy != "skip")
    return bad(fmt::format("checkpoint.on_busy must be \"wait\" or \"skip\", got \"{}\"", c.checkpoint_on_busy));
  if (c.metrics_port > 65535) return bad(fmt::format("log.metrics_port must be at most 65535, got {}", c.metrics_port));
  return Status::OK();
}

Status validate(const TrainConfig& c, const std::string& where) {
  auto bad = [&](std::string msg) { return Status::InvalidArgument(where + ": " + msg); };
  if (c.model_kind == "dlrm") return validate_dlrm(c, where);
  if (c.model_kind != "gpt")
    return bad(fmt::format("model.kind must be \"gpt\" or \"dlrm\", got \"{}\"", c.model_kind));
  if (c.init_from.empty()) RETURN_IF_ERROR(c.model.validate().With(where));
  if (c.dtype != "fp32" && c.dtype != "bf16") return bad(fmt::format("train.dtype must be \"fp32\" or \"bf16\", got \"{}\"", c.dtype));
  if (c.device != "cpu" && c.device != "cuda")
    return bad(fmt::format("train.device must be \"cpu\" or \"cuda\", got \"{}\"", c.device));
  if (c.init_from.empty() && c.seq > c.model.context)
    return bad(fmt::format("train.seq ({}) exceeds model.context ({})", c.seq, c.model.context));
  if (c.checkpoint_on_busy != "wait" && c.checkpoint_on_busy != "skip")
    return bad(fmt::format("checkpoint.on_busy must be \"wait\" or \"skip\", got \"{}\"", c.checkpoint_on_busy));
  if (c.schedule != "1f1b" && c.schedule != "gpipe")
    return bad(fmt::format("parallel.schedule must be \"1f1b\" or \"gpipe\", got \"{}\"", c.schedule));
  if (c.init_from.empty()) {
    ModelShard shard;
    shard.tp = c.tp;
    if (Status st = shard.validate(c.model); !st.ok()) return bad(st.message());
  }
  if (c.init_from.empty() && c.pp > c.model.layers)
    return bad(fmt::format("parallel.pp ({}) exceeds model.layers ({}): every stage needs a layer", c.pp,
                           c.model.layers));
  if (!c.stages.empty()) {
    auto counts = parse_stage_counts(c.stages);
    if (!counts.ok()) return bad(counts.status().message());
    if (c.init_from.empty()) {
      auto layers = stage_layer_counts(c.model.layers, c.pp, *counts);
      if (!layers.ok()) return bad(layers.status().message());
    }
  }
  if (c.zero != 0 && c.zero != 1) return bad(fmt::format("parallel.zero must be 0 or 1, got {}", c.zero));
  if (c.train_data.empty()) return bad("data.train is required");
  if (c.opt.min_lr > c.opt.lr) return bad("train.min_lr must not exceed train.lr");
  // Adam's moment decays: 1 would never forget, above 1 diverges.
  if (!(c.opt.beta1 >= 0.0f && c.opt.beta1 < 1.0f))
    return bad(fmt::format("train.beta1 must be in [0, 1), got {}", c.opt.beta1));
  if (!(c.opt.beta2 >= 0.0f && c.opt.beta2 < 1.0f))
    return bad(fmt::format("train.beta2 must be in [0, 1), got {}", c.opt.beta2));
  if (c.opt.warmup > c.steps)
    return bad(fmt::format("train.warmup ({}) exceeds train.steps ({}): the learning rate would never reach train.lr",
                           c.opt.warmup, c.steps));
  if (c.stop_at > c.steps)
    return bad(fmt::format("train.stop_at ({}) exceeds train.steps ({}); 0 runs all steps", c.stop_at, c.steps));
  if (c.checkpoint_dir.empty())
    return bad("checkpoint.dir is empty; it names the folder for the checkpoints and the final weights");
  if (c.metrics_port > 65535) return bad(fmt::format("log.metrics_port must be at most 65535, got {}", c.metrics_port));
  return Status::OK();
}

}  // namespace

namespace {

// model.arch's defaults, then the keys given, into c.model.
template <typename Given>
Status apply_model_keys(TrainConfig& c, const Given& is_given, const std::string& where) {
  const TrainConfig::ModelKeys& k = c.model_keys;
  auto bad = [&](std::string msg) { return Status::InvalidArgument(where + ": " + msg); };
  GPTConfig& m = c.model;
  if (k.arch == "llama" || k.arch == "qwen2") {
    const bool qwen = k.arch == "qwen2";
    m.norm = Norm::kRMSNorm;
    m.norm_eps = qwen ? 1e-6f : 1e-5f;
    m.positions = Positions::kRope;
    m.rope_theta = qwen ? 1e6 : 1e4;
    m.mlp = Mlp::kSwiGLU;
    m.bias = false;
    m.qkv_bias = qwen;
    m.tied_head = qwen;
  } else if (k.arch != "gpt2") {  // GPT-2's defaults are DecoderConfig's
    return bad(fmt::format("model.arch must be \"gpt2\", \"llama\" or \"qwen2\", got \"{}\"", k.arch));
  }
  if (!k.norm.empty()) {
    if (k.norm != "layernorm" && k.norm != "rmsnorm")
      return bad(fmt::format("model.norm must be \"layernorm\" or \"rmsnorm\", got \"{}\"", k.norm));
    m.norm = k.norm == "rmsnorm" ? Norm::kRMSNorm : Norm::kLayerNorm;
    if (!is_given("model.norm_eps")) m.norm_eps = 1e-5f;
  }
  if (is_given("model.norm_eps")) m.norm_eps = k.norm_eps;
  if (!k.positions.empty()) {
    if (k.positions != "learned" && k.positions != "rope")
      return bad(fmt::format("model.positions must be \"learned\" or \"rope\", got \"{}\"", k.positions));
    m.positions = k.positions == "rope" ? Positions::kRope : Positions::kLearned;
  }
  if (is_given("model.rope_theta")) m.rope_theta = k.rope_theta;
  if (!k.rope_scaling.empty()) {
    if (k.rope_scaling == "none") m.rope_scaling.kind = RopeScaling::Kind::kNone;
    else if (k.rope_scaling == "linear") m.rope_scaling.kind = RopeScaling::Kind::kLinear;
    else if (k.rope_scaling == "llama3") m.rope_scaling.kind = RopeScaling::Kind::kLlama3;
    else
      return bad(fmt::format("model.rope_scaling must be \"none\", \"linear\" or \"llama3\", got \"{}\"",
                             k.rope_scaling));
  }
  if (m.rope_scaling.kind != RopeScaling::Kind::kNone) {
    m.rope_scaling.factor = k.rope_factor;
    m.rope_scaling.low_freq_factor = k.rope_low_freq_factor;
    m.rope_scaling.high_freq_factor = k.rope_high_freq_factor;
    m.rope_scaling.original_context = k.rope_original_context;
  }
  if (!k.mlp.empty()) {
    if (k.mlp != "gelu" && k.mlp != "swiglu")
      return bad(fmt::format("model.mlp must be \"gelu\" or \"swiglu\", got \"{}\"", k.mlp));
    m.mlp = k.mlp == "swiglu" ? Mlp::kSwiGLU : Mlp::kGelu;
  }
  if (is_given("model.bias")) m.bias = k.bias;
  if (is_given("model.qkv_bias")) m.qkv_bias = k.qkv_bias;
  if (is_given("model.tied_head")) m.tied_head = k.tied_head;
  if (!c.init_from.empty()) return Status::OK();  // the folder's config.json decides
  // The two families Hugging Face folders hold (nn/hf_decoder.h).
  const bool gpt2_like = m.norm == Norm::kLayerNorm && m.positions == Positions::kLearned && m.mlp == Mlp::kGelu;
  const bool llama_like = m.norm == Norm::kRMSNorm && m.positions == Positions::kRope && m.mlp == Mlp::kSwiGLU;
  if (!gpt2_like && !llama_like)
    return bad("model.norm, model.positions and model.mlp are GPT-2's (layernorm, learned, gelu) or the Llama "
               "family's (rmsnorm, rope, swiglu): other mixes have no Hugging Face layout to export");
  if (gpt2_like && !m.gpt2())
    return bad("a GPT-2 model (layernorm, learned positions, gelu) keeps GPT-2's heads, widths, biases and tied "
               "head; model.arch = \"llama\" builds the other shapes");
  return Status::OK();
}

}  // namespace

Result<TrainConfig> load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig c;
  // Read through io::read_file: a FIFO or a folder is refused by name
  // instead of blocking the parser.
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, io::read_file(path));
  // Debian's toml++ is built with exceptions: parse errors throw.
  toml::table root;
  try {
    root = toml::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(fmt::format("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                                               e.description()));
  }
  // Where each key was set ("FILE:LINE" or "--set"), for the kind check.
  std::vector<std::pair<std::string, std::string>> given;
  for (auto&& [section, node] : root) {
    const toml::table* t = node.as_table();
    if (!t) return unknown_key(path, std::string(section.str()));
    for (auto&& [key, value] : *t) {
      std::string name = fmt::format("{}.{}", section.str(), key.str());
      const Key* k = find_key(name);
      if (!k) return unknown_key(path, name);
      std::string where = fmt::format("{}:{}", path, value.source().begin.line);
      RETURN_IF_ERROR(assign(c, *k, value, where));
      given.emplace_back(name, where);
    }
  }
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos)
      return Status::InvalidArgument(fmt::format("--set '{}': expected section.key=value", o));
    std::string name = o.substr(0, eq), text = o.substr(eq + 1);
    const Key* k = find_key(name);
    if (!k) return unknown_key("--set", name);
    // Parse the value as TOML; a bare word is taken as a string.
    toml::table v;
    try {
      v = toml::parse("v = " + text);
    } catch (const toml::parse_error&) {
      try {
        v = toml::parse("v = '" + text + "'");
      } catch (const toml::parse_error&) {
        return Status::InvalidArgument(fmt::format("--set '{}': cannot parse the value", o));
      }
    }
    RETURN_IF_ERROR(assign(c, *k, *v.get("v"), "--set"));
    given.emplace_back(name, "--set");
  }
  // A key of the other model kind is refused by name, so a GPT key in a
  // DLRM config (or the reverse) is not silently ignored.
  if (c.model_kind == "gpt" || c.model_kind == "dlrm") {
    const auto& foreign = c.model_kind == "dlrm" ? kGptOnlyKeys : kDlrmOnlyKeys;
    for (const auto& [name, where] : given)
      if (std::find(foreign.begin(), foreign.end(), name) != foreign.end())
        return Status::InvalidArgument(fmt::format("{}: '{}' is a key of model.kind = \"{}\", but this config's "
                                                   "model.kind is \"{}\"",
                                                   where, name, c.model_kind == "dlrm" ? "gpt" : "dlrm",
                                                   c.model_kind));
  }
  // DLRM's defaults for the shared AdamW keys (the DLRM reference's): a
  // constant 1e-3, beta2 0.999, no weight decay, unless the config sets them.
  if (c.model_kind == "dlrm") {
    auto is_given = [&](std::string_view name) {
      return std::any_of(given.begin(), given.end(), [&](const auto& g) { return g.first == name; });
    };
    if (!is_given("train.lr")) c.opt.lr = 1e-3f;
    if (!is_given("train.beta2")) c.opt.beta2 = 0.999f;
    if (!is_given("train.weight_decay")) c.opt.weight_decay = 0.0f;
  }
  if (c.model_kind == "gpt") {
    auto is_given = [&](std::string_view name) {
      return std::any_of(given.begin(), given.end(), [&](const auto& g) { return g.first == name; });
    };
    RETURN_IF_ERROR(apply_model_keys(c, is_given, path));
  }
  c.opt.steps = c.steps;
  if (c.job.empty()) c.job = std::filesystem::path(path).stem().string();
  RETURN_IF_ERROR(validate(c, path));
  return c;
}

std::vector<ConfigKeyDoc> config_key_docs() {
  TrainConfig defaults;
  std::vector<ConfigKeyDoc> out;
  for (const Key& k : keys()) {
    ConfigKeyDoc d{k.name, "", "", k.help};
    std::visit(
        [&](auto&& f) {
          using F = std::decay_t<decltype(f)>;
          if constexpr (std::is_same_v<F, int TrainConfig::*>) d.type = "int", d.default_value = std::to_string(defaults.*f);
          if constexpr (std::is_same_v<F, float TrainConfig::*>) d.type = "float", d.default_value = fmt::format("{}", defaults.*f);
          if constexpr (std::is_same_v<F, std::function<int&(TrainConfig&)>>) d.type = "int", d.default_value = std::to_string(f(defaults));
          if constexpr (std::is_same_v<F, std::function<float&(TrainConfig&)>>) d.type = "float", d.default_value = fmt::format("{}", f(defaults));
          if constexpr (std::is_same_v<F, std::string TrainConfig::*>) d.type = "string", d.default_value = "\"" + defaults.*f + "\"";
          if constexpr (std::is_same_v<F, std::function<std::string&(TrainConfig&)>>) d.type = "string", d.default_value = "\"" + f(defaults) + "\"";
          if constexpr (std::is_same_v<F, std::function<bool&(TrainConfig&)>>)
            d.type = "bool", d.default_value = f(defaults) ? "true" : "false";
          if constexpr (std::is_same_v<F, std::function<std::vector<int>&(TrainConfig&)>>) {
            d.type = "int array";
            d.default_value = "[";
            for (size_t i = 0; i < f(defaults).size(); i++) d.default_value += (i ? ", " : "") + std::to_string(f(defaults)[i]);
            d.default_value += "]";
          }
        },
        k.field);
    out.push_back(d);
  }
  return out;
}

}  // namespace tessera
