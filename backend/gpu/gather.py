"""GPU lowerings of the row ops and of `logsumexp`, through xp (CuPy on a GPU, NumPy in the
simulator); no generated kernel.

- `index` by an integer tensor (a gather): `xp.take` into the result's storage. By a scalar it
  is a view or a row copy (codegen.lower_index).
- `scatter_add`: the base copied into the result (unless memplan gave the result the base's
  buffer), then `Device.add_at` (cupyx.scatter_add), which accumulates repeated rows.
- `logsumexp`: max, exp(x - max), sum, log, + max, with a maximum that is not finite left
  unshifted (as the interpreter does).

Indices are checked on the host before use (xp.take would wrap or clip an index out of range):
one read-back of the smallest and the largest index per gather or scatter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import GirError
from ...ir.core import Operation
from ...ir.ops import reduction_axes

if TYPE_CHECKING:  # codegen.py imports this module; these are only its types
    from .codegen import Env, Lowering, Run


def _check_rows(low: Lowering, op: Operation, rows: int) -> Any:
    dev, i = low.dev, op.operands[1]

    def check(env: Env) -> None:
        idx = env[i]
        if idx.size == 0:
            return
        call = low.xp_call
        lo, hi = (int(v) for v in dev.download(call(dev.xp.stack, [call(idx.min), call(idx.max)])))
        bad = lo if lo < 0 else hi if hi >= rows else None
        if bad is not None:
            raise GirError(f"'{op.name}' index out of range at run time: index {bad} for a leading dim of {rows}",
                           op.loc)

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
