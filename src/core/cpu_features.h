// What this CPU can do, detected once at run time with cpuid and XGETBV (the
// binary is built for generic x86-64 and must run anywhere).
//
// oneDNN's ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA caps these too (AVX2, AVX2_VNNI, AVX512_CORE,
// AVX512_CORE_VNNI, AVX512_CORE_BF16, AVX512_CORE_AMX; oneDNN's names, any
// case): a feature above the cap reads as absent, so that Tessera's own
// kernels and oneDNN's dispatch see the same machine and one variable
// emulates a lower CPU (the isa.avx2 ctest; docs/formats/int8.md).
#pragma once

#include <string>

namespace tessera {

struct CpuFeatures {
  std::string brand;        // "AMD EPYC ..." from cpuid's brand string
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  // fp16 <-> fp32 conversions (vcvtph2ps)
  bool avx512f = false;
  bool avx512vl = false;     // AVX-512 instructions on 128/256-bit registers
  bool avx512_bf16 = false;  // bf16 dot products (vdpbf16ps)
  bool amx_bf16 = false;     // AMX tiles with bf16
  bool avx512_vnni = false;  // int8 dot products, 512-bit (vpdpbusd)
  bool avx_vnni = false;     // int8 dot products, 256-bit VEX
  bool amx_int8 = false;     // AMX tiles with int8
  int logical_cores = 1;
  std::string cap;  // "DNNL_MAX_CPU_ISA=AVX2" when that capped the features; empty otherwise
  // True when bf16 matmuls run natively (AVX512-BF16 or AMX); elsewhere
  // Tessera computes them in fp32 and says so once.
  bool has_bf16_matmul() const { return avx512_bf16 || amx_bf16; }
  std::string summary() const;  // "avx2 fma avx512f avx512_bf16"
};

const CpuFeatures& cpu_features();

}  // namespace tessera
