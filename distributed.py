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

Ranks that disagree, and errors (docs/distributed.md "When ranks disagree").
- Before its first message, each collective here (`allreduce`, `broadcast`, a `data_parallel`
  step) checks that every rank brings the same thing: a hash of (status, reductions, each
  output's path, shape and dtype) goes through one 16-byte `Allreduce` (MAX of h and -h: equal
  everywhere iff max == -max(-h)). Only when they differ are the full signatures gathered, and
  every rank raises the same `GirError` naming the first output that differs, and the ranks
  (`outputs.dw has shape (4, 6) on rank 0 and (4, 7) on rank 1`). Before, MPICH aborted the job
  with no word of what differed, a broadcast raised a raw `mpi4py.MPI.Exception`, and outputs
  of equal sizes in another order were summed into each other. Paths carry a namedtuple's
  field names (gir.jit's results are named after the `return` operands), so `(loss, db)` on
  one rank against `(db, loss)` on another is a difference; plain tuples of equal shapes in
  another order cannot be told apart.
- A step that raises on some ranks: those ranks enter the same check with their error, and
  every rank raises a `GirError` saying which rank raised what (chained to its own exception
  where it raised). An exception that no rank catches ends the whole job: the first call here
  installs a `sys.excepthook` that prints it, then calls `MPI.COMM_WORLD.Abort(1)` (as
  `python -m mpi4py` does), so no rank is left waiting in a collective for one that died.
- A mean of integers (or booleans) is refused, on every rank: it is not an integer, and
  floor division gave a wrong one silently. Reduce such an output with "sum", or leave it local.

Known gaps: synchronous, blocking all-reduce after the whole step (no overlap of communication
with the backward pass, no bucketing); CPU arrays (a GPU step's outputs are NumPy arrays on the
host already, so it works, through host memory); no gradient compression.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import GirError

Reduce = str | None
REDUCTIONS = ("mean", "sum", None)

Signature = tuple[str, str, tuple[tuple[str, tuple[int, ...], str], ...]]
"""(status: 'ok' or 'failed', detail: the reductions or the error, ((path, shape, dtype), ...))."""


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise GirError(f"gir.distributed needs mpi4py and an MPI: pip install 'gir[mpi]' ({e})") from None
    return MPI


def world() -> Any:
    """MPI.COMM_WORLD (importing mpi4py initialises MPI)."""
    comm = _mpi().COMM_WORLD
    _abort_on_uncaught_exception()
    return comm


def _communicator(comm: Any) -> Any:
    if comm is None:
        return world()
    _abort_on_uncaught_exception()
    return comm


_hook_installed = False


def _abort_on_uncaught_exception() -> None:
    """An exception no code catches, on any rank, ends the job on every rank: printed as Python
    prints it, then `MPI.COMM_WORLD.Abort(1)`. Without it the other ranks wait in their next
    collective for the dead one forever (mpiexec does not end a job whose process exited
    with an error while MPI is initialised)."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def abort_after_reporting(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or replaced streams: abort anyway
                pass
        mpi = _mpi()
        if mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
            mpi.COMM_WORLD.Abort(1)

    sys.excepthook = abort_after_reporting


def _flatten(tree: Any, out: list[np.ndarray], paths: list[str], path: str = "tree") -> Any:
    """The arrays of a nest of dicts/lists/tuples, in order, with their paths (`tree[1]`,
    `outputs.dw`, `tree['w'][0]`), and a skeleton to rebuild it."""
    if isinstance(tree, dict):
        return {k: _flatten(tree[k], out, paths, f"{path}[{k!r}]") for k in sorted(tree)}
    if isinstance(tree, (list, tuple)):
        fields = getattr(tree, "_fields", None)
        return _same_kind(tree, [_flatten(v, out, paths, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
                                 for i, v in enumerate(tree)])
    out.append(np.asarray(tree))
    paths.append(path)
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


def _signature(detail: str, arrays: list[np.ndarray], paths: list[str]) -> Signature:
    return ("ok", detail, tuple((p, tuple(a.shape), a.dtype.str) for p, a in zip(paths, arrays)))


def _agree(comm: Any, what: str, signature: Signature, cause: BaseException | None = None) -> None:
    """Returns when every rank of comm brings the same signature; else raises the same GirError
    on every rank, naming what differs (chained to cause, this rank's own error, if any). One
    Allreduce of two int64 when they agree; the signatures themselves travel only when not."""
    if comm.Get_size() == 1:
        return
    h = int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=7).digest(), "little")
    both = np.array([h, -h], np.int64)  # < 2**56: no overflow in the negation
    comm.Allreduce(_mpi().IN_PLACE, both, op=_mpi().MAX)
    if both[0] == -both[1]:  # max(h) == min(h): the same hash everywhere
        return
    raise GirError(f"{what}: {_difference(comm.allgather(signature))}") from cause


def _difference(signatures: list[Signature]) -> str:
    """What differs between the ranks' signatures, in words: the ranks that failed, else the
    first rank that differs from rank 0 and the first output where it does."""
    failed = [(rank, s[1]) for rank, s in enumerate(signatures) if s[0] == "failed"]
    if failed:
        return "; ".join(f"rank {rank} raised {message}" for rank, message in failed) + \
            " (every rank stops with this error)"
    first = signatures[0]
    rank, other = next((r, s) for r, s in enumerate(signatures) if s != first)
    if first[1] != other[1]:
        return f"the ranks reduce differently: {first[1]} on rank 0, {other[1]} on rank {rank}"
    for (path, shape, dtype), (path_r, shape_r, dtype_r) in zip(first[2], other[2]):
        if path != path_r:
            return (f"the outputs' structure differs: {path} on rank 0 where rank {rank} has {path_r} "
                    "(other keys, fields or nesting)")
        if shape != shape_r:
            return f"{path} has shape {shape} on rank 0 and {shape_r} on rank {rank}"
        if dtype != dtype_r:
            return f"{path} is {np.dtype(dtype).name} on rank 0 and {np.dtype(dtype_r).name} on rank {rank}"
    n, n_r = len(first[2]), len(other[2])
    extra = (first[2][n_r][0], 0) if n > n_r else (other[2][n][0], rank)
    return f"rank 0 has {n} arrays and rank {rank} has {n_r}: {extra[0]} is only on rank {extra[1]}"


def _check_reducible(what: str, arrays: list[np.ndarray], paths: list[str], ops: list[str]) -> None:
    """Raised after `_agree`, so on every rank alike."""
    for a, path, op in zip(arrays, paths, ops):
        if op not in ("mean", "sum"):
            raise GirError(f"{what}: op must be 'mean' or 'sum', got {op!r}")
        if a.dtype.kind not in "biufc":
            raise GirError(f"{what}: {path} is not numeric ({a.dtype}); it cannot be reduced")
        if a.dtype.kind == "b":
            raise GirError(f"{what}: {path} is boolean; MPI has no sum of booleans: cast it to an integer "
                           "and reduce it with 'sum', or leave it local")
        if op == "mean" and a.dtype.kind != "f" and a.dtype.kind != "c":
            raise GirError(f"{what}: {path} is {a.dtype.name}: a mean over the ranks of integers is not an "
                           "integer (it was floor-divided); reduce it with 'sum' and divide, or leave it local")


def _reduce(comm: Any, arrays: list[np.ndarray], ops: list[str]) -> list[np.ndarray]:
    """The arrays summed or averaged over the ranks: one Allreduce per (op, dtype)."""
    result = list(arrays)
    for op, dtype in sorted({(op, a.dtype.str) for op, a in zip(ops, arrays)}):
        members = [i for i, a in enumerate(arrays) if a.dtype.str == dtype and ops[i] == op]
        buffer = np.concatenate([arrays[i].reshape(-1) for i in members])
        comm.Allreduce(_mpi().IN_PLACE, buffer, op=_mpi().SUM)
        if op == "mean":
            buffer = buffer / comm.Get_size()
        start = 0
        for i in members:
            n = arrays[i].size
            result[i] = buffer[start:start + n].reshape(arrays[i].shape).astype(arrays[i].dtype, copy=False)
            start += n
    return result


def allreduce(tree: Any, op: str = "mean", comm: Any = None) -> Any:
    """tree's arrays summed (or averaged: floats only) over all processes, in one Allreduce per
    dtype, after the check that every process brings the same structure, shapes and dtypes."""
    comm = _communicator(comm)
    arrays: list[np.ndarray] = []
    paths: list[str] = []
    skeleton = _flatten(tree, arrays, paths)
    _agree(comm, "allreduce", _signature(repr(op), arrays, paths))
    ops = [op] * len(arrays)
    _check_reducible("allreduce", arrays, paths, ops)
    return _rebuild(skeleton, _reduce(comm, arrays, ops))


def broadcast(tree: Any, root: int = 0, comm: Any = None) -> Any:
    """root's arrays on every process (so that all start from the same parameters). Every
    process passes a tree of the same structure, shapes and dtypes (its arrays are where root's
    are received); a difference is a GirError on every process, naming the array."""
    comm = _communicator(comm)
    arrays: list[np.ndarray] = []
    paths: list[str] = []
    skeleton = _flatten(tree, arrays, paths)
    _agree(comm, "broadcast", _signature(f"root {root}", arrays, paths))
    for a, path in zip(arrays, paths):
        if a.dtype.kind not in "biufc":
            raise GirError(f"broadcast: {path} is not numeric ({a.dtype})")
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
    outputs step returns; None leaves that output local). Every call first checks that all
    processes succeeded and return the same structure, shapes and dtypes (module docstring)."""
    if isinstance(reduce, str) or reduce is None:
        per_output: list[Reduce] | None = None
        if reduce not in REDUCTIONS:
            raise GirError(f"data_parallel: reduce must be one of {REDUCTIONS}, got {reduce!r}")
    else:
        per_output = list(reduce)
        bad = [r for r in per_output if r not in REDUCTIONS]
        if bad:
            raise GirError(f"data_parallel: each reduction must be one of {REDUCTIONS}, got {bad[0]!r}")
    comm = _communicator(comm)

    def parallel_step(*args: Any) -> Any:
        if reduce is None:
            return step(*args)  # nothing is exchanged, so nothing to agree on
        try:
            outputs = step(*args)
        except Exception as e:
            message = e.message if isinstance(e, GirError) else str(e)
            _agree(comm, "data_parallel", ("failed", f"{type(e).__name__}: {message}", ()), cause=e)
            raise  # every rank failed alike: each raises its own
        return _reduce_outputs(comm, outputs, reduce, per_output)

    parallel_step.__wrapped__ = step  # type: ignore[attr-defined]
    return parallel_step


def _reduce_outputs(comm: Any, outputs: Any, reduce: Any, per_output: list[Reduce] | None) -> Any:
    """A step's outputs reduced as `reduce` says, after the ranks agree on them (on the outputs
    to reduce: an output left local, None in a per-output list, may differ between ranks)."""
    if per_output is None:
        (reduced,) = _agreed_reduction(comm, [(outputs, "outputs", reduce)], f"reduce={reduce!r}")
        return reduced
    outs = list(outputs)
    fields = getattr(outputs, "_fields", None)
    picked = [i for i, op in enumerate(per_output) if op is not None and i < len(outs)]
    items = [(outs[i], f"outputs.{fields[i]}" if fields else f"outputs[{i}]", per_output[i]) for i in picked]
    reduced = _agreed_reduction(comm, items, f"reduce={per_output!r} of {len(outs)} outputs")
    if len(outs) != len(per_output):  # on every rank alike: the counts were part of the agreement
        raise GirError(f"data_parallel: step returned {len(outs)} outputs but reduce names {len(per_output)}")
    for i, value in zip(picked, reduced):
        outs[i] = value
    return _same_kind(outputs, outs) if isinstance(outputs, tuple) else outs


def _agreed_reduction(comm: Any, items: list[tuple[Any, str, Any]], detail: str) -> list[Any]:
    """Each (tree, its path, its reduction) reduced, after `_agree` on all of them together."""
    arrays: list[np.ndarray] = []
    paths: list[str] = []
    ops: list[str] = []
    skeletons = []
    for tree, path, op in items:
        before = len(arrays)
        skeletons.append(_flatten(tree, arrays, paths, path))
        ops += [op] * (len(arrays) - before)
    _agree(comm, "data_parallel", _signature(detail, arrays, paths))
    _check_reducible("data_parallel", arrays, paths, ops)
    reduced = _reduce(comm, arrays, ops)
    return [_rebuild(s, reduced) for s in skeletons]
