// Which kernel the CPU's INT8 matmul (cpu::matmul_int8_forward) runs, and
// whether its int32 products are exact on this CPU (docs/formats/int8.md,
// "Kernels"). Tessera's own kernels are exact on every x86-64 CPU;
// oneDNN's s8 x s8 matmul is exact only where its ISA has VNNI or AMX, so
// the automatic choice uses it only there.
//
// Thread safety: set_int8_kernel is meant for start-up (a flag, a test) and
// may race only with itself; the rest may be called from any thread.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera::cpu {

enum class Int8Kernel {
  kAuto,     // the fastest exact kernel for each call's row count
  kGeneric,  // plain loops: CPUs without AVX2 (Tessera's floor is AVX2; this keeps them correct)
  kAvx2,     // ours: vpmaddubsw on |x| and sign(x)*w (no pair sum can saturate)
  kVnni,     // ours: vpdpbusd (AVX512-VNNI, 256-bit)
  kOneDnn,   // oneDNN's matmul: exact with VNNI or AMX, wrong without
};

// Forces one kernel for every call (kAuto: back to the automatic choice).
// Refuses one this CPU cannot run; kOneDnn is allowed where it is inexact
// (so that tests and the self-check can show what it gets wrong).
Status set_int8_kernel(Int8Kernel k);
// "auto", "generic", "avx2", "vnni", "onednn".
Result<Int8Kernel> parse_int8_kernel(std::string_view name);

struct Int8KernelInfo {
  std::string small;    // the kernel of a decode step (one row)
  std::string large;    // the kernel of a prefill (many rows)
  std::string summary;  // one line for `tessera info`, doctor and serve's start-up log
  bool exact = false;   // false: this choice computes wrong products here
};
Int8KernelInfo int8_kernel_info();

// The 4-bit matmul (matmul_q4.cc) follows the same choice: kGeneric and
// kAvx2 as forced, kVnni for Q4_0 where the CPU has it (Q4_K's products
// take vpmaddubsw everywhere), and the best this CPU runs otherwise.
Int8Kernel forced_int8_kernel();
// "avx2 (vpmaddubsw, exact int32 block sums)" and the like, for the log.
std::string q4_kernel_summary();
// Whether this CPU's kernels run Q4_0 matrices faster in the interleaved
// layouts (q4::pack_x16): true with AVX2.
bool q4_prefers_x16();

}  // namespace tessera::cpu
