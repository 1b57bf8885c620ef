"""gir.distributed: data parallel over MPI equals one process on the concatenated batch.

tests/distributed_worker.py trains a small softmax classifier for a few SGD steps; here it runs
once in this process on the whole batch of 8 (no MPI), and under `mpiexec -n 2` with each
process on 4 rows and the outputs all-reduced: the losses and final parameters agree to
rounding (float64). Skipped where mpi4py or mpiexec is missing (`pip install 'gir[mpi]'`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import distributed_worker  # noqa: E402

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
"""mpich's wheel puts mpiexec beside this Python's executable, which need not be on PATH."""
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
                                reason="needs mpi4py and mpiexec: pip install 'gir[mpi]'")


def run_mpi(n: int, out: Path, reduce: str) -> dict[str, np.ndarray]:
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(HERE / "distributed_worker.py"), str(out), reduce]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return dict(np.load(out))


@needs_mpi
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_two_processes_equal_one_on_the_concatenated_batch(tmp_path: Path, reduce: str) -> None:
    """A loss averaged over the batch wants its outputs averaged across processes; one summed
    over the batch wants them summed."""
    losses, params = distributed_worker.train(reduce, parallel=False)
    got = run_mpi(2, tmp_path / "two.npz", reduce)
    assert int(got["size"]) == 2
    assert float(got["tree_loss"]) == 3.0 and got["tree_loss"].dtype == np.float32  # nests of arrays
    np.testing.assert_array_equal(got["tree_w"], [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(got["tree_n"], [1, 3])
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-12)
    assert losses[-1] < losses[0], losses  # and it trains
    for i, p in enumerate(params):
        np.testing.assert_allclose(got[f"p{i}"], p, rtol=1e-11, atol=1e-13)


@needs_mpi
def test_the_wrong_reduction_differs(tmp_path: Path) -> None:
    """The check above can fail: summing the gradients of a mean loss over 2 processes doubles
    the learning rate, and the trajectory leaves the one-process one."""
    losses, _ = distributed_worker.train("mean", parallel=False)
    text = (HERE / "distributed_worker.py").read_text()
    wrong = tmp_path / "wrong_worker.py"
    wrong.write_text(text.replace("distributed.data_parallel(step, reduce=reduce)",
                                  "distributed.data_parallel(step, reduce='sum')"))
    cmd = [MPIEXEC, "-n", "2", sys.executable, str(wrong), str(tmp_path / "w.npz"), "mean"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "w.npz")["losses"]
    assert not np.allclose(got[1:], losses[1:], rtol=1e-6)


def test_shard_needs_equal_shares() -> None:
    import gir
    from gir import distributed

    class Two:
        def Get_size(self) -> int:  # noqa: N802  (mpi4py's names)
            return 2

        def Get_rank(self) -> int:  # noqa: N802
            return 1

    np.testing.assert_array_equal(distributed.shard(np.arange(6), comm=Two()), [3, 4, 5])
    with pytest.raises(gir.GirError, match="equal shards"):
        distributed.shard(np.arange(5), comm=Two())


@needs_mpi
@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (gir[examples])")
def test_digits_example_trains_data_parallel() -> None:
    """examples/train_digits.py --distributed under mpiexec -n 2: one output (rank 0's), and it learns."""
    example = HERE.parent / "examples" / "train_digits.py"
    cmd = [MPIEXEC, "-n", "2", sys.executable, str(example), "--distributed", "--steps", "20", "--hidden", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"\bloss (\d+\.\d+)", proc.stdout)]
    assert len(losses) == 10, proc.stdout  # printed by rank 0 only
    assert losses[-1] < losses[0] - 0.2, losses


def run_job(n: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mpiexec -n n python distributed_worker.py args`, in a session of its own: a job still
    running after `timeout` is killed whole (its ranks too, not only mpiexec) and the test fails
    with what it printed, instead of leaving ranks waiting in a collective."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(HERE / "distributed_worker.py"), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job hung (killed after {timeout} s):\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


DISAGREEMENTS = {
    "shape": "data_parallel: outputs[1] has shape (3,) on rank 0 and (4,) on rank 1",
    "dtype": "data_parallel: outputs[0] is float64 on rank 0 and float32 on rank 1",
    "structure": "allreduce: the outputs' structure differs: tree['w'] on rank 0 where rank 1 has tree['v']",
    "count": "data_parallel: rank 0 has 2 arrays and rank 1 has 3: outputs[2] is only on rank 1",
    "order": "data_parallel: the outputs' structure differs: outputs.loss on rank 0 where rank 1 has outputs.db",
    "reduction": "data_parallel: the ranks reduce differently: reduce='mean' on rank 0, reduce='sum' on rank 1",
    "step-fails": "data_parallel: rank 1 raised GirArgumentError: the step failed on rank 1 on purpose",
    "broadcast": "broadcast: tree[0] has shape (2, 3) on rank 0 and (2, 4) on rank 1",
    "integer-mean": "allreduce: tree[0] is int64: a mean over the ranks of integers is not an integer",
}


@needs_mpi
def test_ranks_that_disagree_get_the_same_gir_error_naming_what_differs(tmp_path: Path) -> None:
    """Shapes, dtypes, structure, count, order of equal-sized named results, reductions, a step
    that raises on one rank, a broadcast of another shape, an integer mean: before, MPICH
    aborted the job (no word of what differed), mixed the numbers silently (order), raised a raw
    mpi4py exception (broadcast), hung (a step raising on one rank) or floor-divided."""
    out = tmp_path / "disagree"
    proc = run_job(2, str(out), "disagree")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1], "every rank raises the same error"
    for case, message in DISAGREEMENTS.items():
        assert got[0][case] is not None and got[0][case].startswith(message), (case, got[0][case])
    assert got[0]["after"] == [3.0, 3.0]  # the ranks are still in step after every error


@needs_mpi
@pytest.mark.parametrize("mode", ["crash", "crash-in-step"])
def test_an_uncaught_exception_on_one_rank_ends_the_job(mode: str) -> None:
    """Rank 1 raises, rank 0 is (or will be) in an Allreduce: the job ends, with the error,
    instead of rank 0 waiting forever (the first gir.distributed call installs an excepthook
    that aborts the job after printing the exception)."""
    proc = run_job(2, "-", mode)
    assert proc.returncode != 0
    assert "rank 1 failed on purpose" in proc.stderr, proc.stderr


def test_a_single_process_reduces_and_refuses_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one process (no mpiexec) nothing is exchanged, and the same checks hold."""
    pytest.importorskip("mpi4py")
    import gir
    from gir import distributed

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the hook gir.distributed installs: not in pytest's
    monkeypatch.setattr(distributed, "_hook_installed", False)

    assert distributed.allreduce({"a": np.ones(2), "n": np.arange(2)}, "sum")["n"].tolist() == [0, 1]
    with pytest.raises(gir.GirError, match=r"tree\[1\] is int64: a mean over the ranks"):
        distributed.allreduce((np.ones(2), np.arange(2)), "mean")
    with pytest.raises(gir.GirError, match=r"outputs\[0\] is boolean"):
        distributed.data_parallel(lambda: [np.ones(2, bool)], reduce="sum")()
    step = distributed.data_parallel(lambda: (np.ones(2), "a note"), reduce=["mean", None])
    assert step()[1] == "a note"  # a local output is left as it is
