// One whole Nemotron-H decode step (one new token per row) in one call, for bf16 / fp32 models on the CPU.
//
// The plain-math modules (vl/modeling/{nemotron_h,mamba2,attention,mlp,norms}.py, the Mamba-2 one-step recurrence
// of vl/modeling/ssd_ref.py) are the reference twin: this file performs the same operations, rounding to the
// model dtype at the same points (each Linear output, the conv window products and sum, the norm outputs, the
// residual adds), with float32 accumulation everywhere. Only the order of float32 additions differs. What the
// fused step removes is the cost around the arithmetic: ~20 small torch ops per layer, their dispatch and their
// allocations (docs/cpu_decode.md has the measured breakdown).
//
// Weight matrices are dense (the model dtype) or packed as the checkpoint stores them (FP8 E4M3 with its scales,
// NVFP4 with block and global scales): the products are the row kernels of row_kernels.h, which the weight-only
// quantized Linears of vl/quant/linear.py call one layer at a time through quant_gemv.cpp (the same kernels, so the
// fused step and the modules compute the same weights and the same float32 sums).
//
// Built at load (vl/runtime/cpu/decode.py) through vl/kernels/decode_step.py and the build cache of
// vl/kernels/loader.py (g++ -O3 -march=native -fopenmp); -DVL_PORTABLE builds the plain C++ loops that any CPU runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "row_kernels.h"  // VL_AVX512, the dense / FP8 / NVFP4 row kernels, bf16_to_float

extern "C" {

// One weight matrix (N, K): y = x W^T. Mirrored by ctypes in vl/kernels/decode_step.py, as the structs below.
struct VlMat {
  int fmt;                     // 0 = dense in the model dtype, 1 = FP8 E4M3, 2 = NVFP4, 3 = dense stored (K, N)
  int N, K;
  const void* w;               // dense (N, K) | FP8 (N, K) bytes | NVFP4 (N, K/2) packed E2M1
  const float* scale;          // FP8 weight_scale as float32: one (kind 0), per row (1), per 128x128 block (2)
  int scale_kind;
  const uint8_t* block_scale;  // NVFP4 (N, K/16) E4M3 bytes
  float global_scale;          // NVFP4 weight_scale_2
};

struct VlLayer {
  int kind;               // 0 = Mamba-2 ("M"), 1 = attention ("*"), 2 = ReLU^2 MLP ("-"), 3 = MoE ("E")
  const float* norm_w;    // (D) the block's RMSNorm weight, float32
  VlMat w_in;             // mamba in_proj | attention q_proj | mlp (MoE: shared expert) up_proj: (n_in, D)
  VlMat w_k, w_v;         // attention k_proj, v_proj (n_kv_out, D)
  VlMat w_out;            // mamba out_proj | o_proj | down_proj: (D, k_out)
  // Mamba-2
  int d_inner, conv_dim, n_heads, head_dim, n_groups, d_state, conv_k;
  const float* conv_w;    // (conv_k, conv_dim) float32 copy of the model-dtype weight (exact), tap-major
  const float* conv_b;    // (conv_dim) or null
  const float* dt_bias;   // (n_heads)
  const float* A;         // (n_heads) -exp(A_log), computed by torch
  const float* Dskip;     // (n_heads)
  const float* gnorm_w;   // (d_inner) gated RMSNorm weight
  float dt_lo, dt_hi;
  int dt_clamp;
  // attention
  int n_q_heads, n_kv_heads, attn_head_dim;
  // MoE (vl/modeling/mlp.py MoE and Router, one router group, no latent projections)
  const float* router_w;     // (n_experts, D) float32
  const float* router_bias;  // (n_experts) e_score_correction_bias
  int n_experts, top_k, norm_topk;
  float routed_scale;
  const VlMat* up_e;         // (n_experts) routed experts' up_proj (I, D)
  const VlMat* down_e;       // (n_experts) routed experts' down_proj (D, I)
};

struct VlModel {
  int bf16;       // model dtype: 1 = bfloat16, 0 = float32
  int res_f32;    // residual stream kept in float32 (residual_in_fp32) while the model is bf16
  int packed_tiles;  // NVFP4 products on AMX tiles (bf16) from this many decode rows, and a chunk's (0: never)
  int D, vocab, n_layers;
  float eps;
  const void* embed;      // (embed_rows, D) model dtype
  int embed_rows;
  const float* norm_f;    // (D)
  VlMat lm_head;          // (vocab, D)
  const VlLayer* layers;
};

// A joining prompt's chunk that rides along with a decode step (Sarathi-Serve's mixed batch): T tokens of one
// prompt, their rows after the B decode rows in every product, so one pass over the weights serves both. Its
// Mamba recurrence runs token by token on its own state and its attention on its own cache (one row, no padding).
struct VlSegment {
  int T;
  const float* x;       // (T, D) the chunk's embeddings: model-dtype values as float32
  void* const* caches;  // its cache's two pointers per layer, as `caches` below (one row)
  int pos;              // the position its first token takes: its keys [0, pos + t] are read by token t
  int max_len;          // its cache's capacity
  uint8_t* valid;       // (max_len) its cache's valid bytes: [pos, pos + T) are marked real
  int logits;           // 1: its last token's logits too, as row B of the step's logits
};

}  // extern "C"

static inline uint16_t f2b(float f) {  // round to nearest even, as torch's float -> bfloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

struct Round {  // the model dtype's rounding of a float32 value (identity for float32 models)
  int bf16;
  inline float operator()(float f) const { return bf16 ? bf16_to_float(f2b(f)) : f; }
};

#ifdef VL_AVX512
#include "simd_exp.h"  // vl_exp16

static inline __m512 silu_v(__m512 v) {
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.f), vl_exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
}

static inline __m512 rnd_v(__m512 v, int bf16) {  // Round over 16 lanes: f2b's rounding, NaN kept NaN
  if (!bf16) return v;
  const __m512i u = _mm512_castps_si512(v);
  const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512i r = _mm512_and_si512(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                           _mm512_set1_epi32(0x7FFF))), top);
  const __m512i q = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), top);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, q));
}
#endif

// Elementwise passes over n floats, 16 lanes at a time where AVX512 is there (the same per-element operations).
static inline void round_n(float* y, size_t n, int bf16) {  // y = Round(y)
  if (!bf16) return;
  size_t i = 0;
#ifdef VL_AVX512
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, rnd_v(_mm512_loadu_ps(y + i), 1));
#endif
  for (; i < n; ++i) y[i] = Round{1}(y[i]);
}

static inline void to_bf16_n(const float* f, uint16_t* b, size_t n) {  // f already holds bf16 values: exact
  size_t i = 0;
#ifdef VL_AVX512
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(b + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(
                                               _mm512_loadu_ps(f + i)), 16)));
#endif
  for (; i < n; ++i) b[i] = f2b(f[i]);
}

static inline double sumsq_n(const float* v, int n) {  // sum of squares in float64
  int i = 0;
  double ss = 0.0;
#ifdef VL_AVX512
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(v + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(v + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
  for (; i < n; ++i) ss += (double)v[i] * v[i];
  return ss;
}

static inline void scale_round_n(float* o, float r, const float* w, int n, int bf16) {  // o = Round(o * r * w)
  int i = 0;
#ifdef VL_AVX512
  const __m512 rv = _mm512_set1_ps(r);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, rnd_v(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(o + i), rv), _mm512_loadu_ps(w + i)), bf16));
#endif
  for (; i < n; ++i) o[i] = Round{bf16}(o[i] * r * w[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// GEMV: y (M, N) float32 = x (M, K) W^T. x holds model-dtype values as float32, and xb the same as bf16 for bf16
// models (exact). Dense rows go up to eight at a time in contiguous per-thread slices of whole cache lines, so a
// batch of up to eight reads each weight once per step (two passes of four made a bf16 step of 8 rows cost 1.7-2x a
// step of 4 on the 180m config, docs/cpu_decode.md); a group of 2-3 is padded to 4 and of 5-7 to 8 with zero rows
// (three instantiations, not eight: compile time). On AMX tiles bf16 groups go up to 32 (9-15 padded to 16, 17-23 to
// 24, 25-31 to 32): a joining prompt's chunk rides in the same pass as the decode rows. Each row keeps its own
// accumulators in the same order whatever the group size, so a row's result does not depend on the others. Packed rows go through
// quant_gemv.cpp's kernels as the quantized Linears call them (FP8 four rows at a time; NVFP4 four at a time or, on
// AMX tiles, 32 per pass, by the rule of `tile_policy` below): with a bf16 model each weight is rounded to bf16 as
// the modules' weight-only path rounds it.
template <int G>
static void dense_group(const float* xm, const uint16_t* xbm, int K, const VlMat& W, int bf16, float* yt, int nthreads) {
  const int N = W.N;
  const int per = ((N + nthreads - 1) / nthreads + 15) / 16 * 16;  // contiguous slices of whole cache lines
#ifdef VL_AMX
  if (bf16 && amx_ready()) {  // tiles: the rows of a group cost about one row (row_kernels.h dense_bf16_amx)
    static thread_local tile_vector<uint16_t> xv;  // B tiles: 64-byte aligned (amx_tiles.h)
    xv.resize((size_t)(K / 32) * 32 * G);
    amx_pack(xbm, G, K, xv.data());
    const uint16_t* xvp = xv.data();  // (the workers' own `xv` are other vectors: thread_local)
    parallel_for(nthreads, nthreads, [&](int t) {
      const int r0 = t * per, r1 = r0 + per < N ? r0 + per : N;
      if (r0 < r1) dense_bf16_amx<G>(xvp, xbm, K, (const uint16_t*)W.w, N, yt, r0, r1);
    });
    return;
  }
#endif
  parallel_for(nthreads, nthreads, [&](int t) {
    const int r0 = t * per, r1 = r0 + per < N ? r0 + per : N;
    if (r0 >= r1) return;
    if (bf16)
      dense_bf16_rows<G>(xm, xbm, K, (const uint16_t*)W.w, N, yt, r0, r1);
    else
      dense_f32_rows<G>(xm, K, (const float*)W.w, N, yt, r0, r1);
  });
}

#ifdef VL_AMX
// 17-32 bf16 rows on tiles (row_kernels.h dense_bf16_amx32), AMX only: a joining prompt's chunk beside the rows.
template <int G>
static void dense_group_amx32(const uint16_t* xbm, int K, const VlMat& W, float* yt, int nthreads) {
  const int N = W.N;
  const int per = ((N + nthreads - 1) / nthreads + 15) / 16 * 16;
  static thread_local tile_vector<uint16_t> xv;  // B tiles: 64-byte aligned (amx_tiles.h)
  xv.resize((size_t)(K / 32) * 32 * G);
  amx_pack(xbm, G, K, xv.data());
  const uint16_t* xvp = xv.data();
  parallel_for(nthreads, nthreads, [&](int t) {
    const int r0 = t * per, r1 = r0 + per < N ? r0 + per : N;
    if (r0 < r1) dense_bf16_amx32<G>(xvp, xbm, K, (const uint16_t*)W.w, N, yt, r0, r1);
  });
}
#endif

// Which rows of this step's products over all rows take packed NVFP4 weights on AMX tiles: rows [lead, M). A tile
// pass costs about the same for 1 to 32 rows but more than the float32 loop for a few rows (at the 12B widths: 1.5x
// for one row, even at four; vl/kernels/gemv.py TILE_FROM_ROWS), so decode rows fewer than VlModel.packed_tiles keep
// the loop and the rows of larger batches, and every token of a riding chunk, take tiles: a row's bits then depend
// only on whether its batch reaches that size, never on which rows or chunk are beside it (set by vl_decode_step;
// the MoE's routed experts, one row per expert, always take the loop).
struct TilePolicy {
  int lead = 0;
};
static thread_local TilePolicy tile_policy;

static void gemv(const float* x, const uint16_t* xb, int M, const VlMat& W, int bf16, float* y, int nthreads) {
  const int K = W.K, N = W.N;
  if (W.fmt == 3) {  // dense, stored transposed (K, N): skips the zero inputs (a ReLU^2 down_proj)
    dense_t_gemv(x, M, K, W.w, N, bf16, y, nthreads);
    return;
  }
  if (W.fmt == 2) {  // any row count: the loop takes its rows four at a time, tiles 64 per pass
    const int x_bf16 = bf16 && gemv_bf16_dot();
    const int lead = std::min(M, tile_policy.lead);
    const void* xs = x_bf16 ? (const void*)xb : (const void*)x;
    const size_t esz = x_bf16 ? sizeof(uint16_t) : sizeof(float);
    if (lead > 0)
      nvfp4_gemv(xs, lead, K, (const uint8_t*)W.w, W.block_scale, W.global_scale, N, bf16, x_bf16, 0, y, nthreads);
    if (lead < M)
      nvfp4_gemv((const char*)xs + esz * lead * K, M - lead, K, (const uint8_t*)W.w, W.block_scale, W.global_scale,
                 N, bf16, x_bf16, 1, y + (size_t)lead * N, nthreads);
    return;
  }
  if (W.fmt == 1) {
    const int x_bf16 = bf16 && gemv_bf16_dot();
    for (int m0 = 0; m0 < M; m0 += 4) {
      const int mm = M - m0 < 4 ? M - m0 : 4;
      const void* xm = x_bf16 ? (const void*)(xb + (size_t)m0 * K) : (const void*)(x + (size_t)m0 * K);
      fp8_gemv(xm, mm, K, (const uint8_t*)W.w, N, W.scale, W.scale_kind, bf16, x_bf16, y + (size_t)m0 * N,
               nthreads);
    }
    return;
  }
  static thread_local std::vector<float> px, py;
  static thread_local std::vector<uint16_t> pxb;
#ifdef VL_AMX
  const int top = bf16 && amx_ready() ? 32 : 8;  // tiles take 32 rows at about the cost of one (mixed steps)
#else
  const int top = 8;
#endif
  for (int m0 = 0; m0 < M; m0 += top) {
    const int mm = M - m0 < top ? M - m0 : top;
    const int g = mm == 1 ? 1 : mm <= 4 ? 4 : mm <= 8 ? 8 : mm <= 16 ? 16 : mm <= 24 ? 24 : 32;  // its instantiation
    const float* xm = x + (size_t)m0 * K;
    const uint16_t* xbm = xb ? xb + (size_t)m0 * K : nullptr;
    float* ym = y + (size_t)m0 * N;
    const bool pad = mm != g;
    if (pad) {
      px.assign((size_t)g * K, 0.f);
      std::memcpy(px.data(), xm, sizeof(float) * mm * K);
      xm = px.data();
      if (xbm) {
        pxb.assign((size_t)g * K, 0);
        std::memcpy(pxb.data(), xbm, sizeof(uint16_t) * mm * K);
        xbm = pxb.data();
      }
      py.resize((size_t)g * N);
    }
    float* yt = pad ? py.data() : ym;
    if (g == 1)
      dense_group<1>(xm, xbm, K, W, bf16, yt, nthreads);
    else if (g == 4)
      dense_group<4>(xm, xbm, K, W, bf16, yt, nthreads);
    else if (g == 8)
      dense_group<8>(xm, xbm, K, W, bf16, yt, nthreads);
    else if (g == 16)
      dense_group<16>(xm, xbm, K, W, bf16, yt, nthreads);
#ifdef VL_AMX
    else if (g == 24)
      dense_group_amx32<24>(xbm, K, W, yt, nthreads);
    else
      dense_group_amx32<32>(xbm, K, W, yt, nthreads);
#endif
    if (pad) std::memcpy(ym, yt, sizeof(float) * mm * N);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Scratch: one growing buffer set per call site, reused across steps (no allocation in the steady state).
struct Act {  // M rows of K model-dtype values, as float32 and (bf16 models) as bf16 for the GEMV
  std::vector<float> f;
  std::vector<uint16_t> b;
  void resize(size_t n, int bf16) {
    if (f.size() < n) f.resize(n);
    if (bf16 && b.size() < n) b.resize(n);
  }
  void sync_bf16(size_t n, int bf16) {  // after f holds rounded values: the bf16 copy, exact
    if (bf16) to_bf16_n(f.data(), b.data(), n);
  }
};

static inline float silu(float v) { return v / (1.f + std::exp(-v)); }

static inline float softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }  // torch's threshold 20

// out = round(rmsnorm(h') * w) with h' = round(h) for a block's norm (Block casts h to the norm's dtype first) and
// h' = h for norm_f (which normalises the residual stream in its own dtype).
static void rms_rows(const float* h, int B, int D, const float* w, float eps, Round rnd, Act& out,
                     bool round_in = true) {
  out.resize((size_t)B * D, rnd.bf16);
  for (int b = 0; b < B; ++b) {
    const float* hr = h + (size_t)b * D;
    float* o = out.f.data() + (size_t)b * D;
    std::memcpy(o, hr, sizeof(float) * D);
    if (round_in) round_n(o, D, rnd.bf16);
    const float r = 1.f / std::sqrt((float)(sumsq_n(o, D) / D) + eps);
    scale_round_n(o, r, w, D, rnd.bf16);
  }
  out.sync_bf16((size_t)B * D, rnd.bf16);
}

static void residual_add(float* h, const float* y, size_t n, Round res) {
  size_t i = 0;
#ifdef VL_AVX512
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(h + i, rnd_v(_mm512_add_ps(_mm512_loadu_ps(h + i), _mm512_loadu_ps(y + i)), res.bf16));
#endif
  for (; i < n; ++i) h[i] = res(h[i] + y[i]);
}

#ifdef VL_AVX512
// 16 channels' conv state (16 x 3 values, channel-major, the model dtype) as three float32 vectors, exact.
static inline void load_state48(const void* st, int bf16, __m512 f[3]) {
  for (int v = 0; v < 3; ++v)
    f[v] = bf16 ? load_bf16x16((const uint16_t*)st + 16 * v) : _mm512_loadu_ps((const float*)st + 16 * v);
}

static inline void store_state48(void* st, int bf16, const __m512 f[3]) {  // f holds model-dtype values: exact
  for (int v = 0; v < 3; ++v) {
    if (bf16)
      _mm256_storeu_si256((__m256i*)((uint16_t*)st + 16 * v),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f[v]), 16)));
    else
      _mm512_storeu_ps((float*)st + 16 * v, f[v]);
  }
}
#endif

// The depthwise causal conv for one row and one token, then SiLU: window [state, x] per channel, the products and
// their running sum rounded to the model dtype as the reference's ops are; the state (conv_dim, k-1) rolls by one
// and takes x. xbc (conv_dim) holds x on entry and the activation on exit. Where k = 4 (every released model) the
// AVX512 path takes 16 channels at a time: their 48 state values are loaded once, the taps picked out and the
// rolled state built by lane permutations, so each channel gets exactly the scalar loop's operations.
static void conv_row(const VlLayer& L, int bf16, void* state, float* xbc) {
  const Round rnd{bf16};
  const int km1 = L.conv_k - 1, cd = L.conv_dim;
  const float* wt = L.conv_w;  // (conv_k, conv_dim) tap-major
  int c = 0;
#ifdef VL_AVX512
  if (km1 == 3) {
    const __m512i step1 = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    __m512i lo[3], hi[3];  // tap j of channel i is flat value 3i + j: from (f0, f1) below 32, (f1, f2) above
    __mmask16 above[3];
    for (int j = 0; j < 3; ++j) {
      alignas(64) int a[16], b[16];
      above[j] = 0;
      for (int i = 0; i < 16; ++i) {
        const int f = 3 * i + j;
        a[i] = f & 31;
        b[i] = (f - 16) & 31;
        if (f >= 32) above[j] |= (__mmask16)(1u << i);
      }
      lo[j] = _mm512_load_si512(a);
      hi[j] = _mm512_load_si512(b);
    }
    // In the rolled state, flat value k is the old k + 1, except every third (k % 3 == 2): the new x values,
    // 5 + 5 + 6 of them across the three vectors.
    const __mmask16 fresh[3] = {0x4924, 0x2492, 0x9249};
    const int first[3] = {0, 5, 10};
    for (; c + 16 <= cd; c += 16) {
      void* st = bf16 ? (void*)((uint16_t*)state + (size_t)3 * c) : (void*)((float*)state + (size_t)3 * c);
      __m512 f[3], r[3];
      load_state48(st, bf16, f);
      __m512 acc = _mm512_setzero_ps();
      for (int j = 0; j < 3; ++j) {
        const __m512 tap = _mm512_mask_blend_ps(above[j], _mm512_permutex2var_ps(f[0], lo[j], f[1]),
                                                _mm512_permutex2var_ps(f[1], hi[j], f[2]));
        acc = _mm512_add_ps(acc, rnd_v(_mm512_mul_ps(tap, _mm512_loadu_ps(wt + (size_t)j * cd + c)), bf16));
      }
      r[0] = _mm512_permutex2var_ps(f[0], step1, f[1]);
      r[1] = _mm512_permutex2var_ps(f[1], step1, f[2]);
      r[2] = _mm512_permutex2var_ps(f[2], step1, f[2]);
      for (int v = 0; v < 3; ++v) r[v] = _mm512_mask_expandloadu_ps(r[v], fresh[v], xbc + c + first[v]);
      store_state48(st, bf16, r);
      acc = _mm512_add_ps(acc, rnd_v(_mm512_mul_ps(_mm512_loadu_ps(xbc + c), _mm512_loadu_ps(wt + (size_t)3 * cd + c)),
                                     bf16));
      acc = rnd_v(acc, bf16);
      if (L.conv_b) acc = rnd_v(_mm512_add_ps(acc, _mm512_loadu_ps(L.conv_b + c)), bf16);
      _mm512_storeu_ps(xbc + c, rnd_v(silu_v(acc), bf16));
    }
  }
#endif
  for (; c < cd; ++c) {
    float acc = 0.f;
    if (bf16) {
      uint16_t* st = (uint16_t*)state + (size_t)c * km1;
      for (int j = 0; j < km1; ++j) acc += rnd(bf16_to_float(st[j]) * wt[(size_t)j * cd + c]);
      for (int j = 0; j + 1 < km1; ++j) st[j] = st[j + 1];
      if (km1 > 0) st[km1 - 1] = f2b(xbc[c]);
    } else {
      float* st = (float*)state + (size_t)c * km1;
      for (int j = 0; j < km1; ++j) acc += rnd(st[j] * wt[(size_t)j * cd + c]);
      for (int j = 0; j + 1 < km1; ++j) st[j] = st[j + 1];
      if (km1 > 0) st[km1 - 1] = xbc[c];
    }
    acc += rnd(xbc[c] * wt[(size_t)km1 * cd + c]);
    acc = rnd(acc);
    if (L.conv_b) acc = rnd(acc + L.conv_b[c]);
    xbc[c] = rnd(silu(acc));
  }
}

// Mamba-2 mixer, one token per row: conv window roll + SiLU, dt softplus, S <- exp(dt A) S + dt x B^T,
// y = S C + D x, y * silu(z) normalised per group, out_proj. conv_state (B, conv_dim, k-1) model dtype; ssm
// (B, H, P, N) float32. A segment's T tokens follow the B rows through the products; between them its tokens take
// the same one-token recurrence in order on its own state (a prefill of T tokens, up to float32 summation order).
static void mamba_layer(const VlModel& m, const VlLayer& L, int B, float* h, void* conv_state, float* ssm,
                        const VlSegment* seg, int l, int nthreads) {
  const Round rnd{m.bf16};
  static thread_local Act xn, yn;
  static thread_local std::vector<float> zx, out;
  const int R = B + (seg ? seg->T : 0);
  rms_rows(h, R, m.D, L.norm_w, m.eps, rnd, xn);
  zx.resize((size_t)R * L.w_in.N);
  gemv(xn.f.data(), m.bf16 ? xn.b.data() : nullptr, R, L.w_in, m.bf16, zx.data(), nthreads);
  round_n(zx.data(), (size_t)R * L.w_in.N, rnd.bf16);
  yn.resize((size_t)R * L.d_inner, m.bf16);
  const int km1 = L.conv_k - 1, gs = L.d_inner / L.n_groups, hpg = L.n_heads / L.n_groups;
  const size_t conv_row_bytes = (size_t)L.conv_dim * km1 * (m.bf16 ? 2 : 4);
  const size_t ssm_row = (size_t)L.n_heads * L.head_dim * L.d_state;
  for (int r = 0; r < R; ++r) {  // row r < B: decode row r's state; r >= B: the segment's token r - B, its state
    float* z = zx.data() + (size_t)r * L.w_in.N;
    float* xbc = z + L.d_inner;
    const float* dtr = xbc + L.conv_dim;
    void* cstate = r < B ? (char*)conv_state + (size_t)r * conv_row_bytes : seg->caches[2 * l];
    conv_row(L, m.bf16, cstate, xbc);
    const float* xs = xbc;                                   // (H, P)
    const float* Bm = xbc + L.d_inner;                       // (G, N)
    const float* Cm = Bm + (size_t)L.n_groups * L.d_state;   // (G, N)
    float* y = yn.f.data() + (size_t)r * L.d_inner;
    float* S = r < B ? ssm + (size_t)r * ssm_row : (float*)seg->caches[2 * l + 1];
    parallel_for(L.n_heads, nthreads, [&](int hh) {
      float dt = softplus(dtr[hh] + L.dt_bias[hh]);
      if (L.dt_clamp) dt = dt < L.dt_lo ? L.dt_lo : (dt > L.dt_hi ? L.dt_hi : dt);
      const float dA = std::exp(dt * L.A[hh]);
      const int g = hh / hpg;
      const float* Bg = Bm + (size_t)g * L.d_state;
      const float* Cg = Cm + (size_t)g * L.d_state;
      for (int p = 0; p < L.head_dim; ++p) {
        float* s = S + ((size_t)hh * L.head_dim + p) * L.d_state;
        const float xv = xs[hh * L.head_dim + p];
        const float xdt = xv * dt;
        float acc = 0.f;
        int n = 0;
#ifdef VL_AVX512
        __m512 va = _mm512_setzero_ps();
        const __m512 vdA = _mm512_set1_ps(dA), vx = _mm512_set1_ps(xdt);
        for (; n + 16 <= L.d_state; n += 16) {
          _mm_prefetch((const char*)(s + n) + PREFETCH_BYTES, _MM_HINT_T0);  // the state streams as the weights do
          __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(s + n), vdA);
          sv = _mm512_add_ps(sv, _mm512_mul_ps(vx, _mm512_loadu_ps(Bg + n)));
          _mm512_storeu_ps(s + n, sv);
          va = _mm512_fmadd_ps(sv, _mm512_loadu_ps(Cg + n), va);
        }
        acc = _mm512_reduce_add_ps(va);
#endif
        for (; n < L.d_state; ++n) {
          const float sv = s[n] * dA + xdt * Bg[n];
          s[n] = sv;
          acc += sv * Cg[n];
        }
        y[hh * L.head_dim + p] = acc + xv * L.Dskip[hh];
      }
    });
    // gated RMSNorm (norm after the gate), per group of d_inner / n_groups channels
    for (int g = 0; g < L.n_groups; ++g) {
      float* yg = y + (size_t)g * gs;
      const float* zg = z + (size_t)g * gs;
      int i = 0;
#ifdef VL_AVX512
      for (; i + 16 <= gs; i += 16)
        _mm512_storeu_ps(yg + i, _mm512_mul_ps(silu_v(_mm512_loadu_ps(zg + i)), _mm512_loadu_ps(yg + i)));
#endif
      for (; i < gs; ++i) yg[i] = silu(zg[i]) * yg[i];
      const float r = 1.f / std::sqrt((float)(sumsq_n(yg, gs) / gs) + m.eps);
      scale_round_n(yg, r, L.gnorm_w + (size_t)g * gs, gs, m.bf16);
    }
  }
  yn.sync_bf16((size_t)R * L.d_inner, m.bf16);
  out.resize((size_t)R * m.D);
  gemv(yn.f.data(), m.bf16 ? yn.b.data() : nullptr, R, L.w_out, m.bf16, out.data(), nthreads);
  round_n(out.data(), (size_t)R * m.D, rnd.bf16);
  residual_add(h, out.data(), (size_t)R * m.D, Round{m.bf16 && !m.res_f32});
}

// One cached key or value row (model dtype, at element offset `at`) against float32 vectors, 16 lanes at a time.
static inline float dot_row(const float* q, const void* cache, size_t at, int hd, int bf16) {
  int d = 0;
  float dot = 0.f;
#ifdef VL_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= hd; d += 16) {
    const __m512 kv = bf16 ? load_bf16x16((const uint16_t*)cache + at + d) : _mm512_loadu_ps((const float*)cache + at + d);
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), kv, acc);
  }
  dot = _mm512_reduce_add_ps(acc);
#endif
  for (; d < hd; ++d)
    dot += q[d] * (bf16 ? bf16_to_float(((const uint16_t*)cache)[at + d]) : ((const float*)cache)[at + d]);
  return dot;
}

// Four query vectors against one cached key row, each exactly as dot_row computes it (the same sums in the same
// order): the key row is loaded once, and the four accumulation chains are independent, so they overlap instead
// of each waiting on its own FMA latency.
static inline void dot_rows4(const float* const q[4], const void* cache, size_t at, int hd, int bf16, float out[4]) {
#ifdef VL_AVX512
  if (hd % 16 == 0) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < hd; d += 16) {
      const __m512 kv = bf16 ? load_bf16x16((const uint16_t*)cache + at + d) : _mm512_loadu_ps((const float*)cache + at + d);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q[0] + d), kv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q[1] + d), kv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q[2] + d), kv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q[3] + d), kv, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);
    return;
  }
#endif
  for (int r = 0; r < 4; ++r) out[r] = dot_row(q[r], cache, at, hd, bf16);
}

static inline void axpy_row(float p, const void* cache, size_t at, float* o, int hd, int bf16) {  // o += p * row
  int d = 0;
#ifdef VL_AVX512
  const __m512 pv = _mm512_set1_ps(p);
  for (; d + 16 <= hd; d += 16) {
    const __m512 vv = bf16 ? load_bf16x16((const uint16_t*)cache + at + d) : _mm512_loadu_ps((const float*)cache + at + d);
    _mm512_storeu_ps(o + d, _mm512_fmadd_ps(pv, vv, _mm512_loadu_ps(o + d)));
  }
#endif
  for (; d < hd; ++d) o[d] += p * (bf16 ? bf16_to_float(((const uint16_t*)cache)[at + d]) : ((const float*)cache)[at + d]);
}

// One query row's attention over cached keys [0, pos] of one cache row (`base`: its element offset at kv head 0,
// `stride`: elements per kv head), keys whose `vrow` byte is 0 masked (the query always sees itself); qrow (nq, hd)
// in, orow (nq, hd) out, rounded to the model dtype; scd: nq * (pos + 1) floats of scratch.
// One task per kv head, or per part of its query heads when there are fewer kv heads than threads. Keys in the
// outer loop and the task's query heads in the inner: a cached key or value row is read from memory once per task
// and then from L1 for the other heads, instead of once per query head (16 query heads share each of Omni's 2 kv
// heads: at 25k positions the per-head order streamed 2.4 GB of cache per token). Each head's sums still run over
// the keys in order: the same bits as one head at a time.
static void attend_row(const VlModel& m, const VlLayer& L, const float* qrow, float* orow, const void* kc,
                       const void* vc, size_t base, size_t stride, int pos, const uint8_t* vrow, float* scd,
                       int nthreads) {
  const Round rnd{m.bf16};
  const int hd = L.attn_head_dim, nq = L.n_q_heads, nkv = L.n_kv_heads, rep = nq / nkv;
  const float scale = 1.f / std::sqrt((float)hd);
  const int parts = std::max({1, std::min(rep, (nthreads + nkv - 1) / nkv), (rep + 63) / 64});  // <= 64 heads each
  const int per = (rep + parts - 1) / parts;
  parallel_for(nkv * parts, nthreads, [&](int task) {
    const int kh = task / parts, q0 = kh * rep + (task % parts) * per, q1 = std::min(q0 + per, (kh + 1) * rep);
    if (q0 >= q1) return;
    const size_t kbase = base + (size_t)kh * stride;
    float mx[64], tot[64];  // per query head of the task
    for (int qh = q0; qh < q1; ++qh) mx[qh - q0] = -INFINITY;
    for (int j = 0; j <= pos; ++j) {
      const bool masked = vrow && !vrow[j] && j != pos;
      const size_t at = kbase + (size_t)j * hd;
      int qh = q0;
      float dots[4];
      for (; !masked && qh + 4 <= q1; qh += 4) {
        const float* const qs[4] = {qrow + (size_t)qh * hd, qrow + (size_t)(qh + 1) * hd,
                                    qrow + (size_t)(qh + 2) * hd, qrow + (size_t)(qh + 3) * hd};
        dot_rows4(qs, kc, at, hd, m.bf16, dots);
        for (int r = 0; r < 4; ++r) {
          const float v = dots[r] * scale;
          scd[(size_t)(qh + r) * (pos + 1) + j] = v;
          mx[qh + r - q0] = v > mx[qh + r - q0] ? v : mx[qh + r - q0];
        }
      }
      for (; qh < q1; ++qh) {
        float* s = scd + (size_t)qh * (pos + 1);
        if (masked) { s[j] = -INFINITY; continue; }
        s[j] = dot_row(qrow + (size_t)qh * hd, kc, at, hd, m.bf16) * scale;
        mx[qh - q0] = s[j] > mx[qh - q0] ? s[j] : mx[qh - q0];
      }
    }
    for (int qh = q0; qh < q1; ++qh) {
      float* s = scd + (size_t)qh * (pos + 1);
      float t = 0.f;
      for (int j = 0; j <= pos; ++j) {
        s[j] = s[j] == -INFINITY ? 0.f : std::exp(s[j] - mx[qh - q0]);
        t += s[j];
      }
      tot[qh - q0] = t;
      float* o = orow + (size_t)qh * hd;
      for (int d = 0; d < hd; ++d) o[d] = 0.f;
    }
    for (int j = 0; j <= pos; ++j)
      for (int qh = q0; qh < q1; ++qh) {
        const float p = scd[(size_t)qh * (pos + 1) + j];
        if (p == 0.f) continue;
        axpy_row(p / tot[qh - q0], vc, kbase + (size_t)j * hd, orow + (size_t)qh * hd, hd, m.bf16);
      }
    for (int qh = q0; qh < q1; ++qh) {
      float* o = orow + (size_t)qh * hd;
      for (int d = 0; d < hd; ++d) o[d] = rnd(o[d]);
    }
  });
}

// A chunk's T query rows (token t at position pos0 + t sees keys [0, pos0 + t] of one cache row, no padding) over
// their shared keys: per kv head, every cached key and value row is read once for all T tokens and their query heads
// (token after token would stream the whole cache T times: at a 4k-token prompt's end that was most of a 25-token
// chunk's cost). Each (token, head) sums its keys in increasing order whatever T, so a token's bits do not depend on
// the tokens beside it; the exponentials are vl_exp16's (attend_row's are exp()'s). scd: nq * T * (pos0 + T) floats.
#ifdef VL_AMX
// The same attention as products, for bf16 models on AMX tiles: per kv head, the T * rep query rows (bf16 values,
// exact) times the cached keys are one tile product (the keys are a (len, hd) matrix as a Linear's weight is), the
// scores softmaxed per row with token t's keys past pos0 + t masked, and the probabilities times the cached values
// one product through the kernel for weights stored (K, N) (the values are (len, hd)). Every row's sums keep one
// order whatever the rows beside it, so a token's bits still do not depend on the chunk around it; the order is
// the products', not attend_row's.
static void attend_segment_tiles(const VlModel& m, const VlLayer& L, const float* q, float* out, const void* kc,
                                 const void* vc, size_t stride, int pos0, int T, float* scd, int nthreads) {
  const Round rnd{m.bf16};
  const int hd = L.attn_head_dim, nq = L.n_q_heads, nkv = L.n_kv_heads, rep = nq / nkv, W = L.w_in.N;
  const int len = pos0 + T, rows = T * rep, padded = (rows + 15) / 16 * 16;
  const float scale = 1.f / std::sqrt((float)hd);
  parallel_for(nkv, nthreads, [&](int kh) {
    const size_t kbase = (size_t)kh * stride;
    float* sc = scd + (size_t)kh * padded * len;  // (padded rows, len) scores, then probabilities
    std::vector<uint16_t> qb((size_t)padded * hd, 0);
    tile_vector<uint16_t> xv((size_t)(hd / 32) * 32 * 16);  // B tiles: 64-byte aligned (amx_tiles.h)
    std::vector<float> o((size_t)padded * hd);
    for (int t = 0; t < T; ++t)  // row t * rep + r: token t, query head kh * rep + r
      for (int r = 0; r < rep; ++r)
        to_bf16_n(q + (size_t)t * W + (size_t)(kh * rep + r) * hd, qb.data() + (size_t)(t * rep + r) * hd, hd);
    for (int g = 0; g < padded; g += 16) {
      amx_pack(qb.data() + (size_t)g * hd, 16, hd, xv.data());
      dense_bf16_amx<16>(xv.data(), qb.data() + (size_t)g * hd, hd, (const uint16_t*)kc + kbase, len,
                         sc + (size_t)g * len, 0, len);
    }
    for (int i = 0; i < rows; ++i) {
      float* sr = sc + (size_t)i * len;
      const int n = pos0 + i / rep + 1;  // keys this row's token sees
      float mv = -INFINITY;
      for (int j = 0; j < n; ++j) {
        sr[j] *= scale;
        mv = sr[j] > mv ? sr[j] : mv;
      }
      float tt = 0.f;
      int j = 0;
      const __m512 mvv = _mm512_set1_ps(mv);
      for (; j + 16 <= n; j += 16) {
        alignas(64) float e[16];
        _mm512_store_ps(e, vl_exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mvv)));
        for (int k = 0; k < 16; ++k) tt += (sr[j + k] = e[k]);
      }
      for (; j < n; ++j) tt += (sr[j] = std::exp(sr[j] - mv));
      const float inv = 1.f / tt;
      for (j = 0; j < n; ++j) sr[j] *= inv;
      for (; j < len; ++j) sr[j] = 0.f;  // keys after this token: masked (and skipped by the product below)
    }
    dense_t_gemv(sc, rows, len, (const uint16_t*)vc + kbase, hd, 1, o.data(), 1);
    for (int i = 0; i < rows; ++i) {
      float* dst = out + (size_t)(i / rep) * W + (size_t)(kh * rep + i % rep) * hd;
      for (int d = 0; d < hd; ++d) dst[d] = rnd(o[(size_t)i * hd + d]);
    }
  });
}
#endif

static void attend_segment(const VlModel& m, const VlLayer& L, const float* q, float* out, const void* kc,
                           const void* vc, size_t stride, int pos0, int T, float* scd, int nthreads) {
#ifdef VL_AMX
  if (m.bf16 && amx_ready() && L.attn_head_dim % 32 == 0) {
    attend_segment_tiles(m, L, q, out, kc, vc, stride, pos0, T, scd, nthreads);
    return;
  }
#endif
  const Round rnd{m.bf16};
  const int hd = L.attn_head_dim, nq = L.n_q_heads, nkv = L.n_kv_heads, rep = nq / nkv, W = L.w_in.N;
  const int len = pos0 + T;  // keys of the last token
  const float scale = 1.f / std::sqrt((float)hd);
  parallel_for(nkv, nthreads, [&](int kh) {
    const int q0 = kh * rep, q1 = q0 + rep;
    const size_t kbase = (size_t)kh * stride;
    std::vector<float> mx((size_t)T * rep, -INFINITY), tot((size_t)T * rep);
    auto row = [&](int t, int qh) { return scd + ((size_t)t * nq + qh) * len; };  // scores of (token, head)
    for (int j = 0; j < len; ++j) {
      const size_t at = kbase + (size_t)j * hd;
      for (int t = j > pos0 ? j - pos0 : 0; t < T; ++t) {  // the tokens that see key j
        const float* qrow = q + (size_t)t * W;
        int qh = q0;
        float dots[4];
        for (; qh + 4 <= q1; qh += 4) {
          const float* const qs[4] = {qrow + (size_t)qh * hd, qrow + (size_t)(qh + 1) * hd,
                                      qrow + (size_t)(qh + 2) * hd, qrow + (size_t)(qh + 3) * hd};
          dot_rows4(qs, kc, at, hd, m.bf16, dots);
          for (int r = 0; r < 4; ++r) {
            const float v = dots[r] * scale;
            row(t, qh + r)[j] = v;
            float& mm = mx[(size_t)t * rep + qh + r - q0];
            mm = v > mm ? v : mm;
          }
        }
        for (; qh < q1; ++qh) {
          const float v = dot_row(qrow + (size_t)qh * hd, kc, at, hd, m.bf16) * scale;
          row(t, qh)[j] = v;
          float& mm = mx[(size_t)t * rep + qh - q0];
          mm = v > mm ? v : mm;
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int qh = q0; qh < q1; ++qh) {
        float* sr = row(t, qh);
        const float mv = mx[(size_t)t * rep + qh - q0];
        const int n = pos0 + t + 1;
        float tt = 0.f;
        int j = 0;
#ifdef VL_AVX512
        // 16 exponentials at a time (a chunk's keys are many: the scalar loop was a third of its attention); the
        // sum stays in order, one key after the other, so only the exponentials' own rounding differs from exp()
        const __m512 mvv = _mm512_set1_ps(mv);
        for (; j + 16 <= n; j += 16) {
          alignas(64) float e[16];
          _mm512_store_ps(e, vl_exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mvv)));
          for (int i = 0; i < 16; ++i) tt += (sr[j + i] = e[i]);
        }
#endif
        for (; j < n; ++j) {
          sr[j] = std::exp(sr[j] - mv);
          tt += sr[j];
        }
        tot[(size_t)t * rep + qh - q0] = tt;
        float* o = out + (size_t)t * W + (size_t)qh * hd;
        for (int d = 0; d < hd; ++d) o[d] = 0.f;
      }
    // values: four tokens at a time over the keys, so their heads' output rows stay in L1 (all T tokens' rows at
    // once did not fit and made the pass slower than token by token)
    for (int t0 = 0; t0 < T; t0 += 4) {
      const int t1 = std::min(T, t0 + 4);
      for (int j = 0; j < pos0 + t1; ++j)
        for (int t = std::max(t0, j - pos0); t < t1; ++t)
          for (int qh = q0; qh < q1; ++qh) {
            const float p = row(t, qh)[j];
            if (p == 0.f) continue;
            axpy_row(p / tot[(size_t)t * rep + qh - q0], vc, kbase + (size_t)j * hd,
                     out + (size_t)t * W + (size_t)qh * hd, hd, m.bf16);
          }
    }
    for (int t = 0; t < T; ++t)
      for (int qh = q0; qh < q1; ++qh) {
        float* o = out + (size_t)t * W + (size_t)qh * hd;
        for (int d = 0; d < hd; ++d) o[d] = rnd(o[d]);
      }
  });
}

// Writes one token's keys and values (nkv heads of hd, float32 holding model-dtype values) at position `pos` of a
// cache row (`base`: the row's element offset, `stride`: elements per kv head).
static void put_kv(const float* ks, const float* vs, void* kc, void* vc, size_t base, size_t stride, int pos, int nkv,
                   int hd, int bf16) {
  for (int kh = 0; kh < nkv; ++kh) {
    const size_t at = base + (size_t)kh * stride + (size_t)pos * hd;
    for (int d = 0; d < hd; ++d) {
      if (bf16) {
        ((uint16_t*)kc)[at + d] = f2b(ks[kh * hd + d]);
        ((uint16_t*)vc)[at + d] = f2b(vs[kh * hd + d]);
      } else {
        ((float*)kc)[at + d] = ks[kh * hd + d];
        ((float*)vc)[at + d] = vs[kh * hd + d];
      }
    }
  }
}

// Attention without positional encoding, one query per row over keys [0, pos]; padded batches mask keys whose
// `valid` is 0, the query always sees itself (vl/modeling/attention.py attention_mask). A segment's token t writes
// its keys at seg->pos + t of its own cache and reads keys [0, seg->pos + t] there (causal within the chunk).
static void attention_layer(const VlModel& m, const VlLayer& L, int B, float* h, void* kc, void* vc, int pos,
                            int max_len, const uint8_t* valid, const VlSegment* seg, int l, int nthreads) {
  const Round rnd{m.bf16};
  static thread_local Act xn, ao;
  static thread_local std::vector<float> q, k, v, out, sc;
  const int R = B + (seg ? seg->T : 0);
  rms_rows(h, R, m.D, L.norm_w, m.eps, rnd, xn);
  const int hd = L.attn_head_dim, nq = L.n_q_heads, nkv = L.n_kv_heads;
  q.resize((size_t)R * L.w_in.N);
  k.resize((size_t)R * L.w_k.N);
  v.resize((size_t)R * L.w_k.N);
  const uint16_t* xb = m.bf16 ? xn.b.data() : nullptr;
  gemv(xn.f.data(), xb, R, L.w_in, m.bf16, q.data(), nthreads);
  gemv(xn.f.data(), xb, R, L.w_k, m.bf16, k.data(), nthreads);
  gemv(xn.f.data(), xb, R, L.w_v, m.bf16, v.data(), nthreads);
  round_n(q.data(), (size_t)R * L.w_in.N, rnd.bf16);
  round_n(k.data(), (size_t)R * L.w_k.N, rnd.bf16);
  round_n(v.data(), (size_t)R * L.w_k.N, rnd.bf16);
  ao.resize((size_t)R * L.w_in.N, m.bf16);
  const size_t seg_scores = seg ? (size_t)nkv * ((seg->T * (nq / nkv) + 15) / 16 * 16) * (seg->pos + seg->T) : 0;
  sc.resize(std::max((size_t)nq * (pos + 1), seg_scores));
  float* const scd = sc.data();  // thread_local buffers: the OpenMP workers use the caller's, by pointer
  const size_t stride = (size_t)max_len * hd;
  for (int b = 0; b < B; ++b) {
    const size_t base = (size_t)b * nkv * stride;
    put_kv(k.data() + (size_t)b * L.w_k.N, v.data() + (size_t)b * L.w_k.N, kc, vc, base, stride, pos, nkv, hd,
           m.bf16);
    attend_row(m, L, q.data() + (size_t)b * L.w_in.N, ao.f.data() + (size_t)b * L.w_in.N, kc, vc, base, stride, pos,
               valid ? valid + (size_t)b * max_len : nullptr, scd, nthreads);
  }
  if (seg) {
    void *skc = seg->caches[2 * l], *svc = seg->caches[2 * l + 1];
    const size_t sstride = (size_t)seg->max_len * hd;
    for (int t = 0; t < seg->T; ++t)
      put_kv(k.data() + (size_t)(B + t) * L.w_k.N, v.data() + (size_t)(B + t) * L.w_k.N, skc, svc, 0, sstride,
             seg->pos + t, nkv, hd, m.bf16);
    attend_segment(m, L, q.data() + (size_t)B * L.w_in.N, ao.f.data() + (size_t)B * L.w_in.N, skc, svc, sstride,
                   seg->pos, seg->T, scd, nthreads);
  }
  ao.sync_bf16((size_t)R * L.w_in.N, m.bf16);
  out.resize((size_t)R * m.D);
  gemv(ao.f.data(), m.bf16 ? ao.b.data() : nullptr, R, L.w_out, m.bf16, out.data(), nthreads);
  round_n(out.data(), (size_t)R * m.D, rnd.bf16);
  residual_add(h, out.data(), (size_t)R * m.D, Round{m.bf16 && !m.res_f32});
}

// y = Round(ReLU(Round(y))^2) over n values: the ReLU^2 of an up projection's output, as mlp_layer squares it.
static void relu2_n(float* y, size_t n, Round rnd) {
  size_t i = 0;
#ifdef VL_AVX512
  for (; i + 16 <= n; i += 16) {  // max(u, 0) takes the 0 for a NaN, as the scalar line does
    const __m512 r = _mm512_max_ps(rnd_v(_mm512_loadu_ps(y + i), rnd.bf16), _mm512_setzero_ps());
    _mm512_storeu_ps(y + i, rnd_v(_mm512_mul_ps(r, r), rnd.bf16));
  }
#endif
  for (; i < n; ++i) {
    const float u = rnd(y[i]);
    const float r = u > 0.f ? u : 0.f;
    y[i] = rnd(r * r);
  }
}

// out (B, D) = down(relu(up(xn))^2) with L.w_in / L.w_out, rounded to the model dtype: relu is exact, the square
// is rounded as the reference's. The MLP layer's body and the MoE layer's shared expert.
static void relu2_mlp(const VlModel& m, const VlLayer& L, int B, const Act& xn, std::vector<float>& out,
                      int nthreads) {
  const Round rnd{m.bf16};
  static thread_local Act a;
  a.resize((size_t)B * L.w_in.N, m.bf16);
  gemv(xn.f.data(), m.bf16 ? xn.b.data() : nullptr, B, L.w_in, m.bf16, a.f.data(), nthreads);
  relu2_n(a.f.data(), (size_t)B * L.w_in.N, rnd);
  a.sync_bf16((size_t)B * L.w_in.N, m.bf16);
  out.resize((size_t)B * m.D);
  gemv(a.f.data(), m.bf16 ? a.b.data() : nullptr, B, L.w_out, m.bf16, out.data(), nthreads);
  round_n(out.data(), (size_t)B * m.D, rnd.bf16);
}

static void mlp_layer(const VlModel& m, const VlLayer& L, int B, float* h, int nthreads) {
  static thread_local Act xn;
  static thread_local std::vector<float> out;
  rms_rows(h, B, m.D, L.norm_w, m.eps, Round{m.bf16}, xn);
  relu2_mlp(m, L, B, xn, out, nthreads);
  residual_add(h, out.data(), (size_t)B * m.D, Round{m.bf16 && !m.res_f32});
}

// G products of one shape, group g: x row g (xs[g] float32, xbs[g] its bf16 copy) times W[g]. Packed NVFP4 or FP8
// matrices of one format go as one kernel call (row_kernels.h nvfp4_gemv_group / fp8_gemv_group: the threads wake
// once for all of them), anything else one gemv per matrix; either way each row has the bits of its own gemv.
static void gemv_group(int G, const float* const* xs, const uint16_t* const* xbs, const VlMat* const* W, int bf16,
                       float* y, int nthreads) {
  const VlMat& W0 = *W[0];
  bool same = W0.fmt == 1 || W0.fmt == 2;  // packed, all of one format, shape and (FP8) scale kind
  for (int g = 1; g < G && same; ++g)
    same = W[g]->fmt == W0.fmt && W[g]->K == W0.K && W[g]->N == W0.N && W[g]->scale_kind == W0.scale_kind;
  if (!same) {
    for (int g = 0; g < G; ++g) gemv(xs[g], xbs[g], 1, *W[g], bf16, y + (size_t)g * W[g]->N, nthreads);
    return;
  }
  const int x_bf16 = bf16 && gemv_bf16_dot();
  std::vector<const void*> x(G);
  std::vector<const uint8_t*> w(G), bs(G);
  std::vector<const float*> sc(G);
  std::vector<float> gs(G);
  for (int g = 0; g < G; ++g) {
    x[g] = x_bf16 ? (const void*)xbs[g] : (const void*)xs[g];
    w[g] = (const uint8_t*)W[g]->w;
    bs[g] = W[g]->block_scale;
    sc[g] = W[g]->scale;
    gs[g] = W[g]->global_scale;
  }
  if (W0.fmt == 2)
    nvfp4_gemv_group(G, x.data(), 1, W0.K, w.data(), bs.data(), gs.data(), W0.N, bf16, x_bf16, 0, y, nthreads);
  else
    fp8_gemv_group(G, x.data(), 1, W0.K, w.data(), W0.N, sc.data(), W0.scale_kind, bf16, x_bf16, y, nthreads);
}

// The router (Router.forward): sigmoid scores of the float32 product, the top k by score + bias, weighted by the
// scores (normalised over the k when norm_topk) times routed_scale; -> the k (expert, weight) pairs by expert id.
static void route(const VlLayer& L, int D, const float* x, std::vector<std::pair<int, float>>& chosen) {
  static thread_local std::vector<float> score, choice;
  static thread_local std::vector<int> order;
  score.resize(L.n_experts);
  choice.resize(L.n_experts);
  order.resize(L.n_experts);
  for (int e = 0; e < L.n_experts; ++e) {
    const float* wr = L.router_w + (size_t)e * D;
    int i = 0;
    float dot = 0.f;
#ifdef VL_AVX512
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(wr + i), acc);
    dot = _mm512_reduce_add_ps(acc);
#endif
    for (; i < D; ++i) dot += x[i] * wr[i];
    score[e] = 1.f / (1.f + std::exp(-dot));
    choice[e] = score[e] + L.router_bias[e];
    order[e] = e;
  }
  std::partial_sort(order.begin(), order.begin() + L.top_k, order.end(), [&](int a, int b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  float tot = 0.f;
  for (int j = 0; j < L.top_k; ++j) tot += score[order[j]];
  chosen.resize(L.top_k);
  for (int j = 0; j < L.top_k; ++j) {
    const float wj = L.norm_topk ? score[order[j]] / (tot + 1e-20f) : score[order[j]];
    chosen[j] = {order[j], wj * L.routed_scale};
  }
  std::sort(chosen.begin(), chosen.end());
}

// MoE: each row's k routed experts (down(relu(up(x))^2), the products of all rows' experts as one group per
// projection), added in float32 by expert id with the router's weights, rounded, plus the shared expert's MLP.
static void moe_layer(const VlModel& m, const VlLayer& L, int B, float* h, int nthreads) {
  const Round rnd{m.bf16};
  static thread_local Act xn, a;
  static thread_local std::vector<float> up, y, acc, out;
  static thread_local std::vector<std::pair<int, float>> chosen;
  static thread_local std::vector<std::pair<int, float>> all;
  static thread_local std::vector<const float*> xs;
  static thread_local std::vector<const uint16_t*> xbs;
  static thread_local std::vector<const VlMat*> mats;
  rms_rows(h, B, m.D, L.norm_w, m.eps, rnd, xn);
  const int k = L.top_k, G = B * k, I = L.up_e[0].N;
  all.clear();
  for (int b = 0; b < B; ++b) {
    route(L, m.D, xn.f.data() + (size_t)b * m.D, chosen);
    all.insert(all.end(), chosen.begin(), chosen.end());
  }
  xs.resize(G);
  xbs.resize(G);
  mats.resize(G);
  for (int g = 0; g < G; ++g) {
    xs[g] = xn.f.data() + (size_t)(g / k) * m.D;
    xbs[g] = m.bf16 ? xn.b.data() + (size_t)(g / k) * m.D : nullptr;
    mats[g] = &L.up_e[all[g].first];
  }
  a.resize((size_t)G * I, m.bf16);
  gemv_group(G, xs.data(), xbs.data(), mats.data(), m.bf16, a.f.data(), nthreads);
  relu2_n(a.f.data(), (size_t)G * I, rnd);
  a.sync_bf16((size_t)G * I, m.bf16);
  for (int g = 0; g < G; ++g) {
    xs[g] = a.f.data() + (size_t)g * I;
    xbs[g] = m.bf16 ? a.b.data() + (size_t)g * I : nullptr;
    mats[g] = &L.down_e[all[g].first];
  }
  y.resize((size_t)G * m.D);
  gemv_group(G, xs.data(), xbs.data(), mats.data(), m.bf16, y.data(), nthreads);
  round_n(y.data(), y.size(), rnd.bf16);
  acc.assign((size_t)B * m.D, 0.f);
  for (int g = 0; g < G; ++g) {  // float32 sums in expert order, as the modules' out[token] += y * w
    float* o = acc.data() + (size_t)(g / k) * m.D;
    const float* yr = y.data() + (size_t)g * m.D;
    const float wg = all[g].second;
    for (int i = 0; i < m.D; ++i) o[i] += yr[i] * wg;
  }
  round_n(acc.data(), acc.size(), rnd.bf16);
  relu2_mlp(m, L, B, xn, out, nthreads);  // the shared expert
  for (size_t i = 0; i < out.size(); ++i) out[i] = rnd(acc[i] + out[i]);
  residual_add(h, out.data(), (size_t)B * m.D, Round{m.bf16 && !m.res_f32});
}

extern "C" {

int vl_isa() { return gemv_isa(); }  // 2 = AVX512 path, 0 = portable path

int vl_tile_rows() {  // rows a bf16 product takes in one pass on AMX tiles (0: no tiles here)
#ifdef VL_AMX
  return amx_ready() ? 32 : 0;
#else
  return 0;
#endif
}

int vl_packed_tiles() { return packed_tiles(); }  // 1: VlModel.packed_tiles takes NVFP4 rows to AMX tiles here

// ids (B,) token ids; caches: two pointers per layer (mamba: conv state, ssm state; attention: K, V; MLP: unused);
// pos: the position the new token takes (keys [0, pos] are read); valid (B, max_len) bytes: the step marks
// column `pos` real in every row, and with `padded` masks the keys whose byte is 0 (left padding);
// logits (B, vocab) float32 out, holding model-dtype values (the reference's lm_head output, widened).
// seg: null, or a joining prompt's chunk that rides along (VlSegment); with seg->logits, logits has B + 1 rows.
// -> 0, or 1 when an id is outside the embedding table: then nothing is read past the table or written.
int vl_decode_step(const VlModel* m, int B, const int64_t* ids, void* const* caches, int pos, int max_len,
                   uint8_t* valid, int padded, float* logits, const VlSegment* seg, int nthreads) {
  for (int b = 0; b < B; ++b)
    if (ids[b] < 0 || ids[b] >= m->embed_rows) return 1;
  if (seg && seg->T <= 0) seg = nullptr;
  for (int b = 0; b < B; ++b) valid[(size_t)b * max_len + pos] = 1;
  if (seg) std::memset(seg->valid + seg->pos, 1, seg->T);
  const uint8_t* mask = padded ? valid : nullptr;
  const int R = B + (seg ? seg->T : 0), D = m->D;
  tile_policy.lead = m->packed_tiles <= 0 ? R : B >= m->packed_tiles ? 0 : B;
  static thread_local std::vector<float> h;
  static thread_local Act xn;
  h.resize((size_t)R * D);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < D; ++i) {
      const size_t at = (size_t)ids[b] * D + i;
      h[(size_t)b * D + i] = m->bf16 ? bf16_to_float(((const uint16_t*)m->embed)[at]) : ((const float*)m->embed)[at];
    }
  if (seg) std::memcpy(h.data() + (size_t)B * D, seg->x, sizeof(float) * seg->T * D);
  for (int l = 0; l < m->n_layers; ++l) {
    const VlLayer& L = m->layers[l];
    if (L.kind == 0)
      mamba_layer(*m, L, B, h.data(), caches[2 * l], (float*)caches[2 * l + 1], seg, l, nthreads);
    else if (L.kind == 1)
      attention_layer(*m, L, B, h.data(), caches[2 * l], caches[2 * l + 1], pos, max_len, mask, seg, l, nthreads);
    else if (L.kind == 2)
      mlp_layer(*m, L, R, h.data(), nthreads);
    else
      moe_layer(*m, L, R, h.data(), nthreads);
  }
  int out_rows = B;  // the decode rows' logits, then the segment's last token's where asked
  if (seg && seg->logits) {
    std::memmove(h.data() + (size_t)B * D, h.data() + (size_t)(R - 1) * D, sizeof(float) * D);
    out_rows = B + 1;
  }
  const Round rnd{m->bf16};
  rms_rows(h.data(), out_rows, D, m->norm_f, m->eps, rnd, xn, false);
  gemv(xn.f.data(), m->bf16 ? xn.b.data() : nullptr, out_rows, m->lm_head, m->bf16, logits, nthreads);
  round_n(logits, (size_t)out_rows * m->vocab, rnd.bf16);
  return 0;
}

}  // extern "C"
