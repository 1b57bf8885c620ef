"""Data parallel training over MPI: one gir-compiled step per process, gradients all-reduced.

    from gir import distributed                       # needs `pip install 'gir[mpi]'`
    step = gir.jit(source, "train_step")              # -> loss, dW, db, ... for ONE shard
    step = distributed.data_parallel(step)            # -> the same, averaged over all processes
    params = distributed.broadcast(params)            # every process starts from rank 0's
    xs = distributed.shard(global_xs, axis=0)         # this process's share of the batch
    loss, *grads = step(*params, xs, ys)

    mpiexec -n 4 python train.py                      # 4 processes on this host
    mpiexec -n 8 -hosts a,b python train.py           # 4 on each of two hosts (MPICH)

Terms.
- *Rank*, *size*: this process's number and the number of processes in the communicator
  (`MPI.COMM_WORLD` unless another is given).
- *Shard*: the rows of the global batch one process computes, `shard(x)` (equal sizes: the
  global batch must divide by the number of processes).
- *Reduction of an output*: "mean" (the default), "sum", or None (left as this process
  computed it). A step whose loss is a MEAN over its batch has gradients that are means too,
  so averaging the outputs over equal shards gives exactly the loss and gradients of one
  process on the concatenated batch (up to rounding); a loss that SUMS over its batch wants
  "sum". tests/test_distributed.py checks both against a one-process run.

All outputs to reduce go into one contiguous buffer and one `Allreduce` (one message per step,
not one per gradient). Outputs can be arrays or nests of dicts, lists and tuples of arrays (what
`gir.value_and_grad` returns): they are flattened in a fixed order and rebuilt.

Known gaps: synchronous, blocking all-reduce after the whole step (no overlap of communication
with the backward pass, no bucketing); CPU arrays (a GPU step's outputs are NumPy arrays on the
host already, so it works, through host memory); no gradient compression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import GirError

Reduce = str | None
REDUCTIONS = ("mean", "sum", None)


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise GirError(f"gir.distributed needs mpi4py and an MPI: pip install 'gir[mpi]' ({e})") from None
    return MPI


def world() -> Any:
    """MPI.COMM_WORLD (importing mpi4py initialises MPI)."""
    return _mpi().COMM_WORLD


def _flatten(tree: Any, out: list[np.ndarray]) -> Any:
    """The arrays of a nest of dicts/lists/tuples, in order, and a skeleton to rebuild it."""
    if isinstance(tree, dict):
        return {k: _flatten(tree[k], out) for k in sorted(tree)}
    if isinstance(tree, (list, tuple)):
        return _same_kind(tree, [_flatten(v, out) for v in tree])
    out.append(np.asarray(tree))
    return len(out) - 1


def _rebuild(skeleton: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(skeleton, dict):
        return {k: _rebuild(v, arrays) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return _same_kind(skeleton, [_rebuild(v, arrays) for v in skeleton])
    return arrays[skeleton]


def _same_kind(like: list | tuple, items: list) -> Any:
    """items as a sequence of like's type: a namedtuple (gir.jit's named results) takes them as
    fields, a list or tuple as one iterable."""
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def allreduce(tree: Any, op: str = "mean", comm: Any = None) -> Any:
    """tree's arrays summed (or averaged) over all processes, in one Allreduce per dtype."""
    if op not in ("mean", "sum"):
        raise GirError(f"allreduce: op must be 'mean' or 'sum', got {op!r}")
    comm = comm if comm is not None else world()
    arrays: list[np.ndarray] = []
    skeleton = _flatten(tree, arrays)
    result = list(arrays)
    for dtype in sorted({a.dtype.str for a in arrays}):
        members = [i for i, a in enumerate(arrays) if a.dtype.str == dtype]
        buffer = np.concatenate([arrays[i].reshape(-1) for i in members]) if members else np.empty(0)
        comm.Allreduce(_mpi().IN_PLACE, buffer, op=_mpi().SUM)
        if op == "mean":
            buffer = buffer / comm.Get_size() if buffer.dtype.kind == "f" else buffer // comm.Get_size()
        start = 0
        for i in members:
            n = arrays[i].size
            result[i] = buffer[start:start + n].reshape(arrays[i].shape).astype(arrays[i].dtype, copy=False)
            start += n
    return _rebuild(skeleton, result)


def broadcast(tree: Any, root: int = 0, comm: Any = None) -> Any:
    """root's arrays on every process (so that all start from the same parameters)."""
    comm = comm if comm is not None else world()
    arrays: list[np.ndarray] = []
    skeleton = _flatten(tree, arrays)
    out = []
    for a in arrays:
        b = np.ascontiguousarray(a).copy()
        comm.Bcast(b, root=root)
        out.append(b)
    return _rebuild(skeleton, out)


def shard(x: np.ndarray, axis: int = 0, comm: Any = None) -> np.ndarray:
    """This process's equal share of x along axis (a copy, C-contiguous)."""
    comm = comm if comm is not None else world()
    size, rank = comm.Get_size(), comm.Get_rank()
    n = x.shape[axis]
    if n % size:
        raise GirError(f"shard: a batch of {n} along axis {axis} does not split into {size} equal shards")
    k = n // size
    return np.ascontiguousarray(np.take(x, np.arange(rank * k, (rank + 1) * k), axis=axis))


def data_parallel(step: Callable[..., Any], reduce: Reduce | Sequence[Reduce] = "mean",
                  comm: Any = None) -> Callable[..., Any]:
    """step, run on this process's arguments, its outputs then all-reduced across processes.

    `reduce` is one reduction for every output, or one per output (a list as long as the
    outputs step returns; None leaves that output local)."""
    if isinstance(reduce, str) or reduce is None:
        per_output: Sequence[Reduce] | None = None
        if reduce not in REDUCTIONS:
            raise GirError(f"data_parallel: reduce must be one of {REDUCTIONS}, got {reduce!r}")
    else:
        per_output = list(reduce)
        bad = [r for r in per_output if r not in REDUCTIONS]
        if bad:
            raise GirError(f"data_parallel: each reduction must be one of {REDUCTIONS}, got {bad[0]!r}")
    comm = comm if comm is not None else world()

    def parallel_step(*args: Any) -> Any:
        outputs = step(*args)
        if per_output is None:
            return outputs if reduce is None else allreduce(outputs, reduce, comm)  # type: ignore[arg-type]
        outs = list(outputs)
        if len(outs) != len(per_output):
            raise GirError(f"data_parallel: step returned {len(outs)} outputs but reduce names {len(per_output)}")
        for op in ("mean", "sum"):
            picked = [i for i, r in enumerate(per_output) if r == op]
            if picked:
                for i, v in zip(picked, allreduce([outs[i] for i in picked], op, comm)):
                    outs[i] = v
        return type(outputs)(outs) if isinstance(outputs, tuple) else outs

    parallel_step.__wrapped__ = step  # type: ignore[attr-defined]
    return parallel_step
