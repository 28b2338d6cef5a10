// forerun's native CPU kernels for the embedded engine: batch-invariant by construction.
//
// Every result of a row (a token) is computed by the same sequence of IEEE operations whatever the batch,
// its size, the padding, the prefill chunking or the thread count:
//
//   dot(x, w) over K      16 accumulation lanes, lane l takes k = l, l+16, l+32, ... in ascending order with
//                         one fused multiply-add each; then the fixed tree 16 -> 8 -> 4 -> 2 -> 1
//                         (t8[l] = a[l] + a[l+8], t4[l] = t8[l] + t8[l+4], t2[l] = t4[l] + t4[l+2], t2[0] + t2[1]).
//   linear y = x W^T + b  per (row, output feature) ONE fused multiply-add chain over k = 0, 1, ..., K-1 in order,
//                         y = fma(x[k], w[k], y) from y = +0, then + b; the weights are read ONCE per call for all
//                         rows (a block of K steps of a few panels stays in L1 while every row tile visits it;
//                         a chain pauses at the block's end with its value stored in y and resumes from it).
//   attention             per query over exactly its own keys [row_start, position]; scores by dot(), softmax
//                         with exp_det() and a sequential double sum, output = sequential fma over the keys.
//   exp_det(x)            one fixed polynomial (Cephes expf), the same operations in the vector and scalar code.
//   vocabulary statistics blocks of 16 summed by the same tree, blocks accumulated sequentially in double.
//
// The portable code below IS the definition; the vector code performs the identical operations on 16 lanes at
// once (V16: one AVX-512 register, or two AVX2 registers when built with -mavx2 -mfma -mf16c), so every build
// gives the same bits (a test checks vector against portable on the machine it runs on).  Build flags
// include -ffp-contract=off so the compiler never fuses a multiply and an add that the definition keeps apart.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define FR_AVX512 1
#define FR_VEC 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FR_AVX512 0
#define FR_VEC 1
#else
#define FR_AVX512 0
#define FR_VEC 0
#endif
#if FR_VEC
#include <cpuid.h>
#endif

namespace {

constexpr int LANES = 16;
bool g_portable = false;  // tests: force the portable code path

// How the calls of 2+ row tiles walk a unit's weights (linear_kernel): K blocks of kblock_bytes (0: one block, the
// whole K) and the last prefetch_tiles row tiles of a block prefetch the next block into L2.  Only the speed
// depends on it, never a bit of the results (a test runs every schedule).  Measured, 20 rows, float32, the model's
// matrices, 2 threads:
//   Intel AVX-512 Xeon (48 KB L1), 2026-12-04: 16 KB blocks, 4 prefetching tiles: 24.0 ms; no blocks: 33.5 (6-row tiles).
//   Another (model 207, 2 MB L2), 2026-12-05, the whole decode step: 16 KB / 4 tiles 33.8 ms; no blocks, 1 tile 43.3.
//   AMD Zen 4 (32 KB L1, 1 MB L2), 2026-12-05, the AVX-512 build: 16 KB blocks, 4 prefetching tiles 30.0 ms; 1
//   prefetching tile 28.3; 64 KB blocks, 1 tile 27.3; no blocks, 1 tile 26.9 (a unit's 2 panels, 72 KB at K = 576,
//   re-read from L2 by the second row tile while the last tile fetches the next unit, each line once); the whole
//   20-row decode step 38.3 -> 34.3 ms.  The AVX2 build on the same machine (6 x 1 tiles, 4 of them at 20 rows) lost
//   with no blocks: 33.3 -> 38.0 ms.
// So the AVX-512 build on AMD CPUs gets {0, 1}, every other build and CPU {16 KB, 4}; set_row_tile_schedule()
// overrides it (benchmarks, tests).
// A prefetching tile's streams: the single row tile of a call of STREAM_ROWS + 1 to TILE_ROWS rows walks the next
// unit, which it prefetches, in PREFETCH_STREAMS interleaved runs (line i of the unit's lines in stream i mod S, so S
// runs of consecutive lines advance side by side) instead of one run from its start.  Memory serves several streams
// faster than one: measured 2026-12-07 on a 2-core AMD Zen 3 (AVX2, a C++ microbenchmark of 6-row tiles over 442 MB of
// packed weights, 2 threads, GB/s): one stream 31-33, 2 streams 42-47, 4 streams 43-46, 8 streams 42-44, against
// 41 for a plain read of the same memory and 46-49 for the one-row tile (4 panels: 4 streams).  The calls with K
// blocks prefetch each block's short slices (48 lines) in one run: there 4 streams were slower (the model's
// matrices, 25 alternating pairs: 20 rows 33.8 against 33.1 ms, 2 streams 35.9; 12 rows 24.0 against 22.5).
// The AVX-512 build on a Zen 4 (2026-12-07, the model's matrices, no K blocks, 1 prefetching tile, medians of 6
// interleaved runs at 35 GB/s): 1 / 2 / 4 streams 18.19 / 18.01 / 18.37 ms at 6 rows, within the noise of code the
// streams do not touch (20 rows 29.70 / 29.78 / 29.70), so the same default; set_row_tile_schedule(kb, tiles, 1)
// restores one run for an A/B.
constexpr int64_t PREFETCH_STREAMS = 4;
struct RowTileSchedule {
  int64_t kblock_bytes;
  int64_t prefetch_tiles;
  int64_t prefetch_streams;  // 1, 2 or 4: see "A prefetching tile's streams" above
};
bool amd_cpu() {  // cpuid leaf 0: the vendor string in ebx, edx, ecx
#if FR_VEC
  unsigned a = 0, vendor[3] = {0, 0, 0};
  return __get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]) && std::memcmp(vendor, "AuthenticAMD", 12) == 0;
#else
  return false;
#endif
}
RowTileSchedule g_schedule = FR_AVX512 && amd_cpu() ? RowTileSchedule{0, 1, PREFETCH_STREAMS}
                                                    : RowTileSchedule{16 * 1024, 4, PREFETCH_STREAMS};

// How a prefetching row tile walks its slice of the next weights: `slice_lines` lines per panel over `steps` K steps
// (the i-th line, i = (k * rate) >> 16, at step k), the first streams x chunk of them in `streams` interleaved
// streams of `chunk` lines (stream i mod streams, position i / streams), the last slice_lines mod streams in order:
// every line of the slice once when steps >= slice_lines.
struct TilePrefetch {
  const char* at = nullptr;  // nullptr: the tile prefetches nothing
  int64_t rate = 0, chunk = 0;
  int64_t streams = 1;
};

TilePrefetch slice_prefetch(const char* at, int64_t slice_lines, int64_t steps, int64_t streams) {
  TilePrefetch pf;
  pf.at = at;
  pf.rate = (int64_t(1) << 16) * slice_lines / std::max<int64_t>(1, steps);
  pf.streams = streams;
  pf.chunk = slice_lines / streams;
  return pf;
}

// The line of its slice a tile with PF prefetch streams prefetches at step k.
template <int PF>
inline int64_t prefetch_line(int64_t k, int64_t rate, int64_t chunk) {
  static_assert(PF == 1 || PF == 2 || PF == 4, "prefetch streams: 1, 2 or 4");
  const int64_t i = (k * rate) >> 16;
  return PF == 1 || i >= PF * chunk ? i : (i & (PF - 1)) * chunk + (i >> (PF == 4 ? 2 : 1));
}

// ------------------------------------------------------------------------------------------ scalars
inline float widen(float w) { return w; }
inline double widen(double w) { return w; }
inline float widen(c10::BFloat16 w) {
  uint32_t bits = uint32_t(w.x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float widen(c10::Half w) { return static_cast<float>(w); }

template <typename A>
inline A tree16(const A* a) {
  A t8[8], t4[4], t2[2];
  for (int l = 0; l < 8; ++l) t8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  for (int l = 0; l < 2; ++l) t2[l] = t4[l] + t4[l + 2];
  return t2[0] + t2[1];
}

// Block sums: e[c] for a block of 16 summed by tree16 (missing lanes are +0), blocks accumulated in double.
template <typename A>
inline double block_sum(const A* e, int64_t n) {
  A t[LANES] = {};
  for (int64_t l = 0; l < n; ++l) t[l] = e[l];
  return double(tree16(t));
}

// ------------------------------------------------------------------------------------------ packed weights
// The weight matrices of one call, concatenated along the output features into W [N, K], are stored packed in
// panels of PANEL = 16 output features, input-major:
//     packed[p][k][j] = W[p * 16 + j][k]        (zero past N; the panels padded to a multiple of MAX_TILE_PANELS),
// so one call streams its weights as one sequential run (one row reads MAX_TILE_PANELS panels side by side), and
// step k of a chain reads the 16 weights x[k] multiplies as one vector.  The layout moves values only; the chains
// below are the definition.
constexpr int PANEL = LANES;
constexpr int MAX_TILE_PANELS = 4;

// The definition of linear for the 16 features of one panel: out[j] = the fma chain over k of x and W[p * 16 + j].
template <typename A, typename W>
inline void panel_chains(const A* x, const W* panel, int64_t K, A* out) {
  A acc[PANEL] = {};
  for (int64_t k = 0; k < K; ++k)
    for (int j = 0; j < PANEL; ++j) acc[j] = std::fma(x[k], A(widen(panel[k * PANEL + j])), acc[j]);
  for (int j = 0; j < PANEL; ++j) out[j] = acc[j];
}

// dot(x, w) of two contiguous vectors of one dtype (norms, attention scores): lane l takes k = l, l + 16, ... in
// ascending order with one fma each, then the tree.
template <typename A>
inline A dot_ref(const A* x, const A* w, int64_t K) {
  A acc[LANES] = {};
  for (int64_t k0 = 0; k0 < K; k0 += LANES)
    for (int l = 0; l < LANES && k0 + l < K; ++l) acc[l] = std::fma(x[k0 + l], w[k0 + l], acc[l]);
  return tree16(acc);
}

// exp with a fixed polynomial (float) / the C library (double); x <= 88 finite (larger -> inf).
inline float exp_det(float x) {
  if (x != x) return x;
  if (!(x > -87.33654f)) return 0.0f;
  if (x > 88.0f) return std::numeric_limits<float>::infinity();
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  float r2 = r * r;
  p = std::fma(p, r2, r);
  p = p + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
inline double exp_det(double x) { return std::exp(x); }

#if FR_VEC
// ------------------------------------------------------------------------------------------ 16-lane vectors
// V16 holds the 16 lanes of the definition above: one __m512 with AVX-512, two __m256 (lanes 0-7, 8-15) with
// AVX2.  Every operation is lane-wise IEEE (or the fixed tree of hsum), so both backends give the same bits as
// the portable code.  M16 selects lanes (tails, special values of exp).

// The rest of tree16 once t8[l] = a[l] + a[l + 8] is formed: t4, t2, then t2[0] + t2[1].
inline float tree8(__m256 t8) {
  __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  __m128 t1 = _mm_add_ss(t2, _mm_movehdup_ps(t2));
  return _mm_cvtss_f32(t1);
}
#if FR_AVX512
struct V16 { __m512 v; };
struct M16 { __mmask16 m; };
constexpr int kRegsPerV16 = 1;
inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset1(float s) { return {_mm512_set1_ps(s)}; }
inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline M16 vfirst(int64_t n) { return {static_cast<__mmask16>((1u << n) - 1u)}; }  // lanes < n, 0 <= n <= 16
inline void vstore(float* p, V16 a, M16 m) { _mm512_mask_storeu_ps(p, m.m, a.v); }  // lanes past m untouched
inline V16 vload(const float* p, M16 m) { return {_mm512_maskz_loadu_ps(m.m, p)}; }
inline V16 vload_w(const float* p) { return vload(p); }
inline V16 vload_w(const c10::BFloat16* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))};
}
inline V16 vload_w(const c10::Half* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 vfma(V16 a, V16 b, V16 c, M16 m) { return {_mm512_mask3_fmadd_ps(a.v, b.v, c.v, m.m)}; }  // c past m
inline V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 vmin(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline float vmax_lanes(V16 a) { return _mm512_reduce_max_ps(a.v); }
inline V16 vround(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// 2^n for integral n in [-126, 127]
inline V16 vpow2(V16 n) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23))};
}
inline M16 vunordered(V16 a) { return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)}; }
inline M16 vnot_greater(V16 a, V16 b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NGT_UQ)}; }  // !(a > b)
inline M16 vgreater(V16 a, V16 b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)}; }
inline M16 vnonfinite(V16 a) { return {_mm512_fpclass_ps_mask(a.v, 0x99)}; }  // NaN or infinity
inline M16 vor(M16 a, M16 b) { return {static_cast<__mmask16>(a.m | b.m)}; }
inline bool vany(M16 a) { return a.m != 0; }
inline V16 vselect(M16 m, V16 yes, V16 no) { return {_mm512_mask_mov_ps(no.v, m.m, yes.v)}; }
inline float hsum_tree(V16 a) {
  return tree8(_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)));
}
// out[j] = hsum_tree(a[j]) for 16 vectors: the same tree (t8, t4, t2, t1) for each, computed for 16 vectors at
// once with shuffles (15 adds instead of 16 x 4).
inline void hsum16(const V16* a, float* out) {
  __m512 r8[8], r4[4], r2[2];
  for (int i = 0; i < 8; ++i)
    r8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i].v, a[2 * i + 1].v, 0x44),
                          _mm512_shuffle_f32x4(a[2 * i].v, a[2 * i + 1].v, 0xEE));
  for (int i = 0; i < 4; ++i)
    r4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r8[2 * i], r8[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(r8[2 * i], r8[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)
    r2[i] = _mm512_add_ps(_mm512_shuffle_ps(r4[2 * i], r4[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(r4[2 * i], r4[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r1 = _mm512_add_ps(_mm512_shuffle_ps(r2[0], r2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_ps(r2[0], r2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // r1 lane 4k + m holds vector 4m + k
  const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, r1));
}
#else  // AVX2 + FMA + F16C
struct V16 { __m256 lo, hi; };
struct M16 { __m256 lo, hi; };  // all-ones lanes are selected
constexpr int kRegsPerV16 = 2;
inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset1(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, V16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline M16 vfirst(int64_t n) {
  const __m256i nv = _mm256_set1_epi32(static_cast<int>(n));
  return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)))};
}
inline V16 vload(const float* p, M16 m) {  // lanes past m are neither read nor kept
  return {_mm256_maskload_ps(p, _mm256_castps_si256(m.lo)), _mm256_maskload_ps(p + 8, _mm256_castps_si256(m.hi))};
}
inline void vstore(float* p, V16 a, M16 m) {  // lanes past m untouched
  _mm256_maskstore_ps(p, _mm256_castps_si256(m.lo), a.lo);
  _mm256_maskstore_ps(p + 8, _mm256_castps_si256(m.hi), a.hi);
}
inline __m256 widen8(const c10::BFloat16* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
inline __m256 widen8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V16 vload_w(const float* p) { return vload(p); }
inline V16 vload_w(const c10::BFloat16* p) { return {widen8(p), widen8(p + 8)}; }
inline V16 vload_w(const c10::Half* p) { return {widen8(p), widen8(p + 8)}; }
inline V16 vselect(M16 m, V16 yes, V16 no) { return {_mm256_blendv_ps(no.lo, yes.lo, m.lo), _mm256_blendv_ps(no.hi, yes.hi, m.hi)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 vfma(V16 a, V16 b, V16 c, M16 m) { return vselect(m, vfma(a, b, c), c); }  // c past m
inline V16 vadd(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 vmin(V16 a, V16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline float vmax_lanes(V16 a) {
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_max_ps(a.lo, a.hi));
  float m = t[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, t[i]);
  return m;
}
inline V16 vround(V16 a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
inline __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline V16 vpow2(V16 n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
inline M16 vunordered(V16 a) { return {_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q), _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q)}; }
inline M16 vnot_greater(V16 a, V16 b) { return {_mm256_cmp_ps(a.lo, b.lo, _CMP_NGT_UQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_NGT_UQ)}; }
inline M16 vgreater(V16 a, V16 b) { return {_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)}; }
inline M16 vnonfinite(V16 a) {  // x - x is NaN exactly for NaN and infinity
  const V16 d = vsub(a, a);
  return vunordered(d);
}
inline M16 vor(M16 a, M16 b) { return {_mm256_or_ps(a.lo, b.lo), _mm256_or_ps(a.hi, b.hi)}; }
inline bool vany(M16 a) { return _mm256_movemask_ps(_mm256_or_ps(a.lo, a.hi)) != 0; }
inline float hsum_tree(V16 a) { return tree8(_mm256_add_ps(a.lo, a.hi)); }
inline void hsum16(const V16* a, float* out) {
  for (int j = 0; j < 16; ++j) out[j] = hsum_tree(a[j]);
}
#endif

// Fully unrolled small loops: the tiles' accumulator indices must be constants for GCC to keep them in registers.
#define FR_UNROLL _Pragma("GCC unroll 16")

// scores[c] = dot(q, k_c) for KEYS keys at once (D a multiple of 16): one accumulator per key, then the tree.
// KEYS: as many accumulators as the registers hold (16 with AVX-512, 4 with AVX2).
constexpr int SCORE_KEYS = FR_AVX512 ? 16 : 4;
inline void score_keys(const float* q, const float* kb, int64_t kstride, int64_t D, float* out) {
  V16 acc[SCORE_KEYS];
  for (int j = 0; j < SCORE_KEYS; ++j) acc[j] = vzero();
  for (int64_t d = 0; d < D; d += LANES) {
    const V16 qv = vload(q + d);
    for (int j = 0; j < SCORE_KEYS; ++j) acc[j] = vfma(qv, vload(kb + j * kstride + d), acc[j]);
  }
  if constexpr (SCORE_KEYS == 16) {
    hsum16(acc, out);
  } else {
    for (int j = 0; j < SCORE_KEYS; ++j) out[j] = hsum_tree(acc[j]);
  }
}

#if FR_AVX512
// score_keys for keys stored one after another (kstride = D = 16 * DV, as in the KV buffer and the prefix segments):
// q held in registers and every key at a constant offset from kb, so the 16 accumulators stay in registers (the
// general version above keeps 16 key pointers, which GCC spills).  The same fmas in the same order: the same bits.
template <int DV>
inline void score_keys_packed(const float* q, const float* kb, float* out) {
  V16 qv[DV], acc[SCORE_KEYS];
  for (int v = 0; v < DV; ++v) qv[v] = vload(q + 16 * v);
  FR_UNROLL for (int j = 0; j < SCORE_KEYS; ++j) {
    acc[j] = vzero();
    FR_UNROLL for (int v = 0; v < DV; ++v) acc[j] = vfma(qv[v], vload(kb + (j * DV + v) * 16), acc[j]);
  }
  hsum16(acc, out);
}
#endif

inline V16 exp_det(V16 x) {
  const M16 nan = vunordered(x), small = vnot_greater(x, vset1(-87.33654f)), big = vgreater(x, vset1(88.0f));
  const V16 n = vround(vmul(x, vset1(1.44269504088896341f)));
  V16 r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  V16 p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  const V16 r2 = vmul(r, r);
  p = vfma(p, r2, r);
  p = vadd(p, vset1(1.0f));
  // n is clamped so that the exponent bits stay valid in the lanes that are replaced below, and is 0 in the lanes
  // that become 0: there p * 2^-126 would be a subnormal, and an instruction producing one costs a microcode assist
  // on Intel cores (~100 cycles each; most of a vocabulary's lanes at tau = 1/4: `draw` of 20 rows took 1.7 ms
  // instead of 0.3, measured 2026-12-04).  Either way those lanes are replaced: the same bits.
  V16 y = vmul(p, vpow2(vmax(vmin(vselect(small, vzero(), n), vset1(127.0f)), vset1(-126.0f))));
  y = vselect(small, vzero(), y);
  y = vselect(big, vset1(std::numeric_limits<float>::infinity()), y);
  return vselect(nan, x, y);
}

// A tile of linear: R rows against NP consecutive panels (panel q's weights at w + q * ps), K steps, R x NP
// accumulators; lane j of acc[r][q] is the chain of row r and feature 16 q + j of the tile.  Per step k: NP weight
// vectors, R broadcasts of x[r][k], R x NP fmas.  Only the first fn features are stored.  With `cont` the chains
// continue from the values in y (the previous K block's, stored as they were: the same bits as one long chain).
// PF streams (0: no prefetch): step k also prefetches line i = (k * pf.rate) >> 16 of each of the NP panels' slices
// of weights that a later tile will read, starting at `pf.at` (`rate` = lines per step in 1/65536ths, so K steps
// cover the slice evenly), in PF interleaved streams of pf.chunk lines (line i goes to stream i mod PF, position
// i / PF: see PREFETCH_STREAMS), into L2, not L1: before K blocks, a unit's slices added up to more than L1 holds,
// and prefetched into L1 they evicted the lines the tiles were reading (measured on Zen 4, 2026-12-02: 20 rows
// 41.9 ms of matrix products with T0, 29.2 with T1); with K blocks, T0 and T1 were within noise (AVX-512 Xeon,
// 2026-12-04).
// Never inlined: the register allocation of the loop then does not depend on the caller (inlined into linear_kernel,
// small changes there made GCC 12 spill the row pointers of this loop and cost up to 25 %, measured 2026-12-02).
// A tile of PF_BURST_ROWS rows or more with one prefetch stream (a unit's prefetching row tile in AVX-512 calls of
// 16-20 rows, and others whose tiles have 8+ rows; AVX2 tiles have at most 6) issues the prefetches of PF_BURST steps
// together before running them: computed in the loop of multiply-adds, their address arithmetic took the registers
// of the row pointers (GCC 12 moved them to vector registers and the stack every step; smaller tiles had registers
// to spare).  Measured with `scripts/kernel_ab --step` on a 2-core Zen 4, 2026-12-08, whole decode steps, 48 tokens,
// 12 pairs: 16 rows 31.86 -> 28.52 ms (faster in 12 of 12), 20 rows 35.44 -> 34.39 (9 of 12); 12 rows (6-row tiles,
// unchanged code) 6 of 12.  Bursts lost elsewhere: in the 6-row tiles of 12 rows (1 of 12 pairs), in the single tile
// of 9 rows (1 of 12), and in the single 4-panel tiles that 4 and 5 rows had then (3 and 0 of 10, bursts of 4 steps).
// Not measured on the Intel schedule (K blocks, 4 prefetching tiles), which runs the same loop.
constexpr int64_t PF_BURST = 8, PF_BURST_ROWS = 8;
template <int R, int NP, typename W, int PF>
__attribute__((noinline)) void tile(const float* x, int64_t ldx, const W* w, int64_t ps, int64_t K, bool cont, float* y,
                                    int64_t ldy, int fn, const TilePrefetch pf) {
  V16 acc[R][NP];
  if (cont) {
    FR_UNROLL for (int r = 0; r < R; ++r) FR_UNROLL for (int q = 0; q < NP; ++q) {
      const int left = fn - q * PANEL;
      acc[r][q] = left >= PANEL ? vload(y + r * ldy + q * PANEL)
                  : left > 0    ? vload(y + r * ldy + q * PANEL, vfirst(left))
                                : vzero();
    }
  } else {
    FR_UNROLL for (int r = 0; r < R; ++r) FR_UNROLL for (int q = 0; q < NP; ++q) acc[r][q] = vzero();
  }
  const int64_t psb = ps * static_cast<int64_t>(sizeof(W));
  // K >= 1.  A do-while, not a for: with a loop that may run zero times, GCC 12 stored every accumulator to the
  // stack on every step (2.5-3x slower; seen with objdump).
  int64_t k = 0;
  do {
    // Steps [k, kend) run after their prefetches: one step at a time, or PF_BURST steps (see PF_BURST).
    const int64_t kend = PF == 0 ? K : PF == 1 && R >= PF_BURST_ROWS ? std::min<int64_t>(K, k + PF_BURST) : k + 1;
    if constexpr (PF > 0) {
      for (int64_t j = k; j < kend; ++j) {
        const int64_t line = prefetch_line<PF>(j, pf.rate, pf.chunk);
        FR_UNROLL for (int q = 0; q < NP; ++q) _mm_prefetch(pf.at + q * psb + line * 64, _MM_HINT_T1);
      }
    }
    do {
      V16 b[NP];
      FR_UNROLL for (int q = 0; q < NP; ++q) b[q] = vload_w(w + q * ps + k * PANEL);
      FR_UNROLL for (int r = 0; r < R; ++r) {
        const V16 a = vset1(x[r * ldx + k]);
        FR_UNROLL for (int q = 0; q < NP; ++q) acc[r][q] = vfma(a, b[q], acc[r][q]);
      }
    } while (++k < kend);
  } while (k < K);
  FR_UNROLL for (int r = 0; r < R; ++r) FR_UNROLL for (int q = 0; q < NP; ++q) {
    const int left = fn - q * PANEL;
    if (left >= PANEL)
      vstore(y + r * ldy + q * PANEL, acc[r][q]);
    else if (left > 0)
      vstore(y + r * ldy + q * PANEL, acc[r][q], vfirst(left));
  }
}

// Tile shapes: every tile of a call has the same NP (= tile_panels(M)).  Calls of up to STREAM_ROWS rows are a
// stream of the weights: the threads split the panels, one tile of all the rows walks them (run_narrow_tile), the
// hardware prefetchers fetch them.  One row: 4 panels (8 independent chains on AVX2, enough to hide the fma latency).
// Two rows: TWO_ROW_PANELS.  AVX-512, 3 to 6 rows: 4 panels (R x 4 accumulators, at most 24 of the 32 registers).
// More rows: row tiles of 3 to TILE_ROWS rows, as even as possible, with TILE_PANELS panels, over units of weights
// that a prefetching tile fetches ahead.  Registers: AVX2 (16 ymm, 2 per V16) 6 x 1 -> 12 accumulators + 2 weights +
// 1 broadcast; AVX-512 (32 zmm) 10 x 2 -> 20 + 2 + 1.  A row's results never depend on the shape: every lane is one
// chain.  Measured 2026-12-04 on a 2-core AVX-512 Xeon (the model's matrices, 20 rows, 2 threads): 6 x 2 tiles
// without K blocks 33.5 ms, with K blocks 25.3, 10 x 2 with K blocks 24.0 (8 or 12 rows: within noise); AVX2 tiles on
// the same machine 37.7 -> 36.9 ms.  AVX-512 calls of 3 to 6 rows as streams (STREAM_ROWS 6, before 2), measured with
// `scripts/kernel_ab --step` on a 2-core Zen 4, 2026-12-08, 48 tokens, 10 pairs, against one 4-panel tile per unit
// with software prefetch (3-5 rows) and 6 x 2 tiles (6 rows): 3 / 4 / 5 / 6 rows 14.00 -> 12.67, 14.55 -> 13.34,
// 15.36 -> 14.26, 16.12 -> 14.69 ms (faster in 10 of 10 pairs each; the VM's fast bandwidth mode); 7 and 8 rows as
// streams of 2-panel tiles: 9 and 0 of 10 (8 rows 17.15 -> 17.89 ms), so they stay row tiles.
constexpr int TILE_ROWS = FR_AVX512 ? 10 : 6;
constexpr int TILE_PANELS = FR_AVX512 ? 2 : 1;
constexpr int TWO_ROW_PANELS = FR_AVX512 ? 4 : 2;
constexpr int STREAM_ROWS = FR_AVX512 ? 6 : 2;
constexpr int tile_panels(int64_t M) {
  return M == 1 ? MAX_TILE_PANELS : M == 2 ? TWO_ROW_PANELS : M <= STREAM_ROWS ? MAX_TILE_PANELS : TILE_PANELS;
}

// Prefetching tiles get pf.at != nullptr.  Row tiles of 3 rows or more (the streamed calls: run_narrow_tile).
template <int R, typename W>
inline void run_tile_rows(const float* x, int64_t ldx, const W* w, int64_t ps, int64_t K, bool cont, float* y,
                          int64_t ldy, int fn, const TilePrefetch& pf) {
  if (pf.at == nullptr)
    tile<R, TILE_PANELS, W, 0>(x, ldx, w, ps, K, cont, y, ldy, fn, pf);
  else if (pf.streams >= 4)
    tile<R, TILE_PANELS, W, 4>(x, ldx, w, ps, K, cont, y, ldy, fn, pf);
  else if (pf.streams == 2)
    tile<R, TILE_PANELS, W, 2>(x, ldx, w, ps, K, cont, y, ldy, fn, pf);
  else
    tile<R, TILE_PANELS, W, 1>(x, ldx, w, ps, K, cont, y, ldy, fn, pf);
}

template <typename W>
inline void run_tile(int rn, const float* x, int64_t ldx, const W* w, int64_t ps, int64_t K, bool cont, float* y,
                     int64_t ldy, int fn, const TilePrefetch& pf) {
  switch (rn) {
    case 3: run_tile_rows<3, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    case 4: run_tile_rows<4, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    case 5: run_tile_rows<5, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
#if FR_AVX512
    case 6: run_tile_rows<6, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    case 7: run_tile_rows<7, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    case 8: run_tile_rows<8, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    case 9: run_tile_rows<9, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
    default: run_tile_rows<10, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
#else
    default: run_tile_rows<6, W>(x, ldx, w, ps, K, cont, y, ldy, fn, pf); return;
#endif
  }
}

// R rows (a streamed call: R <= STREAM_ROWS), pn (1 to 4) panels side by side.
template <int R, typename W>
inline void run_narrow_tile(int pn, const float* x, int64_t ldx, const W* w, int64_t ps, int64_t K, float* y,
                            int64_t ldy, int fn) {
  switch (pn) {
    case 1: tile<R, 1, W, 0>(x, ldx, w, ps, K, false, y, ldy, fn, TilePrefetch{}); return;
    case 2: tile<R, 2, W, 0>(x, ldx, w, ps, K, false, y, ldy, fn, TilePrefetch{}); return;
    case 3: tile<R, 3, W, 0>(x, ldx, w, ps, K, false, y, ldy, fn, TilePrefetch{}); return;
    default: tile<R, 4, W, 0>(x, ldx, w, ps, K, false, y, ldy, fn, TilePrefetch{}); return;
  }
}

template <typename A, typename W>
constexpr bool kVec = std::is_same<A, float>::value && !std::is_same<W, double>::value;
#else
template <typename A, typename W>
constexpr bool kVec = false;
constexpr int TILE_ROWS = 6;
constexpr int tile_panels(int64_t) { return 1; }
#endif

// ------------------------------------------------------------------------------------------ linear
// Fewest multiply-adds a parallel task gets: smaller calls run on the calling thread alone (a parallel region
// costs microseconds on a quiet machine and a scheduler time slice on a busy one).
constexpr int64_t MIN_TASK_WORK = int64_t(1) << 17;

// The split of a call's n work items (panels or units) between the threads of its parallel region.  Thread t owns
// the t-th of nth equal contiguous ranges and walks it forward, claiming a quarter of what is left each time; a
// thread whose range is done takes the back half of what is left of another's, until nothing is left.  With
// threads of equal speed this is the static split (each thread one sequential stream); when one is slower (a
// vCPU shared with another tenant, memory contention), the other finishes its work instead of waiting at the
// barrier.  Each item is run exactly once, by whichever thread claimed it: the results never depend on who.
// fn(b, e, next): items [b, e); next = the first item of the owner's next claim (e, when its range goes on; -1
// otherwise), which the caller may prefetch.  g_work_stealing off: the static split only (benchmarks, tests).
// Measured 2026-12-05 on a 2-core AVX-512 Xeon (`forerun bench work-split`, decode steps at 1, 6 and 20 rows, 31
// pairs each): never slower at the median; quiet 0.4-4.9 % faster, beside a process busy 30 % / 60 % of the time on
// one core 3-5 % / 6-8 %.  A shared counter handing out chunks to both threads (guided) lost at 6 rows: the thread's
// next unit, which its tiles prefetch, was unknown at every chunk end.
bool g_work_stealing = true;

class StealRanges {
 public:
  // align > 1: the ranges start at multiples of align (quantum is then a multiple of it: every claim too)
  StealRanges(int64_t n, int64_t parts, int64_t quantum, int64_t align = 1)
      : quantum_(quantum), r_(new std::atomic<uint64_t>[parts]) {
    const auto start = [&](int64_t t) { return t == parts ? n : n * t / parts / align * align; };
    for (int64_t t = 0; t < parts; ++t) r_[t].store(pack(start(t), start(t + 1)));
  }
  // The owner's next claim from the front of range t: false when it is empty.
  bool claim_front(int64_t t, int64_t& b, int64_t& e, int64_t& next) {
    uint64_t cur = r_[t].load(std::memory_order_relaxed);
    for (;;) {
      const int64_t lo = lo_of(cur), hi = hi_of(cur);
      if (lo >= hi) return false;
      const int64_t take = std::min(hi - lo, std::max(quantum_, (hi - lo) / 4 / quantum_ * quantum_));
      if (r_[t].compare_exchange_weak(cur, pack(lo + take, hi), std::memory_order_relaxed)) {
        b = lo, e = lo + take, next = e < hi ? e : -1;
        return true;
      }
    }
  }
  // A thief's claim of the back half of range t (all of it when one item is left): false when it is empty.
  bool steal_back(int64_t t, int64_t& b, int64_t& e) {
    uint64_t cur = r_[t].load(std::memory_order_relaxed);
    for (;;) {
      const int64_t lo = lo_of(cur), hi = hi_of(cur);
      if (lo >= hi) return false;
      const int64_t keep = (hi - lo) / 2 / quantum_ * quantum_;
      if (r_[t].compare_exchange_weak(cur, pack(lo, lo + keep), std::memory_order_relaxed)) {
        b = lo + keep, e = hi;
        return true;
      }
    }
  }
 private:
  static uint64_t pack(int64_t lo, int64_t hi) { return uint64_t(lo) | (uint64_t(hi) << 32); }
  static int64_t lo_of(uint64_t v) { return int64_t(v & 0xffffffffu); }
  static int64_t hi_of(uint64_t v) { return int64_t(v >> 32); }
  int64_t quantum_;
  std::unique_ptr<std::atomic<uint64_t>[]> r_;
};

// align > 1 (dividing n and quantum): every range fn gets starts and ends at a multiple of align.
template <typename F>
void parallel_stealing(int64_t n, int64_t grain, int64_t quantum, F&& fn, int64_t align = 1) {
  const int64_t nth = std::min<int64_t>(at::get_num_threads(), (n + grain - 1) / std::max<int64_t>(1, grain));
  TORCH_CHECK(n < (int64_t(1) << 32), "parallel_stealing: too many items");
  TORCH_CHECK(align >= 1 && n % align == 0 && quantum % align == 0,
              "parallel_stealing: align must divide n and quantum");
  if (!g_work_stealing || nth <= 1) {
    at::parallel_for(0, n / align, std::max<int64_t>(1, grain / align),
                     [&](int64_t b, int64_t e) { fn(b * align, e * align, int64_t(-1)); });
    return;
  }
  StealRanges ranges(n, nth, quantum, align);
  at::parallel_for(0, nth, 1, [&](int64_t t0, int64_t t1) {
    int64_t b, e, next;
    for (int64_t t = t0; t < t1; ++t)
      while (ranges.claim_front(t, b, e, next)) fn(b, e, next);
    for (int64_t i = 1; i < nth; ++i)  // then the others' ranges, the next thread's first
      while (ranges.steal_back((t0 + i) % nth, b, e)) fn(b, e, int64_t(-1));
  });
}

// Weights of one call, packed (see "packed weights"): `data` holds ceil(N / PANEL) panels of K x PANEL, padded with
// zero panels to a multiple of MAX_TILE_PANELS.
struct Packed {
  torch::Tensor data;
  int64_t N = 0, K = 0;
  // pack_pairs(gate, up): 0 otherwise.  The panels alternate gate, up (panel 2p: gate features 16p .. 16p + 15, panel
  // 2p + 1: up's, zero past `pairs`), N = 32 x the panel pairs.
  int64_t pairs = 0;
};

// The epilogue of linear_silu: after a thread's call has computed output features [f0, f0 + fn) of every row (the
// interleaved gate, up panels of pack_pairs), out[r][16p + j] = silu(gate) * up of each pair p in it, while they
// are in cache.
template <typename A>
struct SiluPairs {
  const A* y;  // [M, N] the interleaved products (N = 32 x the pairs of panels)
  A* out;      // [M, I]
  int64_t M, N, I;
  void operator()(int64_t f0, int64_t fn) const;
};

// y[r][f0 + f] += bias[f0 + f] for the M rows and the fn features from f0 (nothing without a bias).
template <typename A>
inline void add_bias(const A* bias, int64_t M, int64_t N, int64_t f0, int fn, A* y) {
  if (bias != nullptr)
    for (int64_t r = 0; r < M; ++r)
      for (int f = 0; f < fn; ++f) y[r * N + f0 + f] = y[r * N + f0 + f] + bias[f0 + f];
}

// y [M, N] = x W^T (+ b).  Up to STREAM_ROWS rows: the panels split evenly between the threads.  More: work units
// are runs of np consecutive panels (one tile's), split between the threads in contiguous runs; every row tile visits
// a unit while it sits in L2, so the weights are read from memory once for all rows.  (pack() pads the panels to a
// multiple of MAX_TILE_PANELS: a unit never reads past the data.)
template <typename A, typename W>
void linear_kernel(const A* x, int64_t M, int64_t K, const W* pk, int64_t N, const A* bias, A* y,
                   const SiluPairs<A>* post = nullptr) {
  // With an epilogue, every range a thread takes holds whole pairs of panels (one unit is a pair, or two units).
  if (M == 0) return;
  const int64_t pstride = K * PANEL;
  const bool vec = kVec<A, W> && !g_portable;
  const int64_t np = vec ? tile_panels(M) : 1, width = np * PANEL, units = (N + width - 1) / width;
  [[maybe_unused]] const int64_t tiles = (M + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t grain = std::max<int64_t>(1, MIN_TASK_WORK / std::max<int64_t>(1, width * M * K));
  const int64_t unit_align = post != nullptr && np == 1 ? 2 : 1;
#if FR_VEC
  if constexpr (kVec<A, W>) {
    if (vec && M <= STREAM_ROWS) {
      // A pure stream of the weights: the threads split the panels, not units of np panels, so that neither
      // reads more than one panel past half (units of 4 split 36 panels 20 / 16: the 576-wide outputs of
      // SmolLM2's o and down projections ran 11 % faster split 18 / 18, measured 2026-12-04).  A thread's run
      // ends with a narrower tile where np does not divide it; every lane is still one chain (the same bits).
      const int64_t panels = (N + PANEL - 1) / PANEL;
      const int64_t pgrain = std::max<int64_t>(1, MIN_TASK_WORK / std::max<int64_t>(1, PANEL * M * K));
      parallel_stealing(panels, pgrain, np, [&](int64_t p0, int64_t p1, int64_t) {
        for (int64_t p = p0; p < p1; p += np) {
          const int pn = static_cast<int>(std::min<int64_t>(np, p1 - p));
          const int64_t f0 = p * PANEL;
          const int fn = static_cast<int>(std::min<int64_t>(pn * PANEL, N - f0));
          static_assert(STREAM_ROWS == (FR_AVX512 ? 6 : 2), "one case per streamed row count");
          switch (M) {
            case 1: run_narrow_tile<1, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
#if FR_AVX512
            case 3: run_narrow_tile<3, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
            case 4: run_narrow_tile<4, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
            case 5: run_narrow_tile<5, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
            case 6: run_narrow_tile<6, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
#endif
            default: run_narrow_tile<2, W>(pn, x, K, pk + p * pstride, pstride, K, y + f0, N, fn); break;
          }
          add_bias(bias, M, N, f0, fn, y);
          if (post != nullptr) (*post)(f0, fn);
        }
      }, post != nullptr ? 2 : 1);
      return;
    }
  }
  // K blocks (calls of 2+ row tiles): a block of the unit's panels (np x kbw x 16 weights, the schedule's
  // kblock_bytes) is read from memory by the first row tile and from L1 by the others; each chain continues across
  // blocks through y.
  // The last pft tiles of a block prefetch the next block (the unit's, else the thread's next unit's first), each
  // an equal slice of its lines per panel.  Block j covers k in [kstart(j), kstart(j + 1)).
  const RowTileSchedule sched = g_schedule;
  const int64_t kbw = std::max<int64_t>(1, sched.kblock_bytes / (np * PANEL * static_cast<int64_t>(sizeof(W))));
  const int64_t nb = tiles >= 2 && sched.kblock_bytes > 0 ? std::max<int64_t>(1, (K + kbw - 1) / kbw) : 1;
  const auto kstart = [K, nb](int64_t j) { return j * K / nb; };
  [[maybe_unused]] const int64_t pft = std::min<int64_t>(sched.prefetch_tiles, tiles);
  // One row tile prefetches the whole next unit in the schedule's streams; the K blocks' slices in one run each.
  [[maybe_unused]] const int64_t streams = tiles == 1 ? sched.prefetch_streams : 1;
#endif
  parallel_stealing(units, grain, unit_align, [&](int64_t u0, int64_t u1, [[maybe_unused]] int64_t unext) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t f0 = u * width;
      const int fn = static_cast<int>(std::min<int64_t>(width, N - f0));
      const W* w = pk + u * np * pstride;
#if FR_VEC
      if constexpr (kVec<A, W>) {
        if (vec) {
          for (int64_t j = 0; j < nb; ++j) {
            const int64_t k0 = kstart(j), k1 = kstart(j + 1), kn = k1 - k0;
            const W* nw = nullptr;  // the next block's first weights (panel 0), nkn steps long
            int64_t nkn = 0;
            if (j + 1 < nb) { nw = w + k1 * PANEL; nkn = kstart(j + 2) - k1; }
            else if (u + 1 < u1) { nw = w + np * pstride; nkn = kstart(1); }
            else if (unext >= 0) { nw = pk + unext * np * pstride; nkn = kstart(1); }
            const int64_t lines = nw ? (nkn * PANEL * static_cast<int64_t>(sizeof(W)) + 63) / 64 : 0;
            for (int64_t t = 0, r0 = 0; t < tiles; ++t) {
              const int64_t rn = (M - r0) / (tiles - t);  // rows per tile as even as possible
              const int64_t slice = t - (tiles - pft);
              const TilePrefetch pf = slice_prefetch(
                  nw != nullptr && slice >= 0 ? reinterpret_cast<const char*>(nw) + slice * lines / pft * 64 : nullptr,
                  lines / pft, kn, streams);
              run_tile<W>(static_cast<int>(rn), x + r0 * K + k0, K, w + k0 * PANEL, pstride, kn, j > 0,
                          y + r0 * N + f0, N, fn, pf);
              r0 += rn;
            }
          }
          add_bias(bias, M, N, f0, fn, y);
          if (post != nullptr) (*post)(f0, fn);
          continue;
        }
      }
#endif
      for (int64_t r = 0; r < M; ++r) {
        A out[PANEL];
        panel_chains<A, W>(x + r * K, w, K, out);
        for (int f = 0; f < fn; ++f) y[r * N + f0 + f] = bias != nullptr ? out[f] + bias[f0 + f] : out[f];
      }
      if (post != nullptr) (*post)(f0, fn);
    }
  }, unit_align);
}

template <typename A, typename W>
torch::Tensor linear_typed(const torch::Tensor& x, const Packed& w, const c10::optional<torch::Tensor>& bias) {
  const A* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == w.N && bias->scalar_type() == x.scalar_type() && bias->is_contiguous(),
                "linear: bias must be [N] in the activation dtype");
    b = static_cast<const A*>(bias->data_ptr());
  }
  auto y = torch::empty({x.size(0), w.N}, x.options());
  linear_kernel<A, W>(static_cast<const A*>(x.data_ptr()), x.size(0), w.K, static_cast<const W*>(w.data.data_ptr()),
                      w.N, b, static_cast<A*>(y.data_ptr()));
  return y;
}

// fn(A{}, W{}) for the activation type A of x and the weight type W of w (float64 with float64; float32 with
// float32, bfloat16 or float16), after the checks every matrix product makes.
template <typename F>
torch::Tensor with_linear_types(const char* what, const torch::Tensor& x, const Packed& w, F&& fn) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), what, ": x must be [M, K] contiguous");
  TORCH_CHECK(x.size(1) == w.K, what, ": x has ", x.size(1), " inputs, the weights ", w.K);
  const auto wt = w.data.scalar_type();
  if (x.scalar_type() == torch::kDouble) {
    TORCH_CHECK(wt == torch::kDouble, what, ": float64 activations need float64 weights");
    return fn(double{}, double{});
  }
  TORCH_CHECK(x.scalar_type() == torch::kFloat, what, ": activations must be float32 or float64");
  switch (wt) {
    case torch::kFloat: return fn(float{}, float{});
    case torch::kBFloat16: return fn(float{}, c10::BFloat16{});
    case torch::kHalf: return fn(float{}, c10::Half{});
    default: TORCH_CHECK(false, what, ": unsupported weight dtype");
  }
  return {};
}

torch::Tensor linear(const torch::Tensor& x, const Packed& w, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(w.pairs == 0, "linear: weights packed by pack_pairs go to linear_silu");
  return with_linear_types("linear", x, w, [&](auto a, auto b) {
    return linear_typed<decltype(a), decltype(b)>(x, w, bias);
  });
}

// The fused MLP input of the layer loop (fuse, the default): g_fuse_silu off computes the same products, then the
// epilogue in a pass of its own (an A/B of the fusion).  Measured on a 2-core Zen 4, 2026-12-08, whole decode steps
// of SmolLM2-135M, one process alternating, 16 pairs, 48 tokens: fused against the pass of its own, 6 rows -0.47 ms
// (faster in 13 of 16 pairs), 20 rows -0.65 ms (15 of 16), 1 row +0.04 ms (8 of 16): silu_mul read gate and up
// rows that the other thread had written and the weights' stream had evicted.
bool g_fuse_silu = true;

// silu(x W_gate^T) * (x W_up^T) [M, I] over weights packed by pack_pairs: each thread applies the epilogue
// (SiluPairs) to the pairs of panels it has just multiplied.  The same products and the same silu as
// silu_mul(linear(x, pack({gate, up}))), bit for bit.
torch::Tensor linear_silu(const torch::Tensor& x, const Packed& w) {
  TORCH_CHECK(w.pairs > 0, "linear_silu: weights must come from pack_pairs");
  return with_linear_types("linear_silu", x, w, [&](auto a, auto b) {
    using A = decltype(a);
    using W = decltype(b);
    const int64_t M = x.size(0), I = w.pairs, N = 32 * ((I + PANEL - 1) / PANEL);
    auto y = torch::empty({M, N}, x.options());
    auto out = torch::empty({M, I}, x.options());
    const SiluPairs<A> post{y.data_ptr<A>(), out.data_ptr<A>(), M, N, I};
    linear_kernel<A, W>(x.data_ptr<A>(), M, w.K, static_cast<const W*>(w.data.data_ptr()), N, nullptr,
                        y.data_ptr<A>(), g_fuse_silu ? &post : nullptr);
    if (!g_fuse_silu)
      at::parallel_for(0, N / 32, 1, [&](int64_t p0, int64_t p1) { post(p0 * 32, (p1 - p0) * 32); });
    return out;
  });
}

torch::Tensor huge_page_zeros(int64_t numel, const torch::TensorOptions& options);

// rows[n] (K weights, nullptr: zeros) of output feature n, packed in panels (huge-page memory).
template <typename T>
torch::Tensor pack_rows(const std::vector<const T*>& rows, int64_t K, const torch::TensorOptions& options) {
  const int64_t N = static_cast<int64_t>(rows.size()), panels = (N + PANEL - 1) / PANEL;
  const int64_t padded = (panels + MAX_TILE_PANELS - 1) / MAX_TILE_PANELS * MAX_TILE_PANELS;  // whole units
  torch::Tensor data = huge_page_zeros(padded * K * PANEL, options);
  T* out = data.data_ptr<T>();
  // One thread on purpose: pack runs on the thread that loads the model, and a parallel region there would leave
  // an OpenMP pool on it for its life (see native.on_transient_thread): the engine's decode steps 1.5-2x slower.
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t j = 0; j < PANEL && q * PANEL + j < N; ++j) {
      const T* src = rows[q * PANEL + j];
      if (src != nullptr)
        for (int64_t k = 0; k < K; ++k) out[(q * K + k) * PANEL + j] = src[k];
    }
  return data;
}

// The matrices [N_i, K] of one call, concatenated along the output features and packed (huge-page memory).
Packed pack(const std::vector<torch::Tensor>& ws) {
  TORCH_CHECK(!ws.empty(), "pack: no weights");
  Packed p;
  p.K = ws[0].size(1);
  TORCH_CHECK(p.K >= 1, "pack: weights need at least one input");
  const auto wt = ws[0].scalar_type();
  for (const auto& w : ws) {
    TORCH_CHECK(w.dim() == 2 && w.size(1) == p.K && w.is_contiguous() && w.device().is_cpu(),
                "pack: weights must be [N, K] contiguous CPU tensors with one K");
    TORCH_CHECK(w.scalar_type() == wt, "pack: weights of one call share a dtype");
    p.N += w.size(0);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, wt, "pack", [&] {
    std::vector<const scalar_t*> rows;  // W[n] for every output feature n
    for (const auto& w : ws)
      for (int64_t i = 0; i < w.size(0); ++i) rows.push_back(w.data_ptr<scalar_t>() + i * p.K);
    p.data = pack_rows(rows, p.K, ws[0].options());
  });
  return p;
}

// gate, up [I, K] (an MLP's two input matrices) packed for linear_silu: their panels alternate (see Packed::pairs).
Packed pack_pairs(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() && gate.size(0) >= 1 && gate.size(1) >= 1,
              "pack_pairs: gate and up must be [I, K] of one shape");
  TORCH_CHECK(gate.is_contiguous() && up.is_contiguous() && gate.device().is_cpu() && up.device().is_cpu() &&
                  gate.scalar_type() == up.scalar_type(),
              "pack_pairs: contiguous CPU tensors of one dtype");
  Packed p;
  p.K = gate.size(1);
  p.pairs = gate.size(0);
  p.N = 2 * p.pairs;
  const int64_t I = p.pairs, P = (I + PANEL - 1) / PANEL;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "pack_pairs", [&] {
    std::vector<const scalar_t*> rows(2 * P * PANEL, nullptr);  // nullptr: a zero feature
    for (int64_t i = 0; i < I; ++i) {
      rows[(2 * (i / PANEL)) * PANEL + i % PANEL] = gate.data_ptr<scalar_t>() + i * p.K;
      rows[(2 * (i / PANEL) + 1) * PANEL + i % PANEL] = up.data_ptr<scalar_t>() + i * p.K;
    }
    p.data = pack_rows(rows, p.K, gate.options());
  });
  return p;
}

// ------------------------------------------------------------------------------------------ vector helpers
// exp over n values in place (the vector code for full blocks of 16, the scalar definition for the rest: same bits).
template <typename A>
inline void exp_inplace(A* v, int64_t n) {
  int64_t i = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      for (; i + LANES <= n; i += LANES) vstore(v + i, exp_det(vload(v + i)));
      if (i < n) {  // the last n - i values: the lanes past them load as 0 and are not stored
        const M16 m = vfirst(n - i);
        vstore(v + i, exp_det(vload(v + i, m)), m);
        i = n;
      }
    }
  }
#endif
  for (; i < n; ++i) v[i] = exp_det(v[i]);
}

// acc[d] = fma(s, v[d], acc[d]) for d < D (lane-wise: vectorizing over d keeps each lane's order).
template <typename A>
inline void axpy(A s, const A* v, A* acc, int64_t D) {
  int64_t d = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      const V16 sv = vset1(s);
      for (; d + LANES <= D; d += LANES) vstore(acc + d, vfma(sv, vload(v + d), vload(acc + d)));
    }
  }
#endif
  for (; d < D; ++d) acc[d] = std::fma(s, v[d], acc[d]);
}

template <typename A>
inline A dot_same(const A* x, const A* w, int64_t K) {
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      V16 acc = vzero();
      int64_t k = 0;
      for (; k + LANES <= K; k += LANES) acc = vfma(vload(x + k), vload(w + k), acc);
      if (k < K) {
        const M16 m = vfirst(K - k);
        acc = vfma(vload(x + k, m), vload(w + k, m), acc, m);
      }
      return hsum_tree(acc);
    }
  }
#endif
  return dot_ref<A>(x, w, K);
}

// ------------------------------------------------------------------------------------------ rms norm
// y = w * (x * (1 / sqrt(dot(x, x) / K + eps)));  with `add`, first h += add (in place).
template <typename A>
void rmsnorm_kernel(A* h, const A* add, const A* w, A* y, int64_t M, int64_t K, double eps) {
  at::parallel_for(0, M, std::max<int64_t>(1, MIN_TASK_WORK / std::max<int64_t>(1, K)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      A* hr = h + r * K;
      if (add != nullptr)
        for (int64_t k = 0; k < K; ++k) hr[k] = hr[k] + add[r * K + k];
      A var = dot_same<A>(hr, hr, K) / A(K);
      A inv = A(1) / std::sqrt(var + A(eps));
      for (int64_t k = 0; k < K; ++k) y[r * K + k] = w[k] * (hr[k] * inv);
    }
  });
}

torch::Tensor rmsnorm(torch::Tensor h, const c10::optional<torch::Tensor>& add, const torch::Tensor& w, double eps) {
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous() && w.is_contiguous() && w.numel() == h.size(1), "rmsnorm: shapes");
  TORCH_CHECK(w.scalar_type() == h.scalar_type(), "rmsnorm: weight dtype must match");
  if (add.has_value()) TORCH_CHECK(add->sizes() == h.sizes() && add->is_contiguous() && add->scalar_type() == h.scalar_type(),
                                   "rmsnorm: add must match h");
  auto y = torch::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "rmsnorm", [&] {
    rmsnorm_kernel<scalar_t>(h.data_ptr<scalar_t>(), add.has_value() ? add->data_ptr<scalar_t>() : nullptr,
                             w.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), h.size(0), h.size(1), eps);
  });
  return y;
}

// ------------------------------------------------------------------------------------------ silu * up
// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n, e: n values of scratch.
template <typename A>
inline void silu_times(const A* g, const A* u, A* out, int64_t n, A* e) {
  for (int64_t i = 0; i < n; ++i) e[i] = -g[i];
  exp_inplace<A>(e, n);
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (A(1) + e[i]) * u[i];
}

template <typename A>
void SiluPairs<A>::operator()(int64_t f0, int64_t fn) const {
  alignas(64) A e[PANEL];
  for (int64_t r = 0; r < M; ++r)
    for (int64_t p = f0 / 32; p < (f0 + fn) / 32 && PANEL * p < I; ++p)
      silu_times<A>(y + r * N + 32 * p, y + r * N + 32 * p + PANEL, out + r * I + PANEL * p,
                    std::min<int64_t>(PANEL, I - PANEL * p), e);
}

// gu [M, 2I] = [gate | up] -> gate / (1 + exp(-gate)) * up
torch::Tensor silu_mul(const torch::Tensor& gu) {
  TORCH_CHECK(gu.dim() == 2 && gu.is_contiguous() && gu.size(1) % 2 == 0, "silu_mul: gu must be [M, 2I]");
  const int64_t M = gu.size(0), I = gu.size(1) / 2;
  auto y = torch::empty({M, I}, gu.options());
  AT_DISPATCH_FLOATING_TYPES(gu.scalar_type(), "silu_mul", [&] {
    const scalar_t* g = gu.data_ptr<scalar_t>();
    scalar_t* out = y.data_ptr<scalar_t>();
    at::parallel_for(0, M, std::max<int64_t>(1, MIN_TASK_WORK / std::max<int64_t>(1, 8 * I)), [&](int64_t r0, int64_t r1) {
      std::vector<scalar_t> e(I);
      for (int64_t r = r0; r < r1; ++r)
        silu_times<scalar_t>(g + r * 2 * I, g + r * 2 * I + I, out + r * I, I, e.data());
    });
  });
  return y;
}

// ------------------------------------------------------------------------------------------ attention
// RoPE as transformers: out_i = x_i * cos_i + rotate_half(x)_i * sin_i (no fused multiply-add).
template <typename A>
inline void rope(const A* x, const A* c, const A* s, A* out, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) out[i] = x[i] * c[i] + (-x[i + h]) * s[i];
  for (int64_t i = h; i < D; ++i) out[i] = x[i] * c[i] + x[i - h] * s[i];
}

template <typename A>
struct AttnArgs {
  const A* qkv; const A* cos; const A* sin; A* kc; A* vc; const int64_t* starts; A* out;
  int64_t B, T, Hq, Hkv, D, length, sk0, sk1, sk2, sv0, sv1, sv2;
  A scale;
  // prefix segments held by reference (row b: seg[seg_off[b] .. seg_off[b+1]) of (address, tokens)), each a
  // contiguous [layers, 2, Hkv, tokens, D] tensor; this call is layer `layer`
  const int64_t* seg; const int64_t* seg_off; int64_t layer;
};

// A KV piece: keys at k (row stride ks), values at v (row stride vs), n tokens.
template <typename A>
struct Piece { const A* k; const A* v; int64_t ks, vs, n; };

template <typename A>
void write_kv_and_rope_q(const AttnArgs<A>& a, A* qrot) {
  const int64_t M = a.B * a.T, W = (a.Hq + 2 * a.Hkv) * a.D;
  at::parallel_for(0, M, std::max<int64_t>(16, MIN_TASK_WORK / std::max<int64_t>(1, W)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t b = m / a.T, col = a.length + m % a.T;
      const A* row = a.qkv + m * W;
      const A* c = a.cos + m * a.D;
      const A* s = a.sin + m * a.D;
      for (int64_t h = 0; h < a.Hq; ++h) rope(row + h * a.D, c, s, qrot + (m * a.Hq + h) * a.D, a.D);
      for (int64_t h = 0; h < a.Hkv; ++h) {
        rope(row + (a.Hq + h) * a.D, c, s, a.kc + b * a.sk0 + h * a.sk1 + col * a.sk2, a.D);
        std::memcpy(a.vc + b * a.sv0 + h * a.sv1 + col * a.sv2, row + (a.Hq + a.Hkv + h) * a.D, a.D * sizeof(A));
      }
    }
  });
}

// Rows of KV (keys or values) to prefetch into L2, a few at a time: `left` rows of `bytes` each, `stride` bytes apart.
struct RowStream {
  const char* p = nullptr;
  int64_t stride = 0, left = 0, bytes = 0;
  void rows(int64_t n) {
    for (; n > 0 && left > 0; --n, --left, p += stride) {
#if FR_VEC
      for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
#endif
    }
  }
};

// n rows of D elements at p, `stride` elements apart.
template <typename A>
RowStream row_stream(const A* p, int64_t stride, int64_t n, int64_t D) {
  const int64_t size = static_cast<int64_t>(sizeof(A));
  return {reinterpret_cast<const char*>(p), stride * size, n, D * size};
}

// Rows of several KV pieces prefetched into L2 piece after piece: pace(calls) spreads them evenly over `calls` calls
// of step() (all at once when there are none).  At most MAX pieces (more are left to the hardware: speed only).
struct PieceStream {
  static constexpr int MAX = 16;
  RowStream part[MAX];
  int n = 0, cur = 0;
  int64_t total = 0, rate = 0;
  void add(RowStream r) {
    if (n < MAX && r.left > 0) { part[n++] = r; total += r.left; }
  }
  void rows(int64_t k) {
    for (; k > 0 && cur < n; cur += part[cur].left == 0) {
      const int64_t before = part[cur].left;
      part[cur].rows(k);
      k -= before - part[cur].left;
    }
  }
  void pace(int64_t calls) {
    rate = calls > 0 ? (total + calls - 1) / calls : 0;
    if (calls <= 0) rows(total);
  }
  void step() { rows(rate); }
};

// What one attention task prefetches while it computes its scores, spread evenly over its blocks of SCORE_KEYS keys:
// the values of its tokens' own buffer columns (read by the weighted sum right after) and the keys of the buffer
// columns of the tokens of the thread's next task.  Prefix segments are left out: the rows that share one read it in
// turn, so it stays in cache.  (Measured on Zen 4, 2026-12-02: 20 rows with a 74-token shared prefix and 64 own
// tokens, 30 layers' attention 8.2 -> 5.6 ms, the whole forward 40.0 -> 37.0 ms, prefetching one token's columns
// per task; an earlier variant that prefetched the segments too gained less.  2026-12-07, all the task's tokens'
// columns instead of the first's (a unit of rows sharing a prompt has up to SHARED_ROWS), `scripts/kernel_ab --base
// baa73d1` (both builds in one process, alternating): 20 rows 5.35 -> 4.43 ms (faster in 10 of 10 pairs), 6 rows
// 1.84 -> 1.63 ms (9 of 10); 1 row unchanged (6 of 20).  Prefetching the segments too, the next task's values too,
// or every task's columns at the start gained nothing or lost, in 20 pairs each.)
struct AttnPrefetch {
  PieceStream values, next_keys;
  void pace(int64_t blocks) { values.pace(blocks); next_keys.pace(blocks); }
  void rows() { values.step(); next_keys.step(); }
};

// scores[i][c] = dot(q_i, k_c) for Q queries (query heads, of one or several tokens, that share these keys) and keys
// c < n, query i's scores at sc[i]: the same dot as everywhere (a query is a "row", a key an "output feature" of the
// linear tile).  A block of keys is read once for all the queries.
template <typename A>
void scores_block(const A* const* q, const int64_t Q, const A* kb, int64_t kstride, int64_t n, int64_t D,
                  A* const* sc, AttnPrefetch& pf) {
  int64_t c0 = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable && D % LANES == 0)
      for (; c0 + SCORE_KEYS <= n; c0 += SCORE_KEYS) {
        pf.rows();
        for (int64_t i = 0; i < Q; ++i) {
#if FR_AVX512
          if (kstride == D && D == 64) { score_keys_packed<4>(q[i], kb + c0 * kstride, sc[i] + c0); continue; }
          if (kstride == D && D == 128) { score_keys_packed<8>(q[i], kb + c0 * kstride, sc[i] + c0); continue; }
#endif
          score_keys(q[i], kb + c0 * kstride, kstride, D, sc[i] + c0);
        }
      }
  }
#endif
  for (; c0 < n; ++c0)
    for (int64_t i = 0; i < Q; ++i) sc[i][c0] = dot_same<A>(q[i], kb + c0 * kstride, D);
}

// acc[i][d] = fma(e[i][c], v_c[d], acc[i][d]) for c = 0 .. n-1 in order, continuing from acc: the weighted values of
// Q queries that share these values (e[i]: query i's weights of this piece); keys held in several pieces are
// accumulated piece after piece.  The vector code keeps a block of WV_HEADS queries x WV_VECS * 16 values in
// registers (AVX-512: 4 x 64, AVX2: 2 x 32).
#if FR_VEC
constexpr int WV_HEADS = FR_AVX512 ? 4 : 2, WV_VECS = FR_AVX512 ? 4 : 2;
template <int GN, int DN>
inline void wv_block(const float* const* e, int64_t n, const float* vb, int64_t vstride, float* const* acc,
                     int64_t d0) {
  V16 r[GN][DN];
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < DN; ++j) r[g][j] = vload(acc[g] + d0 + 16 * j);
  for (int64_t c = 0; c < n; ++c) {
    V16 v[DN];
    for (int j = 0; j < DN; ++j) v[j] = vload(vb + c * vstride + d0 + 16 * j);
    for (int g = 0; g < GN; ++g) {
      const V16 w = vset1(e[g][c]);
      for (int j = 0; j < DN; ++j) r[g][j] = vfma(w, v[j], r[g][j]);
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < DN; ++j) vstore(acc[g] + d0 + 16 * j, r[g][j]);
}

template <int GN>
inline void wv_rows(const float* const* e, int64_t n, const float* vb, int64_t vstride, float* const* acc, int64_t d0,
                    int dn) {
  switch (dn) {
    case 4: wv_block<GN, 4>(e, n, vb, vstride, acc, d0); break;
    case 3: wv_block<GN, 3>(e, n, vb, vstride, acc, d0); break;
    case 2: wv_block<GN, 2>(e, n, vb, vstride, acc, d0); break;
    default: wv_block<GN, 1>(e, n, vb, vstride, acc, d0); break;
  }
}
#endif

template <typename A>
void weighted_values(const A* const* e, A* const* acc, int64_t Q, int64_t n, const A* vb, int64_t vstride, int64_t D) {
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable && D % LANES == 0) {
      for (int64_t i0 = 0; i0 < Q; i0 += WV_HEADS)
        for (int64_t d0 = 0; d0 < D; d0 += WV_VECS * LANES) {
          const int dn = static_cast<int>(std::min<int64_t>(WV_VECS, (D - d0) / LANES));
          switch (std::min<int64_t>(WV_HEADS, Q - i0)) {
            case 4: wv_rows<4>(e + i0, n, vb, vstride, acc + i0, d0, dn); break;
            case 3: wv_rows<3>(e + i0, n, vb, vstride, acc + i0, d0, dn); break;
            case 2: wv_rows<2>(e + i0, n, vb, vstride, acc + i0, d0, dn); break;
            default: wv_rows<1>(e + i0, n, vb, vstride, acc + i0, d0, dn); break;
          }
        }
      return;
    }
  }
#endif
  for (int64_t c = 0; c < n; ++c)
    for (int64_t i = 0; i < Q; ++i)
      for (int64_t d = 0; d < D; ++d) acc[i][d] = std::fma(e[i][c], vb[c * vstride + d], acc[i][d]);
}

// s[c] <- exp(s[c] * scale - max_c(s[c] * scale)) in place; returns the denominator: blocks of 16 summed by
// tree16 (in A), the blocks accumulated in double, in order (the max is exact in any order).
template <typename A>
double softmax_numerators(A* s, int64_t n, A scale) {
  A mx = -std::numeric_limits<A>::infinity();
  int64_t c = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      V16 mv = vset1(mx);
      const V16 sv = vset1(scale);
      for (; c + LANES <= n; c += LANES) {
        const V16 v = vmul(vload(s + c), sv);
        vstore(s + c, v);
        mv = vmax(mv, v);
      }
      mx = vmax_lanes(mv);
    }
  }
#endif
  for (; c < n; ++c) {
    s[c] = s[c] * scale;
    mx = std::max(mx, s[c]);
  }
  for (c = 0; c < n; ++c) s[c] = s[c] - mx;
  exp_inplace<A>(s, n);
  double sum = 0.0;
  c = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable)
      for (; c + LANES <= n; c += LANES) sum += double(hsum_tree(vload(s + c)));
  }
#endif
  for (; c < n; c += LANES) sum += block_sum<A>(s + c, std::min<int64_t>(LANES, n - c));
  return sum;
}

// One thread's scratch for its attention tasks (kept from task to task).
template <typename A>
struct AttnScratch {
  std::vector<A> sc, acc;
  std::vector<double> sums;
  std::vector<int64_t> keys;                 // per token: its keys
  std::vector<const A*> q, e;                // per query: its q; its weights of the piece at hand
  std::vector<A*> s, t, o;                   // per query: its scores; a piece's scores; its accumulators
  std::vector<std::vector<Piece<A>>> pieces; // per token: its keys' pieces, in order
};

// The G query heads of R tokens and one KV head, each token over its own keys (s.pieces[r], in order):
// softmax(q.k * scale) v, token r's heads from q[r] (consecutive, stride D) to out[r].  The keys all R tokens share
// (the leading pieces that are the same prefix segments, then the first keys of the next piece where every token has
// one over the same memory) are read once for all R x G queries.  Each query's operations are those of its token
// attended alone, in the same order (the loops only visit the queries in another order): the same bits.
template <typename A>
void attend_tokens(const AttnArgs<A>& a, const A* const* q, int64_t R, int64_t G, A* const* out, AttnScratch<A>& s,
                   AttnPrefetch& pf) {
  const int64_t D = a.D, Q = R * G;
  // Leading pieces that are the same memory for all R tokens (the prefix segments they share); a token's last
  // piece, its own buffer columns, never is.
  size_t shared = 0;
  if (R > 1)
    for (bool same = true; same && shared + 1 < s.pieces[0].size(); shared += same) {
      const Piece<A>& p = s.pieces[0][shared];
      for (int64_t r = 1; r < R && same; ++r)
        same = shared + 1 < s.pieces[r].size() && s.pieces[r][shared].k == p.k && s.pieces[r][shared].n == p.n;
    }
  // Then the piece at `shared`, where every token has one over the same keys (a prompt's tokens: their row's
  // columns, as many as each token's position allows), is shared up to the shortest.
  int64_t common = 0;
  if (R > 1) {
    const Piece<A>& p = s.pieces[0][shared];
    common = p.n;
    for (int64_t r = 1; r < R && common > 0; ++r) {
      const Piece<A>& x = s.pieces[r][shared];
      common = x.k == p.k && x.v == p.v && x.ks == p.ks && x.vs == p.vs ? std::min(common, x.n) : 0;
    }
  }
  s.keys.assign(R, 0);
  int64_t total = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (const auto& p : s.pieces[r]) s.keys[r] += p.n;
    total += G * s.keys[r];
  }
  s.sc.resize(total);
  s.acc.assign(Q * D, A(0));
  s.sums.assign(Q, 0.0);
  s.q.resize(Q); s.e.resize(Q); s.s.resize(Q); s.t.resize(Q); s.o.resize(Q);
  for (int64_t r = 0, base = 0; r < R; base += G * s.keys[r], ++r)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t i = r * G + g;
      s.q[i] = q[r] + g * D;
      s.s[i] = s.sc.data() + base + g * s.keys[r];
      s.o[i] = s.acc.data() + i * D;
    }
  // Every key once, in each query's order: the shared pieces (and the first `common` keys of the next) for all Q
  // queries, then each token's own for its G; fn(piece, first query, queries, the piece's offset in their scores).
  const auto each_piece = [&](auto&& fn) {
    int64_t off = 0;
    for (size_t j = 0; j < shared; off += s.pieces[0][j++].n) fn(s.pieces[0][j], int64_t(0), Q, off);
    if (common > 0) {
      Piece<A> p = s.pieces[0][shared];
      p.n = common;
      fn(p, int64_t(0), Q, off);
      off += common;
    }
    for (int64_t r = 0; r < R; ++r)
      for (size_t j = shared, o = off; j < s.pieces[r].size(); ++j) {
        Piece<A> p = s.pieces[r][j];
        if (j == shared) {  // less the keys read above
          p.k += common * p.ks;
          p.v += common * p.vs;
          p.n -= common;
        }
        if (p.n > 0) fn(p, r * G, G, static_cast<int64_t>(o));
        o += p.n;
      }
  };
  int64_t blocks = 0;  // the calls of pf.rows() in the scores below
#if FR_VEC
  if (std::is_same<A, float>::value && !g_portable && D % LANES == 0)
    each_piece([&](const Piece<A>& p, int64_t, int64_t, int64_t) { blocks += p.n / SCORE_KEYS; });
#endif
  pf.pace(blocks);
  each_piece([&](const Piece<A>& p, int64_t i0, int64_t n, int64_t off) {
    for (int64_t i = i0; i < i0 + n; ++i) s.t[i] = s.s[i] + off;
    scores_block<A>(s.q.data() + i0, n, p.k, p.ks, p.n, D, s.t.data() + i0, pf);
  });
  for (int64_t i = 0; i < Q; ++i) s.sums[i] = softmax_numerators<A>(s.s[i], s.keys[i / G], a.scale);
  each_piece([&](const Piece<A>& p, int64_t i0, int64_t n, int64_t off) {
    for (int64_t i = i0; i < i0 + n; ++i) s.e[i] = s.s[i] + off;
    weighted_values<A>(s.e.data() + i0, s.o.data() + i0, n, p.n, p.v, p.vs, D);
  });
  for (int64_t i = 0; i < Q; ++i) {
    const A denom = A(s.sums[i]);
    // query i is head i % G of the KV head's group of token i / G: out rows are consecutive heads
    A* o = out[i / G] + (i % G) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = s.o[i][d] / denom;
  }
}

// Row b's buffer columns [starts[b], length + j] for KV head hk and query j (0-based among the T new tokens).
template <typename A>
Piece<A> buffer_piece(const AttnArgs<A>& a, int64_t b, int64_t hk, int64_t j) {
  const int64_t start = a.starts[b], end = a.length + j + 1;
  return {a.kc + b * a.sk0 + hk * a.sk1 + start * a.sk2, a.vc + b * a.sv0 + hk * a.sv1 + start * a.sv2, a.sk2, a.sv2,
          end - start};
}

// Row b's keys for KV head hk and query j: its prefix segments, then its buffer columns.
template <typename A>
void row_pieces(const AttnArgs<A>& a, int64_t b, int64_t hk, int64_t j, std::vector<Piece<A>>& pieces) {
  pieces.clear();
  if (a.seg_off != nullptr)
    for (int64_t s = a.seg_off[b]; s < a.seg_off[b + 1]; ++s) {
      const A* base = reinterpret_cast<const A*>(a.seg[2 * s]);
      const int64_t n = a.seg[2 * s + 1];
      pieces.push_back({base + ((a.layer * 2 + 0) * a.Hkv + hk) * n * a.D,
                        base + ((a.layer * 2 + 1) * a.Hkv + hk) * n * a.D, a.D, a.D, n});
    }
  pieces.push_back(buffer_piece(a, b, hk, j));
}

// Keys the queries of one call attend to, summed over its B x T tokens: each row's prefix segments and its buffer
// columns (query j of row b: starts[b] .. length + j).
template <typename A>
int64_t attended_keys(const AttnArgs<A>& a) {
  int64_t keys = 0;
  for (int64_t b = 0; b < a.B; ++b) {
    int64_t prefix = 0;
    if (a.seg_off != nullptr)
      for (int64_t s = a.seg_off[b]; s < a.seg_off[b + 1]; ++s) prefix += a.seg[2 * s + 1];
    keys += a.T * (prefix + a.length - a.starts[b]) + a.T * (a.T + 1) / 2;
  }
  return keys;
}

// Rows decoding after one shared prefix segment read it together: at most this many rows per task.
constexpr int64_t SHARED_ROWS = 4;
static_assert(SHARED_ROWS <= PieceStream::MAX, "a task prefetches the columns of each of its rows");
// A prompt's consecutive tokens read the keys they share together: at most this many tokens per task.  Measured
// 2026-12-06 on a 2-core Zen 4, one row's prompt of 2023 / 500 tokens, 6 layers' attention (2 alternating processes,
// GFMA/s): one token per task 31.9 / 25.0-31.5, 4 tokens 45.1-46.4 / 32.4-36.8, 16 tokens 44.8-51.5 / 42.1-44.8;
// the whole 2023-token prefill 4.28-4.52 -> 3.63-3.82 s (4 tokens), 3.55-3.72 s (16).
constexpr int64_t PROMPT_UNIT_TOKENS = 16;

// The units of tokens attended together, one task per unit and KV head: unit u is the tokens order[unit[u] ..
// unit[u + 1]).  A prompt's tokens (T > 1) form units of up to PROMPT_UNIT_TOKENS consecutive tokens of one row, as
// even as possible, which read the keys they share (the row's segments and columns up to the unit's first token)
// once.  In decode steps (T = 1) with prefix segments, rows whose first segment is the same tensor (rows forked from
// one cached prompt) form units of up to SHARED_ROWS rows, as even as possible, that read the leading segments they
// share once instead of once per row (ordered by their segment lists, rows forked from one node of a deeper tree sit
// side by side).  Otherwise a unit is one token.
template <typename A>
void token_units(const AttnArgs<A>& a, std::vector<int64_t>& order, std::vector<int64_t>& unit) {
  const int64_t M = a.B * a.T;
  order.resize(M);
  for (int64_t m = 0; m < M; ++m) order[m] = m;
  unit.clear();
  if (a.T > 1) {  // a prompt's tokens: runs of consecutive tokens of one row share its keys
    const int64_t parts = (a.T + PROMPT_UNIT_TOKENS - 1) / PROMPT_UNIT_TOKENS;
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t p = 0; p < parts; ++p) unit.push_back(b * a.T + p * a.T / parts);
    unit.push_back(M);
    return;
  }
  if (a.seg_off == nullptr) {
    for (int64_t m = 0; m <= M; ++m) unit.push_back(m);
    return;
  }
  const auto first = [&a](int64_t b) {  // (address, tokens) of row b's first segment, (0, 0) without one
    const int64_t s = a.seg_off[b];
    return s < a.seg_off[b + 1] ? std::make_pair(a.seg[2 * s], a.seg[2 * s + 1]) : std::make_pair(int64_t(0), int64_t(0));
  };
  // rows in the order of their segment lists: rows that share more segments than the first end up side by side
  const auto before = [&a](int64_t x, int64_t y) {
    return std::lexicographical_compare(a.seg + 2 * a.seg_off[x], a.seg + 2 * a.seg_off[x + 1],
                                        a.seg + 2 * a.seg_off[y], a.seg + 2 * a.seg_off[y + 1]);
  };
  std::stable_sort(order.begin(), order.end(), before);
  for (int64_t i = 0; i < M;) {
    int64_t j = i + 1;
    if (first(order[i]).first != 0)
      while (j < M && first(order[j]) == first(order[i])) ++j;
    const int64_t parts = (j - i + SHARED_ROWS - 1) / SHARED_ROWS;
    for (int64_t p = 0; p < parts; ++p) unit.push_back(i + p * (j - i) / parts);
    i = j;
  }
  unit.push_back(M);
}

// Tasks are (unit of tokens, query head) pairs, split between the threads in contiguous runs; a thread attends the
// heads of its run that share a KV head together, so it reads that KV head's keys and values once (only the KV heads
// at the runs' ends are read by two threads).  The work, which sets the grain of the split, counts the keys the
// tokens actually read, prefix segments included (a row decoding after a cached prompt reads its prompt from a
// segment and has few buffer columns; counting only those ran the attention of up to 6 such rows on one thread).
// Measured on a 2-core Zen 4, decode steps after a cached prompt, alternating pairs:
//   2026-12-06 00:00, buffer columns only -> all keys, 15 pairs: 2018-token prompt 1 / 2 / 6 rows 24.7 -> 22.7,
//   26.5 -> 23.2, 36.3 -> 30.0 ms (15, 15, 14 pairs faster); 74-token prompt 18.2 -> 18.1, 17.8 -> 17.4, 19.7 ->
//   19.3 (10, 8, 13).  One task per query head, each reading its KV head alone, lost: 1 row at 2018 tokens 15.9 ->
//   17.9 ms (0 of 15).
//   2026-12-06 03:00, this split with units of rows sharing a segment and score_keys_packed (against a692085: one
//   task per token and KV head), the 30 layers' attention of one decode step alone, 32 own tokens per row, medians of
//   15 calls, 3 alternating processes each: 2018-token segment 1 / 6 / 20 rows 5.0-7.2 -> 4.6-5.4, 11.1-21.4 ->
//   9.3-9.4, 27.0-34.3 -> 20.6-20.9 ms; 74-token segment 6 / 20 rows 0.60-0.82 -> 0.56-0.80, 1.72-2.53 -> 1.69-1.73.
//   Whole decode steps (6 alternating processes, medians): 2018-token prompt 1 / 6 / 20 rows 21.8 -> 20.6, 30.0 ->
//   27.1, 61.5 -> 56.7 ms (4, 6, 4 of 6 faster); 74-token prompt within the VM's noise (14.7 -> 13.5, 16.8 -> 15.3,
//   34.2 -> 34.7).
template <typename A>
void attention_kernel(const AttnArgs<A>& a) {
  const int64_t M = a.B * a.T, groups = a.Hq / a.Hkv;
  std::vector<A> qrot(M * a.Hq * a.D);
  write_kv_and_rope_q(a, qrot.data());
  std::vector<int64_t> order, unit;
  token_units(a, order, unit);
  const int64_t units = static_cast<int64_t>(unit.size()) - 1, tasks = units * a.Hq;
  const int64_t work = std::max<int64_t>(1, 2 * a.D * attended_keys(a) / std::max<int64_t>(1, units));
  // A decode step's tasks are split between the threads however little their multiply-adds (a step's attention
  // waits on its KV rows, and two cores fetch them sooner than one; with the grain below, one row after a short
  // prompt ran on one thread).  Measured with exp_inplace's vector tail, `scripts/kernel_ab --step` on a 2-core Zen 4,
  // 2026-12-08, 16 pairs, 48 tokens: 1 / 6 / 20 rows faster in 9 / 13 / 12 pairs, 20 rows 35.2 -> 34.7 ms.
  at::parallel_for(0, tasks, a.T == 1 ? 1 : std::max<int64_t>(1, MIN_TASK_WORK / work), [&](int64_t t0, int64_t t1) {
    AttnScratch<A> s;
    std::vector<const A*> q;
    std::vector<A*> out;
    for (int64_t t = t0; t < t1;) {
      // this thread's query heads of one unit and one KV head: read its keys and values once for all of them
      const int64_t u = t / a.Hq, h = t % a.Hq, hk = h / groups, R = unit[u + 1] - unit[u];
      const int64_t G = std::min((hk + 1) * groups - h, t1 - t);
      q.resize(R);
      out.resize(R);
      if (static_cast<int64_t>(s.pieces.size()) < R) s.pieces.resize(R);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t m = order[unit[u] + r];
        q[r] = qrot.data() + (m * a.Hq + h) * a.D;
        out[r] = a.out + (m * a.Hq + h) * a.D;
        row_pieces<A>(a, m / a.T, hk, m % a.T, s.pieces[r]);
      }
      // A unit's tokens are rows of their own (decode) or consecutive tokens of one row, whose pieces start at the
      // same column: then only the last (longest) is prefetched.
      AttnPrefetch pf;
      for (int64_t r = 0; r < R; ++r) {
        const Piece<A>& own = s.pieces[r].back();
        if (r + 1 < R && s.pieces[r + 1].back().v == own.v) continue;
        pf.values.add(row_stream(own.v, own.vs, own.n, a.D));
      }
      if (t + G < t1) {
        const int64_t u1 = (t + G) / a.Hq, hk1 = (t + G) % a.Hq / groups;
        for (int64_t i = unit[u1]; i < unit[u1 + 1]; ++i) {
          const int64_t m1 = order[i];
          const Piece<A> next = buffer_piece(a, m1 / a.T, hk1, m1 % a.T);
          if (i + 1 < unit[u1 + 1] && order[i + 1] / a.T == m1 / a.T) continue;
          pf.next_keys.add(row_stream(next.k, next.ks, next.n, a.D));
        }
      }
      attend_tokens<A>(a, q.data(), R, G, out.data(), s, pf);
      t += G;
    }
  });
}

// qkv [B*T, (Hq + 2 Hkv) D] (q | k | v, before RoPE); cos, sin [B*T, D]; kc, vc [B, Hkv, cap, D] (views);
// starts [B]: row b's first valid column; the T new tokens of row b go to columns length .. length+T-1.
// seg [S, 2] int64 (address, tokens) and seg_off [B + 1]: prefix segments read before the buffer columns
// (contiguous [layers, 2, Hkv, tokens, D] tensors the caller keeps alive); empty seg_off: none.
torch::Tensor attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor kc,
                        torch::Tensor vc, const torch::Tensor& starts, int64_t length, int64_t T, int64_t Hq,
                        int64_t Hkv, double scale, const torch::Tensor& seg, const torch::Tensor& seg_off,
                        int64_t layer) {
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous(), "attention: inputs contiguous");
  TORCH_CHECK(kc.dim() == 4 && vc.dim() == 4 && kc.stride(3) == 1 && vc.stride(3) == 1, "attention: cache layout");
  TORCH_CHECK(starts.scalar_type() == torch::kLong && starts.is_contiguous(), "attention: starts int64");
  const int64_t B = kc.size(0), D = kc.size(3);
  TORCH_CHECK(Hkv >= 1 && Hq >= 1 && T >= 0 && length >= 0 && Hq % Hkv == 0,
              "attention: Hq a positive multiple of Hkv >= 1, T >= 0, length >= 0");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == B * T && qkv.size(1) == (Hq + 2 * Hkv) * D, "attention: qkv shape");
  TORCH_CHECK(kc.size(1) == Hkv && vc.size(0) == B && vc.size(1) == Hkv && vc.size(3) == D,
              "attention: kc and vc [B, Hkv, cap, D]");
  TORCH_CHECK(cos.numel() == B * T * D && sin.numel() == B * T * D, "attention: cos and sin [B * T, D]");
  TORCH_CHECK(length + T <= kc.size(2) && length + T <= vc.size(2) && starts.numel() == B, "attention: cache too small");
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(starts.data_ptr<int64_t>()[b] >= 0 && starts.data_ptr<int64_t>()[b] <= length,
                "attention: starts[", b, "] outside [0, length]");
  const bool segmented = seg_off.numel() > 0;
  TORCH_CHECK(!segmented || (seg_off.numel() == B + 1 && seg_off.scalar_type() == torch::kLong &&
                             seg.scalar_type() == torch::kLong && seg.is_contiguous() && seg_off.is_contiguous()),
              "attention: seg [S, 2] and seg_off [B + 1] int64");
  auto out = torch::empty({B * T, Hq * D}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "attention", [&] {
    AttnArgs<scalar_t> a{qkv.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(),
                         kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), starts.data_ptr<int64_t>(),
                         out.data_ptr<scalar_t>(), B, T, Hq, Hkv, D, length, kc.stride(0), kc.stride(1), kc.stride(2),
                         vc.stride(0), vc.stride(1), vc.stride(2), scalar_t(scale),
                         segmented ? seg.data_ptr<int64_t>() : nullptr,
                         segmented ? seg_off.data_ptr<int64_t>() : nullptr, layer};
    attention_kernel<scalar_t>(a);
  });
  return out;
}

// ------------------------------------------------------------------------------------------ vocabulary

// Per row: max m, log S with S = sum exp(l - m), H = log S - sum e (l - m) / S, all finite (m = +0 when the
// largest logit is a zero of either sign; a row with a NaN or an infinity: finite = false, m, log S, H NaN).
template <typename A>
void stats_row(const A* l, int64_t V, A& m, double& log_s, double& ent, bool& finite) {
  m = -std::numeric_limits<A>::infinity();
  finite = true;
  int64_t c0 = 0;
  double s = 0.0, sd = 0.0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      V16 mv = vset1(m);
      M16 bad = vfirst(0);  // no lane yet
      for (; c0 + LANES <= V; c0 += LANES) {
        const V16 v = vload(l + c0);
        bad = vor(bad, vnonfinite(v));
        mv = vmax(mv, v);
      }
      m = vmax_lanes(mv);
      finite = !vany(bad);
    }
  }
#endif
  for (; c0 < V; ++c0) {
    finite = finite && std::isfinite(l[c0]);
    m = std::max(m, l[c0]);
  }
  if (!finite) {  // defined outputs (the vector and scalar max disagree over NaN): the caller skips the row
    m = std::numeric_limits<A>::quiet_NaN();
    log_s = ent = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  // A max of signed zeros is +0: max() keeps the first of two equal values, and the vector code (lane-wise, then
  // across lanes) sees -0 and +0 in another order than the scalar loop; -0 + +0 = +0 in both.
  m = m + A(0);
  c0 = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable) {
      const V16 mv = vset1(m);
      // 16 blocks at a time: their trees summed together (hsum16), then accumulated in order (the same bits).
      // `scripts/kernel_ab --step` on a 2-core Zen 4, 2026-12-08 (with draw_row's), 16 pairs, 48 tokens: 20 rows
      // 32.19 -> 31.91 ms, faster in 16 of 16 pairs (1 / 6 rows: 9 / 5 of 16, within the noise).
      for (; c0 + 16 * LANES <= V; c0 += 16 * LANES) {
        V16 e[16], ed[16];
        for (int j = 0; j < 16; ++j) {
          const V16 d = vsub(vload(l + c0 + j * LANES), mv);
          e[j] = exp_det(d);
          ed[j] = vselect(vgreater(e[j], vzero()), vmul(e[j], d), vzero());  // see below
        }
        alignas(64) float se[16], sed[16];
        hsum16(e, se);
        hsum16(ed, sed);
        for (int j = 0; j < 16; ++j) {
          s += double(se[j]);
          sd += double(sed[j]);
        }
      }
      for (; c0 + LANES <= V; c0 += LANES) {
        const V16 d = vsub(vload(l + c0), mv), e = exp_det(d);
        s += double(hsum_tree(e));
        sd += double(hsum_tree(vselect(vgreater(e, vzero()), vmul(e, d), vzero())));
      }
    }
  }
#endif
  A e[LANES], d[LANES], ed[LANES];
  for (; c0 < V; c0 += LANES) {
    const int64_t n = std::min<int64_t>(LANES, V - c0);
    for (int64_t j = 0; j < n; ++j) d[j] = e[j] = l[c0 + j] - m;
    exp_inplace<A>(e, n);
    // e (l - m) is 0 where e is 0: l - m may overflow to -inf (logits 3e38 and -3e38), and 0 * -inf is NaN.  Where
    // it did not, e * d was -0, now +0: the same sums (x + -0 = x + +0 for x != 0, and sd starts at +0).
    for (int64_t j = 0; j < n; ++j) ed[j] = e[j] > A(0) ? e[j] * d[j] : A(0);
    s += block_sum<A>(e, n);
    sd += block_sum<A>(ed, n);
  }
  log_s = std::log(s);
  ent = log_s - sd / s;
}

std::vector<torch::Tensor> vocab_stats(const torch::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.size(1) >= 1,
              "vocab_stats: logits [B, V] contiguous, V >= 1");
  const int64_t B = logits.size(0), V = logits.size(1);
  auto opt = logits.options();
  auto mx = torch::empty({B}, opt);
  auto log_s = torch::empty({B}, opt.dtype(torch::kDouble));
  auto ent = torch::empty({B}, opt.dtype(torch::kDouble));
  auto fin = torch::empty({B}, opt.dtype(torch::kBool));
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "vocab_stats", [&] {
    const scalar_t* l = logits.data_ptr<scalar_t>();
    at::parallel_for(0, B, std::max<int64_t>(1, MIN_TASK_WORK / (8 * V)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        bool f;
        stats_row<scalar_t>(l + r * V, V, mx.data_ptr<scalar_t>()[r], log_s.data_ptr<double>()[r],
                            ent.data_ptr<double>()[r], f);
        fin.data_ptr<bool>()[r] = f;
      }
    });
  });
  return {mx, log_s, ent, fin};
}

// (l - m) / tau of the draws.  tau = 0 (a temperature below the dtype's smallest positive value, which rounds to 0):
// the limit tau -> 0, 0 for the tokens of the max (0 / 0 would be NaN: no token drawn) and -inf below them.  Any
// tau > 0: d / tau, the same bits as always.
template <typename A>
inline A scaled_logit(A d, A tau) { return d == A(0) && tau == A(0) ? A(0) : d / tau; }

// Inverse-CDF draw from q_tau in token order with one uniform u: e[c] = exp((l[c] - m) / tau); the total T and
// the CDF follow the block scheme (blocks by tree16, accumulated in double; inside the chosen block, sequential
// double sums from the block's start).  Returns the token and log T.
template <typename A>
void draw_row(const A* l, int64_t V, A m, A tau, double u, int64_t& token, double& log_t, std::vector<double>& cum) {
  const int64_t nb = (V + LANES - 1) / LANES;
  cum.resize(nb);
  A e[LANES];
  double s = 0.0;
  int64_t b0 = 0;
#if FR_VEC
  if constexpr (std::is_same<A, float>::value) {
    if (!g_portable && tau > A(0)) {  // tau = 0: the scalar code below (scaled_logit)
      const V16 mv = vset1(m), tv = vset1(tau);
      for (; (b0 + 16) * LANES <= V; b0 += 16) {  // 16 blocks' trees at once, as in stats_row
        V16 e[16];
        for (int j = 0; j < 16; ++j) e[j] = exp_det(vdiv(vsub(vload(l + (b0 + j) * LANES), mv), tv));
        alignas(64) float se[16];
        hsum16(e, se);
        for (int j = 0; j < 16; ++j) {
          s += double(se[j]);
          cum[b0 + j] = s;
        }
      }
      for (; (b0 + 1) * LANES <= V; ++b0) {
        s += double(hsum_tree(exp_det(vdiv(vsub(vload(l + b0 * LANES), mv), tv))));
        cum[b0] = s;
      }
    }
  }
#endif
  for (int64_t b = b0; b < nb; ++b) {
    const int64_t c0 = b * LANES, n = std::min<int64_t>(LANES, V - c0);
    for (int64_t j = 0; j < n; ++j) e[j] = scaled_logit<A>(l[c0 + j] - m, tau);
    exp_inplace<A>(e, n);
    s += block_sum<A>(e, n);
    cum[b] = s;
  }
  log_t = std::log(s);
  const double target = u * s;
  int64_t b = std::upper_bound(cum.begin(), cum.end(), target) - cum.begin();
  if (b >= nb) b = nb - 1;
  while (b > 0 && cum[b] == cum[b - 1]) --b;  // never a block of zero mass
  const int64_t c0 = b * LANES, n = std::min<int64_t>(LANES, V - c0);
  for (int64_t j = 0; j < n; ++j) e[j] = scaled_logit<A>(l[c0 + j] - m, tau);
  exp_inplace<A>(e, n);
  double run = b > 0 ? cum[b - 1] : 0.0;
  token = -1;
  for (int64_t j = 0; j < n; ++j) {
    if (e[j] > A(0)) token = c0 + j;
    run += double(e[j]);
    if (e[j] > A(0) && run > target) break;
  }
}

// rows [R] (int64): which logits rows; m [B] from vocab_stats; taus, us [R] (double).  Returns the tokens [R], log T_tau
// [R] and the drawn tokens' logits [R] as doubles (exact; NaN where no token was drawn), so the caller need not
// index the logits again (an indexing in Python cost ~0.2 ms per step, its code cold after the weights' stream).
std::vector<torch::Tensor> draw(const torch::Tensor& logits, const torch::Tensor& mx, const torch::Tensor& rows,
                                const torch::Tensor& taus, const torch::Tensor& us) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.size(1) >= 1, "draw: logits [B, V] contiguous, V >= 1");
  const int64_t R = rows.numel(), B = logits.size(0), V = logits.size(1);
  TORCH_CHECK(mx.numel() == B && mx.is_contiguous() && mx.scalar_type() == logits.scalar_type(),
              "draw: m [B] in the logits' dtype");
  TORCH_CHECK(rows.scalar_type() == torch::kLong && rows.is_contiguous(), "draw: rows int64, contiguous");
  TORCH_CHECK(taus.numel() == R && us.numel() == R && taus.scalar_type() == torch::kDouble &&
                  us.scalar_type() == torch::kDouble && taus.is_contiguous() && us.is_contiguous(),
              "draw: taus and us [R] float64, contiguous");
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = rows.data_ptr<int64_t>()[i];
    TORCH_CHECK(r >= 0 && r < B, "draw: row ", r, " outside the logits' ", B, " rows");
  }
  auto tok = torch::empty({R}, rows.options());
  auto log_t = torch::empty({R}, taus.options());
  auto drawn = torch::empty({R}, taus.options());
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "draw", [&] {
    const scalar_t* l = logits.data_ptr<scalar_t>();
    at::parallel_for(0, R, std::max<int64_t>(1, MIN_TASK_WORK / (8 * V)), [&](int64_t i0, int64_t i1) {
      std::vector<double> cum;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r = rows.data_ptr<int64_t>()[i];
        draw_row<scalar_t>(l + r * V, V, mx.data_ptr<scalar_t>()[r], scalar_t(taus.data_ptr<double>()[i]),
                           us.data_ptr<double>()[i], tok.data_ptr<int64_t>()[i], log_t.data_ptr<double>()[i], cum);
        const int64_t t = tok.data_ptr<int64_t>()[i];
        drawn.data_ptr<double>()[i] = t >= 0 ? double(l[r * V + t]) : std::numeric_limits<double>::quiet_NaN();
      }
    });
  });
  return {tok, log_t, drawn};
}

// ------------------------------------------------------------------------------------------ misc
// Read x once (a sum of float32 lanes, to measure the memory read bandwidth): each thread its contiguous share, in `streams` interleaved runs (a line of each run in turn; memory
// serves several streams faster than one: see PREFETCH_STREAMS).
double stream_read(const torch::Tensor& x, int64_t streams) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous(), "stream_read: float32 contiguous");
  TORCH_CHECK(streams >= 1 && streams <= 16, "stream_read: 1 to 16 streams");
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  std::vector<double> part(at::get_num_threads() + 1, 0.0);
  at::parallel_for(0, (n + 63) / 64, 1, [&](int64_t c0, int64_t c1) {  // items of 64 floats (4 lines)
    [[maybe_unused]] const int64_t lo = c0 * 64, hi = std::min(n, c1 * 64), len = (hi - lo) / (64 * streams) * 64;
    double s = 0.0;
#if FR_VEC
    V16 a0 = vzero(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < len; i += 64)
      for (int64_t r = 0; r < streams; ++r) {
        const float* q = p + lo + r * len + i;
        a0 = vadd(a0, vload(q));
        a1 = vadd(a1, vload(q + 16));
        a2 = vadd(a2, vload(q + 32));
        a3 = vadd(a3, vload(q + 48));
      }
    s += double(hsum_tree(vadd(vadd(a0, a1), vadd(a2, a3))));
    int64_t i = lo + streams * len;
#else
    int64_t i = lo;
#endif
    float acc[LANES] = {};
    for (; i + LANES <= hi; i += LANES)
      for (int l = 0; l < LANES; ++l) acc[l] += p[i + l];
    for (; i < hi; ++i) acc[0] += p[i];
    part[at::get_thread_num()] += s + double(tree16(acc));
  });
  double s = 0.0;
  for (double v : part) s += v;
  return s;
}

// `iters` rounds of 12 independent float32 vector multiply-adds per thread, registers only: the compute probe of
// `forerun bench engine` (the caller times it; the returned sum keeps the work from being optimized away).
double fma_peak(int64_t iters) {
  const int threads = at::get_num_threads();
  std::vector<double> part(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
#if FR_VEC
      // 12 vectors in groups that fit the registers (AVX2: two groups of 6, each 12 independent 8-lane chains)
      constexpr int group = 12 / kRegsPerV16;
      const V16 m = vset1(0.999999f), c = vset1(1e-7f);
      for (int j0 = 0; j0 < 12; j0 += group) {
        V16 acc[group];
        for (int j = 0; j < group; ++j) acc[j] = vset1(float(j0 + j + t));
        for (int64_t i = 0; i < iters; ++i)
          for (int j = 0; j < group; ++j) acc[j] = vfma(acc[j], m, c);
        for (int j = 0; j < group; ++j) part[t] += double(hsum_tree(acc[j]));
      }
#else
      float acc[12 * LANES];
      for (int j = 0; j < 12 * LANES; ++j) acc[j] = float(j + t);
      for (int64_t i = 0; i < iters; ++i)
        for (int j = 0; j < 12 * LANES; ++j) acc[j] = std::fma(acc[j], 0.999999f, 1e-7f);
      for (int j = 0; j < 12 * LANES; ++j) part[t] += acc[j];
#endif
    }
  });
  double s = 0.0;
  for (double v : part) s += v;
  return s;
}

// `numel` zeros in 2 MiB-aligned memory advised for transparent huge pages (Linux; elsewhere plain memory):
// streaming 0.5 GB of weights per step through 4 KiB pages costs a page walk every 4 KiB.
torch::Tensor huge_page_zeros(int64_t numel, const torch::TensorOptions& options) {
  constexpr size_t align = size_t(2) << 20;
  const size_t bytes = std::max<size_t>(size_t(numel) * options.dtype().itemsize(), 1);
  const size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  TORCH_CHECK(p != nullptr, "huge_page_zeros: out of memory");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, size, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, size);
  return torch::from_blob(p, {numel}, [](void* q) { std::free(q); }, options);
}

// A copy of `src` in huge-page memory (the bandwidth probe's buffer).
torch::Tensor huge_page_copy(const torch::Tensor& src) {
  TORCH_CHECK(src.is_contiguous(), "huge_page_copy: contiguous tensors only");
  auto t = huge_page_zeros(src.numel(), src.options());
  std::memcpy(t.data_ptr(), src.data_ptr(), src.nbytes());
  return t.view(src.sizes());
}

// ------------------------------------------------------------------------------------------ layer loop
// The decoder layers of the lean forward (runtime_ext/engine/lean.py), looped here instead of in Python: the same
// kernel calls in the same order (so the same bits), without ~8 Python calls per layer on a decode step's
// critical path.  Per layer i:
//     y = rmsnorm(h, d_{i-1}, ln1[i])            (h += the previous layer's MLP output; layer 0: y = rmsnorm(h))
//     a = attention(linear(y, qkv[i], qkv_bias[i]))   over buf[i]
//     y = rmsnorm(h, linear(a, o[i]), ln2[i])    (h += the attention output)
//     d = linear(linear_silu(y, gate_up[i]), down[i])    (= linear(silu_mul(linear(y, [gate; up])), down[i]))
// and finally y = rmsnorm(h, d_last, final_norm).  h is updated in place (the residual stream).
struct LayerStack {
  std::vector<Packed> qkv, o, gate_up, down;
  std::vector<c10::optional<torch::Tensor>> qkv_bias;
  std::vector<torch::Tensor> ln1, ln2;
  torch::Tensor final_norm;
  double eps = 0.0, scale = 0.0;
  int64_t heads = 0, kv_heads = 0;

  // buf [layers, 2, B, Hkv, cap, D]; the other arguments as for `attention`.  Returns the final-normed y.
  torch::Tensor forward(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& buf,
                        const torch::Tensor& starts, int64_t length, int64_t T, const torch::Tensor& seg,
                        const torch::Tensor& seg_off) const {
    const int64_t layers = static_cast<int64_t>(qkv.size());
    TORCH_CHECK(buf.dim() == 6 && buf.size(0) >= layers && buf.size(1) == 2, "layer stack: buf [layers, 2, B, H, cap, D]");
    torch::Tensor y = rmsnorm(h, c10::nullopt, ln1[0], eps);
    for (int64_t i = 0; i < layers; ++i) {
      const torch::Tensor kv = buf.select(0, i);
      const torch::Tensor a = attention(linear(y, qkv[i], qkv_bias[i]), cos, sin, kv.select(0, 0), kv.select(0, 1),
                                        starts, length, T, heads, kv_heads, scale, seg, seg_off, i);
      y = rmsnorm(h, linear(a, o[i], c10::nullopt), ln2[i], eps);
      const torch::Tensor d = linear(linear_silu(y, gate_up[i]), down[i], c10::nullopt);
      y = rmsnorm(h, d, i + 1 < layers ? ln1[i + 1] : final_norm, eps);
    }
    return y;
  }
};

LayerStack layer_stack(std::vector<Packed> qkv, std::vector<c10::optional<torch::Tensor>> qkv_bias,
                       std::vector<Packed> o, std::vector<Packed> gate_up, std::vector<Packed> down,
                       std::vector<torch::Tensor> ln1, std::vector<torch::Tensor> ln2, torch::Tensor final_norm,
                       double eps, double scale, int64_t heads, int64_t kv_heads) {
  const size_t n = qkv.size();
  TORCH_CHECK(n > 0 && qkv_bias.size() == n && o.size() == n && gate_up.size() == n && down.size() == n &&
                  ln1.size() == n && ln2.size() == n,
              "layer_stack: one entry per layer in every list");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "layer_stack: heads must be a multiple of kv_heads");
  return LayerStack{std::move(qkv), std::move(o), std::move(gate_up), std::move(down), std::move(qkv_bias),
                    std::move(ln1), std::move(ln2), std::move(final_norm), eps, scale, heads, kv_heads};
}

void set_portable(bool on) { g_portable = on; }
std::tuple<int64_t, int64_t, int64_t> row_tile_schedule() {
  return {g_schedule.kblock_bytes, g_schedule.prefetch_tiles, g_schedule.prefetch_streams};
}
void set_row_tile_schedule(int64_t kblock_bytes, int64_t prefetch_tiles, int64_t prefetch_streams) {
  TORCH_CHECK(kblock_bytes >= 0 && prefetch_tiles >= 1 &&
                  (prefetch_streams == 1 || prefetch_streams == 2 || prefetch_streams == 4),
              "row tile schedule: kblock_bytes >= 0, prefetch_tiles >= 1, prefetch_streams 1, 2 or 4");
  g_schedule = {kblock_bytes, prefetch_tiles, prefetch_streams};
}
bool vectorized() { return FR_VEC && !g_portable; }

// The lines, in order, that a row tile of `steps` K steps prefetches of a slice of `slice_lines` lines in `streams`
// streams (tests).
std::vector<int64_t> prefetch_trace(int64_t slice_lines, int64_t steps, int64_t streams) {
  TORCH_CHECK(slice_lines >= 0 && steps >= 1 && (streams == 1 || streams == 2 || streams == 4),
              "prefetch_trace: slice_lines >= 0, steps >= 1, streams 1, 2 or 4");
  const TilePrefetch pf = slice_prefetch(nullptr, slice_lines, steps, streams);
  std::vector<int64_t> lines;
  for (int64_t k = 0; k < steps; ++k)
    lines.push_back(streams == 4 ? prefetch_line<4>(k, pf.rate, pf.chunk)
                    : streams == 2 ? prefetch_line<2>(k, pf.rate, pf.chunk) : prefetch_line<1>(k, pf.rate, pf.chunk));
  return lines;
}
// The rows a PieceStream of pieces of rows[j] rows prefetches, paced over `calls` calls of step(): per call (one
// entry for pace itself, then one per call), the (piece << 32 | row) it covers.  For the tests of the pacing.
std::vector<std::vector<int64_t>> piece_stream_trace(const std::vector<int64_t>& rows, int64_t calls) {
  TORCH_CHECK(calls >= 0, "piece_stream_trace: calls >= 0");
  static const char nowhere[64] = {};
  PieceStream ps;
  for (const int64_t n : rows) {
    TORCH_CHECK(n >= 0 && n < (int64_t(1) << 32), "piece_stream_trace: 0 <= rows < 2^32");
    ps.add({nowhere, 0, n, 0});  // no bytes: nothing is prefetched, only the rows are counted
  }
  std::vector<int64_t> size(ps.n);
  for (int j = 0; j < ps.n; ++j) size[j] = ps.part[j].left;
  std::vector<std::vector<int64_t>> trace;
  const auto covered = [&](const std::vector<int64_t>& left_before) {
    std::vector<int64_t> got;
    for (int j = 0; j < ps.n; ++j)
      for (int64_t r = size[j] - left_before[j]; r < size[j] - ps.part[j].left; ++r) got.push_back((int64_t(j) << 32) | r);
    trace.push_back(std::move(got));
  };
  const auto lefts = [&] { std::vector<int64_t> v(ps.n); for (int j = 0; j < ps.n; ++j) v[j] = ps.part[j].left; return v; };
  auto before = lefts();
  ps.pace(calls);
  covered(before);
  for (int64_t c = 0; c < calls; ++c) {
    before = lefts();
    ps.step();
    covered(before);
  }
  return trace;
}
bool work_stealing() { return g_work_stealing; }
void set_work_stealing(bool on) { g_work_stealing = on; }

// parallel_stealing over n items as linear runs it, thread t pausing pause_us[t] per item: which thread ran each item
// (-1: none; an item run twice or never fails here).  For the tests of the split.
std::vector<int64_t> stealing_trace(int64_t n, int64_t quantum, const std::vector<int64_t>& pause_us) {
  TORCH_CHECK(n >= 0 && quantum >= 1, "stealing_trace: n >= 0, quantum >= 1");
  std::vector<std::atomic<int64_t>> runs(n);
  std::vector<int64_t> who(n, -1);
  for (auto& r : runs) r.store(0);
  parallel_stealing(n, 1, quantum, [&](int64_t b, int64_t e, int64_t) {
    const int64_t t = at::get_thread_num();
    const int64_t pause = t < static_cast<int64_t>(pause_us.size()) ? pause_us[t] : 0;
    for (int64_t i = b; i < e; ++i) {
      if (pause > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause));
      runs[i].fetch_add(1);
      who[i] = t;
    }
  });
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(runs[i].load() == 1, "stealing_trace: item ", i, " ran ", runs[i].load(), " times");
  return who;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Packed>(m, "Packed")
      .def_readonly("data", &Packed::data)
      .def_readonly("N", &Packed::N)
      .def_readonly("K", &Packed::K)
      .def_readonly("pairs", &Packed::pairs)
      .def_property_readonly("nbytes", [](const Packed& p) { return p.data.nbytes(); });
  pybind11::class_<LayerStack>(m, "LayerStack")
      .def("forward", &LayerStack::forward, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "h (updated in place), cos, sin, buf, starts, length, T, seg, seg_off -> the final-normed hidden states");
  m.def("layer_stack", &layer_stack, "the decoder layers' packed weights and norms, looped natively by forward()");
  m.def("pack", &pack, "the weights [N_i, K] of one call, concatenated and packed for one sequential stream");
  m.def("linear", &linear, "batch-invariant y = x W^T (+ b) over packed weights (read once for all rows)");
  m.def("rmsnorm", &rmsnorm, "y = rmsnorm(h (+= add), w, eps)");
  m.def("silu_mul", &silu_mul, "[gate | up] -> silu(gate) * up");
  m.def("pack_pairs", &pack_pairs, "an MLP's gate and up matrices [I, K], their panels alternating, for linear_silu");
  m.def("linear_silu", &linear_silu,
        "silu(x gate^T) * (x up^T) over pack_pairs weights, silu applied as each pair is done");
  m.def("set_fuse_silu", [](bool on) { g_fuse_silu = on; },
        "on (default) or off: linear_silu's silu in a pass of its own (speed only, same bits)");
  m.def("attention", &attention, "RoPE, KV write and per-query attention over each row's own keys");
  m.def("vocab_stats", &vocab_stats, "per row: max, log sum exp(l - max), entropy, finite");
  m.def("draw", &draw, "inverse-CDF draws from q_tau in token order: (tokens, log totals)");
  m.def("stream_read", &stream_read, "read a float32 tensor once, in interleaved streams per thread (bandwidth probe)",
        py::arg("x"), py::arg("streams") = 1);
  m.def("fma_peak", &fma_peak, "iters x 12 x 16 float32 multiply-adds per thread, registers only (compute probe)");
  m.def("huge_page_copy", &huge_page_copy, "a copy in memory advised for transparent huge pages");
  m.def("set_portable", &set_portable, "force the portable (non-vector) code path");
  m.def("row_tile_schedule", &row_tile_schedule,
        "(K block bytes, 0 = none; prefetching row tiles; streams each prefetches in) of linear");
  m.def("set_row_tile_schedule", &set_row_tile_schedule, "override the row tile schedule (speed only, same bits)",
        py::arg("kblock_bytes"), py::arg("prefetch_tiles"), py::arg("prefetch_streams") = PREFETCH_STREAMS);
  m.def("piece_stream_trace", &piece_stream_trace,
        "the rows an attention task's prefetch stream covers at each paced call (tests)");
  m.def("work_stealing", &work_stealing, "whether the threads of a linear call take over each other's unstarted work");
  m.def("set_work_stealing", &set_work_stealing, "on (default) or off: the static split (speed only, same bits)");
  m.def("prefetch_trace", &prefetch_trace, "the slice lines a prefetching row tile prefetches, step by step (tests)");
  m.def("stealing_trace", &stealing_trace, "which thread ran each of n items, each thread pausing its own time per item (tests)");
  m.def("vectorized", &vectorized, "whether the vector (AVX-512 or AVX2) path is in use");
}
