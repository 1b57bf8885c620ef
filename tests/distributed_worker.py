"""Run by tests/test_distributed.py under `mpiexec -n N` (and with N = 1 without MPI): a few SGD
steps of a small softmax classifier, data parallel over the processes, float64.

    mpiexec -n 2 python tests/distributed_worker.py OUT.npz mean|sum
    mpiexec -n 2 python tests/distributed_worker.py OUT disagree
    mpiexec -n 2 python tests/distributed_worker.py - crash|crash-in-step

mean|sum: every process makes the same global batch of 8 from a fixed seed and computes on its
shard; rank 0 writes the losses and final parameters to OUT.npz. disagree: the ranks bring
different things to each collective of DISAGREEMENTS in turn; every rank catches the GirError
and writes what it got to OUT.rank<r>.json. crash: rank 1 raises outside any gir call while
rank 0 waits in an allreduce; crash-in-step: a data_parallel step raises on rank 1 only. Both
must end the job (not hang) with the error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

STEP = """
func @loss(%w1: tensor<4x6xf64>, %b1: tensor<6xf64>, %w2: tensor<6x5xf64>, %x: tensor<?x4xf64>,
           %onehot: tensor<?x5xf64>) -> tensor<f64> {
  %logits = tanh(%x @ %w1 + %b1) @ %w2
  return REDUCE(logsumexp(%logits, axes=[1]) - sum(%logits * %onehot, axes=[1]))
}

func @step(%w1: tensor<4x6xf64>, %b1: tensor<6xf64>, %w2: tensor<6x5xf64>, %x: tensor<?x4xf64>,
           %onehot: tensor<?x5xf64>) -> (tensor<f64>, tensor<4x6xf64>, tensor<6xf64>, tensor<6x5xf64>) {
  %l, %dw1, %db1, %dw2 = grad @loss(%w1, %b1, %w2, %x, %onehot) wrt (%w1, %b1, %w2)
  return %l, %dw1, %db1, %dw2
}
"""
BATCH, STEPS, LR = 8, 5, 0.5


def data() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((4, 6)), rng.standard_normal(6) * 0.1, rng.standard_normal((6, 5))]
    x = rng.standard_normal((BATCH, 4))
    onehot = np.eye(5)[rng.integers(0, 5, BATCH)]
    return params, x, onehot


def train(reduce: str, parallel: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    import gir

    params, x, onehot = data()
    step = gir.jit(STEP.replace("REDUCE", reduce), "step")
    if parallel:
        from gir import distributed

        step = distributed.data_parallel(step, reduce=reduce)
        params = distributed.broadcast(params)
        x, onehot = distributed.shard(x), distributed.shard(onehot)
    losses = []
    for _ in range(STEPS):
        loss, *grads = step(*params, x, onehot)
        losses.append(float(loss))
        params = [p - LR * g for p, g in zip(params, grads)]
    return np.array(losses), params


ORDERED = """
func @step(%x: tensor<3xf64>) -> (tensor<f64>, tensor<f64>) {
  %loss = sum(%x * %x)
  %db = sum(%x)
  return FIRST, SECOND
}
"""
"""Two scalars in either order: equal sizes, so only the names (the namedtuple's fields) tell."""


def disagreements(rank: int) -> dict[str, Callable[[], Any]]:
    """Name -> a collective to which rank 1 brings something else than rank 0."""
    import gir
    from gir import distributed

    def step_failing_on_rank_1() -> Any:
        if rank == 1:
            raise gir.GirArgumentError("the step failed on rank 1 on purpose")
        return np.ones(2)

    first, second = ("%loss", "%db") if rank == 0 else ("%db", "%loss")
    ordered = gir.jit(ORDERED.replace("FIRST", first).replace("SECOND", second), "step")
    cases: dict[str, Callable[[], Any]] = {
        "shape": lambda: distributed.data_parallel(lambda: (np.ones(3), np.ones(3 + rank)))(),
        "dtype": lambda: distributed.data_parallel(lambda: [np.ones(2, np.float64 if rank == 0 else np.float32)])(),
        "structure": lambda: distributed.allreduce({"w": np.ones(2)} if rank == 0 else {"v": np.ones(2)}),
        "count": lambda: distributed.data_parallel(lambda: [np.ones(2)] * (2 + rank))(),
        "order": lambda: distributed.data_parallel(ordered)(np.arange(3.0)),
        "reduction": lambda: distributed.data_parallel(lambda: np.ones(2), reduce="mean" if rank == 0 else "sum")(),
        "step-fails": lambda: distributed.data_parallel(step_failing_on_rank_1)(),
        "broadcast": lambda: distributed.broadcast([np.ones((2, 3 + rank))]),
        "integer-mean": lambda: distributed.allreduce((np.arange(3), np.ones(2)), "mean"),
    }
    return cases


def run_disagreements(out: str) -> None:
    """Each case must raise a GirError on every rank; afterwards the ranks are still in step."""
    import gir
    from gir import distributed

    rank = distributed.world().Get_rank()
    got: dict[str, Any] = {}
    for name, case in disagreements(rank).items():
        try:
            case()
            got[name] = None
        except gir.GirError as e:
            got[name] = e.message
    got["after"] = distributed.allreduce([np.full(2, rank + 1.0)], "sum")[0].tolist()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(got, f)


def crash(in_step: bool) -> None:
    import gir
    from gir import distributed

    rank = distributed.world().Get_rank()

    def step() -> np.ndarray:
        if rank == 1:
            raise gir.GirError("rank 1 failed on purpose")
        return np.ones(2)

    if in_step:
        distributed.data_parallel(step)()
    elif rank == 1:
        step()
    distributed.allreduce([np.ones(2)], "sum")  # rank 0 waits here for rank 1 (before: forever)


def main() -> None:
    out, reduce = sys.argv[1], sys.argv[2]
    if reduce == "disagree":
        run_disagreements(out)
        return
    if reduce.startswith("crash"):
        crash(in_step=reduce == "crash-in-step")
        return
    from gir import distributed

    losses, params = train(reduce, parallel=True)
    comm = distributed.world()
    rank = comm.Get_rank()
    # A nest as gir.value_and_grad returns it, with two dtypes: one Allreduce per dtype.
    tree = distributed.allreduce((np.float32(rank + 1), {"w": [np.full(3, rank + 1.0)], "n": (np.arange(2) + rank,)}),
                                 "sum")
    if rank == 0:
        np.savez(out, losses=losses, size=comm.Get_size(), tree_loss=tree[0], tree_w=tree[1]["w"][0],
                 tree_n=tree[1]["n"][0], **{f"p{i}": p for i, p in enumerate(params)})


if __name__ == "__main__":
    main()
