// exp over 16 float32 lanes (AVX512), shared by the C++ kernels: ssd_scan.cpp (the scan's decay factors) and
// decode_step.cpp (SiLU). Cody-Waite reduction by ln 2 and Cephes' degree-6 polynomial for
// expf: within ~1 ulp of std::exp over the float range, the same +-inf / 0 / NaN at the ends; the power of two goes
// in with VSCALEFPS, which rounds subnormal results correctly. Include inside an AVX512-only block.
#pragma once
#include <immintrin.h>

static inline __m512 vl_exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));  // NaN passes (2nd operand)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
