"""The CPU backend: llvmlite code generation calling MKL or OpenBLAS GEMMs."""
