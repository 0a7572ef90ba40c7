// Micro-benchmarks of the fast CPU kernels at GPT-2 124M training shapes
// (B=8, T=256, C=768, NH=12, Vp=50304), with bytes or FLOPs processed so
// Google Benchmark reports GB/s or FLOP/s. Run: build/release/bench/tessera_bench
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <immintrin.h>

#include <sys/mman.h>

#include <benchmark/benchmark.h>

#include "core/cpu_features.h"
#include "core/huge_pages.h"

#include "kernels/cpu/int8_kernel.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/q4.h"
#include "perf/cpu_checks.h"

namespace tessera {
namespace {

constexpr int kB = 8, kT = 256, kC = 768, kNH = 12;
constexpr int kN = kB * kT;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  for (float& x : v) x = d(rng);
  return v;
}

void BM_MatmulForward(benchmark::State& s) {
  const int OC = static_cast<int>(s.range(0));
  const auto prec = s.range(1) ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  auto x = random_vec(size_t{kN} * kC, 1), w = random_vec(static_cast<size_t>(OC) * kC, 2), b = random_vec(OC, 3);
  std::vector<float> out(size_t{kN} * OC);
  for (auto _ : s) cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), kN, kC, OC, prec);
  s.counters["FLOP/s"] = benchmark::Counter(2.0 * kN * kC * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulForward)->Args({768, 0})->Args({3072, 0})->Args({3072, 1})->Unit(benchmark::kMillisecond);

void BM_MatmulBackward(benchmark::State& s) {
  const int OC = static_cast<int>(s.range(0));
  const auto prec = s.range(1) ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  auto x = random_vec(size_t{kN} * kC, 1), w = random_vec(static_cast<size_t>(OC) * kC, 2), dy = random_vec(size_t{kN} * OC, 3);
  std::vector<float> dx(size_t{kN} * kC), dw(static_cast<size_t>(OC) * kC), db(OC);
  for (auto _ : s) cpu::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), kN, kC, OC, prec);
  s.counters["FLOP/s"] = benchmark::Counter(4.0 * kN * kC * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulBackward)->Args({3072, 0})->Args({3072, 1})->Unit(benchmark::kMillisecond);

// One linear layer's forward + backward at a given row count: a multiple of
// 64 runs exact-shape primitives, any other count the shared run-time-row
// ones (src/kernels/cpu/matmul.cc), so 256 against 255 rows compares the two.
void BM_MatmulRows(benchmark::State& s) {
  const int N = static_cast<int>(s.range(0)), OC = static_cast<int>(s.range(1));
  const auto prec = s.range(2) ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  auto x = random_vec(size_t(N) * kC, 1), w = random_vec(size_t(OC) * kC, 2), dy = random_vec(size_t(N) * OC, 3);
  std::vector<float> out(size_t(N) * OC), dx(size_t(N) * kC), dw(size_t(OC) * kC);
  for (auto _ : s) {
    cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, kC, OC, prec);
    cpu::matmul_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, kC, OC, prec);
  }
  s.counters["FLOP/s"] = benchmark::Counter(6.0 * N * kC * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulRows)
    ->ArgsProduct({{256, 255}, {3072, 50304}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// One forward GEMM at a training shape: M rows (tokens) times an (N, K)
// weight, fp32. scripts/plan-profile.sh records these as the profile's
// cpu.gemm.fp32.MxNxK figures for `tessera plan` (docs/planner.md).
void BM_MatmulShape(benchmark::State& s) {
  const int M = static_cast<int>(s.range(0)), N = static_cast<int>(s.range(1)), K = static_cast<int>(s.range(2));
  auto x = random_vec(size_t(M) * K, 1), w = random_vec(size_t(N) * K, 2);
  std::vector<float> out(size_t(M) * N);
  for (auto _ : s) cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, M, K, N, MatmulPrecision::kF32);
  s.counters["FLOP/s"] = benchmark::Counter(2.0 * M * N * K * s.iterations(), benchmark::Counter::kIsRate);
}
void matmul_shapes(benchmark::internal::Benchmark* b) {
  for (int C : {256, 512, 768})
    for (int M : {256, 1024})
      for (auto [N, K] : {std::pair{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}, {50304, C}}) b->Args({M, N, K});
}
BENCHMARK(BM_MatmulShape)->Apply(matmul_shapes)->Unit(benchmark::kMillisecond);

// The INT8 matmul at decode and prefill rows (N) for one GPT-2 weight shape
// (OC x C), per kernel (0 auto, 1 avx2, 2 vnni, 3 onednn; skipped where the
// CPU cannot run it), with the weight bytes read per second and int8 OP/s,
// next to the fp32 matmul of the same shape (kernel -1). The INT8 kernel
// choice (kOneDnnMinRows) and docs/performance.md read these.
void BM_MatmulInt8(benchmark::State& s) {
  const int N = static_cast<int>(s.range(0)), C = static_cast<int>(s.range(1)), OC = static_cast<int>(s.range(2));
  const int kernel = static_cast<int>(s.range(3));
  auto x = random_vec(size_t(N) * C, 1), w = random_vec(size_t(OC) * C, 2);
  std::vector<float> out(size_t(N) * OC);
  if (kernel < 0) {
    for (auto _ : s) cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC, MatmulPrecision::kF32);
    s.counters["weight_B/s"] = benchmark::Counter(4.0 * OC * C * s.iterations(), benchmark::Counter::kIsRate);
  } else {
    const cpu::Int8Kernel kinds[] = {cpu::Int8Kernel::kAuto, cpu::Int8Kernel::kAvx2, cpu::Int8Kernel::kVnni,
                                     cpu::Int8Kernel::kOneDnn};
    if (!cpu::set_int8_kernel(kinds[kernel]).ok()) {
      s.SkipWithError("this CPU cannot run that kernel");
      return;
    }
    std::vector<int8_t> wq(w.size());
    std::vector<float> ws(OC);
    cpu::quantize_weights_int8(wq.data(), ws.data(), w.data(), OC, C);
    for (auto _ : s) cpu::matmul_int8_forward(out.data(), x.data(), wq.data(), ws.data(), nullptr, N, C, OC);
    (void)cpu::set_int8_kernel(cpu::Int8Kernel::kAuto);
    s.counters["weight_B/s"] = benchmark::Counter(1.0 * OC * C * s.iterations(), benchmark::Counter::kIsRate);
  }
  s.counters["OP/s"] = benchmark::Counter(2.0 * N * C * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulInt8)
    ->ArgsProduct({{1, 4, 8, 16, 32, 128}, {768}, {2304, 50304}, {-1, 0, 1, 2, 3}})
    ->Args({1, 3072, 768, -1})->Args({1, 3072, 768, 1})->Args({1, 3072, 768, 2})->Args({1, 3072, 768, 3})
    ->Unit(benchmark::kMicrosecond);

// The fp32 matmul of a few rows (a decode step): oneDNN's (kernel 0)
// against Tessera's weight-streaming loops (kernel 1, cpu::matmul_f32_rows),
// with the weight bytes read per second; the model runs kernel 1 up to
// cpu::kFewRowsMax rows.
void BM_MatmulF32Rows(benchmark::State& s) {
  const int N = static_cast<int>(s.range(0)), C = static_cast<int>(s.range(1)), OC = static_cast<int>(s.range(2));
  auto x = random_vec(size_t(N) * C, 1), w = random_vec(size_t(OC) * C, 2);
  std::vector<float> out(size_t(N) * OC);
  if (s.range(3) == 0) {
    for (auto _ : s) cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC, MatmulPrecision::kF32);
  } else {
    for (auto _ : s) cpu::matmul_f32_rows(out.data(), x.data(), w.data(), nullptr, N, C, OC);
  }
  s.counters["weight_B/s"] = benchmark::Counter(4.0 * OC * C * s.iterations(), benchmark::Counter::kIsRate);
  s.counters["FLOP/s"] = benchmark::Counter(2.0 * N * C * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulF32Rows)
    ->ArgsProduct({{1, 2, 4, 8, 16, 32, 64}, {768}, {2304, 50304}, {0, 1}})
    ->Args({1, 3072, 768, 0})->Args({1, 3072, 768, 1})
    // TinyLlama-1.1B's one-row products: gate and up, down, the head.
    ->Args({1, 2048, 11264, 1})->Args({1, 5632, 2048, 1})->Args({1, 2048, 32000, 1})
    ->Unit(benchmark::kMicrosecond);

// The 4-bit matmul (kernels/q4.h) on the same shapes: type 0 = Q4_0, 1 =
// Q4_K; kernel 0 = auto, 1 = avx2 forced (Q4_0's vnni otherwise). The
// weight bytes are the blocks' (4.5 bits a weight).
void BM_MatmulQ4(benchmark::State& s) {
  const int N = static_cast<int>(s.range(0)), C = static_cast<int>(s.range(1)), OC = static_cast<int>(s.range(2));
  // range(3): 0 Q4_0, 1 Q4_K, 2 Q4_0 and 3 Q4_K interleaved by 16 rows (what
  // the model runs).
  const q4::Type t = s.range(3) % 2 == 1 ? q4::Type::kQ4_K : q4::Type::kQ4_0;
  if (s.range(4) == 1 && !cpu::set_int8_kernel(cpu::Int8Kernel::kAvx2).ok()) {
    s.SkipWithError("this CPU cannot run that kernel");
    return;
  }
  auto x = random_vec(size_t(N) * C, 1), w = random_vec(size_t(OC) * C, 2);
  std::vector<uint8_t> wq(OC * q4::row_bytes(t, C));
  q4::quantize_rows(t, wq.data(), w.data(), OC, C);
  q4::Type run = t;
  if (s.range(3) >= 2) {
    std::vector<uint8_t> packed(wq.size());
    q4::pack_x16(t, packed.data(), wq.data(), OC, C);
    wq = std::move(packed);
    run = q4::x16_of(t);
  }
  std::vector<float> out(size_t(N) * OC);
  for (auto _ : s) cpu::matmul_q4_forward(out.data(), x.data(), wq.data(), run, nullptr, N, C, OC);
  (void)cpu::set_int8_kernel(cpu::Int8Kernel::kAuto);
  s.counters["weight_B/s"] =
      benchmark::Counter(static_cast<double>(wq.size()) * s.iterations(), benchmark::Counter::kIsRate);
  s.counters["OP/s"] = benchmark::Counter(2.0 * N * C * OC * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulQ4)
    ->ArgsProduct({{1, 4, 8, 32, 128}, {768}, {2304, 50304}, {0, 1, 2, 3}, {0, 1}})
    ->Args({1, 2048, 11264, 2, 1})
    ->Args({1, 3072, 768, 0, 0})->Args({1, 3072, 768, 1, 0})
    ->Args({1, 2048, 11264, 2, 0})->Args({1, 5632, 2048, 2, 0})->Args({1, 2048, 32000, 2, 0})
    ->Args({1, 2048, 11264, 1, 0})->Args({1, 5632, 2048, 1, 0})->Args({1, 2048, 32000, 1, 0})
    ->Args({1, 2048, 11264, 3, 0})->Args({1, 5632, 2048, 3, 0})->Args({1, 2048, 32000, 3, 0})
    ->Args({1, 2048, 11264, 3, 1})->Args({1, 5632, 2048, 3, 1})
    ->Args({32, 2048, 11264, 1, 0})->Args({32, 2048, 11264, 2, 0})->Args({32, 2048, 11264, 3, 0})
    ->Args({32, 2048, 11264, 3, 1})->Args({128, 2048, 2048, 3, 0})->Args({128, 2048, 2048, 2, 0})
    ->Unit(benchmark::kMicrosecond);

// A decode step's matmul (N = range(3) rows: 1, or 8 sequences decoding
// together) with the weights coming from memory, as in a decode step (the
// rest of the model's weights have evicted them): each iteration takes the
// next of several copies of the weights (together over 256 MB). dtype 0 =
// fp32 (cpu::matmul_f32_rows), 1 = INT8 per-channel (matmul_int8_forward),
// 2 = Q4_0 and 3 = Q4_K interleaved by 16 rows (the model's int4 layouts). weight_B/s: the
// bytes of one copy read per second, to compare with the machine's read
// roof (tessera bench decode's read_gb_s; BM_ReadRoof below). of_roof: the
// median over iterations of the product's rate over the roof's, read
// (untimed) over another cold copy right after it: this host's bandwidth
// moves between ~30 and ~55 GB/s from one second to the next, so a roof
// taken apart from the products (BM_ReadRoof) can be in the other phase.
// One copy of an (OC, C) matrix's stored bytes in the layout of `dtype`
// (0 fp32, 1 INT8 per-channel with its scales, 2 Q4_0x16, 3 Q4_Kx16), and
// its product with N rows.
struct DecodeWeights {
  std::vector<uint8_t> one;
  std::vector<float> scales;
};
DecodeWeights decode_weights(int dtype, int C, int OC) {
  const auto w = random_vec(static_cast<size_t>(OC) * C, 2);
  DecodeWeights d;
  d.scales.resize(OC);
  if (dtype == 0) {
    d.one.resize(w.size() * 4);
    std::memcpy(d.one.data(), w.data(), d.one.size());
  } else if (dtype == 1) {
    d.one.resize(w.size());
    cpu::quantize_weights_int8(reinterpret_cast<int8_t*>(d.one.data()), d.scales.data(), w.data(), OC, C);
  } else {
    const q4::Type t = dtype == 2 ? q4::Type::kQ4_0 : q4::Type::kQ4_K;
    std::vector<uint8_t> rows(OC * q4::row_bytes(t, C));
    q4::quantize_rows(t, rows.data(), w.data(), OC, C);
    d.one.resize(rows.size());
    q4::pack_x16(t, d.one.data(), rows.data(), OC, C);
  }
  return d;
}
void decode_product(int dtype, float* out, const float* x, const uint8_t* w, const float* scales, int N, int C,
                    int OC) {
  if (dtype == 0) {
    cpu::matmul_f32_rows(out, x, reinterpret_cast<const float*>(w), nullptr, N, C, OC);
  } else if (dtype == 1) {
    cpu::matmul_int8_forward(out, x, reinterpret_cast<const int8_t*>(w), scales, nullptr, N, C, OC);
  } else {
    cpu::matmul_q4_forward(out, x, w, dtype == 2 ? q4::Type::kQ4_0x16 : q4::Type::kQ4_Kx16, nullptr, N, C, OC);
  }
}
double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void decode_product_bench(benchmark::State& s, bool cold) {
  const int dtype = static_cast<int>(s.range(0)), C = static_cast<int>(s.range(1)), OC = static_cast<int>(s.range(2));
  const int N = static_cast<int>(s.range(3));
  const auto x = random_vec(static_cast<size_t>(N) * C, 1);
  std::vector<float> out(static_cast<size_t>(N) * OC);
  const DecodeWeights dw = decode_weights(dtype, C, OC);
  const size_t bytes = dw.one.size();
  const int copies = cold ? static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / bytes + 1)) : 1;
  std::vector<uint8_t> all(bytes * copies);
  for (int c = 0; c < copies; c++) std::memcpy(all.data() + c * bytes, dw.one.data(), bytes);
  int copy = 0;
  std::vector<double> of_roof;
  for (auto _ : s) {
    const uint8_t* wc = all.data() + copy * bytes;
    const auto t0 = std::chrono::steady_clock::now();
    decode_product(dtype, out.data(), x.data(), wc, dw.scales.data(), N, C, OC);
    const double product_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!cold) continue;
    s.PauseTiming();
    // The copy half the ring away: cold, and not the next product's.
    const uint8_t* far = all.data() + ((copy + copies / 2) % copies) * bytes;
    const double roof = perf::read_gb_per_s_over({{far, bytes}}, 1);
    if (roof > 0 && product_s > 0) of_roof.push_back(static_cast<double>(bytes) / product_s / 1e9 / roof);
    s.ResumeTiming();
    copy = (copy + 1) % copies;
  }
  s.counters["weight_B/s"] = benchmark::Counter(static_cast<double>(bytes) * s.iterations(), benchmark::Counter::kIsRate);
  if (!of_roof.empty()) s.counters["of_roof"] = median_of(of_roof);
}
void BM_MatmulDecodeCold(benchmark::State& s) { decode_product_bench(s, true); }
// The same products with one copy of the weights, read again and again from
// the caches (GPT-2's matrices fit in L2 and L3 on the 2-core hosts): the
// kernel's own arithmetic rate, the most a cold product could reach
// however well it overlapped its reads.
void BM_MatmulDecodeHot(benchmark::State& s) { decode_product_bench(s, false); }
// One core's AVX2 FMA peak, the ceiling the many-row fp32 kernels are
// held to: 12 independent chains of vfmadd231ps (inline asm, so the
// compiler keeps them; the FMA latency of 2 pipes x 5 cycles wants 10).
// FMA/s: 8-lane FMA instructions a second (x 16 for FLOP/s). Skipped
// without AVX2 and FMA.
__attribute__((target("avx2,fma"), noinline)) void fma_chains(int64_t n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
         a10 = a0, a11 = a0;
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < n; i++) {
#define TESSERA_FMA(A) asm volatile("vfmadd231ps %1, %2, %0" : "+x"(A) : "x"(x), "x"(y))
    TESSERA_FMA(a0); TESSERA_FMA(a1); TESSERA_FMA(a2); TESSERA_FMA(a3); TESSERA_FMA(a4); TESSERA_FMA(a5);
    TESSERA_FMA(a6); TESSERA_FMA(a7); TESSERA_FMA(a8); TESSERA_FMA(a9); TESSERA_FMA(a10); TESSERA_FMA(a11);
#undef TESSERA_FMA
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  _mm256_storeu_ps(out, s);
}
void BM_FmaPeak(benchmark::State& s) {
  if (!cpu_features().avx2 || !cpu_features().fma) {
    s.SkipWithError("no AVX2 and FMA");
    return;
  }
  constexpr int64_t kSteps = 1 << 20;
  float out[8];
  for (auto _ : s) {
    fma_chains(kSteps, out);
    benchmark::DoNotOptimize(out);
  }
  s.counters["FMA/s"] = benchmark::Counter(12.0 * kSteps * static_cast<double>(s.iterations()),
                                           benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond);

// GPT-2's qkv, fc, fcproj and head; TinyLlama's gate and up, down and head;
// at 8 rows, GPT-2's fc and TinyLlama's gate and up; fp32 at 2, 4 and 8
// rows (matmul_f32_rows' many-row tiles).
BENCHMARK(BM_MatmulDecodeCold)
    ->ArgsProduct({{0, 1, 2}, {768}, {2304, 3072, 50304}, {1}})
    ->ArgsProduct({{0, 1, 2}, {3072}, {768}, {1}})
    ->ArgsProduct({{0, 1, 2, 3}, {2048}, {11264, 32000}, {1}})
    ->ArgsProduct({{0, 1, 2, 3}, {5632}, {2048}, {1}})
    ->ArgsProduct({{0, 1, 2}, {768}, {3072}, {8}})
    ->ArgsProduct({{0, 1, 2, 3}, {2048}, {11264}, {8}})
    ->ArgsProduct({{0}, {768}, {3072}, {2, 4}})
    ->ArgsProduct({{0}, {2048}, {11264}, {2, 4}})
    ->ArgsProduct({{0}, {5632}, {2048}, {2, 8}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulDecodeHot)
    ->ArgsProduct({{0, 1, 2, 3}, {768}, {2304, 3072}, {1}})
    ->ArgsProduct({{0, 1, 2, 3}, {3072}, {768}, {1}})
    ->Unit(benchmark::kMicrosecond);

// The cold products above from 4 KiB pages and from 2 MiB ones
// (collapse_to_huge_pages, what the inference tiers do with their weights),
// two rings of copies (each over 256 MB) taken in turn: huge_over_4k is the
// median over pairs of iterations of the huge copy's rate over the rate of
// the 4 KiB copy just before it, so both fall in the same second of a host
// whose bandwidth changes from one second to the next. The same for a plain
// read (dtype 4: perf::read_gb_per_s_over, the read roof). Skipped where
// the kernel gives no huge pages.
// TESSERA_HUGE_PAGES=0 as the CLI reads it (tools/fault_env.cc): the read
// roof (BM_ReadRoof) and the arenas in 4 KiB pages.
const bool kHugePagesFromEnv = [] {
  if (const char* v = std::getenv("TESSERA_HUGE_PAGES"); v != nullptr && std::strcmp(v, "0") == 0)
    set_huge_pages(false);
  return true;
}();

struct Mapping {
  void* p = MAP_FAILED;
  size_t n = 0;
  explicit Mapping(size_t bytes) : n(bytes) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~Mapping() {
    if (p != MAP_FAILED) munmap(p, n);
  }
  uint8_t* at(size_t off) const { return static_cast<uint8_t*>(p) + off; }
};
void BM_MatmulDecodeHuge(benchmark::State& s) {
  const int dtype = static_cast<int>(s.range(0)), C = static_cast<int>(s.range(1)), OC = static_cast<int>(s.range(2));
  const int N = 1;
  const auto x = random_vec(static_cast<size_t>(C), 1);
  std::vector<float> out(static_cast<size_t>(OC));
  const DecodeWeights dw = decode_weights(dtype == 4 ? 0 : dtype, C, OC);
  const size_t bytes = dw.one.size();
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / bytes + 1));
  const size_t huge = size_t{2} << 20, ring = bytes * copies;
  Mapping small(ring), big(ring + huge);
  if (small.p == MAP_FAILED || big.p == MAP_FAILED) {
    s.SkipWithError("cannot map the copies");
    return;
  }
  madvise(small.p, ring, MADV_NOHUGEPAGE);
  // The huge ring starts on a 2 MiB boundary, so all of it can be huge.
  const size_t skew = (huge - reinterpret_cast<uintptr_t>(big.p) % huge) % huge;
  uint8_t* hring = big.at(skew);
  for (int c = 0; c < copies; c++) {
    std::memcpy(small.at(c * bytes), dw.one.data(), bytes);
    std::memcpy(hring + c * bytes, dw.one.data(), bytes);
  }
  if (collapse_to_huge_pages(hring, static_cast<int64_t>(ring / huge * huge)) == 0) {
    s.SkipWithError("no huge pages here (a kernel older than 6.1, THP never, or TESSERA_HUGE_PAGES=0)");
    return;
  }
  int copy = 0;
  int64_t i = 0;
  double small_s = 0.0;
  std::vector<double> ratio;
  for (auto _ : s) {
    const bool from_huge = i % 2 == 1;
    const uint8_t* wc = (from_huge ? hring : small.at(0)) + copy * bytes;
    const auto t0 = std::chrono::steady_clock::now();
    if (dtype == 4)
      benchmark::DoNotOptimize(perf::read_gb_per_s_over({{wc, bytes}}, 1));
    else
      decode_product(dtype, out.data(), x.data(), wc, dw.scales.data(), N, C, OC);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!from_huge) {
      small_s = t;
    } else {
      if (t > 0) ratio.push_back(small_s / t);
      copy = (copy + 1) % copies;
    }
    i++;
  }
  s.counters["weight_B/s"] = benchmark::Counter(static_cast<double>(bytes) * s.iterations(), benchmark::Counter::kIsRate);
  s.counters["huge_over_4k"] = median_of(ratio);
}
// TinyLlama's gate and up (one row), each dtype, and the plain read.
BENCHMARK(BM_MatmulDecodeHuge)->ArgsProduct({{0, 1, 2, 3, 4}, {2048}, {11264}})->Unit(benchmark::kMicrosecond);

// The read roof the cold products above are held to (perf::read_gb_per_s,
// what bench decode and doctor report), in the same run: run it between
// them, as this machine's bandwidth moves from minute to minute.
void BM_ReadRoof(benchmark::State& s) {
  double gb = 0.0;
  for (auto _ : s) gb = perf::read_gb_per_s();
  s.counters["read_B/s"] = gb * 1e9;
}
BENCHMARK(BM_ReadRoof)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_Layernorm(benchmark::State& s) {
  auto x = random_vec(size_t{kN} * kC, 1), w = random_vec(kC, 2), b = random_vec(kC, 3);
  std::vector<float> out(size_t{kN} * kC), mean(kN), rstd(kN);
  for (auto _ : s) cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC);
  s.SetBytesProcessed(int64_t{s.iterations()} * 2 * kN * kC * 4);
}
BENCHMARK(BM_Layernorm)->Unit(benchmark::kMillisecond);

void BM_Gelu(benchmark::State& s) {
  const int64_t n = int64_t{kN} * 4 * kC;
  auto x = random_vec(n, 1);
  std::vector<float> out(n);
  for (auto _ : s) cpu::gelu_forward(out.data(), x.data(), n);
  s.SetBytesProcessed(s.iterations() * 2 * n * 4);
}
BENCHMARK(BM_Gelu)->Unit(benchmark::kMillisecond);

void BM_AttentionForward(benchmark::State& s) {
  auto qkv = random_vec(size_t{kN} * 3 * kC, 1);
  std::vector<float> out(size_t{kN} * kC), preatt(size_t{kB} * kNH * kT * kT), att(preatt.size());
  for (auto _ : s) cpu::attention_forward(out.data(), preatt.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  s.counters["FLOP/s"] =
      benchmark::Counter(4.0 * kB * kNH * kT * kT * (kC / kNH) * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMillisecond);

// One decode step's attention over a paged KV cache (ops.inc
// paged_attention_gqa_forward): one row, `keys` positions, every layer of
// a model in turn, as forward_tokens calls it. Shapes: 0 = GPT-2 124M (12
// layers, 12 heads of 64), 1 = TinyLlama 1.1B (22 layers, 32 query heads,
// 4 key/value heads of 64). Each iteration takes the next of several
// copies of the cache (together over 256 MB), so its blocks come from
// memory, as in a decode step where the weights' stream has evicted them
// since the last. KV_B/s: cache bytes read per second. Third argument:
// the cache's dtype, 0 fp32, 1 fp16 (paged_attention_gqa_f16_forward,
// the cache the decode benchmarks and llama.cpp use).
// BM_PagedAttentionDecodeHot: one layer's cache, the same copy every time
// (each thread's share at 160 keys: fp16 245 KB, within a 512 KB L2; fp32
// 490 KB, nearly all of it),
// so the arithmetic and the kernels' own overheads are what is timed, and
// the cold figure's excess over it is the wait for memory.
template <class T>
void paged_attention_decode(benchmark::State& s, bool hot) {
  const int keys = static_cast<int>(s.range(0));
  const bool llama = s.range(1) == 1;
  const int L = hot ? 1 : llama ? 22 : 12, NH = llama ? 32 : 12, KV = llama ? 4 : 12, hs = 64, bs = 16;
  const int blocks = (keys + bs - 1) / bs;
  const int64_t layer_floats = int64_t{blocks} * bs * KV * hs;
  const int64_t layer_bytes = layer_floats * static_cast<int64_t>(sizeof(T));
  const int copies = hot ? 1 : static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / (2 * L * layer_bytes) + 1));
  std::vector<T> kc(static_cast<size_t>(copies) * L * layer_floats), vc(kc.size());
  for (size_t i = 0; i < kc.size(); i++) {
    const float x = static_cast<float>(i % 97) * 0.01f - 0.5f;
    if constexpr (sizeof(T) == 2)
      kc[i] = vc[i] = q4::f32_to_fp16(x);
    else
      kc[i] = vc[i] = x;
  }
  const auto qkv = random_vec(static_cast<size_t>(NH + 2 * KV) * hs, 1);
  std::vector<float> out(static_cast<size_t>(NH) * hs);
  std::vector<int> table(blocks);
  for (int b = 0; b < blocks; b++) table[b] = b;
  const int seq = 0, pos = keys - 1;
  int copy = 0;
  for (auto _ : s) {
    for (int l = 0; l < L; l++) {
      const size_t at = (static_cast<size_t>(copy) * L + l) * layer_floats;
      if constexpr (sizeof(T) == 2)
        cpu::paged_attention_gqa_f16_forward(out.data(), qkv.data(), kc.data() + at, vc.data() + at, table.data(),
                                             &seq, &pos, 1, NH, KV, hs, bs, blocks);
      else
        cpu::paged_attention_gqa_forward(out.data(), qkv.data(), kc.data() + at, vc.data() + at, table.data(), &seq,
                                         &pos, 1, NH, KV, hs, bs, blocks);
    }
    copy = (copy + 1) % copies;
  }
  s.counters["KV_B/s"] = benchmark::Counter(2.0 * static_cast<double>(sizeof(T)) * L * keys * KV * hs *
                                                static_cast<double>(s.iterations()),
                                            benchmark::Counter::kIsRate);
}
void paged_attention_bench(benchmark::State& s, bool hot) {
  if (s.range(2) == 1)
    paged_attention_decode<uint16_t>(s, hot);
  else
    paged_attention_decode<float>(s, hot);
}
void BM_PagedAttentionDecode(benchmark::State& s) { paged_attention_bench(s, false); }
BENCHMARK(BM_PagedAttentionDecode)
    ->ArgsProduct({{16, 160, 512, 2048}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
void BM_PagedAttentionDecodeHot(benchmark::State& s) { paged_attention_bench(s, true); }
BENCHMARK(BM_PagedAttentionDecodeHot)->ArgsProduct({{16, 160, 512}, {0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

void BM_AdamW(benchmark::State& s) {
  const int64_t n = 124'000'000 / 8;  // an eighth of GPT-2 124M keeps memory modest
  auto p = random_vec(n, 1), g = random_vec(n, 2);
  std::vector<float> m(n), v(n);
  AdamWParams hp;
  hp.weight_decay = 0.1f;
  for (auto _ : s) cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp);
  s.SetBytesProcessed(s.iterations() * n * 4 * 7);  // read p g m v, write p m v
}
BENCHMARK(BM_AdamW)->Unit(benchmark::kMillisecond);

// The DLRM dot interaction at the 500M preset (configs/dlrm_500m.toml):
// B = 2048 samples of F = 27 features (the bottom MLP's output and 26
// pooled embeddings) of D = 64. Forward 2*P*D FLOPs a sample, backward 4*P*D.
constexpr int kDlrmB = 2048, kDlrmF = 27, kDlrmD = 64, kDlrmP = kDlrmF * (kDlrmF - 1) / 2;

void BM_DlrmInteractionForward(benchmark::State& s) {
  auto feat = random_vec(size_t{kDlrmB} * kDlrmF * kDlrmD, 1);
  std::vector<float> out(size_t{kDlrmB} * (kDlrmD + kDlrmP));
  for (auto _ : s) cpu::interaction_forward(out.data(), feat.data(), kDlrmB, kDlrmF, kDlrmD);
  s.counters["FLOP/s"] =
      benchmark::Counter(2.0 * kDlrmB * kDlrmP * kDlrmD * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DlrmInteractionForward)->Unit(benchmark::kMillisecond);

void BM_DlrmInteractionBackward(benchmark::State& s) {
  auto feat = random_vec(size_t{kDlrmB} * kDlrmF * kDlrmD, 1), dout = random_vec(size_t{kDlrmB} * (kDlrmD + kDlrmP), 2);
  std::vector<float> dfeat(feat.size());
  for (auto _ : s) cpu::interaction_backward(dfeat.data(), dout.data(), feat.data(), kDlrmB, kDlrmF, kDlrmD);
  s.counters["FLOP/s"] =
      benchmark::Counter(4.0 * kDlrmB * kDlrmP * kDlrmD * s.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DlrmInteractionBackward)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera
