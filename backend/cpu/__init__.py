"""The CPU backend: llvmlite code generation calling MKL or OpenBLAS GEMMs."""

from . import llvm_exit

llvm_exit.register()  # first, so it runs after blas.py's and tiers.py's exit handlers (llvm_exit.py)
