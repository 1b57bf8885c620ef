"""What one busy process beside it does to a 2-thread OpenBLAS GEMM, and what the kernel's
accounting shows of it (backend/cpu/quiet_timing.py counts rounds by involuntary context
switches).

Times gir's `openblas` path for the LSTM-S per-step GEMM (32x256 @ 256x1024) on 2 threads in
rounds of 100 calls: first alone, then with a busy Python loop in a second process. Prints the
median per-call time and the involuntary switches per round, and what
`quiet_timing.best_clean_rounds` returns in both cases.

    python bench/gemm_disturbed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np


def rounds(call, n: int = 6) -> list[tuple[float, int]]:  # noqa: ANN001
    from gir.backend.cpu import quiet_timing

    out = []
    for _ in range(n):
        call()
        before = quiet_timing.involuntary_switches()
        start = time.perf_counter()
        for _ in range(100):
            call()
        out.append(((time.perf_counter() - start) / 100, quiet_timing.involuntary_switches() - before))
    return out


def main() -> None:
    from gir.backend.cpu import blas, quiet_timing

    m, n, k = 32, 1024, 256
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    c = np.zeros((m, n), np.float32)
    call = blas.gemm_caller("openblas", "f32", m, n, k, False, False, a, b, c)

    def one_round() -> float:
        return rounds(call, 1)[0][0]

    for label in ("alone", "with a busy process"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if label != "alone" else None
        try:
            time.sleep(0.2)
            found = rounds(call)
            best, disturbed = quiet_timing.best_clean_rounds({"gemm": one_round})
        finally:
            if busy is not None:
                busy.kill()
        print(f"{label:20} median {1e3 * statistics.median(t for t, _ in found):8.3f} ms a call, involuntary "
              f"switches per round {[s for _, s in found]}; best_clean_rounds: {1e3 * best['gemm']:.3f} ms, "
              f"disturbed={disturbed}")


if __name__ == "__main__":
    main()
