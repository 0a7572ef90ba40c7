#include "plan/serve.h"

#include <algorithm>

#include <fmt/format.h>

namespace tessera::plan {

namespace {

// Bytes a weight takes in each tier: int8 with a scale a row (under 1%
// more, left out), int4 as Q4_0 blocks (18 bytes for 32 weights).
double bytes_per_weight(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16") return 2;
  if (dtype == "int8") return 1;
  return 18.0 / 32.0;
}

}  // namespace

Result<ServeEstimate> estimate_serving(const ModelSpec& model, const NodeType& node, const ServeJob& job,
                                       double price_per_device_hour) {
  const std::string& dt = job.dtype;
  if (dt != "fp32" && dt != "bf16" && dt != "int8" && dt != "int4")
    return Status::InvalidArgument(fmt::format("serving dtype '{}' (fp32, bf16, int8 or int4)", dt));
  if (node.kind == DeviceKind::kGpu && (dt == "int8" || dt == "int4"))
    return Status::InvalidArgument(
        fmt::format("{}: {} is a CPU tier of Tessera's; its GPU path serves fp32 and bf16", node.name, dt));
  if (job.batch < 1 || job.prompt < 1 || job.tokens < 1)
    return Status::InvalidArgument(fmt::format("serving: batch {}, prompt {} and tokens {} must each be 1 or more",
                                               job.batch, job.prompt, job.tokens));
  const DecoderConfig c = model.shape();
  const double matmul_params = c.flops_per_token(0) / 6.0;  // the head's V x C included
  const double width = static_cast<double>(c.heads) * c.hs();
  ServeEstimate e;
  e.weight_bytes = static_cast<double>(c.num_parameters()) * bytes_per_weight(dt);
  e.stream_bytes = matmul_params * bytes_per_weight(dt);
  e.kv_bytes_per_token = 2.0 * c.layers * c.kv() * c.hs() * 2;  // fp16 on the CPU, bf16 on GPUs
  e.cache_bytes = static_cast<double>(job.batch) * (job.prompt + job.tokens) * e.kv_bytes_per_token;
  e.memory = e.weight_bytes + e.cache_bytes;
  e.capacity = node.memory;
  e.fits = e.capacity <= 0 || e.memory <= e.capacity;
  if (!e.fits)
    e.refusal = fmt::format("{:.1f} GB of weights and {:.1f} GB of cache need more than the {:.1f} GB of one {}",
                            e.weight_bytes / 1e9, e.cache_bytes / 1e9, e.capacity / 1e9,
                            node.kind == DeviceKind::kGpu ? "GPU" : "node");
  if (node.read_bw > 0) {
    e.roof = node.read_bw;
    e.roof_source = "the profile's cpu.mem.read";
  } else {
    e.roof = node.mem_bw;
    const bool profiled = node.source.rfind("profile ", 0) == 0;
    e.roof_source = profiled ? "the profile's STREAM triad (it has no cpu.mem.read)" : "the datasheet's memory bandwidth";
  }
  // A decode step at the mean context: the weights once, each sequence's
  // cache; the products' arithmetic (2 per weight and sequence) and
  // attention's (4 x context x width a layer and sequence) at the peak.
  const double context = job.prompt + job.tokens / 2.0;
  e.cache_read_bytes = job.batch * context * e.kv_bytes_per_token;
  const double read = e.stream_bytes + e.cache_read_bytes;
  const std::string cdt = dt == "bf16" ? "bf16" : (dt == "fp32" ? "fp32" : "int8");
  const double peak = node.peak_of(cdt);
  const double flops = job.batch * (2.0 * matmul_params + 4.0 * c.layers * context * width);
  const double t_read = e.roof > 0 ? read / e.roof : 0, t_math = peak > 0 ? flops / peak : 0;
  e.compute_bound = t_math > t_read;
  e.decode_step = std::max(t_read, t_math);
  e.decode_tokens_per_s = e.decode_step > 0 ? job.batch / e.decode_step : 0;
  // One prompt: the products as one GEMM of prompt rows, causal attention's
  // 2 x prompt x width a layer and token.
  const double pflops = job.prompt * (2.0 * matmul_params + 2.0 * c.layers * job.prompt * width);
  const double prate = peak * node.gemm_efficiency(cdt, job.prompt, c.channels, c.channels);
  e.prefill_tokens_per_s = prate > 0 ? job.prompt / (pflops / prate) : 0;
  if (price_per_device_hour > 0 && e.decode_tokens_per_s > 0)
    e.usd_per_million = price_per_device_hour / 3600.0 / e.decode_tokens_per_s * 1e6;
  return e;
}

}  // namespace tessera::plan
