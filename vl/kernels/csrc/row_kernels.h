// The row kernels: fused dequantize + dot for few-row products (decode) with weights kept as the checkpoint
// stores them, and the dense bf16 / fp32 few-row products. Shared by quant_gemv.cpp (the quantized Linears'
// entry points, one layer at a time) and decode_step.cpp (the whole fused step), so both compute the same weights
// and the same float32 sums. A header of internal (static) functions: each .cpp that includes it exports its own.
//
// y[m, o] = sum_i x[m, i] * W[o, i], where W[o, i] is bit for bit the weight the pure-torch reference
// (vl/quant/fp8.py dequantize_fp8, vl/quant/nvfp4.py dequantize_nvfp4) builds in float32, optionally rounded
// to bfloat16 (round-to-nearest-even) as the reference does when the activations are bf16. Only the order of
// the float32 additions differs from a dequantize-then-GEMM. See docs/quant_cpu_kernels.md.
//
// FP8 E4M3 -> float exactly, subnormals included: the 7 magnitude bits shifted left by 7 are an IEEE fp16
// with the same mantissa and an exponent 8 lower (bias 15 vs 7), so fp16->fp32 conversion then x256 is exact.
// The x256 is folded into the scale (a power of two: no extra rounding). NaN codes (0x7F/0xFF) are NOT
// decoded here; the caller sends layers holding them to the reference path.
// NVFP4: a layer's weights are all among 256 x 16 values (E2M1 value x block scale x global scale, computed in
// float32 exactly as the reference does), tabulated once per call; the 16 E2M1 codes of one block index their
// scale's row with one permute (nvfp4_rows_perm, float32 FMAs), or, with bf16 activations on CPUs without AMX,
// a table of bf16 values four blocks at a time (nvfp4_rows_bf16, VDPBF16PS); on CPUs with AMX, rows of bf16
// activations that the caller sends with tiles = 1 take AMX tiles, the weights rebuilt in bf16 per 16 x 32 block
// (nvfp4_rows_amx).
//
// Built into each library by vl/kernels/loader.py (g++ -O3 -march=native -fopenmp); -DVL_PORTABLE builds the plain
// C++ path (table lookups) that any CPU runs.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <cstdint>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(VL_PORTABLE)
#define VL_AVX512 1
#include <immintrin.h>
#endif

static float FP8_LUT[256];  // E4M3 byte -> float (portable path and tails)
static const float E2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                               -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

static float e4m3_to_float(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = std::ldexp((float)m / 8.f, -6);
  else v = std::ldexp(1.f + (float)m / 8.f, e - 7);
  return s ? -v : v;
}

static struct Init {
  Init() { for (int i = 0; i < 256; ++i) FP8_LUT[i] = e4m3_to_float((uint8_t)i); }
} init_;

static inline float round_bf16(float f) {  // RNE to bfloat16, kept in a float (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static float* bf16_rows_to_float(const uint16_t* x, int M, int K) {
  float* out = new float[(size_t)M * K];
  for (size_t i = 0; i < (size_t)M * K; ++i) out[i] = bf16_to_float(x[i]);
  return out;
}

#ifdef VL_AVX512
static inline __m512 load_bf16x16(const uint16_t* p) {  // 16 bf16 values -> float32, exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

static inline __m512 round_bf16_v(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline __m512 e4m3x16(const uint8_t* p) {  // 16 E4M3 bytes -> 16 floats times 2^-8, exact
  // sign-extend to 16 bits and shift left by 7: the sign lands in bit 15 and the 7 magnitude bits in 7..13;
  // bit 14 (a copy of the sign) is cleared. The result is the fp16 (-1)^s * 2^(e-15) * 1.m (or the subnormal).
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p)), 7);
  return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xBFFF)));
}
#endif

static constexpr int PREFETCH_BYTES = 4096;

// body(i) for i in [0, n) on `nthreads` OpenMP threads; with one thread a plain loop: an OpenMP region that its
// `if` clause serializes still costs a team set-up per call in libgomp (~0.4 us alone, and a decode step makes
// dozens of such calls).
template <class F>
static inline void parallel_for(int n, int nthreads, F&& body) {
  if (nthreads <= 1) {
    for (int i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int i = 0; i < n; ++i) body(i);
}
#ifdef VL_AVX512
// Into L2 (T1), not L1: the dense rows' loop reads each line once, and on a Zen 4 core (AVX512-BF16, no AMX) the
// fused bf16 decode step of the 180m config ran 3.5-4.5% faster on one thread than with T0 and 0-8% on two
// (median round-by-round ratios, 10-12 rounds in random order; docs/cpu_decode.md, "Prefetch into L2"). The FP8
// kernel keeps T0 (T1 there was 3-5% slower); NVFP4 showed no difference either way.
static inline void prefetch2(const void* p) {
  _mm_prefetch((const char*)p + PREFETCH_BYTES, _MM_HINT_T1);
  _mm_prefetch((const char*)p + PREFETCH_BYTES + 64, _MM_HINT_T1);
}
#endif

static int gemv_bf16_dot() {  // 1: fp8_gemv takes bf16 activations (x_bf16=1): the table path below
#if defined(VL_AVX512) && defined(__AVX512BF16__) && defined(__AVX512VBMI__)
  return 1;
#else
  return 0;
#endif
}

static int gemv_isa() {  // 2 = AVX512 path, 0 = portable path
#ifdef VL_AVX512
  return 2;
#else
  return 0;
#endif
}


#if defined(VL_AVX512) && defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#define VL_FP8_TABLE 1
// NVFP4 with bf16 activations: VDPBF16PS on a table of bf16 weights (nvfp4_rows_bf16) where that instruction is
// fast (the AMD Zen 4 / Zen 5 runners: 30-37 G weights/s per core), the float32 FMA loop (nvfp4_rows_perm) on Intel
// cores with AMX, where one VDPBF16PS issued every ~2.2 cycles against two FMAs per cycle (a register-only loop of
// 8 independent chains on the Intel runner, docs/quant_cpu_kernels.md). AMX-BF16 marks those cores at compile time
// (-march=native), so the choice is fixed per build: the bits never depend on a run-time probe. -DVL_NVFP4_FMA=0|1
// overrides it (the tests build both loops on any CPU that runs them).
#ifndef VL_NVFP4_FMA
#ifdef __AMX_BF16__
#define VL_NVFP4_FMA 1
#else
#define VL_NVFP4_FMA 0
#endif
#endif
#if !VL_NVFP4_FMA
#define VL_NVFP4_DOT 1
#endif
// bf16 activations: the reference's weight is bf16(float(w8) * s). With one scale per row (tensor, channel) or
// per 128 x 128 block there are only 128 magnitudes per scale, and bf16(-v) = -bf16(v) (round to nearest even
// is symmetric): so a 128-entry table of bf16 values per scale, looked up with two byte permutes (VPERMI2B
// reads the low 7 bits of each index byte: the E4M3 magnitude), with the sign bit copied in, rebuilds exactly
// the reference's bf16 weights. VDPBF16PS multiplies them with bf16 activations (products exact in float32,
// float32 accumulation). The unpack that interleaves low and high bytes works per 128-bit lane, so the
// activations are permuted once per call into that order.
struct Table {
  __m512i lo0, lo1, hi0, hi1;
};

static inline void make_table(float s, Table& t) {  // entries m = bf16(FP8_LUT[m] * s), m = 0..127, in registers
  const __m512 sv = _mm512_set1_ps(s);
  __m512i e[4];  // 32 bf16 entries each
  for (int j = 0; j < 4; ++j)
    e[j] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(FP8_LUT + 32 * j + 16), sv),
                                        _mm512_mul_ps(_mm512_loadu_ps(FP8_LUT + 32 * j), sv));
  auto lo = [](__m512i a, __m512i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)), _mm512_cvtepi16_epi8(b), 1);
  };
  auto hi = [](__m512i a, __m512i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))),
                              _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1);
  };
  t.lo0 = lo(e[0], e[1]);
  t.lo1 = lo(e[2], e[3]);
  t.hi0 = hi(e[0], e[1]);
  t.hi1 = hi(e[2], e[3]);
}

// VCVTNE2PS2BF16 and VDPBF16PS treat float32 / bf16 subnormals as zero (DAZ / FTZ). A layer whose smallest
// non-zero weight magnitude `least` could be subnormal (only with scales below ~1e-35, never seen in a real
// checkpoint) takes the float32 path with bf16-rounded weights instead: the same weights, slower. Subnormal
// activations or products (|term| < 2^-126) are still flushed by VDPBF16PS: an absolute difference far below
// the float32 accumulation noise of any sum with a normal-sized term.
static inline bool bf16_weights_normal(float least) { return !(std::fabs(least) < 1.1754944e-38f); }

// x position of lane j of the two unpacked halves of a 64-byte block (see above)
static inline int unpack_pos(int j) { return j < 32 ? (j / 8) * 16 + j % 8 : ((j - 32) / 8) * 16 + 8 + (j - 32) % 8; }

// Activation rows (M, K) bf16 in the order a table kernel reads them: out[i0 + j] = x[i0 + pos[j]] within each
// 64-column block (two permutes per block); the columns past the last full 64 stay in place.
static void reorder_rows64(const uint16_t* x, int M, int K, const uint16_t (&pos)[64], uint16_t* xp) {
  const __m512i p0 = _mm512_loadu_si512(pos), p1 = _mm512_loadu_si512(pos + 32);
  for (int m = 0; m < M; ++m) {
    const uint16_t* xr = x + (size_t)m * K;
    uint16_t* out = xp + (size_t)m * K;
    int i = 0;
    for (; i + 64 <= K; i += 64) {
      const __m512i a = _mm512_loadu_si512(xr + i), b = _mm512_loadu_si512(xr + i + 32);
      _mm512_storeu_si512(out + i, _mm512_permutex2var_epi16(a, p0, b));
      _mm512_storeu_si512(out + i + 32, _mm512_permutex2var_epi16(a, p1, b));
    }
    for (; i < K; ++i) out[i] = xr[i];
  }
}

template <int M>
static void fp8_rows_table(const uint16_t* x, const uint16_t* xp, int K, const uint8_t* w, int N, const float* scale,
                           int kind, const Table* shared, float* y, int r0, int r1) {
  const int nkb = kind == 2 ? K / 128 : 1;
  const int span = kind == 2 ? 128 : K;
  const __m512i signbit = _mm512_set1_epi8((char)0x80);
  Table tab;
  Table* blk = nullptr;
  if (kind == 2) {  // one table per 128 columns, shared by the (up to) 128 rows of this chunk
    blk = new Table[nkb];
    for (int kb = 0; kb < nkb; ++kb) make_table(scale[(size_t)(r0 / 128) * nkb + kb], blk[kb]);
  }
  for (int o = r0; o < r1; ++o) {
    const uint8_t* wr = w + (size_t)o * K;
    if (kind == 1) make_table(scale[o], tab);
    float tot[M];
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m) { tot[m] = 0.f; acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = _mm512_setzero_ps(); }
    for (int c0 = 0, kb = 0; c0 < K; c0 += span, ++kb) {
      const Table& t = kind == 2 ? blk[kb] : kind == 0 ? *shared : tab;
      const int c1 = c0 + span < K ? c0 + span : K;
      auto step = [&](int i, int a) __attribute__((always_inline)) {
        _mm_prefetch((const char*)(wr + i) + PREFETCH_BYTES, _MM_HINT_T0);
        const __m512i b = _mm512_loadu_si512(wr + i);
        const __m512i lo = _mm512_permutex2var_epi8(t.lo0, b, t.lo1);
        const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, b, t.hi1), b, signbit, 0xF8);
        const __m512bh w0 = (__m512bh)_mm512_unpacklo_epi8(lo, hi), w1 = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
        for (int m = 0; m < M; ++m) {
          const uint16_t* xr = xp + (size_t)m * K + i;
          acc[m][a] = _mm512_dpbf16_ps(acc[m][a], w0, (__m512bh)_mm512_loadu_si512(xr));
          acc[m][a + 1] = _mm512_dpbf16_ps(acc[m][a + 1], w1, (__m512bh)_mm512_loadu_si512(xr + 32));
        }
      };
      int i = c0;
      for (; i + 128 <= c1; i += 128) {  // two 64-byte steps: four independent accumulator chains
        step(i, 0);
        step(i + 64, 2);
      }
      if (i + 64 <= c1) {
        step(i, 0);
        i += 64;
      }
      const float s = scale[kind == 0 ? 0 : kind == 1 ? o : (size_t)(o / 128) * nkb + kb];
      for (; i < c1; ++i) {  // tails (K % 64) in the natural order
        const float wv = round_bf16(FP8_LUT[wr[i]] * s);
        for (int m = 0; m < M; ++m) tot[m] += wv * bf16_to_float(x[(size_t)m * K + i]);
      }
    }
    for (int m = 0; m < M; ++m)
      y[(size_t)m * N + o] = tot[m] + _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]),
                                                                          _mm512_add_ps(acc[m][2], acc[m][3])));
  }
  delete[] blk;
}

#ifdef VL_NVFP4_DOT
// NVFP4 with bf16 activations. A layer has one global scale, so every weight is one of 256 x 16 values:
// tab[s * 16 + c] = bf16(E2M1[c] * (float(e4m3 s) * gs)), the reference's float32 product rounded as it rounds
// (nvfp4_table below, built once per call: 8 KiB, shared by the threads). Per 64 weights (4 blocks, 32 packed
// bytes) the four blocks' 16-entry rows form a 64-entry table in two registers, and two VPERMT2W look up the
// low nibbles (even elements) and the high nibbles (odd elements); VDPBF16PS multiplies them with the
// activations, which the caller has put in that order once per call (reorder_rows64) (per 64 columns: the 32 even, then the
// 32 odd ones). The bf16 products are exact in float32; only the order of the float32 additions differs.
template <int M>
static void nvfp4_rows_bf16(const uint16_t* x, const uint16_t* xp, int K, const uint8_t* w, const uint8_t* bs,
                            const uint16_t* tab, int N, float* y, int r0, int r1) {
  const int nb = K / 16, ng = K / 64;
  const __m512i low4 = _mm512_set1_epi16(0x0F);
  // word j of a group indexes the rows of block j / 8: offset 16 * (j / 8) into the 64-entry table
  const __m512i blk = _mm512_set_epi16(48, 48, 48, 48, 48, 48, 48, 48, 32, 32, 32, 32, 32, 32, 32, 32,
                                       16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int o = r0; o < r1; ++o) {
    const uint8_t* wr = w + (size_t)o * (K / 2);
    const uint8_t* sr = bs + (size_t)o * nb;
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = _mm512_setzero_ps();
    auto group = [&](int g, int a) __attribute__((always_inline)) {
      const __m512i w16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wr + g * 32)));
      const __m512i ilo = _mm512_ternarylogic_epi32(w16, low4, blk, 0xEA);  // (w & 0x0F) | blk
      const __m512i ihi = _mm512_or_si512(_mm512_srli_epi16(w16, 4), blk);
      // table row s starts at byte 32 * s; one byte load and one shift per block (fewer scalar operations than
      // one 4-byte load split by shifts and masks: 5-8% faster where the loop is compute-bound, 2% slower on one
      // thread reading from memory, on a Zen 5 core; same bits; docs/quant_cpu_kernels.md)
      const uint8_t* s = sr + g * 4;
      auto row = [&](int j) { return _mm256_load_si256((const __m256i*)((const char*)tab + ((size_t)s[j] << 5))); };
      const __m512i ta = _mm512_inserti64x4(_mm512_castsi256_si512(row(0)), row(1), 1);
      const __m512i tb = _mm512_inserti64x4(_mm512_castsi256_si512(row(2)), row(3), 1);
      const __m512bh we = (__m512bh)_mm512_permutex2var_epi16(ta, ilo, tb);
      const __m512bh wo = (__m512bh)_mm512_permutex2var_epi16(ta, ihi, tb);
      for (int m = 0; m < M; ++m) {
        const uint16_t* xr = xp + (size_t)m * K + g * 64;
        acc[m][a] = _mm512_dpbf16_ps(acc[m][a], we, (__m512bh)_mm512_loadu_si512(xr));
        acc[m][a + 1] = _mm512_dpbf16_ps(acc[m][a + 1], wo, (__m512bh)_mm512_loadu_si512(xr + 32));
      }
    };
    int g = 0;
    for (; g + 2 <= ng; g += 2) {  // two groups per step: four independent accumulator chains
      _mm_prefetch((const char*)(wr + g * 32) + PREFETCH_BYTES, _MM_HINT_T0);
      if (!(g & 15)) _mm_prefetch((const char*)(sr + g * 4) + PREFETCH_BYTES / 8, _MM_HINT_T0);
      group(g, 0);
      group(g + 1, 2);
    }
    if (g < ng) group(g, 0);
    float tot[M];
    for (int m = 0; m < M; ++m) tot[m] = 0.f;
    for (int b = ng * 4; b < nb; ++b) {  // the last 1..3 blocks when K % 64 != 0, from the same table
      const uint16_t* row = tab + sr[b] * 16;
      for (int j = 0; j < 8; ++j) {
        const uint8_t byte = wr[b * 8 + j];
        const float lo = bf16_to_float(row[byte & 15]), hi = bf16_to_float(row[byte >> 4]);
        for (int m = 0; m < M; ++m)
          tot[m] += lo * bf16_to_float(x[(size_t)m * K + b * 16 + 2 * j]) +
                    hi * bf16_to_float(x[(size_t)m * K + b * 16 + 2 * j + 1]);
      }
    }
    for (int m = 0; m < M; ++m)
      y[(size_t)m * N + o] = tot[m] + _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]),
                                                                          _mm512_add_ps(acc[m][2], acc[m][3])));
  }
}

// tab[s * 16 + c] = bf16(E2M1[c] * (FP8_LUT[s] * gs)) for the 256 block-scale bytes s (64-byte aligned).
static void nvfp4_bf16_table(float gs, uint16_t* tab) {
  const __m512 base = _mm512_loadu_ps(E2M1);
  for (int s = 0; s < 256; s += 2) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_mul_ps(base, _mm512_set1_ps(FP8_LUT[s + 1] * gs)),
                                           _mm512_mul_ps(base, _mm512_set1_ps(FP8_LUT[s] * gs)));
    _mm512_store_si512((__m512i*)(tab + s * 16), (__m512i)v);
  }
}

#endif  // VL_NVFP4_DOT
#endif

// x: (M, K) float32; w: (N, K) E4M3 bytes; scale: see kind; y: (M, N) float32.
// kind 0: one scale; 1: one per output row; 2: (N/128, K/128) blocks of 128 x 128.
// round16: round each weight to bf16 after scaling (the reference's bf16 weight).
template <int M>
static void fp8_rows(const float* x, int K, const uint8_t* w, int N, const float* scale, int kind, int round16,
                     float* y, int r0, int r1) {
  const int nkb = kind == 2 ? K / 128 : 1;
  for (int o = r0; o < r1; ++o) {
    const uint8_t* wr = w + (size_t)o * K;
    const float* srow = kind == 0 ? scale : kind == 1 ? scale + o : scale + (size_t)(o / 128) * nkb;
    const int span = kind == 2 ? 128 : K;
    float tot[M];
    for (int m = 0; m < M; ++m) tot[m] = 0.f;
#ifdef VL_AVX512
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
#endif
    for (int c0 = 0, kb = 0; c0 < K; c0 += span, ++kb) {
      const float s = srow[kind == 2 ? kb : 0];
      const int c1 = c0 + span < K ? c0 + span : K;
      int i = c0;
#ifdef VL_AVX512
      const __m512 s256 = _mm512_set1_ps(s * 256.f);
      for (; i + 32 <= c1; i += 32) {
        // one line 4 KiB ahead per 64 bytes, into L2: without it the loop read 5.3 G weights/s from memory on one
        // thread of the Intel runner, 10.4-11.4 with it (T0: 9.3-10.0; a C++ driver, 30 layers of 3072 x 1024)
        if (!((i - c0) & 63)) _mm_prefetch((const char*)(wr + i) + PREFETCH_BYTES, _MM_HINT_T1);
        __m512 w0 = _mm512_mul_ps(e4m3x16(wr + i), s256);
        __m512 w1 = _mm512_mul_ps(e4m3x16(wr + i + 16), s256);
        if (round16) { w0 = round_bf16_v(w0); w1 = round_bf16_v(w1); }
        for (int m = 0; m < M; ++m) {
          acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)m * K + i), acc[m][0]);
          acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)m * K + i + 16), acc[m][1]);
        }
      }
      for (; i + 16 <= c1; i += 16) {
        __m512 w0 = _mm512_mul_ps(e4m3x16(wr + i), s256);
        if (round16) w0 = round_bf16_v(w0);
        for (int m = 0; m < M; ++m)
          acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)m * K + i), acc[m][0]);
      }
#endif
      for (; i < c1; ++i) {
        float wv = FP8_LUT[wr[i]] * s;
        if (round16) wv = round_bf16(wv);
        for (int m = 0; m < M; ++m) tot[m] += wv * x[(size_t)m * K + i];
      }
    }
    for (int m = 0; m < M; ++m) {
#ifdef VL_AVX512
      tot[m] += _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#endif
      y[(size_t)m * N + o] = tot[m];
    }
  }
}

// x: (M, K) float32; w: (N, K/2) packed E2M1 (element 2k low nibble); bs: (N, K/16) E4M3 bytes; gs: global
// scale; y: (M, N) float32. K % 16 == 0. The portable path (the AVX512 build uses nvfp4_rows_perm below).
template <int M>
static void nvfp4_rows(const float* x, int K, const uint8_t* w, const uint8_t* bs, float gs, int N, int round16,
                       float* y, int r0, int r1) {
  const int nb = K / 16;
  for (int o = r0; o < r1; ++o) {
    const uint8_t* wr = w + (size_t)o * (K / 2);
    const uint8_t* sr = bs + (size_t)o * nb;
    float tot[M];
    for (int m = 0; m < M; ++m) tot[m] = 0.f;
    for (int b = 0; b < nb; ++b) {
      const float s = FP8_LUT[sr[b]] * gs;
      float lut[16];
      for (int j = 0; j < 16; ++j) lut[j] = round16 ? round_bf16(E2M1[j] * s) : E2M1[j] * s;
      for (int j = 0; j < 8; ++j) {
        const uint8_t byte = wr[b * 8 + j];
        const float lo = lut[byte & 15], hi = lut[byte >> 4];
        for (int m = 0; m < M; ++m) {
          const float* xr = x + (size_t)m * K + b * 16 + 2 * j;
          tot[m] += lo * xr[0] + hi * xr[1];
        }
      }
    }
    for (int m = 0; m < M; ++m) y[(size_t)m * N + o] = tot[m];
  }
}

#ifdef VL_AVX512
// NVFP4 with float32 FMAs (float32 activations everywhere; bf16 activations on CPUs with AMX, see VL_NVFP4_DOT).
// A layer has one global scale, so every weight is one of 256 x 16 float32 values: tab[s * 16 + c] = E2M1[c] *
// (FP8_LUT[s] * gs), rounded to bf16 when the activations are bf16 (the reference's weights exactly; 16 KiB, built
// once per call). One block of 16 weights is one VPERMPS with its scale's table row as the memory operand: the
// block's 8 code bytes are broadcast to every 64-bit lane, so dword j holds bytes 4 (j % 2) .. 4 (j % 2) + 3, and
// shifting it right by 4 (j / 2) puts the code of element 8 (j % 2) + j / 2 in the 4 low bits VPERMPS reads. The
// caller puts the activations of every 16 columns in that order once per call (nvfp4_perm_rows). Two weight rows
// share each activation load. bf16 x bf16 products are exact in float32 and float32 x float32 ones are what the
// reference's GEMM rounds, so only the order of the float32 additions differs.
// Against the VDPBF16PS loop on an Intel Xeon with AMX (one thread, 3072 x 1024 layers, one bf16 row): 23.5 vs
// 18.5 G weights/s in L2, 19.9 vs 14.8 streaming 120 layers from memory; with float32 rows 23.5 vs 8.0 against the
// per-block VMULPS + unpack loop it replaced (docs/quant_cpu_kernels.md).
static inline int nvfp4_perm_pos(int j) { return 8 * (j % 2) + j / 2; }  // element read by lane j of a block

static void nvfp4_f32_table(float gs, int round16, float* tab) {
  const __m512 base = _mm512_loadu_ps(E2M1);
  for (int s = 0; s < 256; ++s) {
    __m512 v = _mm512_mul_ps(base, _mm512_set1_ps(FP8_LUT[s] * gs));
    _mm512_store_ps(tab + s * 16, round16 ? round_bf16_v(v) : v);
  }
}

// x (M, K) float32 (x_bf16 = 0) or bf16 (x_bf16 = 1) -> xq (M, K) float32 in lookup order per 16 columns
static void nvfp4_perm_rows(const void* x, int x_bf16, int M, int K, float* xq) {
  int pos[16];
  for (int j = 0; j < 16; ++j) pos[j] = nvfp4_perm_pos(j);
  const __m512i p = _mm512_loadu_si512(pos);
  for (size_t i = 0; i < (size_t)M * K; i += 16) {
    const __m512 v = x_bf16 ? load_bf16x16((const uint16_t*)x + i) : _mm512_loadu_ps((const float*)x + i);
    _mm512_storeu_ps(xq + i, _mm512_permutexvar_ps(p, v));
  }
}

template <int M, int R>
static inline void nvfp4_perm_pass(const float* xq, int K, const uint8_t* w, const uint8_t* bs, const float* tab,
                                   __m512i sh, int N, float* y, int o) {
  const int nb = K / 16;
  const uint8_t* wr = w + (size_t)o * (K / 2);
  const uint8_t* sr = bs + (size_t)o * nb;
  __m512 acc[M][R][2];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r][0] = acc[m][r][1] = _mm512_setzero_ps();
  auto block = [&](int b, int a) __attribute__((always_inline)) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) {
      const __m512i codes = _mm512_set1_epi64(*(const long long*)(wr + (size_t)r * (K / 2) + b * 8));
      wv[r] = _mm512_permutexvar_ps(_mm512_srlv_epi32(codes, sh), _mm512_load_ps(tab + ((size_t)sr[r * nb + b] << 4)));
    }
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_loadu_ps(xq + (size_t)m * K + b * 16);
      for (int r = 0; r < R; ++r) acc[m][r][a] = _mm512_fmadd_ps(wv[r], xv, acc[m][r][a]);
    }
  };
  int b = 0;
  for (; b + 2 <= nb; b += 2) {
    if (!(b & 7))  // one line 4 KiB ahead per 64 bytes of each row (per 16 bytes: 0.98-1.03x as fast, 4 pairs)
      for (int r = 0; r < R; ++r)
        _mm_prefetch((const char*)(wr + (size_t)r * (K / 2) + b * 8) + PREFETCH_BYTES, _MM_HINT_T0);
    block(b, 0);
    block(b + 1, 1);
  }
  if (b < nb) block(b, 0);
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r)
      y[(size_t)m * N + o + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][r][0], acc[m][r][1]));
}

template <int M>
static void nvfp4_rows_perm(const float* xq, int K, const uint8_t* w, const uint8_t* bs, const float* tab, int N,
                            float* y, int r0, int r1) {
  __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
  __asm__("" : "+v"(sh));  // keep the shift counts in a register (a memory operand costs a load per block)
  int o = r0;
  for (; o + 2 <= r1; o += 2) nvfp4_perm_pass<M, 2>(xq, K, w, bs, tab, sh, N, y, o);
  if (o < r1) nvfp4_perm_pass<M, 1>(xq, K, w, bs, tab, sh, N, y, o);
}
#endif

// Dense weights (plain bf16 / fp32 Linears, and every dense matrix of the fused decode step in decode_step.cpp,
// which includes this file): torch's CPU GEMV reads bf16 weights at about half the speed it reads fp32 ones;
// reading them straight into VDPBF16PS (bf16 x bf16 products are exact in float32) or FMA keeps the loop at
// memory speed. One weight row at a time, two accumulators per activation row, float32 accumulation. Each
// 128-byte step also prefetches the two cache lines 4 KiB ahead (prefetches never fault, so reading past the
// last row is harmless): +10-25% read bandwidth over the hardware prefetcher alone in a standalone read of one
// 328 MB bf16 matrix on this project's (loaded) runner; within noise on the 180m model's matrices.
// x (M, K) float32, w (N, K) float32; y[m * N + o] for o in [r0, r1).
template <int M>
static void dense_f32_rows(const float* x, int K, const float* w, int N, float* y, int r0, int r1) {
  for (int o = r0; o < r1; ++o) {
    const float* wr = w + (size_t)o * K;
    float tot[M];
    int i = 0;
#ifdef VL_AVX512
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (; i + 32 <= K; i += 32) {
      prefetch2(wr + i);
      const __m512 wa = _mm512_loadu_ps(wr + i), wb = _mm512_loadu_ps(wr + i + 16);
      for (int m = 0; m < M; ++m) {
        acc[m][0] = _mm512_fmadd_ps(wa, _mm512_loadu_ps(x + (size_t)m * K + i), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(wb, _mm512_loadu_ps(x + (size_t)m * K + i + 16), acc[m][1]);
      }
    }
    for (int m = 0; m < M; ++m) tot[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#else
    for (int m = 0; m < M; ++m) tot[m] = 0.f;
#endif
    for (; i < K; ++i)
      for (int m = 0; m < M; ++m) tot[m] += wr[i] * x[(size_t)m * K + i];
    for (int m = 0; m < M; ++m) y[(size_t)m * N + o] = tot[m];
  }
}

// xb (M, K) bf16 activations, w (N, K) bf16. x: the same values as float32, read only where the CPU lacks
// AVX512-BF16 (widening + FMA there); it may be null where dense_bf16_native() says 1.
template <int M>
static void dense_bf16_rows(const float* x, const uint16_t* xb, int K, const uint16_t* w, int N, float* y, int r0,
                            int r1) {
  for (int o = r0; o < r1; ++o) {
    const uint16_t* wr = w + (size_t)o * K;
    float tot[M];
    int i = 0;
#ifdef VL_AVX512
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
#ifdef __AVX512BF16__
    for (; i + 64 <= K; i += 64) {
      prefetch2(wr + i);
      const __m512bh wa = (__m512bh)_mm512_loadu_si512(wr + i), wb = (__m512bh)_mm512_loadu_si512(wr + i + 32);
      for (int m = 0; m < M; ++m) {
        const uint16_t* xr = xb + (size_t)m * K + i;
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wa, (__m512bh)_mm512_loadu_si512(xr));
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], wb, (__m512bh)_mm512_loadu_si512(xr + 32));
      }
    }
#else
    for (; i + 32 <= K; i += 32) {
      if (!(i & 63)) prefetch2(wr + i);  // 64 bytes per step here: one prefetch pair per 128 bytes
      const __m512 wa = load_bf16x16(wr + i), wb = load_bf16x16(wr + i + 16);
      for (int m = 0; m < M; ++m) {
        acc[m][0] = _mm512_fmadd_ps(wa, _mm512_loadu_ps(x + (size_t)m * K + i), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(wb, _mm512_loadu_ps(x + (size_t)m * K + i + 16), acc[m][1]);
      }
    }
#endif
    for (int m = 0; m < M; ++m) tot[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#else
    for (int m = 0; m < M; ++m) tot[m] = 0.f;
#endif
    (void)x;
    for (; i < K; ++i) {
      const float wv = bf16_to_float(wr[i]);
      for (int m = 0; m < M; ++m) tot[m] += wv * bf16_to_float(xb[(size_t)m * K + i]);
    }
    for (int m = 0; m < M; ++m) y[(size_t)m * N + o] = tot[m];
  }
}

#if defined(VL_AVX512) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__linux__)
#define VL_AMX 1
#include "amx_tiles.h"  // amx_ready, amx_configure
// Dense bf16 rows on AMX tiles (CPUs with AMX-BF16; built with -march=native there). The loops above issue one
// VDPBF16PS per 32 weights per activation row, so beyond one row they are bound by arithmetic, not memory: on the
// Intel Xeon runner a matrix of 4 rows cost 1.2-1.6x one row and of 8 rows 1.5-2.4x. TDPBF16PS multiplies a tile of
// 16 weight rows x 32 inputs by the same 32 inputs of up to 16 activation rows at once, so 1, 4 or 8 rows all read
// the weights at about memory speed (docs/cpu_decode.md, "Batches"). The weight rows are the A tile as stored (16
// rows of 64 bytes, stride K); the activations are repacked once per call into the B tile's pair layout
// (`amx_pack`); each output is one lane of a C tile in float32. Per output, the products of one 32-input block are
// summed in the instruction's fixed order (pair by pair, its k order) and the blocks in increasing order, then the
// inputs past the last whole block one by one: the same sums whatever the number of rows, their place, or the
// thread count. Rows past the last whole 16 (N % 16) take the VDPBF16PS loop, also independent of the rows. The
// process asks Linux once for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM); where it is refused the VDPBF16PS
// loops run everywhere (amx_ready, amx_tiles.h).

// xb (M, K) bf16 -> xv: per block of 32 inputs, 16 rows (input pairs) of M (even, odd) pairs: the B tile's layout.
static void amx_pack(const uint16_t* xb, int M, int K, uint16_t* xv) {
  const int nkb = K / 32;
  for (int kb = 0; kb < nkb; ++kb)
    for (int kk = 0; kk < 16; ++kk) {
      uint16_t* dst = xv + ((size_t)kb * 16 + kk) * M * 2;
      for (int m = 0; m < M; ++m) {
        dst[2 * m] = xb[(size_t)m * K + kb * 32 + 2 * kk];
        dst[2 * m + 1] = xb[(size_t)m * K + kb * 32 + 2 * kk + 1];
      }
    }
}

// One C tile's outputs to y: c holds 16 weight rows (o..o+15) x `rows` activation rows (m0..m0+rows-1), row n at
// c + n * rows. y wants each activation row's 16 outputs side by side: written one scalar at a time, 16 rows x M
// lands on M lines N floats apart, which share one L1 set when N is a power of two, and the conflict misses made a
// 16-row product cost 1.3-1.6x an 8-row one; so one gather and one store per activation row. Inputs past the last
// whole block of 32 (k32 < K) are added per output after the tile's sums, one by one.
static inline void amx_tile_out(const float* c, int rows, int m0, const uint16_t* w, const uint16_t* xb, int K, int k32,
                                int N, float* y, int o) {
  if (k32 == K) {
    const __m512i column = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(rows));
    for (int m = 0; m < rows; ++m)
      _mm512_storeu_ps(y + (size_t)(m0 + m) * N + o, _mm512_i32gather_ps(column, c + m, 4));
    return;
  }
  for (int n = 0; n < 16; ++n) {
    const uint16_t* wr = w + (size_t)(o + n) * K;
    for (int m = 0; m < rows; ++m) {
      float v = c[n * rows + m];
      for (int i = k32; i < K; ++i) v += bf16_to_float(wr[i]) * bf16_to_float(xb[(size_t)(m0 + m) * K + i]);
      y[(size_t)(m0 + m) * N + o + n] = v;
    }
  }
}

// y[m * N + o] for o in [r0, r1), r0 a multiple of 16; xv: `amx_pack` of xb. Tiles: 0-1 C, 2-3 A, 4 B.
template <int M>
static void dense_bf16_amx(const uint16_t* xv, const uint16_t* xb, int K, const uint16_t* w, int N, float* y, int r0,
                           int r1) {
  const int nkb = K / 32, k32 = nkb * 32;
  int o = r0;
  if (nkb > 0 && r1 - r0 >= 16) {
    amx_configure({M * 4, M * 4, 64, 64, M * 4});
    alignas(64) float out[2][16 * M];
    for (; o + 16 <= r1; o += 32) {
      const bool two = o + 32 <= r1;
      const uint16_t* w0 = w + (size_t)o * K;
      const uint16_t* w1 = w0 + (size_t)16 * K;
      _tile_zero(0);
      _tile_zero(1);
      for (int kb = 0; kb < nkb; ++kb) {
        _tile_loadd(4, xv + (size_t)kb * 16 * M * 2, M * 4);
        _tile_loadd(2, w0 + kb * 32, K * 2);
        _tile_dpbf16ps(0, 2, 4);
        if (two) {
          _tile_loadd(3, w1 + kb * 32, K * 2);
          _tile_dpbf16ps(1, 3, 4);
        }
      }
      _tile_stored(0, out[0], M * 4);
      if (two) _tile_stored(1, out[1], M * 4);
      for (int h = 0; h < (two ? 2 : 1); ++h) amx_tile_out(out[h], M, 0, w, xb, K, k32, N, y, o + 16 * h);
      if (!two) {
        o += 16;
        break;
      }
    }
    _tile_release();
  }
  if (o < r1) dense_bf16_rows<M>(nullptr, xb, K, w, N, y, o, r1);
}

// 17-32 rows on tiles: a B tile takes at most 16 activation rows, so rows 0-15 and 16..M-1 are two B tiles over the
// same `amx_pack` layout (B_hi starts 16 pairs into each pair-row) and each weight block has two C tiles (tiles: 0-1
// and 5-6 C, 2-3 A, 4 and 7 B). The weights are still read once; each output gets the same sums as in the 16-row
// kernel (the tile instruction's order per 32-input block, blocks in order, then the tail), so a row's bits do not
// depend on the group. Rows past the last whole 16 weight rows go through the 16-row kernel's tail loop, in two
// halves of the activation rows.
template <int M>
static void dense_bf16_amx32(const uint16_t* xv, const uint16_t* xb, int K, const uint16_t* w, int N, float* y,
                             int r0, int r1) {
  static_assert(M > 16 && M <= 32, "16 < M <= 32");
  constexpr int H = M - 16;
  const int nkb = K / 32, k32 = nkb * 32;
  int o = r0;
  if (nkb > 0 && r1 - r0 >= 16) {
    amx_configure({64, 64, 64, 64, 64, H * 4, H * 4, H * 4});
    alignas(64) float lo[2][16 * 16], hi[2][16 * H];
    for (; o + 16 <= r1; o += 32) {
      const bool two = o + 32 <= r1;
      const uint16_t* w0 = w + (size_t)o * K;
      const uint16_t* w1 = w0 + (size_t)16 * K;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(5);
      _tile_zero(6);
      for (int kb = 0; kb < nkb; ++kb) {
        const uint16_t* xk = xv + (size_t)kb * 16 * M * 2;
        _tile_loadd(4, xk, M * 4);
        _tile_loadd(7, xk + 32, M * 4);
        _tile_loadd(2, w0 + kb * 32, K * 2);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(5, 2, 7);
        if (two) {
          _tile_loadd(3, w1 + kb * 32, K * 2);
          _tile_dpbf16ps(1, 3, 4);
          _tile_dpbf16ps(6, 3, 7);
        }
      }
      _tile_stored(0, lo[0], 64);
      _tile_stored(5, hi[0], H * 4);
      if (two) {
        _tile_stored(1, lo[1], 64);
        _tile_stored(6, hi[1], H * 4);
      }
      for (int h = 0; h < (two ? 2 : 1); ++h) {
        amx_tile_out(lo[h], 16, 0, w, xb, K, k32, N, y, o + 16 * h);
        amx_tile_out(hi[h], H, 16, w, xb, K, k32, N, y, o + 16 * h);
      }
      if (!two) {
        o += 16;
        break;
      }
    }
    _tile_release();
  }
  if (o < r1) {  // the last weight rows (N % 16): the row loop, 16 activation rows and then the rest
    dense_bf16_rows<16>(nullptr, xb, K, w, N, y, o, r1);
    static thread_local std::vector<uint16_t> rest;
    static thread_local std::vector<float> yr;
    rest.assign(xb + (size_t)16 * K, xb + (size_t)M * K);
    rest.resize((size_t)16 * K, 0);  // zero rows up to the 16-row kernel: an exact no-op on the real rows' sums
    yr.assign((size_t)16 * N, 0.f);
    dense_bf16_rows<16>(nullptr, rest.data(), K, w, N, yr.data(), o, r1);
    for (int m = 0; m < H; ++m)
      std::memcpy(y + (size_t)(16 + m) * N + o, yr.data() + (size_t)m * N + o, sizeof(float) * (r1 - o));
  }
}

// NVFP4 rows on AMX tiles (bf16 activations): each 16 weight rows x 32 inputs (two blocks) are rebuilt as bf16 into
// a 1 KiB A tile (nvfp4_amx_row), and TDPBF16PS multiplies them by the same inputs of up to 64 activation rows, 16
// per B tile. The rebuilt weights are the reference's exactly and bf16 x bf16 products are exact in float32, so only
// the order of the float32 additions differs from a dequantize-then-GEMM: per output, the pairs of one 32-input
// block in the instruction's order, the blocks in increasing order. The A tile holds each block's weights in the
// lane order of the rebuild, so the activations are packed in that order too (nvfp4_amx_pack); a K that is an odd
// number of blocks ends on a zero half (zero weights times zero inputs add exact zeros). An output depends only on
// its own activation row (a C tile's column), so every row count, one row included, gives a row the same bits.
// Weight rows past the last whole 16 of the range fill the A tile's first rows (the rest zeros) and store only theirs.
static inline int nvfp4_amx_col(int p) { return 4 * (p % 8) + p / 8; }  // element held by lane p of a tile row

// A block's 16 rows (r[m]: row m's 16 pairs, as dwords) -> its B tile (row j: pair j of rows 0..15): a 16 x 16
// transpose of dwords, written one 64-byte tile row at a time. (A scatter per row, which wrote 4 bytes into each of
// 16 lines, made the packing ~30% of a 512-row product's time at Omni's expert widths.)
static inline void amx_b_tile(__m512i r[16], uint16_t* tile) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows: per 128-bit lane, columns 0-1 and 2-3 interleaved
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4 i + c], lane L: rows 4 i .. 4 i + 3 at column 4 L + c
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4 L + c, lane q = u[4 q + c] lane L: a 4 x 4 transpose of 128-bit lanes
    const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    _mm512_storeu_si512((__m512i*)(tile + (size_t)c * 32), _mm512_shuffle_i32x4(v0, v2, 0x88));
    _mm512_storeu_si512((__m512i*)(tile + (size_t)(4 + c) * 32), _mm512_shuffle_i32x4(v0, v2, 0xDD));
    _mm512_storeu_si512((__m512i*)(tile + (size_t)(8 + c) * 32), _mm512_shuffle_i32x4(v1, v3, 0x88));
    _mm512_storeu_si512((__m512i*)(tile + (size_t)(12 + c) * 32), _mm512_shuffle_i32x4(v1, v3, 0xDD));
  }
}

// xb (M, K) bf16 -> xv: per 32 inputs, per group of 16 rows (the last filled up with zero rows), one B tile: 16
// pair-rows of 16 (even, odd) pairs in the A tile's lane order (1 KiB). M <= 64. Per group and block: the rows' 32
// inputs permuted into lane order, then transposed into the tile (amx_b_tile); a last block of 16 inputs pair by pair.
static void nvfp4_amx_pack(const uint16_t* xb, int M, int K, uint16_t* xv) {
  const int nkb = (K + 31) / 32, full = K / 32, G = (M + 15) / 16;
  if (full < nkb) std::memset(xv, 0, (size_t)nkb * G * 1024);  // a last block's zero half
  uint16_t colv[32];
  for (int p = 0; p < 32; ++p) colv[p] = (uint16_t)nvfp4_amx_col(p);
  const __m512i perm = _mm512_loadu_si512(colv);
  for (int g = 0; g < G; ++g) {  // 16 rows (the last group filled up with zero rows) per B tile
    const int rows = M - 16 * g < 16 ? M - 16 * g : 16;
    for (int kb = 0; kb < full; ++kb) {
      __m512i r[16];
      for (int m = 0; m < 16; ++m)
        r[m] = m < rows ? _mm512_permutexvar_epi16(perm, _mm512_loadu_si512(xb + (size_t)(16 * g + m) * K + kb * 32))
                        : _mm512_setzero_si512();
      amx_b_tile(r, xv + ((size_t)kb * G + g) * 512);
    }
  }
  for (int m = 0; m < M; ++m) {
    const uint16_t* xr = xb + (size_t)m * K;
    uint16_t* base = xv + (size_t)(m / 16) * 512 + 2 * (m % 16);
    for (int p = 0; full < nkb && p < 32; ++p) {  // a last block of 16 inputs
      const int c = full * 32 + colv[p];
      if (c < K) base[(size_t)full * G * 512 + (p / 2) * 32 + p % 2] = xr[c];
    }
  }
}

// One tile row: weight row `wr` (packed) / `sr` (block scales), inputs 32 kb .. 32 kb + 31 as bf16 in lane order.
// The 16 code bytes go to all four 128-bit lanes; word j of lane L shifted right by 4 L holds, in its low 4 bits, the
// code of element 4 j + L (nvfp4_amx_col), of block j / 4. One VPERMW looks every lane up in the first block's table
// row (16 bf16 weights, exact; 64-byte rows, so no load splits a cache line), a second one, masked to the lanes of
// the second block, in its row. (VPERMT2W on both rows at once is three micro-ops on Intel cores, VPERMW one.)
template <bool PAIR>
static inline void nvfp4_amx_row(const uint8_t* wr, const uint8_t* sr, const uint16_t* tab16, __m512i sh,
                                 uint16_t* at) {
  const __m512i codes = _mm512_broadcast_i32x4(PAIR ? _mm_loadu_si128((const __m128i*)wr)
                                                    : _mm_loadl_epi64((const __m128i*)wr));
  const __m512i idx = _mm512_and_si512(_mm512_srlv_epi16(codes, sh), _mm512_set1_epi16(0x0F));
  const __m512i v = _mm512_permutexvar_epi16(idx, _mm512_load_si512(tab16 + ((size_t)sr[0] << 5)));
  // a lone last block: the second block's lanes read code 0 of the first one, an exact zero
  _mm512_store_si512((__m512i*)at, PAIR ? _mm512_mask_permutexvar_epi16(v, (__mmask32)0xF0F0F0F0u, idx,
                                                                        _mm512_load_si512(tab16 + ((size_t)sr[1] << 5)))
                                        : v);
}

// Block kb of `rows` weight rows (w0 / s0: the first row's packed codes and block scales) into the A tile at `at`:
// two 16-input blocks per tile, or a lone last one (kb == npair) beside zeros.
static inline void nvfp4_amx_block(const uint8_t* w0, const uint8_t* s0, size_t wstride, int nb, int rows, int kb,
                                   int npair, const uint16_t* tab16, __m512i sh, uint16_t* at) {
  for (int r = 0; r < rows; ++r) {
    if (kb < npair)
      nvfp4_amx_row<true>(w0 + r * wstride + kb * 16, s0 + (size_t)r * nb + 2 * kb, tab16, sh, at + r * 32);
    else
      nvfp4_amx_row<false>(w0 + r * wstride + kb * 16, s0 + (size_t)r * nb + 2 * kb, tab16, sh, at + r * 32);
  }
}

// Stored C tiles (c[g]: 16 weight rows x activation rows 16 g .. 16 g + 15, weight row n / activation row m at
// n * 16 + m % 16) -> y[m * N + o .. o + rows) for m < M.
static inline void nvfp4_amx_out(const float (*c)[256], int M, int rows, float* y, int N, int o) {
  const __m512i column = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
  const __mmask16 keep = (__mmask16)((1u << rows) - 1);
  for (int m = 0; m < M; ++m)
    _mm512_mask_storeu_ps(y + (size_t)m * N + o, keep, _mm512_i32gather_ps(column, c[m / 16] + m % 16, 4));
}

// One 32-input block: the A tile (register A: 2 for even blocks, 3 for odd) times the B tile of each group of 16
// activation rows into that group's C tile. GCC's tile intrinsics paste the tile number into their assembly text,
// so it must be a literal: a macro, not a template.
#define VL_NVFP4_AMX_MULTIPLY(A, at, xk, G)                                 \
  do {                                                                      \
    _tile_loadd(A, at, 64);                                                 \
    _tile_loadd(4, xk, 64);                                                 \
    _tile_dpbf16ps(0, A, 4);                                                \
    if ((G) > 1) { _tile_loadd(5, (xk) + 512, 64); _tile_dpbf16ps(1, A, 5); }  \
    if ((G) > 2) { _tile_loadd(4, (xk) + 1024, 64); _tile_dpbf16ps(6, A, 4); } \
    if ((G) > 3) { _tile_loadd(5, (xk) + 1536, 64); _tile_dpbf16ps(7, A, 5); } \
  } while (0)

// y[m * N + o] for m < M <= 64, o in [r0, r1); xv: nvfp4_amx_pack of the M rows; tab16: per block scale s, 64 bytes
// at 32 s: its 16 bf16 weights, then zeros. Tiles: C 0, 1, 6, 7 (rows 0-15, 16-31, 32-47, 48-63), A 2-3 (even and
// odd 32-input blocks), B 4-5 (groups in turn).
static void nvfp4_rows_amx(const uint16_t* xv, int M, int K, const uint8_t* w, const uint8_t* bs, const uint16_t* tab16,
                           int N, float* y, int r0, int r1) {
  const int G = (M + 15) / 16, nb = K / 16, nkb = (K + 31) / 32, npair = nb / 2;
  amx_configure({64, 64, 64, 64, 64, 64, 64, 64});
  uint16_t shv[32];
  for (int p = 0; p < 32; ++p) shv[p] = (uint16_t)(4 * (p / 8));
  __m512i sh = _mm512_loadu_si512(shv);
  __asm__("" : "+v"(sh));
  // A tiles in four buffers: block kb + 2 is rebuilt while kb is multiplied (standalone, 12B widths, one thread:
  // 64 rows 18.3 -> 14.4 ms, one row 9.5 -> 7.7 ms against rebuilding kb just before multiplying it)
  alignas(64) uint16_t a[4][16 * 32];
  alignas(64) float c[4][16 * 16];
  const size_t wstride = K / 2;
  auto multiply = [&](int kb, const uint16_t* at) __attribute__((always_inline)) {
    const uint16_t* xk = xv + (size_t)kb * G * 512;
    if (kb & 1) VL_NVFP4_AMX_MULTIPLY(3, at, xk, G);
    else VL_NVFP4_AMX_MULTIPLY(2, at, xk, G);
  };
  for (int o = r0; o < r1; o += 16) {
    const int rows = r1 - o < 16 ? r1 - o : 16;
    const uint8_t* w0 = w + (size_t)o * wstride;
    const uint8_t* s0 = bs + (size_t)o * nb;
    _tile_zero(0);
    if (G > 1) _tile_zero(1);
    if (G > 2) _tile_zero(6);
    if (G > 3) _tile_zero(7);
    if (rows == 16) {
      constexpr int AHEAD = 2, AHEAD2 = 4;
      auto fill = [&](int kb) __attribute__((always_inline)) {
        uint16_t* at = a[kb % AHEAD2];
        if (!(kb & 3))  // one line 4 KiB ahead per 64 bytes of each row
          for (int r = 0; r < 16; ++r) _mm_prefetch((const char*)(w0 + r * wstride + kb * 16) + PREFETCH_BYTES, _MM_HINT_T0);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r)
          nvfp4_amx_row<true>(w0 + r * wstride + kb * 16, s0 + (size_t)r * nb + 2 * kb, tab16, sh, at + r * 32);
      };
      for (int kb = 0; kb < AHEAD && kb < npair; ++kb) fill(kb);
      for (int kb = 0; kb < npair; ++kb) {
        if (kb + AHEAD < npair) fill(kb + AHEAD);
        multiply(kb, a[kb % AHEAD2]);
      }
      if (npair < nkb) {  // an odd number of blocks: the last one alone, with zeros beside it
        uint16_t* at = a[npair % AHEAD2];
        nvfp4_amx_block(w0, s0, wstride, nb, 16, npair, npair, tab16, sh, at);
        multiply(npair, at);
      }
    } else {  // the range's last rows: the A tile's first `rows` rows, the rest zeros
      std::memset(a, 0, sizeof(a));
      constexpr int AHEAD2 = 2;
      for (int kb = 0; kb < nkb; ++kb) {
        uint16_t* at = a[kb % AHEAD2];
        nvfp4_amx_block(w0, s0, wstride, nb, rows, kb, npair, tab16, sh, at);
        multiply(kb, at);
      }
    }
    _tile_stored(0, c[0], 64);
    if (G > 1) _tile_stored(1, c[1], 64);
    if (G > 2) _tile_stored(6, c[2], 64);
    if (G > 3) _tile_stored(7, c[3], 64);
    nvfp4_amx_out(c, M, rows, y, N, o);
  }
  _tile_release();
}

// Many rows (prompts: more than one slab of activation rows in a call). nvfp4_rows_amx rebuilds the A tiles for
// every slab and multiplies each by B tiles read from L2 (a slab's B tiles are ~0.3-1.5 MiB). Here the range's A
// tiles are rebuilt once per call into a per-thread panel (L2), and the products run in K-blocks of KB 32-input
// blocks: per K-block, every stripe of 16 weight rows in turn takes its C tiles from a small buffer (L1), multiplies
// the K-block's B tiles (L1 after the first stripe) and puts them back. Against nvfp4_rows_amx slab by slab, same
// packing, 2 threads: 512 rows of Omni's 1856 x 2688 expert 3.74 -> 3.07 ms, of the 12B MLP's 20480 x 5120 83.4 ->
// 58.4 ms. A C tile's sums go through memory between K-blocks unchanged (float32 stored and loaded exactly), in the
// same order, so every output has the bits nvfp4_rows_amx gives it.
// xv: nvfp4_amx_pack of all M rows, slab by slab; panel: (r1 - r0 + 15) / 16 stripes of nkb KiB; r1 - r0 <= 64.
static void nvfp4_rows_amx_many(const uint16_t* xv, int M, int slab, int K, const uint8_t* w, const uint8_t* bs,
                                const uint16_t* tab16, int N, float* y, int r0, int r1, uint16_t* panel) {
  constexpr int KB = 4;
  const int nb = K / 16, nkb = (K + 31) / 32, npair = nb / 2, S = (r1 - r0 + 15) / 16;
  const size_t wstride = K / 2;
  uint16_t shv[32];
  for (int p = 0; p < 32; ++p) shv[p] = (uint16_t)(4 * (p / 8));
  __m512i sh = _mm512_loadu_si512(shv);
  __asm__("" : "+v"(sh));
  for (int st = 0; st < S; ++st) {  // the panel: each stripe's A tiles, the rows past the range zero
    const int o = r0 + 16 * st, rows = r1 - o < 16 ? r1 - o : 16;
    const uint8_t* w0 = w + (size_t)o * wstride;
    const uint8_t* s0 = bs + (size_t)o * nb;
    uint16_t* kept = panel + (size_t)st * nkb * 512;
    if (rows < 16) std::memset(kept, 0, (size_t)nkb * 1024);
    for (int kb = 0; kb < nkb; ++kb) nvfp4_amx_block(w0, s0, wstride, nb, rows, kb, npair, tab16, sh, kept + kb * 512);
  }
  amx_configure({64, 64, 64, 64, 64, 64, 64, 64});
  alignas(64) float c[4][4][16 * 16];  // stripe, group of 16 activation rows: the C tiles between K-blocks
  for (int m0 = 0; m0 < M; m0 += slab) {
    const int mm = M - m0 < slab ? M - m0 : slab, G = (mm + 15) / 16;
    const uint16_t* xs = xv + (size_t)m0 * nkb * 32;
    for (int kb0 = 0; kb0 < nkb; kb0 += KB) {
      const int kb1 = kb0 + KB < nkb ? kb0 + KB : nkb;
      for (int st = 0; st < S; ++st) {
        if (kb0 == 0) {
          _tile_zero(0);
          if (G > 1) _tile_zero(1);
          if (G > 2) _tile_zero(6);
          if (G > 3) _tile_zero(7);
        } else {
          _tile_loadd(0, c[st][0], 64);
          if (G > 1) _tile_loadd(1, c[st][1], 64);
          if (G > 2) _tile_loadd(6, c[st][2], 64);
          if (G > 3) _tile_loadd(7, c[st][3], 64);
        }
        const uint16_t* ap = panel + (size_t)st * nkb * 512;
        for (int kb = kb0; kb < kb1; ++kb) {
          const uint16_t* xk = xs + (size_t)kb * G * 512;
          if (kb & 1) VL_NVFP4_AMX_MULTIPLY(3, ap + (size_t)kb * 512, xk, G);
          else VL_NVFP4_AMX_MULTIPLY(2, ap + (size_t)kb * 512, xk, G);
        }
        _tile_stored(0, c[st][0], 64);
        if (G > 1) _tile_stored(1, c[st][1], 64);
        if (G > 2) _tile_stored(6, c[st][2], 64);
        if (G > 3) _tile_stored(7, c[st][3], 64);
      }
    }
    for (int st = 0; st < S; ++st) {
      const int o = r0 + 16 * st;
      nvfp4_amx_out(c[st], mm, r1 - o < 16 ? r1 - o : 16, y + (size_t)m0 * N, N, o);
    }
  }
  _tile_release();
}

// A thread's panel for nvfp4_rows_amx_many (elems uint16), kept for the thread's life and grown as needed (at most
// 4 stripes x K / 32 KiB: 2.5 MiB at 20480 inputs), so that a call does not map fresh pages per range; null where
// it cannot be had.
static uint16_t* amx_panel(size_t elems) {
  static thread_local uint16_t* buf = nullptr;
  static thread_local size_t held = 0;
  if (held < elems) {
    std::free(buf);
    buf = (uint16_t*)std::aligned_alloc(64, (elems * 2 + 63) & ~(size_t)63);
    held = buf ? elems : 0;
  }
  return buf;
}
#endif

#define VL_DISPATCH_ROWS(ROWS, FN, ...)       \
  switch (ROWS) {                             \
    case 1: FN<1>(__VA_ARGS__); break;        \
    case 2: FN<2>(__VA_ARGS__); break;        \
    case 3: FN<3>(__VA_ARGS__); break;        \
    default: FN<4>(__VA_ARGS__); break;       \
  }
#define VL_DISPATCH(FN, ...) VL_DISPATCH_ROWS(M, FN, __VA_ARGS__)

// One FP8 layer's call as its row chunks need it: the activations in the form its loop reads (bf16 in unpack order
// for the table loop; float32 where a scale's table entries would not be exact) and the per-tensor table.
struct Fp8Call {
  const void* x;
  int x_bf16, round16;
  uint16_t* xp = nullptr;
  float* xf = nullptr;
#ifdef VL_FP8_TABLE
  Table shared;
#endif
  Fp8Call() = default;
  Fp8Call(const Fp8Call&) = delete;  // owns xp / xf
  Fp8Call& operator=(const Fp8Call&) = delete;
  ~Fp8Call() {
    delete[] xp;
    delete[] xf;
  }
};

static void fp8_prepare(Fp8Call& c, const void* x, int M, int K, int N, const float* scale, int kind, int round16,
                        int x_bf16) {
  c.x = x;
  c.x_bf16 = x_bf16;
  c.round16 = round16;
#ifdef VL_FP8_TABLE
  if (x_bf16) {
    bool exact = true;  // every scale's table entries come out of the vector conversion exactly
    const int nscale = kind == 0 ? 1 : kind == 1 ? N : ((N + 127) / 128) * (K / 128);
    for (int i = 0; i < nscale; ++i) exact = exact && bf16_weights_normal(scale[i] * (1.f / 512));
    if (!exact) {  // the float32 path with bf16 rounding of each weight: the same weights, slower
      c.xf = bf16_rows_to_float((const uint16_t*)x, M, K);
      c.x = c.xf;
      c.x_bf16 = 0;
      c.round16 = 1;
    } else {  // activations in the unpack order of each 64-column block
      c.xp = new uint16_t[(size_t)M * K];
      uint16_t pos[64];
      for (int j = 0; j < 64; ++j) pos[j] = (uint16_t)unpack_pos(j);
      reorder_rows64((const uint16_t*)x, M, K, pos, c.xp);
      if (kind == 0) make_table(scale[0], c.shared);  // one table for the whole layer
    }
  }
#else
  (void)M; (void)K; (void)N; (void)scale; (void)kind;
#endif
}

static inline void fp8_chunk(Fp8Call& c, int M, int K, const uint8_t* w, int N, const float* scale, int kind,
                             float* y, int r0, int r1) {
#ifdef VL_FP8_TABLE
  if (c.x_bf16) {
    VL_DISPATCH(fp8_rows_table, (const uint16_t*)c.x, c.xp, K, w, N, scale, kind, &c.shared, y, r0, r1)
    return;
  }
#endif
  VL_DISPATCH(fp8_rows, (const float*)c.x, K, w, N, scale, kind, c.round16, y, r0, r1)
}

// G FP8 layers of one shape (N, K) and one scale kind in one call, as nvfp4_gemv_group: group g multiplies its
// rows x[g] (M, K) by (w[g], scale[g]) into y + g * M * N, one parallel loop over every group's row chunks, each
// row computed as the one-layer call computes it.
// M in 1..4 (the caller splits larger row counts). nthreads: OpenMP threads over output rows.
// x_bf16 = 1 (only where gemv_bf16_dot() says so): x holds (M, K) bf16 values and round16 is implied.
static void fp8_gemv_group(int G, const void* const* x, int M, int K, const uint8_t* const* w, int N,
                           const float* const* scale, int kind, int round16, int x_bf16, float* y, int nthreads) {
  const int grain = kind == 2 ? 128 : 16;  // a block-scaled chunk never straddles two scale rows needlessly
  const int chunks = (N + grain - 1) / grain;
  const size_t out = (size_t)M * N;
  std::vector<Fp8Call> calls(G);
  for (int g = 0; g < G; ++g) fp8_prepare(calls[g], x[g], M, K, N, scale[g], kind, round16, x_bf16);
  parallel_for(G * chunks, nthreads, [&](int c) {
    const int g = c / chunks, r0 = (c % chunks) * grain, r1 = r0 + grain < N ? r0 + grain : N;
    fp8_chunk(calls[g], M, K, w[g], N, scale[g], kind, y + out * g, r0, r1);
  });
}

// One layer: the group of one.
static void fp8_gemv(const void* x, int M, int K, const uint8_t* w, int N, const float* scale, int kind,
                     int round16, int x_bf16, float* y, int nthreads) {
  fp8_gemv_group(1, &x, M, K, &w, N, &scale, kind, round16, x_bf16, y, nthreads);
}

// The loop NVFP4 layers take with bf16 activations: 2 = VDPBF16PS on the bf16 table, 1 = VPERMPS + FMA (float32
// activations always take it on AVX512), 0 = the portable loop.
static int nvfp4_loop() {
#if defined(VL_NVFP4_DOT)
  return 2;
#elif defined(VL_AVX512)
  return 1;
#else
  return 0;
#endif
}

// G layers of the same shape (N, K) in one call: group g multiplies its own rows x[g] (M, K) by its own weights
// (w[g], bs[g], gs[g]) into y + g * M * N. One parallel loop over every group's row chunks, so the threads wake once
// for all of them: a MoE layer's k routed experts of one token are k such groups (vl/quant/experts.py). Each output
// row is computed exactly as the one-layer call computes it (same table, same activation order, same loop), and
// the same whatever M: the loops keep per-row accumulators four rows at a time, and with tiles = 1 (bf16
// activations, AMX) nvfp4_rows_amx takes every row count (64 rows per pass) in its own order of the sums. So a row's
// bits depend on `tiles`, never on the other rows: the caller picks `tiles` by a rule that does not look at them
// (vl/kernels/gemv.py, decode_step.cpp `gemv`).
// x_bf16 = 1 (only where gemv_bf16_dot() says so): x holds (M, K) bf16 values and round16 is implied.
static void nvfp4_gemv_group(int G, const void* const* x, int M, int K, const uint8_t* const* w,
                             const uint8_t* const* bs, const float* gs, int N, int round16, int x_bf16, int tiles,
                             float* y, int nthreads) {
  const size_t out = (size_t)M * N;
#ifdef VL_AVX512
  // per group: its 256 x 16 weight values (float32, or bf16 for the table loop) and its activations in the order
  // its loop reads them, in one 64-byte aligned slot of `per` bytes
  const int nkb = (K + 31) / 32;  // the tiles' B tiles: per 32 inputs, 1 KiB per 16 rows (the last filled up)
  // rows per tile pass: every 16 weight rows read a pass's B tiles whole, so they are kept to about L2 (~1.5 MiB);
  // a row's sums are the same in any pass (5120 -> 20480 inputs, 64 rows, one thread: 31.2 ms in one pass, 29.6 in
  // two, within the runs' spread)
#ifdef VL_AMX
  const int slab = nkb * 4 <= 1536 ? 64 : nkb * 2 <= 1536 ? 32 : 16;
#endif
  const size_t xbytes = std::max((size_t)M * K * sizeof(float), (size_t)nkb * ((M + 15) / 16) * 1024);
  const size_t per = 256 * 16 * sizeof(float) + ((xbytes + 63) & ~(size_t)63);
  char* buf = (char*)std::aligned_alloc(64, per * G);
  std::vector<char> loop(G, 1);  // 1 = nvfp4_rows_perm, 2 = nvfp4_rows_bf16, 3 = nvfp4_rows_amx
#ifdef VL_NVFP4_DOT
  uint16_t pos[64];  // per 64 columns: the 32 even ones, then the 32 odd ones (low, then high nibbles)
  for (int j = 0; j < 64; ++j) pos[j] = (uint16_t)(j < 32 ? 2 * j : 2 * (j - 32) + 1);
#endif
  for (int g = 0; g < G; ++g) {
    // the bf16 weights are exact (and not flushed by the tiles) when the least |weight|, 0.5 x 2^-9 (E4M3) x gs, is a
    // normal bf16
    const bool normal = x_bf16 && bf16_weights_normal(gs[g] * (1.f / 1024));
#ifdef VL_NVFP4_DOT
    if (normal) {
      loop[g] = 2;
      uint16_t* tab = (uint16_t*)(buf + per * g);
      nvfp4_bf16_table(gs[g], tab);
      reorder_rows64((const uint16_t*)x[g], M, K, pos, tab + 256 * 16);
      continue;
    }
#endif
    float* tab = (float*)(buf + per * g);
    nvfp4_f32_table(gs[g], round16 || x_bf16, tab);
#ifdef VL_AMX
    if (tiles && normal && amx_ready()) {  // the bf16 weights (exact: round16), 64-row slabs each packed for its B tiles
      loop[g] = 3;
      uint16_t* tab16 = (uint16_t*)tab;  // per scale 64 bytes: its 16 bf16 weights, then 16 zeros, in place of
      for (int sc = 0; sc < 256; ++sc) {  // the float32 row (read whole before it is written)
        const __m512i v = _mm512_load_si512(tab + sc * 16);
        _mm256_store_si256((__m256i*)(tab16 + sc * 32), _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
        _mm256_store_si256((__m256i*)(tab16 + sc * 32 + 16), _mm256_setzero_si256());
      }
      parallel_for((M + slab - 1) / slab, M > slab ? nthreads : 1, [&](int i) {
        const int m0 = i * slab;
        nvfp4_amx_pack((const uint16_t*)x[g] + (size_t)m0 * K, std::min(slab, M - m0), K,
                       (uint16_t*)(tab + 256 * 16) + (size_t)m0 * nkb * 32);
      });
      continue;
    }
#endif
    nvfp4_perm_rows(x[g], x_bf16, M, K, tab + 256 * 16);
  }
  const int grain = 64;  // 16 x 4: an AMX chunk loads its tile configuration once
  const int chunks = (N + grain - 1) / grain;
  parallel_for(G * chunks, nthreads, [&](int c) {
    const int g = c / chunks, r0 = (c % chunks) * grain, r1 = r0 + grain < N ? r0 + grain : N;
    float* yg = y + out * g;
#ifdef VL_NVFP4_DOT
    if (loop[g] == 2) {
      const uint16_t* tab = (const uint16_t*)(buf + per * g);
      for (int m0 = 0; m0 < M; m0 += 4) {
        const int mm = std::min(4, M - m0);
        const uint16_t* xr = (const uint16_t*)x[g] + (size_t)m0 * K;
        VL_DISPATCH_ROWS(mm, nvfp4_rows_bf16, xr, tab + 256 * 16 + (size_t)m0 * K, K, w[g], bs[g], tab, N,
                         yg + (size_t)m0 * N, r0, r1)
      }
      return;
    }
#endif
    const float* tab = (const float*)(buf + per * g);
#ifdef VL_AMX
    if (loop[g] == 3) {
      uint16_t* panel = M > slab ? amx_panel((size_t)(r1 - r0 + 15) / 16 * nkb * 512) : nullptr;
      if (panel) {
        nvfp4_rows_amx_many((const uint16_t*)(tab + 256 * 16), M, slab, K, w[g], bs[g], (const uint16_t*)tab, N, yg,
                            r0, r1, panel);
        return;
      }
      for (int m0 = 0; m0 < M; m0 += slab)
        nvfp4_rows_amx((const uint16_t*)(tab + 256 * 16) + (size_t)m0 * nkb * 32, std::min(slab, M - m0), K, w[g],
                       bs[g], (const uint16_t*)tab, N, yg + (size_t)m0 * N, r0, r1);
      return;
    }
#endif
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int mm = std::min(4, M - m0);
      VL_DISPATCH_ROWS(mm, nvfp4_rows_perm, tab + 256 * 16 + (size_t)m0 * K, K, w[g], bs[g], tab, N,
                       yg + (size_t)m0 * N, r0, r1)
    }
  });
  std::free(buf);
#else
  (void)tiles;
  const int grain = 16;
  const int chunks = (N + grain - 1) / grain;
  std::vector<float*> xf(G, nullptr);
  if (x_bf16)
    for (int g = 0; g < G; ++g) xf[g] = bf16_rows_to_float((const uint16_t*)x[g], M, K);
  parallel_for(G * chunks, nthreads, [&](int c) {
    const int g = c / chunks, r0 = (c % chunks) * grain, r1 = r0 + grain < N ? r0 + grain : N;
    const float* xv = x_bf16 ? xf[g] : (const float*)x[g];
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int mm = std::min(4, M - m0);
      VL_DISPATCH_ROWS(mm, nvfp4_rows, xv + (size_t)m0 * K, K, w[g], bs[g], gs[g], N, round16 || x_bf16,
                       y + out * g + (size_t)m0 * N, r0, r1)
    }
  });
  for (float* p : xf) delete[] p;
#endif
}

// One layer: the group of one.
static void nvfp4_gemv(const void* x, int M, int K, const uint8_t* w, const uint8_t* bs, float gs, int N,
                       int round16, int x_bf16, int tiles, float* y, int nthreads) {
  nvfp4_gemv_group(1, &x, M, K, &w, &bs, &gs, N, round16, x_bf16, tiles, y, nthreads);
}

static int packed_tiles() {  // 1: NVFP4 rows with bf16 activations can take AMX tiles (`tiles` = 1) in this build
#ifdef VL_AMX
  return amx_ready() ? 1 : 0;
#else
  return 0;
#endif
}

// Expanding packed rows for products of many rows (prefill): rows [r0, r1) of a layer written out as float32
// (out_bf16 = 0) or bf16 (1), each weight exactly the value the reference dequantizers give (vl/quant/nvfp4.py
// dequantize_nvfp4, vl/quant/fp8.py dequantize_fp8: the float32 product, rounded once to bf16 as torch rounds,
// NaN as torch's 0x7FC0), so a dense GEMM on them equals the reference path. A table lookup per weight where the
// torch reference runs several full-size passes (~0.15 G weights/s on one core, as slow as the GEMM it feeds).
static inline uint16_t bf16_bits(float f) {  // torch's float -> bfloat16: nearest even, NaN -> 0x7FC0
  if (f != f) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline void put_weight(void* out, size_t at, float v, int out_bf16) {
  if (out_bf16) ((uint16_t*)out)[at] = bf16_bits(v);
  else ((float*)out)[at] = v;
}

static void nvfp4_expand(const uint8_t* w, const uint8_t* bs, float gs, int K, int r0, int r1, int out_bf16,
                         void* out, int nthreads) {
  float tab[256 * 16];  // E2M1[c] * (E4M3 block scale s * gs), the reference's float32 products
  for (int sc = 0; sc < 256; ++sc)
    for (int c = 0; c < 16; ++c) tab[sc * 16 + c] = E2M1[c] * (FP8_LUT[sc] * gs);
  const int nb = K / 16;
#ifdef VL_AVX512
  if (out_bf16) {  // per two blocks: one table lookup of 32 bf16 weights (natural order), one store
    // per scale 64 bytes: the 16 weights as bf16 (torch's rounding, NaN as 0x7FC0), then zeros
    uint16_t* tab16 = (uint16_t*)std::aligned_alloc(64, 256 * 64);
    for (int sc = 0; sc < 256; ++sc)
      for (int c = 0; c < 32; ++c) tab16[sc * 32 + c] = c < 16 ? bf16_bits(tab[sc * 16 + c]) : 0;
    parallel_for(r1 - r0, nthreads, [&](int i) {
      const int o = r0 + i;
      const uint8_t* wr = w + (size_t)o * (K / 2);
      const uint8_t* sr = bs + (size_t)o * nb;
      uint16_t* y = (uint16_t*)out + (size_t)i * K;
      const __m512i nibbles = _mm512_set1_epi32(0x000F000F);
      int b = 0;
      for (; b + 2 <= nb; b += 2) {
        // byte j of the 16 -> dword j holding element 2 j (its low nibble) in its low word and 2 j + 1 in its high
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wr + b * 8)));
        const __m512i idx = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), nibbles, 0xA8);  // (d | d << 12) & m
        const __m512i v = _mm512_permutexvar_epi16(idx, _mm512_load_si512(tab16 + (size_t)sr[b] * 32));
        _mm512_storeu_si512(y + b * 16, _mm512_mask_permutexvar_epi16(
                                            v, (__mmask32)0xFFFF0000u, idx, _mm512_load_si512(tab16 + (size_t)sr[b + 1] * 32)));
      }
      if (b < nb) {  // a last lone block
        const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(wr + b * 8)));
        const __m256i idx = _mm256_ternarylogic_epi32(d, _mm256_slli_epi32(d, 12), _mm256_set1_epi32(0x000F000F), 0xA8);
        _mm256_storeu_si256((__m256i*)(y + b * 16),
                            _mm256_permutexvar_epi16(idx, _mm256_load_si256((const __m256i*)(tab16 + (size_t)sr[b] * 32))));
      }
    });
    std::free(tab16);
    return;
  }
#endif
  parallel_for(r1 - r0, nthreads, [&](int i) {
    const int o = r0 + i;
    const uint8_t* wr = w + (size_t)o * (K / 2);
    const uint8_t* sr = bs + (size_t)o * nb;
    const size_t base = (size_t)i * K;
    for (int b = 0; b < nb; ++b) {
      const float* t = tab + sr[b] * 16;
      for (int j = 0; j < 8; ++j) {  // the low nibble is the even element
        const uint8_t byte = wr[b * 8 + j];
        put_weight(out, base + b * 16 + 2 * j, t[byte & 15], out_bf16);
        put_weight(out, base + b * 16 + 2 * j + 1, t[byte >> 4], out_bf16);
      }
    }
  });
}

// scale as the row kernels take it (kind 0: one, 1: per row, 2: per 128 x 128 block, (N/128 rounded up, K/128)).
static void fp8_expand(const uint8_t* w, const float* scale, int kind, int N, int K, int r0, int r1, int out_bf16,
                       void* out, int nthreads) {
  const int kb = (K + 127) / 128;
  parallel_for(r1 - r0, nthreads, [&](int i) {
    const int o = r0 + i;
    const uint8_t* wr = w + (size_t)o * K;
    const size_t base = (size_t)i * K;
    for (int c = 0; c < K; ++c) {
      const float sc = kind == 0 ? scale[0] : kind == 1 ? scale[o] : scale[(size_t)(o / 128) * kb + c / 128];
      put_weight(out, base + c, FP8_LUT[wr[c]] * sc, out_bf16);
    }
  });
  (void)N;
}

// Dense: x (M, K) and w (N, K) both bf16 (bf16=1) or both float32; y (M, N) float32. M in 1..4.
static int dense_bf16_native() {  // 1: the bf16 loop uses VDPBF16PS (else a scalar loop: the caller keeps torch's)
#if defined(VL_AVX512) && defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

static void dense_gemv(const void* x, int M, int K, const void* w, int N, int bf16, float* y, int nthreads) {
  const int grain = 16;
  const int chunks = (N + grain - 1) / grain;
  float* xf = nullptr;  // bf16 activations widened, for CPUs without AVX512-BF16
#if !(defined(VL_AVX512) && defined(__AVX512BF16__))
  if (bf16) xf = bf16_rows_to_float((const uint16_t*)x, M, K);
#endif
#ifdef VL_AMX
  if (bf16 && amx_ready()) {
    tile_vector<uint16_t> xv((size_t)(K / 32) * 32 * M);  // B tiles: 64-byte aligned (amx_tiles.h)
    amx_pack((const uint16_t*)x, M, K, xv.data());
    parallel_for(chunks, nthreads, [&](int c) {
      const int r0 = c * grain, r1 = r0 + grain < N ? r0 + grain : N;
      VL_DISPATCH(dense_bf16_amx, xv.data(), (const uint16_t*)x, K, (const uint16_t*)w, N, y, r0, r1)
    });
    return;
  }
#endif
  parallel_for(chunks, nthreads, [&](int c) {
    const int r0 = c * grain, r1 = r0 + grain < N ? r0 + grain : N;
    if (bf16) {
      VL_DISPATCH(dense_bf16_rows, xf, (const uint16_t*)x, K, (const uint16_t*)w, N, y, r0, r1)
    } else {
      VL_DISPATCH(dense_f32_rows, (const float*)x, K, (const float*)w, N, y, r0, r1)
    }
  });
  delete[] xf;
}

// Dense, stored transposed: wt (K, N) row-major is the layer's (N, K) weight laid out column by column, bf16
// (bf16=1) or float32; x (M, K) float32 holding model-dtype values; y (M, N) float32 = x @ wt, as
// y[m, :] = sum over i, in increasing i, of x[m, i] * wt[i, :] (float32 products, exact for bf16 x bf16, and float32
// sums). A row i of wt is read only where some x[m, i] != 0: the input of a ReLU^2 MLP's down_proj is mostly zeros
// (about half for random weights, more in trained models), so decode reads that much less of the layer. A zero
// term is exactly nothing in a finite sum, so only the order of the float32 additions differs from the row-major
// product (a non-finite weight times a zero input would be NaN there and is skipped here). Threads split the
// columns; each output is summed by one thread in the same order whatever the thread count, and a row whose
// x[m, i] is 0 skips that term, so no row's result depends on the other rows. M: any.
static void dense_t_gemv(const float* x, int M, int K, const void* wt, int N, int bf16, float* y, int nthreads) {
  static thread_local std::vector<int> nz;
  nz.clear();
  for (int i = 0; i < K; ++i)
    for (int m = 0; m < M; ++m)
      if (x[(size_t)m * K + i] != 0.f) {
        nz.push_back(i);
        break;
      }
  const int nnz = (int)nz.size();
  const int* idx = nz.data();
  const int parts = nthreads > 1 ? std::max(1, std::min(nthreads, N / 64)) : 1;
  parallel_for(parts, parts, [&](int t) {
    const int c0 = (int)((int64_t)N * t / parts) & ~15;
    const int c1 = t + 1 == parts ? N : (int)((int64_t)N * (t + 1) / parts) & ~15;
    for (int m = 0; m < M; ++m) std::memset(y + (size_t)m * N + c0, 0, sizeof(float) * (c1 - c0));
    // Up to 4 non-zero rows at a time, their terms added to each output in increasing row order (the same fused
    // multiply-adds as one row at a time; y stays in registers across the 4 and the 4 rows stream side by side).
    for (int j = 0; j < nnz; j += 4) {
      const int nr = nnz - j < 4 ? nnz - j : 4;
      const char* rows[4];
      for (int r = 0; r < 4; ++r) rows[r] = (const char*)wt + (size_t)idx[j + (r < nr ? r : 0)] * N * (bf16 ? 2 : 4);
#ifdef VL_AVX512
      const char* ahead[4];  // the next 4 rows, prefetched one line each per 64 bytes read from a current row
      for (int r = 0; r < 4; ++r)
        ahead[r] = (const char*)wt + (size_t)idx[j + 4 + r < nnz ? j + 4 + r : nnz - 1] * N * (bf16 ? 2 : 4);
#endif
      for (int m0 = 0; m0 < M; m0 += 4) {  // up to 4 activation rows share each load of the 4 weight rows
        const int mg = M - m0 < 4 ? M - m0 : 4;
        float a[4][4] = {};  // a padding row repeats row 0 with a zero coefficient: an exact no-op
        bool any = false;
        for (int mm = 0; mm < mg; ++mm)
          for (int r = 0; r < nr; ++r) any |= (a[mm][r] = x[(size_t)(m0 + mm) * K + idx[j + r]]) != 0.f;
        if (!any) continue;
        int c = c0;
#ifdef VL_AVX512
        __m512 av[4][4];
        for (int mm = 0; mm < 4; ++mm)
          for (int r = 0; r < 4; ++r) av[mm][r] = _mm512_set1_ps(a[mm][r]);
        for (; c + 16 <= c1; c += 16) {
          __m512 w[4];
          if (bf16) {
            if (m0 == 0 && !(c & 31))
              for (int r = 0; r < 4; ++r) _mm_prefetch(ahead[r] + 2 * c, _MM_HINT_T0);
            for (int r = 0; r < 4; ++r) w[r] = load_bf16x16((const uint16_t*)rows[r] + c);
          } else {
            if (m0 == 0)
              for (int r = 0; r < 4; ++r) _mm_prefetch(ahead[r] + 4 * c, _MM_HINT_T0);
            for (int r = 0; r < 4; ++r) w[r] = _mm512_loadu_ps((const float*)rows[r] + c);
          }
          if (mg == 4) {  // the coefficients in registers (the compiler keeps them there for a constant count)
            for (int mm = 0; mm < 4; ++mm) {
              float* ym = y + (size_t)(m0 + mm) * N + c;
              __m512 v = _mm512_loadu_ps(ym);
              for (int r = 0; r < 4; ++r) v = _mm512_fmadd_ps(av[mm][r], w[r], v);
              _mm512_storeu_ps(ym, v);
            }
          } else {
            for (int mm = 0; mm < mg; ++mm) {
              float* ym = y + (size_t)(m0 + mm) * N + c;
              __m512 v = _mm512_loadu_ps(ym);
              for (int r = 0; r < 4; ++r) v = _mm512_fmadd_ps(_mm512_set1_ps(a[mm][r]), w[r], v);
              _mm512_storeu_ps(ym, v);
            }
          }
        }
#endif
        for (; c < c1; ++c)
          for (int mm = 0; mm < mg; ++mm) {
            float* ym = y + (size_t)(m0 + mm) * N;
            float v = ym[c];
            for (int r = 0; r < 4; ++r)
              v = std::fma(a[mm][r], bf16 ? bf16_to_float(((const uint16_t*)rows[r])[c]) : ((const float*)rows[r])[c],
                           v);
            ym[c] = v;
          }
      }
    }
  });
}
