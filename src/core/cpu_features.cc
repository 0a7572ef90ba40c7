#include "core/cpu_features.h"

#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tessera {

namespace {

// oneDNN's ISA masks (dnnl_cpu_isa_t): an ISA is allowed under a cap when
// its bits are a subset of the cap's.
constexpr uint32_t kIsaAvx2 = 0x7, kIsaAvx2Vnni = 0x407, kIsaAvx512Core = 0x27, kIsaAvx512Vnni = 0x67,
                   kIsaAvx512Bf16 = 0xe7, kIsaAmx = 0x3e7;

// The cap DNNL_MAX_CPU_ISA sets, as a mask; all bits when unset or unknown
// (oneDNN ignores a value it does not know, too).
uint32_t isa_cap(std::string* name) {
  // oneDNN reads ONEDNN_MAX_CPU_ISA first, then DNNL_MAX_CPU_ISA.
  const char* var = "ONEDNN_MAX_CPU_ISA";
  const char* v = std::getenv(var);
  if (v == nullptr) v = std::getenv(var = "DNNL_MAX_CPU_ISA");
  if (v == nullptr) return ~0u;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  struct Cap {
    const char* name;
    uint32_t mask;
  };
  static const Cap caps[] = {{"SSE41", 0x1},         {"AVX", 0x3},
                             {"AVX2", kIsaAvx2},      {"AVX2_VNNI", kIsaAvx2Vnni},
                             {"AVX512_CORE", kIsaAvx512Core}, {"AVX512_CORE_VNNI", kIsaAvx512Vnni},
                             {"AVX512_CORE_BF16", kIsaAvx512Bf16}, {"AVX512_CORE_AMX", kIsaAmx}};
  for (const Cap& c : caps)
    if (s == c.name) {
      *name = std::string(var) + "=" + v;
      return c.mask;
    }
  return ~0u;
}

bool allowed(uint32_t isa, uint32_t cap) { return (isa & ~cap) == 0; }

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (__get_cpuid(1, &a, &b, &c, &d)) f.fma = (c >> 12) & 1, f.f16c = (c >> 29) & 1;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512vl = f.avx512f && ((b >> 31) & 1);
    f.amx_bf16 = ((d >> 22) & 1) && ((d >> 24) & 1);
    f.amx_int8 = ((d >> 25) & 1) && ((d >> 24) & 1);
    f.avx512_vnni = f.avx512f && ((c >> 11) & 1);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = (a >> 5) & 1;
    f.avx_vnni = (a >> 4) & 1;
  }
  // The OS must also save the wide registers (XCR0): YMM state for AVX2,
  // opmask and ZMM state for AVX-512. AMX state is requested by oneDNN
  // itself, which runs every AMX kernel.
  uint64_t xcr0 = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) && ((c >> 27) & 1)) {  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  if ((xcr0 & 0x6) != 0x6) f.avx2 = f.fma = f.f16c = f.avx_vnni = false;
  if ((xcr0 & 0xe6) != 0xe6) f.avx512f = f.avx512vl = f.avx512_vnni = f.avx512_bf16 = false;
  // DNNL_MAX_CPU_ISA.
  const uint32_t cap = isa_cap(&f.cap);
  if (!allowed(kIsaAvx2, cap)) f.avx2 = f.fma = false;
  if (!allowed(kIsaAvx2Vnni, cap)) f.avx_vnni = false;
  if (!allowed(kIsaAvx512Core, cap)) f.avx512f = f.avx512vl = false;
  if (!allowed(kIsaAvx512Vnni, cap)) f.avx512_vnni = false;
  if (!allowed(kIsaAvx512Bf16, cap)) f.avx512_bf16 = false;
  if (!allowed(kIsaAmx, cap)) f.amx_bf16 = f.amx_int8 = false;
  char brand[49] = {};
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  f.brand = brand;
  while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  f.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  if (f.logical_cores <= 0) f.logical_cores = 1;
  return f;
}

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  add(avx512_vnni, "avx512_vnni");
  add(avx_vnni, "avx_vnni");
  add(amx_int8, "amx_int8");
  return s.empty() ? "baseline x86-64" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace tessera
