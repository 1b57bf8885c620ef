"""The GPU backend: numba.cuda kernels generated for fused elementwise groups, GEMMs through
CuPy (cuBLAS), `scan` driven from the host over device-resident buffers (docs/gpu.md).

Without a GPU it runs in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), simcupy.py (CuPy's
contracts over host memory) standing in for CuPy; device.py is the only module that knows which.
"""
