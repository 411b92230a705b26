// Unmasked multi-head attention in bf16 on AMX tiles: the vision towers' self-attention (a ViT's tokens attend to
// all tokens) on CPUs with AMX-BF16. The twin is `torch.nn.functional.scaled_dot_product_attention` on the same bf16
// tensors (vl/kernels/attention.py); tests/kernels/test_attention_cpu.py holds them together.
//
// Per head, block of 32 queries and chunk of keys (the whole row up to 2048 keys: a 512-px tile has 1032):
// S = Q K^T on tiles (bf16 products, float32 sums), softmax in float32 (the row's running maximum,
// exp((s - max) * scale), the float32 sum), the unnormalised probabilities rounded to bf16 (round to nearest even)
// as the A tile of P V, the chunk's float32 outputs added to the row's (rescaled when its maximum grew), then each
// output divided by its row's sum and rounded to bf16 once. torch's CPU flash attention does the same arithmetic in
// other blocks, so the two differ by float32 summation order and by where the probabilities are rounded relative to
// the running maximum.
//
// Why: torch's kernel ran a ViT-H block's attention (1032 tokens, 16 heads of 80) at ~0.3 TFLOP/s, a quarter of the
// block's time, bounded by its softmax passes (docs/benchmarks.md, "The vision tower on the CPU").
//
// Layouts: q, k, v are (B, L, H, D) bf16 views with the last dimension contiguous (the qkv projection's output
// split without a copy), each with its own element strides; out is (B, L, H, D) contiguous. Heads are split over
// the threads; each packs its head's K and V once into the tiles' pair layouts (zero-padded to 32 channels and 32
// keys: exact, zero terms add nothing; the padded keys' probabilities are set to 0).
//
// Relative positions (vl_rel_attention): Transformer-XL's attention as Parakeet (Omni's audio encoder) computes it,
// score(i, j) = scale (qu_i . k_j + qv_i . r_{(L - 1) - (i - j)}) over the 2L - 1 rows of r. Per block of 32 queries
// and chunk of keys the position term is one more tile product, qv against the window of r rows the block's
// (query, key) pairs reach (the chunk's keys + 31 + the alignment to 16 rows), added to S along shifted rows (row a
// of the block reads its window from column 31 - a): the term is never materialised beyond one block's rows. The
// twin is the module's torch path (vl/modeling/parakeet.py `RelPositionAttention._attend`), which rounds each term
// and their sum to bf16 before a float32 softmax; here both stay float32 until the probabilities.
//
// Built at first use by vl/kernels/attention.py through the compile cache of vl/kernels/loader.py (g++ -O3
// -march=native -fopenmp). Without AMX the library says so (vl_attention_tiles() = 0) and the caller runs torch's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__linux__) && !defined(VL_PORTABLE)
#define VL_AMX 1
#include <immintrin.h>

#include "amx_tiles.h"  // amx_ready, amx_configure
#endif

namespace {

#ifdef VL_AMX
// Tiles, all 16 rows x 64 bytes: C 0-3 (two query blocks x two key or channel blocks: C[qa][j] = tile 2 qa + j),
// A 4-5 (the two query blocks' Q or P), B 6-7 (two blocks of K or V): each tile loaded feeds two products.
struct Dims {
  int L, D, Lk, Dp, nkb, nds, nkc, ndb;  // keys padded to Lk (32s), channels to Dp (32s); blocks of each
};

// K (L, D) of one head -> B tiles of S = Q K^T: per 16 keys (kb) and 32 channels (ds), 16 rows (channel pairs) of
// 16 (even, odd) pairs, one pair per key: row r of tile (kb, ds) gathers pair ds * 16 + r of the block's 16 keys.
// Padded keys and channels are 0.
void pack_k(const uint16_t* k, long sl, const Dims& d, uint16_t* kp) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i rows = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)(sl * 2)));  // byte offsets of 16 keys
  for (int kb = 0; kb < d.nkb; ++kb) {
    const int keys = std::max(0, std::min(16, d.L - kb * 16));
    const __mmask16 km = (__mmask16)((1u << keys) - 1);
    const char* base = reinterpret_cast<const char*>(k + (size_t)kb * 16 * sl);
    for (int ds = 0; ds < d.nds; ++ds) {
      uint16_t* t = kp + ((size_t)kb * d.nds + ds) * 512;
      for (int r = 0; r < 16; ++r) {
        const int pair = ds * 16 + r;
        __m512i v = _mm512_setzero_si512();
        if (keys && pair < d.D / 2)
          v = _mm512_mask_i32gather_epi32(v, km, _mm512_add_epi32(rows, _mm512_set1_epi32(pair * 4)), base, 1);
        _mm512_storeu_si512(t + r * 32, v);
      }
    }
  }
}

// V (L, D) of one head -> B tiles of O = P V: per 32 keys (kc) and 16 channels (db), 16 rows (key pairs) of 16
// (even key, odd key) pairs, one pair per channel. Padded keys and channels are 0.
void pack_v(const uint16_t* v, long sl, const Dims& d, uint16_t* vp) {
  for (int kc = 0; kc < d.nkc; ++kc)
    for (int j = 0; j < 16; ++j) {
      const int k0 = kc * 32 + 2 * j;
      for (int db = 0; db < d.ndb; ++db) {
        const int c0 = db * 16;
        const __mmask16 cm = (__mmask16)(c0 + 16 <= d.D ? 0xFFFF : (1u << (d.D - c0)) - 1);
        const __m256i lo = k0 < d.L ? _mm256_maskz_loadu_epi16(cm, v + (size_t)k0 * sl + c0) : _mm256_setzero_si256();
        const __m256i hi = k0 + 1 < d.L ? _mm256_maskz_loadu_epi16(cm, v + (size_t)(k0 + 1) * sl + c0)
                                        : _mm256_setzero_si256();
        const __m512i pair = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        _mm512_storeu_si512(vp + ((size_t)kc * d.ndb + db) * 512 + j * 32, pair);
      }
    }
}

// C[qa][j] += A[qa] x B[j] for qa < nq, j < nj (each 1 or 2); tile ids are immediates
inline void dot22(int nq, int nj) {
  _tile_dpbf16ps(0, 4, 6);
  if (nj > 1) _tile_dpbf16ps(1, 4, 7);
  if (nq > 1) {
    _tile_dpbf16ps(2, 5, 6);
    if (nj > 1) _tile_dpbf16ps(3, 5, 7);
  }
}

inline void zero_c() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// C[qa][j] to dst + qa * 16 rows + j * 16 columns (row stride `ld` floats)
inline void store_c(int nq, int nj, float* dst, long ld) {
  _tile_stored(0, dst, ld * 4);
  if (nj > 1) _tile_stored(1, dst + 16, ld * 4);
  if (nq > 1) {
    _tile_stored(2, dst + 16 * ld, ld * 4);
    if (nj > 1) _tile_stored(3, dst + 16 * ld + 16, ld * 4);
  }
}

// C (16 nq, 16 nb) = A B^T for the 16 nq packed query rows at `a` (row stride d.Dp) and the nb blocks of 16 rows
// packed as pack_k packs them (blocks b0 .. b0 + nb - 1 of `packed`), two by two blocks per step, stored at dst (row
// stride ld floats): the scores Q K^T of a chunk, and the position product with r's window
inline void rows_by_blocks(const uint16_t* a, int nq, const uint16_t* packed, int b0, int nb, const Dims& d,
                           float* dst, long ld) {
  for (int kb = 0; kb < nb; kb += 2) {
    const int nj = std::min(2, nb - kb);
    zero_c();
    for (int ds = 0; ds < d.nds; ++ds) {
      _tile_loadd(4, a + ds * 32, d.Dp * 2);
      if (nq > 1) _tile_loadd(5, a + 16 * d.Dp + ds * 32, d.Dp * 2);
      _tile_loadd(6, packed + ((size_t)(b0 + kb) * d.nds + ds) * 512, 64);
      if (nj > 1) _tile_loadd(7, packed + ((size_t)(b0 + kb + 1) * d.nds + ds) * 512, 64);
      dot22(nq, nj);
    }
    store_c(nq, nj, dst + kb * 16, ld);
  }
}

// exp(x) for x <= 0 as 2^(x log2 e): the power of two by VSCALEFPS, 2^f on [-1/2, 1/2] by its degree-6 Taylor
// polynomial (relative error ~1e-7 there: float32's rounding), without vl_exp16's range clamps (the
// arguments are finite and at most 0; far below 0 the result goes to 0 through subnormals as expf's does).
inline __m512 exp_nonpositive(__m512 t /* already x * log2(e) */) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5403530393381609e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Blocking: queries in super-blocks of QS rows, keys in chunks of KC. Within a super-block the chunks go in order,
// each chunk's packed K and V (KC = 512 keys: 88 KB at 80 channels) feeding all of the super-block's query blocks
// while they are in cache; the softmax is online (running maximum and sum per row, the float32 outputs rescaled
// when the maximum grows). Up to 2048 keys the whole row is one chunk (no rescaling at all).
constexpr int QS = 512, KC = 512, ONE_CHUNK_MAX = 2048;

struct Scratch {  // 64-byte aligned: tiles load from and store to these (amx_tiles.h `tile_vector`)
  tile_vector<uint16_t> kp, vp, qp, p, qvp, rraw, rp;
  tile_vector<float> s, o, part, m, l, alpha, pf;
};

// Relative positions for one head: qv (L, D) and r (2L - 1, D) with their row strides; r is copied between RPAD
// zero rows on each side so that every window the blocks reach (including padded queries and keys) lies inside it.
struct Rel {
  const uint16_t* qv;
  long qvsl;
  const uint16_t* r;
  long rsl;
};
constexpr int RPAD = 64;
inline int rel_rows(int L) { return (2 * L - 1 + 2 * RPAD + 64 + 15) / 16 * 16; }

// Online softmax of `rows` score rows (row stride kc, nk keys of which the first nv valid) against the rows' running maxima m
// and sums l: P (bf16, unnormalised, padded keys 0) and alpha = exp(scale (m_old - m_new)), the factor the rows'
// earlier outputs take (0 on a row's first chunk).
inline void softmax_rows(const float* s, int rows, int kc, int nk, int nv, float c, uint16_t* p, float* m, float* l,
                         float* alpha) {
  const int tail_n = nv % 16, full = nv - tail_n;
  const __mmask16 tail = (__mmask16)((1u << tail_n) - 1);
  const __m512 vc = _mm512_set1_ps(c);
  for (int r = 0; r < rows; ++r) {
    const float* sr = s + (size_t)r * kc;
    uint16_t* pr = p + (size_t)r * kc;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < full; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(sr + j));
    if (tail_n) vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_loadu_ps(sr + full));
    const float mx = std::max(m[r], _mm512_reduce_max_ps(vmax));
    alpha[r] = m[r] == -INFINITY ? 0.f : std::exp2(c * (m[r] - mx));  // c holds log2 e
    m[r] = mx;
    const __m512 cm = _mm512_set1_ps(c * mx);
    __m512 vsum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
      __m512 e = exp_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(sr + j), vc, cm));
      if (j + 16 > nv) e = _mm512_maskz_mov_ps(j < nv ? tail : (__mmask16)0, e);
      vsum = _mm512_add_ps(vsum, e);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(vsum);
  }
}

// One head: q, k, v (L, D) with row strides (elements); out rows `osl` apart.
// keys: the keys [0, keys) every query attends to (the rest of the row masked out; d.L when unmasked)
void head(const uint16_t* q, long qsl, const uint16_t* k, long ksl, const uint16_t* v, long vsl, uint16_t* out,
          long osl, const Dims& d, float scale, Scratch& w, int keys, const Rel* rel = nullptr) {
  pack_k(k, ksl, d, w.kp.data());
  pack_v(v, vsl, d, w.vp.data());
  const int pw = (d.Lk <= ONE_CHUNK_MAX ? d.Lk : KC) + 48;  // the position window's width at most (see below)
  if (rel) {  // r between zero rows, then packed like K (its rows are the "keys" of the position product)
    Dims dr = d;
    dr.L = rel_rows(d.L);
    dr.nkb = dr.L / 16;
    std::fill(w.rraw.begin(), w.rraw.end(), (uint16_t)0);
    for (int p = 0; p < 2 * d.L - 1; ++p)
      std::memcpy(w.rraw.data() + (size_t)(RPAD + p) * d.D, rel->r + (size_t)p * rel->rsl, 2 * d.D);
    pack_k(w.rraw.data(), d.D, dr, w.rp.data());
  }
  const int kc = d.Lk <= ONE_CHUNK_MAX ? d.Lk : KC;  // keys per chunk (a multiple of 32)
  const int ow = d.ndb * 16;                         // o's row width
  const float c = scale * 1.4426950408889634f;      // exp(scale (x - m)) = 2^(c x - c m)
  float *s = w.s.data(), *part = w.part.data();
  uint16_t* p = w.p.data();
  for (int qs0 = 0; qs0 < d.L; qs0 += QS) {
    const int nrows = std::min(QS, d.L - qs0), nqb = (nrows + 15) / 16;
    uint16_t* qp = w.qp.data();  // (nqb * 16, Dp) zero-padded
    std::memset(qp, 0, sizeof(uint16_t) * nqb * 16 * d.Dp);
    for (int r = 0; r < nrows; ++r) std::memcpy(qp + (size_t)r * d.Dp, q + (size_t)(qs0 + r) * qsl, 2 * d.D);
    if (rel) {
      std::memset(w.qvp.data(), 0, sizeof(uint16_t) * nqb * 16 * d.Dp);
      for (int r = 0; r < nrows; ++r)
        std::memcpy(w.qvp.data() + (size_t)r * d.Dp, rel->qv + (size_t)(qs0 + r) * rel->qvsl, 2 * d.D);
    }
    std::fill(w.o.begin(), w.o.begin() + (size_t)nqb * 16 * ow, 0.f);
    std::fill(w.m.begin(), w.m.end(), -INFINITY);
    std::fill(w.l.begin(), w.l.end(), 0.f);
    const int lk = (keys + 31) / 32 * 32;  // the chunks that hold a valid key
    for (int k0 = 0; k0 < lk; k0 += kc) {
      const int nk = std::min(kc, lk - k0), nv = std::min(nk, keys - k0);  // keys in the chunk, valid ones
      for (int qb = 0; qb < nqb; qb += 2) {
        const int nq = std::min(2, nqb - qb);
        const uint16_t* qa = qp + (size_t)qb * 16 * d.Dp;
        rows_by_blocks(qa, nq, w.kp.data(), k0 / 16, nk / 16, d, s, kc);  // S (16 nq, nk) = Q K^T
        if (rel) {
          // query i0 + a (a < 32) and key k0 + c reach r row (L - 1) - (i0 + a) + k0 + c = base + (31 - a) + c: the
          // product of the block's qv with r rows [st, st + W) (st = base aligned down to 16, off = base - st) holds
          // it at column off + 31 - a + c
          const long base = (long)(d.L - 1) - (qs0 + qb * 16 + 31) + k0 + RPAD, st = base & ~15L;
          const int off = (int)(base - st), width = (off + 31 + nk + 15) / 16 * 16;
          const uint16_t* qva = w.qvp.data() + (size_t)qb * 16 * d.Dp;
          float* pf = w.pf.data();
          rows_by_blocks(qva, nq, w.rp.data(), (int)(st / 16), width / 16, d, pf, pw);
          for (int a = 0; a < 16 * nq; ++a) {
            float* sr = s + (size_t)a * kc;
            const float* pr = pf + (size_t)a * pw + off + 31 - a;
            for (int c0 = 0; c0 < nk; c0 += 16)
              _mm512_storeu_ps(sr + c0, _mm512_add_ps(_mm512_loadu_ps(sr + c0), _mm512_loadu_ps(pr + c0)));
          }
        }
        const int r0 = qb * 16;
        softmax_rows(s, 16 * nq, kc, nk, nv, c, p, w.m.data() + r0, w.l.data() + r0, w.alpha.data() + r0);
        for (int db = 0; db < d.ndb; db += 2) {  // part (16 nq, ndb * 16) = P V over the chunk
          const int nj = std::min(2, d.ndb - db);
          zero_c();
          for (int j = 0; j < nk / 32; ++j) {
            _tile_loadd(4, p + j * 32, kc * 2);
            if (nq > 1) _tile_loadd(5, p + 16 * kc + j * 32, kc * 2);
            _tile_loadd(6, w.vp.data() + ((size_t)(k0 / 32 + j) * d.ndb + db) * 512, 64);
            if (nj > 1) _tile_loadd(7, w.vp.data() + ((size_t)(k0 / 32 + j) * d.ndb + db + 1) * 512, 64);
            dot22(nq, nj);
          }
          store_c(nq, nj, part + db * 16, ow);
        }
        for (int r = 0; r < 16 * nq; ++r) {  // o = o alpha + part
          float* orow = w.o.data() + (size_t)(r0 + r) * ow;
          const __m512 a = _mm512_set1_ps(w.alpha[r0 + r]);
          for (int ch = 0; ch < ow; ch += 16)
            _mm512_storeu_ps(orow + ch, _mm512_fmadd_ps(_mm512_loadu_ps(orow + ch), a,
                                                        _mm512_loadu_ps(part + (size_t)r * ow + ch)));
        }
      }
    }
    for (int r = 0; r < nrows; ++r) {  // out = o / l, rounded to bf16 once
      const __m512 inv = _mm512_set1_ps(1.f / w.l[r]);
      uint16_t* dst = out + (size_t)(qs0 + r) * osl;
      for (int ch = 0; ch < d.D; ch += 16) {
        const __mmask16 mk = (__mmask16)(ch + 16 <= d.D ? 0xFFFF : (1u << (d.D - ch)) - 1);
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(w.o.data() + (size_t)r * ow + ch), inv);
        _mm256_mask_storeu_epi16(dst + ch, mk, (__m256i)_mm512_cvtneps_pbh(y));
      }
    }
  }
}
#endif

// Both entry points: heads over the threads, each with its own scratch; qv and r (relative positions) optional.
int run(int B, int L, int H, int D, const uint16_t* q, long qsb, long qsl, long qsh, const uint16_t* k, long ksb,
        long ksl, long ksh, const uint16_t* v, long vsb, long vsl, long vsh, const uint16_t* qv, long vqsb, long vqsl,
        long vqsh, const uint16_t* r, long rsp, long rsh, const int* keys, float scale, uint16_t* out, int threads) {
#ifdef VL_AMX
  if (!amx_ready() || L < 1 || D < 2 || D % 2) return 1;
  for (int b = 0; keys && b < B; ++b)
    if (keys[b] < 1 || keys[b] > L) return 1;
  Dims d{};
  d.L = L;
  d.D = D;
  d.Lk = (L + 31) / 32 * 32;
  d.Dp = (D + 31) / 32 * 32;
  d.nkb = d.Lk / 16;
  d.nds = d.Dp / 32;
  d.nkc = d.Lk / 32;
  d.ndb = (D + 15) / 16;
  const int heads = B * H;
  threads = std::max(1, std::min(threads, heads));
#pragma omp parallel num_threads(threads)
  {
    Scratch w;
    w.kp.resize((size_t)512 * d.nkb * d.nds);
    w.vp.resize((size_t)512 * d.nkc * d.ndb);
    const int kc = d.Lk <= ONE_CHUNK_MAX ? d.Lk : KC, ow = d.ndb * 16, qs = std::min(QS, (L + 15) / 16 * 16);
    w.qp.resize((size_t)qs * d.Dp);
    w.o.resize((size_t)qs * ow);
    w.m.resize(qs);
    w.l.resize(qs);
    w.alpha.resize(qs);
    w.s.resize((size_t)32 * kc);
    w.p.resize((size_t)32 * kc);
    w.part.resize((size_t)32 * ow);
    if (r) {
      w.qvp.resize((size_t)qs * d.Dp);
      w.rraw.resize((size_t)rel_rows(L) * D);
      w.rp.resize((size_t)512 * (rel_rows(L) / 16) * d.nds);
      w.pf.resize((size_t)32 * (kc + 48));
    }
    amx_configure({64, 64, 64, 64, 64, 64, 64, 64});
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < heads; ++bh) {
      const int b = bh / H, h = bh % H;
      const Rel rel{r ? qv + b * vqsb + h * vqsh : nullptr, vqsl, r ? r + h * rsh : nullptr, rsp};
      head(q + b * qsb + h * qsh, qsl, k + b * ksb + h * ksh, ksl, v + b * vsb + h * vsh, vsl,
           out + ((size_t)b * L * H + h) * D, (long)H * D, d, scale, w, keys ? keys[b] : L, r ? &rel : nullptr);
    }
    _tile_release();
  }
  return 0;
#else
  (void)B, (void)L, (void)H, (void)D, (void)q, (void)qsb, (void)qsl, (void)qsh, (void)k, (void)ksb, (void)ksl;
  (void)ksh, (void)v, (void)vsb, (void)vsl, (void)vsh, (void)qv, (void)vqsb, (void)vqsl, (void)vqsh, (void)r;
  (void)rsp, (void)rsh, (void)keys, (void)scale, (void)out, (void)threads;
  return 1;
#endif
}

}  // namespace

extern "C" {

int vl_isa() {  // 2 = an AVX512 build, 0 = portable; the tile path is vl_attention_tiles()
#if defined(__AVX512F__) && !defined(VL_PORTABLE)
  return 2;
#else
  return 0;
#endif
}

// 1 where this process can run vl_attention (a build with AMX and the tile state granted), else 0
int vl_attention_tiles() {
#ifdef VL_AMX
  return amx_ready() ? 1 : 0;
#else
  return 0;
#endif
}

// out (B, L, H, D) = softmax(scale * q k^T) v per (batch, head); strides in elements as (batch, position, head), the
// channel stride 1; D even. Returns 0, or 1 where the tiles are unavailable or D is odd (nothing written).
int vl_attention(int B, int L, int H, int D, const uint16_t* q, long qsb, long qsl, long qsh, const uint16_t* k,
                 long ksb, long ksl, long ksh, const uint16_t* v, long vsb, long vsl, long vsh, float scale,
                 uint16_t* out, int threads) {
  return run(B, L, H, D, q, qsb, qsl, qsh, k, ksb, ksl, ksh, v, vsb, vsl, vsh, nullptr, 0, 0, 0, nullptr, 0, 0, nullptr,
             scale, out, threads);
}

// Transformer-XL relative positions (Parakeet): out (B, L, H, D) = softmax(scale (qu k^T + shift(qv r^T))) v, where
// query i and key j take r row (L - 1) - (i - j); r (2L - 1, H, D) is shared by the batch rows (strides: row, head).
// keys: per batch row, the keys [0, keys[b]) that every query of the row attends to (1 .. L), or null for all.
// Returns as vl_attention (1 also for a keys[b] out of range).
int vl_rel_attention(int B, int L, int H, int D, const uint16_t* qu, long qsb, long qsl, long qsh, const uint16_t* qv,
                     long vqsb, long vqsl, long vqsh, const uint16_t* k, long ksb, long ksl, long ksh,
                     const uint16_t* v, long vsb, long vsl, long vsh, const uint16_t* r, long rsp, long rsh,
                     const int* keys, float scale, uint16_t* out, int threads) {
  if (qv == nullptr || r == nullptr) return 1;
  return run(B, L, H, D, qu, qsb, qsl, qsh, k, ksb, ksl, ksh, v, vsb, vsl, vsh, qv, vqsb, vqsl, vqsh, r, rsp, rsh, keys,
             scale, out, threads);
}

}  // extern "C"
