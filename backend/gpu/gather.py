"""GPU lowerings of the row ops and of `logsumexp`, through xp (CuPy on a GPU, NumPy in the
simulator); no generated kernel.

- `index` by an integer tensor (a gather): `xp.take` into the result's storage. By a scalar it
  is a view or a row copy (codegen.lower_index).
- `scatter_add`: the base copied into the result (unless memplan gave the result the base's
  buffer), then `Device.add_at` (cupyx.scatter_add), which accumulates repeated rows.
- `logsumexp`: max, exp(x - max), sum, log, + max, with a maximum that is not finite left
  unshifted (as the interpreter does).

Indices are checked before use (xp.take would wrap or clip an index out of range). Indices
that are arguments of the function (a training step's batch of token ids: `emb[inputs]`) are
checked when the call takes them (`Lowering.index_arguments`, runtime.py): a NumPy argument on
the host before its upload, for free; a device array by one read-back of its smallest and
largest value before the call's device work, so that the work itself has no read-back and can
be captured as a CUDA graph (docs/gpu.md *Training on the device*). An argument out of range
is not raised there: that call runs eagerly and raises at the op, so that an error of an
earlier op (a division by zero the error flag holds) is the one reported, as the interpreter
reports it (`Lowering.index_failures`). Indices computed on the
device are checked where they are used: one read-back of the smallest and the largest index per
gather or scatter, which keeps the function eager (CUDA refuses a synchronisation during capture).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import GirError
from ...ir.core import Operation
from ...ir.ops import reduction_axes

if TYPE_CHECKING:  # codegen.py imports this module; these are only its types
    from .codegen import Env, Lowering, Run


def check_index_range(op: Operation, rows: int, lo: int, hi: int) -> None:
    """Raises op's located GirError when an index in [lo, hi] is outside [0, rows)."""
    bad = lo if lo < 0 else hi if hi >= rows else None
    if bad is not None:
        raise GirError(f"'{op.name}' index out of range at run time: index {bad} for a leading dim of {rows}",
                       op.loc)


def device_index_range(low: Lowering, idx: Any, call: Callable[..., Any]) -> tuple[int, int]:
    """(smallest, largest) of a non-empty device array of indices: three xp launches through
    call (which counts them) and one read-back."""
    xp = low.dev.xp
    lo, hi = (int(v) for v in low.dev.download(call(xp.stack, [call(idx.min), call(idx.max)])))
    return lo, hi


def _check_rows(low: Lowering, op: Operation, rows: int) -> Any:
    i = op.operands[1]
    if i in low.function.args:  # checked when the call takes its arguments (runtime.py)
        low.index_arguments.setdefault(i, []).append((op, rows))

        def raise_found(env: Env) -> None:  # the argument was out of range: raised in program order
            found = low.index_failures.get(op)
            if found is not None:
                raise found

        return raise_found

    def check(env: Env) -> None:
        idx = env[i]
        if idx.size == 0:
            return
        low.counters.read_backs += 1
        check_index_range(op, rows, *device_index_range(low, idx, low.xp_call))

    return check


def lower_gather(low: Lowering, op: Operation) -> Run:
    x, i = op.operands
    out, xp = low.storage(op.result), low.dev.xp
    check = _check_rows(low, op, x.tensor_type.shape[0] or 0)

    def run(env: Env) -> None:
        check(env)
        low.xp_call(xp.take, env[x], low.xp_call(env[i].astype, xp.int64), axis=0, out=out)

    return run


def lower_scatter_add(low: Lowering, op: Operation) -> Run:
    base, i, updates = op.operands
    out, dev = low.storage(op.result), low.dev
    check = _check_rows(low, op, base.tensor_type.shape[0] or 0)

    def run(env: Env) -> None:
        check(env)
        if not low.same_memory(out, env[base]):
            low.copy(out, env[base])
        low.xp_call(dev.add_at, out, low.xp_call(env[i].astype, dev.xp.int64), env[updates])

    return run


def lower_logsumexp(low: Lowering, op: Operation) -> Run:
    x = op.operands[0]
    axes = tuple(reduction_axes(op.attrs, x.tensor_type.rank))
    out, xp = low.storage(op.result), low.dev.xp

    def run(env: Env) -> None:
        a = env[x]
        if a.size == 0:
            out[...] = -xp.inf
            return
        call = low.xp_call  # CuPy launches a kernel per call here (a fused kernel would be one)
        m = call(xp.max, a, axis=axes, keepdims=True)
        shift = call(call(xp.where, call(xp.isfinite, m), m, 0).astype, a.dtype)
        total = call(xp.add, call(xp.log, call(xp.sum, call(xp.exp, call(xp.subtract, a, shift)), axis=axes,
                                               keepdims=True)), shift)
        low.copy(out, total.reshape(out.shape))

    return run
