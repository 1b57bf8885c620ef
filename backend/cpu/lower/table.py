"""The dispatch table: op kind -> its lowering function, and the lowerings that serve every
length."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ....ir.core import Operation
from ....ir.spec import OpSpec, dispatch_by_fact
from .elementwise import lower_constant, lower_elementwise, lower_fused
from .gemm import lower_matmul
from .reductions import lower_reduce
from .scan import lower_scan
from .views import lower_broadcast, lower_concat, lower_index, lower_slice, lower_stack, lower_transpose, lower_view

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def _row_and_softmax_lowerings() -> dict[str, Callable[[Lowering, Operation], None]]:
    from ..gather import lower_logsumexp, lower_scatter_add  # a module of its own (gather.py)
    return {"scatter_add": lower_scatter_add, "logsumexp": lower_logsumexp}


def _lowerings() -> dict[str, Callable[[Lowering, Operation], None]]:
    """Op kind -> lowering function: the kinds with a family of their own by name, every other
    kind by its spec's facts (elementwise, constant, reduction, GEMM, device move)."""
    table: dict[str, Callable[[Lowering, Operation], None]] = {
        "fused": lower_fused,
        "scan": lower_scan,
        "reshape": lower_view,
        "transpose": lower_transpose,
        "broadcast": lower_broadcast,
        "slice": lower_slice,
        "concat": lower_concat,
        "stack": lower_stack,
        "index": lower_index,
        **_row_and_softmax_lowerings(),
    }
    by_fact: list[tuple[Callable[[OpSpec], bool], Callable[[Lowering, Operation], None]]] = [
        (lambda spec: spec.is_elementwise, lower_elementwise),
        (lambda spec: spec.category == "constant", lower_constant),
        (lambda spec: spec.reduction is not None, lower_reduce),
        (lambda spec: bool(spec.gemm_dtypes), lower_matmul),
        (lambda spec: spec.moves_device, lower_view),  # the whole function runs on the CPU
    ]
    return dispatch_by_fact(table, by_fact)


LOWER = _lowerings()
"""Op kind -> lowering function."""

LENGTH_AWARE = {lower_fused, lower_elementwise, lower_constant, lower_view, lower_transpose, lower_broadcast,
                lower_slice, lower_concat, lower_stack, lower_index, lower_reduce, lower_matmul, lower_scan,
                LOWER["scatter_add"]}
"""The lowerings that compute sizes that follow the run-time length from it (`Lowering.shape`);
any other op reading or making such a value refuses (`_refuse_length`)."""
