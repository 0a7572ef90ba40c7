#include "perf/cpu_checks.h"

#include <fcntl.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/huge_pages.h"
#include "kernels/cpu/ops.h"

namespace tessera::perf {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<float> random_floats(int64_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

const char* gemm_dtype_name(GemmDtype d) {
  switch (d) {
    case GemmDtype::kFP32: return "fp32";
    case GemmDtype::kBF16: return "bf16";
    case GemmDtype::kINT8: return "int8";
  }
  return "?";
}

double gemm_gflops(const GemmShape& s, GemmDtype dtype, int iters) {
  const std::vector<float> a = random_floats(int64_t{s.M} * s.K, 1), w = random_floats(int64_t{s.N} * s.K, 2);
  std::vector<float> out(int64_t{s.M} * s.N);
  std::vector<int8_t> wq;
  std::vector<float> wscale;
  if (dtype == GemmDtype::kINT8) {
    wq.resize(w.size());
    wscale.resize(s.N);
    cpu::quantize_weights_int8(wq.data(), wscale.data(), w.data(), s.N, s.K);
  }
  auto run = [&] {
    if (dtype == GemmDtype::kINT8)
      cpu::matmul_int8_forward(out.data(), a.data(), wq.data(), wscale.data(), nullptr, s.M, s.K, s.N);
    else
      cpu::matmul_forward(out.data(), a.data(), w.data(), nullptr, s.M, s.K, s.N,
                          dtype == GemmDtype::kBF16 ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
  };
  // The untimed first run builds the primitive; the second sizes a sample:
  // small shapes repeat until a sample lasts ~10 ms, so that a preemption or
  // the timer's resolution does not decide the figure.
  run();
  auto t0 = Clock::now();
  run();
  const double once = std::max(seconds_since(t0), 1e-7);
  const int reps = static_cast<int>(std::clamp(0.01 / once, 1.0, 1000.0));
  double best = 0.0;
  for (int i = 0; i < iters; i++) {
    t0 = Clock::now();
    for (int r = 0; r < reps; r++) run();
    best = std::max(best, 2.0 * s.M * s.N * s.K * reps / seconds_since(t0) / 1e9);
  }
  return best;
}

double measure_matmul_gflops(int n, MatmulPrecision prec, int iters) {
  return gemm_gflops({n, n, n}, prec == MatmulPrecision::kBF16 ? GemmDtype::kBF16 : GemmDtype::kFP32, iters);
}

std::vector<GemmShape> doctor_gemm_shapes(bool quick) {
  std::vector<GemmShape> shapes;
  for (int n : {128, 256, 512, 1024, 2048}) shapes.push_back({n, n, n});
  if (!quick) shapes.push_back({4096, 4096, 4096});
  for (int m : {64, 256, 1024, 2048})
    for (auto [n, k] : {std::pair{768, 768}, std::pair{2304, 768}, std::pair{3072, 768}, std::pair{768, 3072}})
      shapes.push_back({m, n, k});
  return shapes;
}

std::string gemm_skip_reason(GemmDtype dtype) {
  const CpuFeatures& f = cpu_features();
  if (dtype == GemmDtype::kBF16 && !f.has_bf16_matmul())
    return "no AVX512-BF16 or AMX: bf16 matmuls run in fp32 here";
  if (dtype == GemmDtype::kINT8 && !(f.avx2 || f.avx512_vnni || f.avx_vnni || f.amx_int8))
    return "no AVX2 or VNNI: no int8 kernels";
  return "";
}

double triad_gb_per_s(int64_t n, int reps) {
  std::vector<float> a(n), b(n), c(n);
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  double best = 0.0;
  for (int rep = 0; rep < reps; rep++) {
    const auto t0 = Clock::now();
    const float s = 0.5f + rep;
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    best = std::max(best, 3.0 * n * sizeof(float) / seconds_since(t0) / 1e9);
  }
  return best;
}

namespace {

// XOR of the whole 64-bit words of [p, p + bytes), read as `streams`
// contiguous parts walked together, a 64-byte line of each a step. One
// stream a thread is not the roof everywhere: on a 2-core Zen 3 (AVX2)
// the plain XOR loop read 28-31 GB/s while 4-8 parts a thread read 34-50
// GB/s in the same minutes (one thread: 16 against 26), and the fp32 decode
// kernel, which walks several weight rows at once, streamed 32-37 GB/s
// against the single stream's 25-29. The roof is the best of the ways
// (kRoofStreams), so it bounds the kernels whatever their walk.
__attribute__((target("avx2"))) uint64_t xor_streams_avx2(const uint8_t* p, int64_t bytes, int streams) {
  const int64_t part = bytes / streams / 64 * 64;
  __m256i acc[8];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  for (int64_t o = 0; o < part; o += 64)
    for (int s = 0; s < streams; s++) {
      const uint8_t* q = p + s * part + o;
      acc[s] = _mm256_xor_si256(acc[s], _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32))));
    }
  __m256i x = acc[0];
  for (int s = 1; s < 8; s++) x = _mm256_xor_si256(x, acc[s]);
  uint64_t out = static_cast<uint64_t>(_mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^
                                       _mm256_extract_epi64(x, 2) ^ _mm256_extract_epi64(x, 3));
  for (int64_t o = part * streams; o + 8 <= bytes; o += 8) {  // what the parts left
    uint64_t w;
    std::memcpy(&w, p + o, 8);
    out ^= w;
  }
  return out;
}

uint64_t xor_words(const uint8_t* p, int64_t bytes, int streams) {
  static const bool avx2 = cpu_features().avx2;
  if (avx2 && streams > 1) return xor_streams_avx2(p, bytes, std::min(streams, 8));
  uint64_t x = 0;
  const int64_t n = bytes / 8;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  for (int64_t i = 0; i < n; i++) x ^= w[i];
  return x;
}

// The ways a repetition reads, in turn: 8, 1 and 4 parts a thread.
constexpr int kRoofStreams[] = {8, 1, 4};

// This thread's share of n 64-bit words, in 64-byte lines: [begin, end).
std::pair<int64_t, int64_t> thread_share(int64_t n) {
  const int t = omp_get_thread_num(), T = omp_get_num_threads();
  const int64_t lines = (n + 7) / 8;
  return {std::min(n, lines * t / T * 8), std::min(n, lines * (t + 1) / T * 8)};
}

}  // namespace

double read_gb_per_s(int64_t n, int reps) {
  // In 2 MiB pages, as the weights a decode step streams are
  // (core/huge_pages.h; TESSERA_HUGE_PAGES=0: 4 KiB, as they then are):
  // advised before the first touch, so the pages are huge from the start.
  const size_t bytes = static_cast<size_t>(n) * sizeof(uint64_t);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0.0;
  madvise(mem, bytes, huge_pages_wanted() ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  uint64_t* a = static_cast<uint64_t*>(mem);
  // First touch by the threads that read, in the shares they read, so pages
  // sit near them.
#pragma omp parallel
  {
    const auto [begin, end] = thread_share(n);
    for (int64_t i = begin; i < end; i++) a[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  }
  double best = 0.0;
  volatile uint64_t sink = 0;
  for (int rep = 0; rep < reps; rep++) {
    const int streams = kRoofStreams[rep % 3];
    uint64_t x = 0;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(^ : x)
    {
      const auto [begin, end] = thread_share(n);
      x ^= xor_words(reinterpret_cast<const uint8_t*>(a + begin), (end - begin) * 8, streams);
    }
    best = std::max(best, static_cast<double>(n) * sizeof(uint64_t) / seconds_since(t0) / 1e9);
    sink = sink ^ x;
  }
  munmap(mem, bytes);
  return best;
}

double read_gb_per_s_over(const std::vector<ReadBlock>& blocks, int reps) {
  // Each block's whole aligned words: [first, first + words).
  std::vector<std::pair<const uint64_t*, int64_t>> words;
  double bytes = 0.0;
  for (const ReadBlock& b : blocks) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(b.data) + 7) / 8 * 8;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(b.data) + b.bytes) / 8 * 8;
    if (b.data == nullptr || end <= begin) continue;
    words.push_back({reinterpret_cast<const uint64_t*>(begin), static_cast<int64_t>((end - begin) / 8)});
    bytes += static_cast<double>(end - begin);
  }
  if (bytes == 0.0) return 0.0;
  double best = 0.0;
  volatile uint64_t sink = 0;
  for (int rep = 0; rep < reps; rep++) {
    const int streams = kRoofStreams[rep % 3];
    uint64_t x = 0;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(^ : x)
    for (const auto& [p, n] : words) {
      const auto [begin, end] = thread_share(n);
      x ^= xor_words(reinterpret_cast<const uint8_t*>(p + begin), (end - begin) * 8, streams);
    }
    best = std::max(best, bytes / seconds_since(t0) / 1e9);
    sink = sink ^ x;
  }
  return best;
}

int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int index = 0; index < 8; index++) {
    std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", index));
    int64_t size = 0;
    char unit = 0;
    if (!(in >> size)) continue;
    in >> unit;
    if (unit == 'K') size <<= 10;
    if (unit == 'M') size <<= 20;
    best = std::max(best, size);
  }
  return best > 0 ? best : int64_t{32} << 20;
}

double malloc_ns(size_t bytes, int iters) {
  // One untimed pair first: glibc raises its mmap threshold after freeing a
  // large mmapped block, so the steady state is what a training loop sees.
  free(std::malloc(bytes));
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; i++) {
    volatile char* p = static_cast<char*>(std::malloc(bytes));
    p[0] = 1;
    std::free(const_cast<char*>(p));
  }
  return seconds_since(t0) / iters * 1e9;
}

double page_fault_ns(size_t bytes) {
  constexpr size_t kPage = 4096;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0.0;
  // No transparent huge pages: one fault per 4 KiB page is what is measured.
  madvise(mem, bytes, MADV_NOHUGEPAGE);
  char* p = static_cast<char*>(mem);
  const auto t0 = Clock::now();
  for (size_t off = 0; off < bytes; off += kPage) p[off] = 1;
  const double s = seconds_since(t0);
  munmap(mem, bytes);
  return s / (bytes / kPage) * 1e9;
}

double threads_fp32_gflops(int threads, int n, int iters) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const double g = gemm_gflops({n, n + 16 * threads, n}, GemmDtype::kFP32, iters);
  omp_set_num_threads(saved);
  return g;
}

Result<double> disk_write_fsync_mb_per_s(const std::string& dir, int64_t bytes) {
  const std::string path = fmt::format("{}/.tessera-doctor-{}.tmp", dir, getpid());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError(fmt::format("{}: cannot create a file for the disk check: {}", dir, std::strerror(errno)));
  std::vector<char> block(1 << 20);
  for (size_t i = 0; i < block.size(); i++) block[i] = static_cast<char>(i * 131 + 7);
  const auto t0 = Clock::now();
  Status st;
  for (int64_t done = 0; done < bytes && st.ok();) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(block.size(), bytes - done));
    const ssize_t n = write(fd, block.data(), want);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) st = Status::IOError(fmt::format("{}: write: {}", path, std::strerror(errno)));
    else done += n;
  }
  if (st.ok() && fsync(fd) != 0) st = Status::IOError(fmt::format("{}: fsync: {}", path, std::strerror(errno)));
  const double s = seconds_since(t0);
  close(fd);
  unlink(path.c_str());
  RETURN_IF_ERROR(st);
  return bytes / s / 1e6;
}

}  // namespace tessera::perf
