// The chunked SSD scan of a Mamba-2 prefill (Dao & Gu, "Transformers are SSMs", arXiv 2405.21060, section 6) on
// the CPU, in one call per layer. The reference twin is `ssd_chunked` in vl/modeling/ssd_ref.py: this file performs
// the same operations in float32 (dt * A and its cumulative sum accumulated in double as torch's CPU cumsum does,
// x * dt, the decay exponents clamped at -80, decay * scores, the carried state's read-out scaled by exp(acs) and
// added to the within-chunk output, the state's decay added to the chunk's contribution); what differs is the order
// of the float32 additions inside the products, multiply-adds the compiler fuses, and the exponentials (a
// polynomial of ~1 ulp where the reference calls torch's exp). What it removes is the reference's cost around the arithmetic: ~130 small
// batched products per layer (two per 32-token chunk), their float32 copies of x, B and C in two layouts, and the
// full-size decay tensors. Measured on the 180m config's layer shapes (docs/benchmarks.md, "SSD scan in C++").
//
// Work is split over (batch row, group) pairs, each scanning its chunks in order; the r heads of a group share the
// chunk's C.B^T scores. With fewer pairs than threads a group's heads are split too (each part computes the
// group's scores itself). Shapes, as in ssd_ref.py: b batch, t time, h heads = g groups x r, p head dim, n state.
//
// Built at first use by vl/kernels/ssd_scan.py through the compile cache of vl/kernels/loader.py (g++ -O3
// -march=native -fopenmp); -DVL_PORTABLE builds the plain C++ loops that any CPU runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && !defined(VL_PORTABLE)
#define VL_AVX512 1
#include <immintrin.h>

#include "simd_exp.h"  // vl_exp16
#endif
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

// Subnormal floats as zero while a task runs (MXCSR flush-to-zero and denormals-are-zero, set per thread and
// restored): decays between distant positions of a chunk, exp(acs) of a long chunk and the products of either fall
// below 2^-126, and every arithmetic instruction with a subnormal operand or result takes a microcode assist. With
// the released models' decay rates (A = -1 .. -n_heads, dt ~ 1) a 128-token prefill of the 180m config's Mamba layer
// spent 7.2 ms in this scan instead of 1.9. What is flushed is below 1.2e-38 in magnitude: next to any normal term
// of a sum it is below float32's rounding (the same 128-token scan gave identical bits either way).
struct FlushSubnormals {
#if defined(__SSE2__)
  unsigned int saved = _mm_getcsr();
  FlushSubnormals() { _mm_setcsr(saved | 0x8040); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

namespace {

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n values of the model dtype (bf16 or float32) as float32 (exact)
inline void load_row(const void* src, int bf16, int n, float* dst) {
  if (!bf16) {
    std::memcpy(dst, src, sizeof(float) * n);
    return;
  }
  const uint16_t* s = (const uint16_t*)src;
  int i = 0;
#ifdef VL_AVX512
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(s + i))), 16)));
#endif
  for (; i < n; ++i) dst[i] = bf16_to_float(s[i]);
}

#ifdef VL_AVX512
inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << std::max(n, 0)) - 1); }

// R rows x NV vectors of 16 columns (the last NV-th masked by `last`) of Y (+ init) = A @ Bm, A[i][k] at
// A[i * lda + k * aks]. The loops over R and NV are unrolled so the accumulators stay in registers (without the
// pragmas g++ 12 keeps a memory copy of acc[][] and stores it every k: 2x slower).
template <int R, int NV>
inline void mm_tile(const float* A, int lda, int aks, int K, const float* Bm, int ldb, float* Y, int ldy,
                    const float* init, int ldi, __mmask16 last) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : (__mmask16)0xFFFF, Bm + (size_t)k * ldb + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[(size_t)r * lda + (size_t)k * aks]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : (__mmask16)0xFFFF;
      __m512 o = acc[r][v];
      if (init) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(m, init + (size_t)r * ldi + v * 16));
      _mm512_mask_storeu_ps(Y + (size_t)r * ldy + v * 16, m, o);
    }
}

template <int R>
inline void mm_rows(const float* A, int lda, int aks, int K, const float* Bm, int ldb, int cols, float* Y, int ldy,
                    const float* init, int ldi) {
  for (int c0 = 0; c0 < cols; c0 += 64) {
    const int nv = std::min(4, (cols - c0 + 15) / 16);
    const __mmask16 last = lanes(cols - c0 - (nv - 1) * 16);
    const float* in = init ? init + c0 : nullptr;
    switch (nv) {
      case 1: mm_tile<R, 1>(A, lda, aks, K, Bm + c0, ldb, Y + c0, ldy, in, ldi, last); break;
      case 2: mm_tile<R, 2>(A, lda, aks, K, Bm + c0, ldb, Y + c0, ldy, in, ldi, last); break;
      case 3: mm_tile<R, 3>(A, lda, aks, K, Bm + c0, ldb, Y + c0, ldy, in, ldi, last); break;
      default: mm_tile<R, 4>(A, lda, aks, K, Bm + c0, ldb, Y + c0, ldy, in, ldi, last); break;
    }
  }
}
#else
template <int R>
inline void mm_rows(const float* A, int lda, int aks, int K, const float* Bm, int ldb, int cols, float* Y, int ldy,
                    const float* init, int ldi) {
  std::vector<float> acc(cols);  // Y may be init: sum aside, then add
  for (int r = 0; r < R; ++r) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int k = 0; k < K; ++k) {
      const float a = A[(size_t)r * lda + (size_t)k * aks];
      const float* b = Bm + (size_t)k * ldb;
      for (int c = 0; c < cols; ++c) acc[c] += a * b[c];
    }
    float* y = Y + (size_t)r * ldy;
    for (int c = 0; c < cols; ++c) y[c] = init ? acc[c] + init[(size_t)r * ldi + c] : acc[c];
  }
}
#endif

// Y (M, cols) (+ init) = A (M, K) @ Bm (K, cols), A[i][k] at A[i * lda + k * aks]. lower: A is zero above its
// diagonal, so row i stops at k = i (the tile's last row). Y may be init (in-place accumulation).
void mm(const float* A, int lda, int aks, int M, int K, const float* Bm, int ldb, int cols, float* Y, int ldy,
        const float* init, int ldi, bool lower = false) {
  auto rows = [&](auto tag, int i) {
    constexpr int R = decltype(tag)::value;
    const int kk = lower ? std::min(K, i + R) : K;
    mm_rows<R>(A + (size_t)i * lda, lda, aks, kk, Bm, ldb, cols, Y + (size_t)i * ldy, ldy,
               init ? init + (size_t)i * ldi : nullptr, ldi);
  };
  int i = 0;
  for (; i + 6 <= M; i += 6) rows(std::integral_constant<int, 6>(), i);
  for (; i + 2 <= M; i += 2) rows(std::integral_constant<int, 2>(), i);
  for (; i < M; ++i) rows(std::integral_constant<int, 1>(), i);
}

// M[i][j] = exp(max(acs[i] - acs[j], -80)) * scores[i][j] for j <= i, 0 above the diagonal (row stride L)
void decayed_scores(const float* acs, const float* sc, int Lk, int L, float* M) {
  for (int i = 0; i < Lk; ++i) {
    int j = 0;
#ifdef VL_AVX512
    const __m512 ai = _mm512_set1_ps(acs[i]);
    for (; j <= i; j += 16) {
      const __mmask16 m = lanes(i + 1 - j);
      const __m512 d = _mm512_max_ps(_mm512_sub_ps(ai, _mm512_maskz_loadu_ps(m, acs + j)), _mm512_set1_ps(-80.f));
      _mm512_mask_storeu_ps(M + (size_t)i * L + j, m, _mm512_mul_ps(vl_exp16(d), _mm512_maskz_loadu_ps(m, sc + (size_t)i * L + j)));
    }
    j = i + 1;
#else
    for (; j <= i; ++j) M[(size_t)i * L + j] = std::exp(std::max(acs[i] - acs[j], -80.f)) * sc[(size_t)i * L + j];
#endif
    for (; j < Lk; ++j) M[(size_t)i * L + j] = 0.f;
  }
}

// scores[i][j] = C_i . B_j for j <= i (row stride L); C, B (Lk, n)
void chunk_scores(const float* C, const float* B, int Lk, int n, int L, float* sc) {
  for (int i = 0; i < Lk; ++i)
    for (int j = 0; j <= i; ++j) {
      const float* c = C + (size_t)i * n;
      const float* b = B + (size_t)j * n;
      float s = 0.f;
      int q = 0;
#ifdef VL_AVX512
      __m512 a = _mm512_setzero_ps();
      for (; q + 16 <= n; q += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(c + q), _mm512_loadu_ps(b + q), a);
      s = _mm512_reduce_add_ps(a);
#endif
      for (; q < n; ++q) s += c[q] * b[q];
      sc[(size_t)i * L + j] = s;
    }
}

}  // namespace

extern "C" {

int vl_isa() {  // 2 = AVX512 path, 0 = portable path
#ifdef VL_AVX512
  return 2;
#else
  return 0;
#endif
}

// x (b, t, h, p) in the model dtype (bf16 = 1: bfloat16, else float32), element strides sxb, sxt, sxh, p contiguous;
// dt (b, t, h) float32 (softplus-ed), strides sdb, sdt, sdh; A (h) float32; B and C (b, t, g, n) in the model dtype
// with the same strides sbb, sbt, sbg, n contiguous; init (b, h, p, n) float32 contiguous or null. Writes y (b, t, h,
// p) float32 contiguous (without the D skip) and fin (b, h, p, n) float32 contiguous, the state after the last token.
void vl_ssd_scan(int b, int t, int h, int p, int g, int n, int L, int bf16, const void* x, long sxb, long sxt,
                 long sxh, const float* dt, long sdb, long sdt, long sdh, const float* A, const void* Bp,
                 const void* Cp, long sbb, long sbt, long sbg, const float* init, float* y, float* fin,
                 int nthreads) {
  const int r = h / g, esz = bf16 ? 2 : 4;
  int split = 1;  // parts per group's heads, so that there are at least as many tasks as threads
  while (b * g * split < nthreads && split < r) ++split;
  const int tasks = b * g * split, nchunks = (t + L - 1) / L;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
  for (int task = 0; task < tasks; ++task) {
    const FlushSubnormals flush;
    const int bb = task / (g * split), gg = (task / split) % g, part = task % split;
    const int h0 = gg * r + part * r / split, nh = gg * r + (part + 1) * r / split - h0;
    std::vector<float> S((size_t)nh * n * p);  // each head's state transposed, S^T (n, p)
    std::vector<float> Cc((size_t)L * n), Bc((size_t)L * n), sc((size_t)L * L), M((size_t)L * L);
    std::vector<float> xdt((size_t)L * p), W((size_t)L * p), yin((size_t)L * p), acs(L), e_in(L), e_end(L);
    if (init)
      for (int hh = 0; hh < nh; ++hh) {
        const float* src = init + ((size_t)bb * h + h0 + hh) * p * n;
        float* dst = S.data() + (size_t)hh * n * p;
        for (int pp = 0; pp < p; ++pp)
          for (int q = 0; q < n; ++q) dst[(size_t)q * p + pp] = src[(size_t)pp * n + q];
      }
    for (int k = 0; k < nchunks; ++k) {
      const int t0 = k * L, Lk = std::min(L, t - t0);
      const bool carried = k > 0 || init;  // a state exists before this chunk
      for (int i = 0; i < Lk; ++i) {
        const size_t off = ((size_t)bb * sbb + (size_t)(t0 + i) * sbt + (size_t)gg * sbg) * esz;
        load_row((const char*)Cp + off, bf16, n, Cc.data() + (size_t)i * n);
        load_row((const char*)Bp + off, bf16, n, Bc.data() + (size_t)i * n);
      }
      chunk_scores(Cc.data(), Bc.data(), Lk, n, L, sc.data());
      for (int hh = 0; hh < nh; ++hh) {
        const int hd = h0 + hh;
        float* St = S.data() + (size_t)hh * n * p;
        double run = 0.0;  // torch's CPU cumsum accumulates float32 in double
        for (int i = 0; i < Lk; ++i) {
          const float d = dt[(size_t)bb * sdb + (size_t)(t0 + i) * sdt + (size_t)hd * sdh];
          run += (double)(d * A[hd]);
          acs[i] = (float)run;
          float* xr = xdt.data() + (size_t)i * p;
          load_row((const char*)x + ((size_t)bb * sxb + (size_t)(t0 + i) * sxt + (size_t)hd * sxh) * esz, bf16, p, xr);
          for (int pp = 0; pp < p; ++pp) xr[pp] *= d;
        }
        const float a_end = acs[Lk - 1];
        for (int i = 0; i < Lk; ++i) {
          e_in[i] = std::exp(acs[i]);
          e_end[i] = std::exp(a_end - acs[i]);
        }
        // 1. within the chunk: y = (decay * scores) @ (x dt)
        float* yo = y + (((size_t)bb * t + t0) * h + hd) * p;
        decayed_scores(acs.data(), sc.data(), Lk, L, M.data());
        mm(M.data(), L, 1, Lk, Lk, xdt.data(), p, p, yo, h * p, nullptr, 0, true);
        // 2. the carried state read out at the chunk's positions: y += (C @ S^T) * exp(acs)
        if (carried) {
          mm(Cc.data(), n, 1, Lk, n, St, p, p, yin.data(), p, nullptr, 0);
          for (int i = 0; i < Lk; ++i) {
            float* yr = yo + (size_t)i * h * p;
            const float* v = yin.data() + (size_t)i * p;
            for (int pp = 0; pp < p; ++pp) yr[pp] += v[pp] * e_in[i];
          }
        }
        // 3. the state carried to the chunk's end: S^T = B^T @ (x dt exp(acs_end - acs)) + S^T exp(acs_end)
        for (int i = 0; i < Lk; ++i)
          for (int pp = 0; pp < p; ++pp) W[(size_t)i * p + pp] = xdt[(size_t)i * p + pp] * e_end[i];
        if (carried) {
          const float ce = std::exp(a_end);
          for (size_t q = 0; q < (size_t)n * p; ++q) St[q] *= ce;
        }
        mm(Bc.data(), 1, n, n, Lk, W.data(), p, p, St, p, carried ? St : nullptr, p);
      }
    }
    for (int hh = 0; hh < nh; ++hh) {
      const float* St = S.data() + (size_t)hh * n * p;
      float* dst = fin + ((size_t)bb * h + h0 + hh) * p * n;
      for (int pp = 0; pp < p; ++pp)
        for (int q = 0; q < n; ++q) dst[(size_t)pp * n + q] = St[(size_t)q * p + pp];
    }
  }
}

}  // extern "C"
