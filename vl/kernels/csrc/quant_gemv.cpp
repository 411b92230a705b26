// The row kernels of row_kernels.h as a library: the entry points the quantized Linears (vl/quant/linear.py) and
// the dense decode GEMV pass (vl/runtime/cpu/matmul.py) call one layer at a time, through vl/kernels/gemv.py.
//
// Twins: vl/quant/gemv_ref.py (fp8_gemv_ref, nvfp4_gemv_ref: dequantize, then a float32 product) and F.linear for
// the dense products; tests/kernels/test_cpu_gemv.py compares them. See docs/quant_cpu_kernels.md.
#include "row_kernels.h"

extern "C" {

int vl_isa() { return gemv_isa(); }  // 2 = AVX512 path, 0 = portable path

int vl_gemv_bf16_dot() { return gemv_bf16_dot(); }  // 1: vl_fp8_gemv takes bf16 activations (x_bf16=1)

int vl_nvfp4_loop() { return nvfp4_loop(); }

int vl_dense_bf16_native() { return dense_bf16_native(); }

int vl_packed_tiles() { return packed_tiles(); }  // 1: tiles = 1 takes NVFP4 rows to AMX tiles here

// M in 1..4 (the caller splits larger row counts). nthreads: OpenMP threads over output rows.
void vl_fp8_gemv(const void* x, int M, int K, const uint8_t* w, int N, const float* scale, int kind, int round16,
                 int x_bf16, float* y, int nthreads) {
  fp8_gemv(x, M, K, w, N, scale, kind, round16, x_bf16, y, nthreads);
}

// Any M; tiles = 1: on AMX tiles (bf16 activations), in their order of the sums (row_kernels.h nvfp4_gemv_group).
void vl_nvfp4_gemv(const void* x, int M, int K, const uint8_t* w, const uint8_t* bs, float gs, int N, int round16,
                   int x_bf16, int tiles, float* y, int nthreads) {
  nvfp4_gemv(x, M, K, w, bs, gs, N, round16, x_bf16, tiles, y, nthreads);
}

// G FP8 layers of one shape and scale kind in one call: x, w, scale point to G arrays; y is (G, M, N).
void vl_fp8_gemv_group(int G, const void* const* x, int M, int K, const uint8_t* const* w, int N,
                       const float* const* scale, int kind, int round16, int x_bf16, float* y, int nthreads) {
  fp8_gemv_group(G, x, M, K, w, N, scale, kind, round16, x_bf16, y, nthreads);
}

// G layers of one shape in one call (a MoE layer's routed experts for one token): x, w, bs point to G arrays,
// gs holds G global scales, y is (G, M, N).
void vl_nvfp4_gemv_group(int G, const void* const* x, int M, int K, const uint8_t* const* w, const uint8_t* const* bs,
                         const float* gs, int N, int round16, int x_bf16, int tiles, float* y, int nthreads) {
  nvfp4_gemv_group(G, x, M, K, w, bs, gs, N, round16, x_bf16, tiles, y, nthreads);
}

// Rows [r0, r1) expanded into out ((r1 - r0), K) float32 or bf16 (out_bf16), as the reference dequantizers give them.
void vl_nvfp4_expand(const uint8_t* w, const uint8_t* bs, float gs, int K, int r0, int r1, int out_bf16, void* out,
                     int nthreads) {
  nvfp4_expand(w, bs, gs, K, r0, r1, out_bf16, out, nthreads);
}

void vl_fp8_expand(const uint8_t* w, const float* scale, int kind, int N, int K, int r0, int r1, int out_bf16,
                   void* out, int nthreads) {
  fp8_expand(w, scale, kind, N, K, r0, r1, out_bf16, out, nthreads);
}

void vl_dense_gemv(const void* x, int M, int K, const void* w, int N, int bf16, float* y, int nthreads) {
  dense_gemv(x, M, K, w, N, bf16, y, nthreads);
}

void vl_dense_t_gemv(const float* x, int M, int K, const void* wt, int N, int bf16, float* y, int nthreads) {
  dense_t_gemv(x, M, K, wt, N, bf16, y, nthreads);
}

}  // extern "C"
