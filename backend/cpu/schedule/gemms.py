"""Which GEMM calls a function makes, and the BLAS family and path of each (pure: the times come
from a `Measurements` snapshot, the switches from `config.Options`).

The rules are blas.py's `choose_family` / `choose_path` / `is_measured`, applied to the snapshot
instead of the live tables, so the same measurements give the same paths as before."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ....config import Options
from ....ir.core import Function, Operation, Value
from ....ir.loops import as_loop
from ....ir.spec import view_source
from ..blas import FAMILIES
from .data import GemmParams, Measurements


def op_ids(function: Function) -> dict[Operation, str]:
    """A stable id per op: `op<N>`, N its position in `function.walk()` (the same IR gives the
    same ids; the printed IR with `--print-locations` names the ops' source lines)."""
    return {op: f"op{i}" for i, op in enumerate(function.walk())}


def is_gemm(op: Operation) -> bool:
    """op runs as a BLAS GEMM (`OpSpec.gemm_dtypes`)."""
    return bool(op.spec.gemm_dtypes) and op.result.tensor_type.dtype in op.spec.gemm_dtypes


def gemm_operand(v: Value) -> tuple[Value, bool]:
    """A 2-D transpose read only by GEMMs (`reads_transposed`: the transpose is a view, by the
    same rule memplan follows) is folded into the GEMM's transpose flag."""
    d = v.defining_op
    if d is not None and d.name == "transpose" and view_source(d) is not None:
        return d.operands[0], True
    return v, False


def packable(op: Operation) -> bool:
    """Inside a loop body, with a loop-invariant 2-D right operand: pack it once per loop."""
    parent = op.parent_op
    if parent is None or not parent.spec.loop:
        return False
    w = op.operands[1]
    owner = w.defining_op
    inside = owner is not None and parent.is_ancestor_of(owner)
    return not inside and w.defining_block is not parent.body and w.tensor_type.rank == 2


def _static_gemm(op: Operation) -> bool:
    if not is_gemm(op):
        return False
    a, b = op.operands[0], op.operands[1]
    return all(v.tensor_type.is_static for v in (a, b, op.result))


def sites(function: Function) -> list[tuple[GemmParams, int]]:
    """Every float GEMM of the function with how many times it runs per call (the trip counts of
    its enclosing loops): what the family is chosen by."""
    out = []
    for op in function.walk():
        if not _static_gemm(op):
            continue
        a_shape, b_shape = op.operands[0].tensor_type.static_shape, op.operands[1].tensor_type.static_shape
        res, shape = op.result.tensor_type, op.result.tensor_type.static_shape
        _, ta = gemm_operand(op.operands[0])
        _, tb = gemm_operand(op.operands[1])
        count, parent = 1, op.parent_op
        while parent is not None:
            loop = as_loop(parent)
            if loop is not None:
                count *= loop.trip_count or 1
            parent = parent.parent_op
        if len(b_shape) == 2:
            m = math.prod(shape[:-1])
        else:
            m = shape[-2]
            count *= math.prod(shape[:-2])
        out.append(((res.dtype, m, b_shape[-1], a_shape[-1], ta, tb, packable(op)), count))
    return out


def call_params(op: Operation) -> GemmParams:
    """The shape lower_matmul calls BLAS with for op (a batched right operand: one call per
    batch element, never packed)."""
    ta_t, tb_t, res = op.operands[0].tensor_type, op.operands[1].tensor_type, op.result.tensor_type
    _, ta = gemm_operand(op.operands[0])
    _, tb = gemm_operand(op.operands[1])
    shape = res.static_shape
    k, n = ta_t.static_shape[-1], tb_t.static_shape[-1]
    if tb_t.rank == 2:
        return (res.dtype, math.prod(shape[:-1]), n, k, ta, tb, packable(op))
    return (res.dtype, shape[-2], n, k, ta, tb, False)


def is_measured(params: GemmParams, measured: Measurements, options: Options) -> bool:
    """blas.is_measured on the snapshot: nothing is chosen by measuring (a forced path), or it
    is measured at once or never (GIR_GEMM_MEASURE=now|off), or there is one path, or its
    times are in the snapshot."""
    if options.gemm_path or options.gemm_measure != "background":
        return True
    return len(measured.candidates[params[-1]]) == 1 or params in measured.gemm_times


def _times(params: GemmParams, measured: Measurements) -> tuple[Mapping[str, float], bool]:
    found = measured.gemm_times.get(params)
    return (found, True) if found is not None else (measured.model_times[params], False)


def choose_family(found: list[tuple[GemmParams, int]], measured: Measurements, options: Options) -> tuple[str, str]:
    """(family, why): the provider whose best paths make the function's GEMMs fastest."""
    forced = options.gemm_path
    if forced:
        return ("openblas" if forced in FAMILIES["openblas"] else "mkl"), f"GIR_GEMM_PATH={forced}"
    if not found:  # nothing to choose: the family blas.choose_family gave (all totals 0)
        return ("mkl" if measured.has_mkl else "openblas"), "no GEMM with static shapes"
    if not measured.has_mkl:
        return "openblas", "MKL is not available"
    totals = {family: 0.0 for family in FAMILIES}
    all_measured = True
    for params, count in found:
        times, was = _times(params, measured)
        all_measured &= was
        for family, paths in FAMILIES.items():
            # a family none of whose paths is available here never wins
            totals[family] += count * min((times[p] for p in paths if p in times), default=math.inf)
    best = min(totals, key=totals.__getitem__)
    return best, ("measured" if all_measured else "model") + f": {1e3 * totals[best]:.3f} ms per call"


def choose_path(params: GemmParams, family: str | None, measured: Measurements, options: Options,
                exclude: tuple[str, ...] = ()) -> tuple[str, str]:
    """(path, why): blas.choose_path on the snapshot."""
    forced = options.gemm_path
    candidates = measured.candidates[params[-1]]
    if forced in candidates:
        return forced, f"GIR_GEMM_PATH={forced}"
    if len(candidates) == 1:
        return candidates[0], "the only path"
    times, was = _times(params, measured)
    allowed = [p for p in times if (family is None or p in FAMILIES[family]) and p not in exclude]
    best = min(allowed or [p for p in times if p not in exclude], key=times.__getitem__)
    return best, "measured" if was else "model"
