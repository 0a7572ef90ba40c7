#include "perf/profile.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/json_guard.h"
#include "io/safetensors.h"  // io::write_file_atomic

namespace tessera::perf {

namespace {

using nlohmann::json;

json machine_to_json(const Profile& p) {
  const MachineInfo& m = p.machine;
  json j = {{"hostname", m.hostname},
            {"cpu_model", m.cpu_model},
            {"cores", m.cores},
            {"threads", m.threads},
            {"sockets", m.sockets},
            {"isa", m.isa},
            {"clock_ghz", m.clock_ghz},
            {"clock_source", m.clock_source},
            {"memory_bytes", m.memory_bytes},
            {"os", m.os},
            {"onednn", m.onednn},
            {"mpi", m.mpi},
            {"int8_kernel", m.int8_kernel},
            {"int8_exact", m.int8_exact},
            {"isa_cap", m.isa_cap},
            {"theoretical_peak_gflops", {{"fp32", m.peak.fp32}, {"bf16", m.peak.bf16}, {"int8", m.peak.int8}}}};
  if (m.device) {
    const DeviceInfo& d = *m.device;
    j["device"] = {{"name", d.name},     {"memory_bytes", d.memory_bytes},
                   {"driver", d.driver}, {"cuda", d.cuda},
                   {"nccl", d.nccl},     {"cudnn", d.cudnn.empty() ? json(nullptr) : json(d.cudnn)},
                   {"datasheet_bf16_tflops", d.datasheet_bf16_tflops}};
  } else {
    j["device"] = nullptr;
  }
  if (p.comm_ranks > 0) {
    j["comm_ranks"] = p.comm_ranks;
    j["comm_hosts"] = p.comm_hosts;
  }
  return j;
}

// Field readers: each error names the path of the field.
Status type_error(const std::string& path, const char* want) {
  return Status::InvalidArgument(fmt::format("{}: expected {}", path, want));
}

Result<const json*> field(const json& obj, const std::string& where, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::InvalidArgument(fmt::format("{}{}: missing", where, key));
  return &*it;
}

template <typename T>
Status read_field(const json& obj, const std::string& where, const char* key, T* out) {
  ASSIGN_OR_RETURN(const json* v, field(obj, where, key));
  const std::string path = where + key;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v->is_string()) return type_error(path, "a string");
    *out = v->get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v->is_boolean()) return type_error(path, "true or false");
    *out = v->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v->is_number_integer()) return type_error(path, "an integer");
    *out = v->get<T>();
  } else {
    if (!v->is_number()) return type_error(path, "a number");
    *out = v->get<double>();
    if (!std::isfinite(*out)) return type_error(path, "a finite number");
  }
  return Status::OK();
}

Status parse_machine(const json& j, Profile* p) {
  if (!j.is_object()) return type_error("machine", "an object");
  MachineInfo& m = p->machine;
  const std::string w = "machine.";
  RETURN_IF_ERROR(read_field(j, w, "hostname", &m.hostname));
  RETURN_IF_ERROR(read_field(j, w, "cpu_model", &m.cpu_model));
  RETURN_IF_ERROR(read_field(j, w, "cores", &m.cores));
  RETURN_IF_ERROR(read_field(j, w, "threads", &m.threads));
  RETURN_IF_ERROR(read_field(j, w, "sockets", &m.sockets));
  RETURN_IF_ERROR(read_field(j, w, "clock_ghz", &m.clock_ghz));
  RETURN_IF_ERROR(read_field(j, w, "memory_bytes", &m.memory_bytes));
  RETURN_IF_ERROR(read_field(j, w, "os", &m.os));
  RETURN_IF_ERROR(read_field(j, w, "onednn", &m.onednn));
  RETURN_IF_ERROR(read_field(j, w, "mpi", &m.mpi));
  if (j.contains("clock_source")) RETURN_IF_ERROR(read_field(j, w, "clock_source", &m.clock_source));
  // Profiles from before issue #27 have no INT8 kernel fields.
  if (j.contains("int8_kernel")) RETURN_IF_ERROR(read_field(j, w, "int8_kernel", &m.int8_kernel));
  if (j.contains("int8_exact")) RETURN_IF_ERROR(read_field(j, w, "int8_exact", &m.int8_exact));
  if (j.contains("isa_cap")) RETURN_IF_ERROR(read_field(j, w, "isa_cap", &m.isa_cap));
  ASSIGN_OR_RETURN(const json* isa, field(j, w, "isa"));
  if (!isa->is_array()) return type_error(w + "isa", "an array of strings");
  for (const json& s : *isa) {
    if (!s.is_string()) return type_error(w + "isa", "an array of strings");
    m.isa.push_back(s.get<std::string>());
  }
  // The capabilities the peak's basis is derived from, as detect_machine
  // set them (a saved profile has only the names).
  for (const std::string& f : m.isa) {
    m.caps.fma |= f == "fma";
    m.caps.avx2 |= f == "avx2";
    m.caps.avx512f |= f == "avx512f";
    m.caps.avx512_bf16 |= f == "avx512_bf16";
    m.caps.amx_bf16 |= f == "amx_bf16";
    m.caps.avx512_vnni |= f == "avx512_vnni";
    m.caps.avx_vnni |= f == "avx_vnni";
    m.caps.amx_int8 |= f == "amx_int8";
  }
  ASSIGN_OR_RETURN(const json* peak, field(j, w, "theoretical_peak_gflops"));
  if (!peak->is_object()) return type_error(w + "theoretical_peak_gflops", "an object");
  const std::string pw = w + "theoretical_peak_gflops.";
  RETURN_IF_ERROR(read_field(*peak, pw, "fp32", &m.peak.fp32));
  RETURN_IF_ERROR(read_field(*peak, pw, "bf16", &m.peak.bf16));
  RETURN_IF_ERROR(read_field(*peak, pw, "int8", &m.peak.int8));
  ASSIGN_OR_RETURN(const json* dev, field(j, w, "device"));
  if (!dev->is_null()) {
    if (!dev->is_object()) return type_error(w + "device", "null or an object");
    DeviceInfo d;
    const std::string dw = w + "device.";
    RETURN_IF_ERROR(read_field(*dev, dw, "name", &d.name));
    RETURN_IF_ERROR(read_field(*dev, dw, "memory_bytes", &d.memory_bytes));
    RETURN_IF_ERROR(read_field(*dev, dw, "driver", &d.driver));
    RETURN_IF_ERROR(read_field(*dev, dw, "cuda", &d.cuda));
    RETURN_IF_ERROR(read_field(*dev, dw, "nccl", &d.nccl));
    if (dev->contains("cudnn") && !(*dev)["cudnn"].is_null()) RETURN_IF_ERROR(read_field(*dev, dw, "cudnn", &d.cudnn));
    if (dev->contains("datasheet_bf16_tflops"))
      RETURN_IF_ERROR(read_field(*dev, dw, "datasheet_bf16_tflops", &d.datasheet_bf16_tflops));
    m.device = d;
  }
  if (j.contains("comm_ranks")) RETURN_IF_ERROR(read_field(j, w, "comm_ranks", &p->comm_ranks));
  if (j.contains("comm_hosts")) RETURN_IF_ERROR(read_field(j, w, "comm_hosts", &p->comm_hosts));
  return Status::OK();
}

// 45.0, 1320.4, 0.125: one decimal from 10 up, three significant digits below.
std::string value_text(double v) { return std::fabs(v) >= 10 ? fmt::format("{:.1f}", v) : fmt::format("{:.3g}", v); }

std::string pct(double fraction) {
  const double v = fraction * 100;
  return std::fabs(v) >= 10 || v == std::round(v) ? fmt::format("{:.0f}%", v) : fmt::format("{:.1f}%", v);
}

}  // namespace

const Figure* Profile::find(const std::string& name) const {
  for (const Figure& f : figures)
    if (f.name == name) return &f;
  return nullptr;
}

std::string profile_to_json(const Profile& p) {
  json figures = json::array();
  for (const Figure& f : p.figures)
    figures.push_back({{"name", f.name},
                       {"value", f.value},
                       {"unit", f.unit},
                       {"better", f.better == Better::kHigher ? "higher" : "lower"}});
  json j = {{"schema", kProfileSchema}, {"version", kProfileVersion}, {"created", p.created},
            {"tessera", p.tessera},     {"quick", p.quick},             {"machine", machine_to_json(p)},
            {"figures", figures}};
  return j.dump(2) + "\n";
}

Result<Profile> parse_profile(const std::string& text) {
  RETURN_IF_ERROR(io::check_json_nesting(text, io::JsonLimits{}));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("not JSON");
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  std::string schema;
  RETURN_IF_ERROR(read_field(j, "", "schema", &schema));
  if (schema != kProfileSchema)
    return Status::InvalidArgument(fmt::format("schema is '{}', not '{}'", schema, kProfileSchema));
  int version = 0;
  RETURN_IF_ERROR(read_field(j, "", "version", &version));
  if (version != kProfileVersion)
    return Status::InvalidArgument(
        fmt::format("profile version {} is not supported (this tessera reads version {})", version, kProfileVersion));
  Profile p;
  RETURN_IF_ERROR(read_field(j, "", "created", &p.created));
  RETURN_IF_ERROR(read_field(j, "", "tessera", &p.tessera));
  RETURN_IF_ERROR(read_field(j, "", "quick", &p.quick));
  ASSIGN_OR_RETURN(const json* machine, field(j, "", "machine"));
  RETURN_IF_ERROR(parse_machine(*machine, &p));
  ASSIGN_OR_RETURN(const json* figures, field(j, "", "figures"));
  if (!figures->is_array()) return type_error("figures", "an array");
  for (size_t i = 0; i < figures->size(); i++) {
    const json& fj = (*figures)[i];
    const std::string w = fmt::format("figures[{}].", i);
    if (!fj.is_object()) return type_error(fmt::format("figures[{}]", i), "an object");
    Figure f;
    std::string better;
    RETURN_IF_ERROR(read_field(fj, w, "name", &f.name));
    RETURN_IF_ERROR(read_field(fj, w, "value", &f.value));
    RETURN_IF_ERROR(read_field(fj, w, "unit", &f.unit));
    RETURN_IF_ERROR(read_field(fj, w, "better", &better));
    if (better != "higher" && better != "lower")
      return Status::InvalidArgument(fmt::format("{}better: '{}' is neither \"higher\" nor \"lower\"", w, better));
    f.better = better == "higher" ? Better::kHigher : Better::kLower;
    if (f.name.empty()) return Status::InvalidArgument(fmt::format("{}name: empty", w));
    if (p.find(f.name)) return Status::InvalidArgument(fmt::format("{}name: '{}' appears twice", w, f.name));
    p.figures.push_back(std::move(f));
  }
  return p;
}

Result<Profile> load_profile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound(fmt::format("{}: cannot read the profile", path));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::IOError(fmt::format("{}: cannot read the profile", path));
  Result<Profile> p = parse_profile(ss.str());
  if (!p.ok()) return Status::InvalidArgument(fmt::format("{}: not a tessera profile: {}", path, p.status().message()));
  return p;
}

Status save_profile(const Profile& p, const std::string& path) {
  const std::string text = profile_to_json(p);
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(text))};
  Status st = io::write_file_atomic(path, pieces);
  if (!st.ok()) return Status::IOError(fmt::format("{}: cannot write the profile: {}", path, st.message()));
  return Status::OK();
}

Result<double> parse_tolerance(const std::string& text) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  char* end = nullptr;
  const double v = t.empty() ? NAN : std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(v) || v < 0 || v >= 1000)
    return Status::InvalidArgument(
        fmt::format("--tolerance: bad value '{}' (a percentage from 0 to 1000, e.g. 10%)", text));
  return v / 100.0;
}

Comparison compare_figure(const Figure& current, const Figure* baseline, double tolerance) {
  Comparison c;
  c.name = current.name;
  c.unit = current.unit;
  c.value = current.value;
  if (!baseline) return c;
  c.baseline = baseline->value;
  c.change = baseline->value != 0 ? (current.value - baseline->value) / std::fabs(baseline->value) : 0;
  // How much worse than the baseline, as a fraction of it (> 0: worse).
  double worse = current.better == Better::kHigher ? -c.change : c.change;
  if (baseline->value == 0) {
    const bool is_worse = current.better == Better::kHigher ? current.value < 0 : current.value > 0;
    worse = is_worse ? INFINITY : 0;
  }
  c.verdict = worse > tolerance + 1e-12 ? Verdict::kRegressed : Verdict::kPass;
  return c;
}

std::vector<Comparison> compare_profiles(const Profile& current, const Profile& baseline, double tolerance) {
  std::vector<Comparison> out;
  for (const Figure& f : current.figures) out.push_back(compare_figure(f, baseline.find(f.name), tolerance));
  return out;
}

std::string regression_line(const Comparison& c, double tolerance) {
  return fmt::format("REGRESSED {}: {} {}, baseline {} ({}{}, tolerance {})", c.name, value_text(c.value), c.unit,
                     value_text(c.baseline), c.change > 0 ? "+" : "", pct(c.change), pct(tolerance));
}

PeakReference cpu_peak_reference(const std::optional<Profile>& profile, const MachineInfo& here,
                                 const std::string& dtype, int ranks_per_host) {
  const int share = std::max(ranks_per_host, 1);
  PeakReference r;
  const bool bf16 = dtype == "bf16";
  if (profile) {
    const TheoreticalPeak& t = profile->machine.peak;
    r.peak_gflops = (bf16 ? t.bf16 : t.fp32) / share;
    if (const Figure* g = profile->find(fmt::format("cpu.gemm.{}.peak", bf16 ? "bf16" : "fp32")))
      r.gemm_peak_gflops = g->value / share;
    r.source = "the profile's theoretical peak";
  }
  if (r.peak_gflops <= 0) {
    r.peak_gflops = (bf16 ? here.peak.bf16 : here.peak.fp32) / share;
    r.source = fmt::format("theoretical: {} cores x {:.0f} FLOP/cycle x {:.2f} GHz", here.cores,
                           bf16 ? flops_per_cycle(here.caps).bf16_per_cycle : flops_per_cycle(here.caps).fp32_per_cycle,
                           here.clock_ghz);
  }
  if (share > 1) r.source += fmt::format(", shared by {} ranks", share);
  return r;
}

PeakReference gpu_peak_reference(const std::optional<Profile>& profile, const std::string& device_name,
                                 double fallback_tflops) {
  PeakReference r;
  if (profile && profile->machine.device && profile->machine.device->datasheet_bf16_tflops > 0) {
    r.peak_gflops = profile->machine.device->datasheet_bf16_tflops * 1e3;
    r.source = "the profile's device datasheet peak";
  }
  if (profile)
    if (const Figure* g = profile->find("gpu.gemm.bf16.peak")) r.gemm_peak_gflops = g->value;
  if (r.peak_gflops <= 0) {
    const double tflops = gpu_datasheet_peak_tflops(device_name);
    r.peak_gflops = (tflops > 0 ? tflops : fallback_tflops) * 1e3;
    r.source = tflops > 0 ? "datasheet dense bf16 peak" : "stated peak (device not in the datasheet table)";
  }
  return r;
}

std::string profile_path(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TESSERA_PROFILE");
  return env ? env : "";
}

Result<std::optional<Profile>> find_profile(const std::string& flag) {
  const std::string path = profile_path(flag);
  if (path.empty()) return std::optional<Profile>();
  ASSIGN_OR_RETURN(Profile p, load_profile(path));
  return std::optional<Profile>(std::move(p));
}

}  // namespace tessera::perf
