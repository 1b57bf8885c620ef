"""Run by tests/test_distributed.py under `mpiexec -n N` (and with N = 1 without MPI): a few SGD
steps of a small softmax classifier, data parallel over the processes, float64.

    mpiexec -n 2 python tests/distributed_worker.py OUT.npz mean|sum

Every process makes the same global batch of 8 from a fixed seed and computes on its shard;
rank 0 writes the losses and final parameters to OUT.npz.
"""

from __future__ import annotations

import sys

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


def main() -> None:
    out, reduce = sys.argv[1], sys.argv[2]
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
