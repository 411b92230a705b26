"""The CPU passes of the runtime, applied from outside the model code (vl/runtime/pretrained.py runs them at load):

- decode.py: the fused decode step's plan (which models it covers, the pointers it reads) and the step decode uses;
- matmul.py: the Linear passes (16-bit GEMM in fp32 arithmetic, fp32 through oneDNN, the decode GEMV route, the
  ReLU^2 down_proj stored by input rows);
- hugepages.py, heap.py, gpu_libs.py: the memory passes (weights on 2 MiB pages, freed heap pages back to the OS,
  the CUDA libraries' pages back in a process without a GPU).

The kernels they use are in vl/kernels; the model code in vl/modeling stays plain maths. Importing this package
loads nothing (the heap pass is used by the app without torch).
"""
