// What skipping the exact zeros of ReLU^2 activations would save in a decode step's down_proj (docs/cpu_decode.md,
// "Left for later"): one row, bf16 weights, the 180m config's 10 MLP layers (down_proj 1024 x 3072), float32 sums.
//   dense:  y = W a, W (1024, 3072) row-major as checkpoints store it (the fused step's GEMV today)
//   sparse: y = sum over j with a_j != 0 of a_j * Wt[j, :], Wt (3072, 1024) = W stored transposed, zero rows skipped
// Both read every weight they use once from memory (10 layers x 6 MB, far past the caches); the activations are
// bf16 values with a given fraction of exact zeros (50%: what the random 180m bench model shows).
//   g++ -O3 -march=native -fopenmp scripts/research/relu2_sparse_down.cpp -o /tmp/relu2 && /tmp/relu2 [zero fraction]
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static inline __m512 bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

static void dense(const uint16_t* w, const float* a, int n, int k, float* y) {  // rows of W dotted with a
#pragma omp parallel for schedule(static)
  for (int o = 0; o < n; ++o) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const uint16_t* wr = w + (size_t)o * k;
    for (int i = 0; i < k; i += 32) {
      _mm_prefetch((const char*)(wr + i) + 4096, _MM_HINT_T0);
      acc0 = _mm512_fmadd_ps(bf16x16(wr + i), _mm512_loadu_ps(a + i), acc0);
      acc1 = _mm512_fmadd_ps(bf16x16(wr + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
    }
    y[o] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
}

static void sparse(const uint16_t* wt, const float* a, const int* nz, int cnt, int n, float* y) {
#pragma omp parallel
  {  // each thread owns a slice of the outputs and walks the nonzero rows in order: same sums for any thread count
    const int T = omp_get_num_threads(), t = omp_get_thread_num();
    const int per = (n / T + 15) / 16 * 16, c0 = t * per, c1 = c0 + per < n ? c0 + per : n;
    for (int c = c0; c < c1; ++c) y[c] = 0.f;
    for (int q = 0; q < cnt; ++q) {
      const int j = nz[q];
      if (q + 2 < cnt) _mm_prefetch((const char*)(wt + (size_t)nz[q + 2] * n + c0), _MM_HINT_T0);
      const __m512 av = _mm512_set1_ps(a[j]);
      const uint16_t* row = wt + (size_t)j * n;
      for (int c = c0; c < c1; c += 16)
        _mm512_storeu_ps(y + c, _mm512_fmadd_ps(av, bf16x16(row + c), _mm512_loadu_ps(y + c)));
    }
  }
}

int main(int argc, char** argv) {
  const double zero = argc > 1 ? atof(argv[1]) : 0.5;
  const int L = 10, n = 1024, k = 3072;
  std::mt19937 rng(1);
  std::vector<std::vector<uint16_t>> w(L), wt(L);
  for (int l = 0; l < L; ++l) {
    w[l].resize((size_t)n * k);
    wt[l].resize((size_t)n * k);
    for (auto& v : w[l]) v = 0x3c00 + rng() % 512;
    for (int o = 0; o < n; ++o)
      for (int i = 0; i < k; ++i) wt[l][(size_t)i * n + o] = w[l][(size_t)o * k + i];
  }
  std::vector<float> a(k), y(n), y2(n);
  std::vector<int> nz;
  for (int i = 0; i < k; ++i) {
    a[i] = (rng() % 10000) < zero * 10000 ? 0.f : 0.25f + (rng() % 64) / 64.f;
    if (a[i] != 0.f) nz.push_back(i);
  }
  std::vector<char> flush(256 << 20, 1);
  double best[2] = {1e9, 1e9}, diff = 0;
  for (int rep = 0; rep < 8; ++rep)
    for (int m = 0; m < 2; ++m) {
      std::memset(flush.data(), rep + m, flush.size());  // the weights are not in any cache
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < L; ++l) {
        if (m == 0) dense(w[l].data(), a.data(), n, k, y.data());
        else sparse(wt[l].data(), a.data(), nz.data(), (int)nz.size(), n, y2.data());
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best[m] = s < best[m] ? s : best[m];
    }
  for (int o = 0; o < n; ++o) diff = std::max(diff, (double)std::abs(y[o] - y2[o]) / (std::abs(y[o]) + 1e-3));
  printf("%d threads, %.0f%% zeros (%zu of %d rows used): dense %.3f ms, sparse %.3f ms per token (%.2fx); "
         "max relative difference %.1e\n", omp_get_max_threads(), 100 * zero, nz.size(), k, 1e3 * best[0],
         1e3 * best[1], best[0] / best[1], diff);
}
