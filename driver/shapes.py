"""`?` dims on the command line: `--shape NAME=DIMS`, the entry's types before the passes.

    gir run model.gir --shape xs=50x32x256,h0=32x256 --random 0
    gir compile model.gir --shape xs=50x?x256 ...          # a `?` written here stays unknown

`gir run` and `gir compile` fix the entry's `?` dims before any pass runs (the `autodiff`
pass makes zero cotangents, which need static shapes): from the arrays of `--inputs`, or from
`--shape` (`entry_types`). `compile_entry` (driver/compile.py) then specialises the module on
them (ir/specialize.py: every type re-inferred through calls, `grad` and loops) and the passes
see static shapes, as in `gir.jit`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import GirArgumentError
from ..ir.core import Function
from ..ir.types import TensorType


def parse_shape_flags(f: Function, flags: Sequence[str] | None) -> dict[int, tuple[int | None, ...]]:
    """`--shape` values (`xs=4x?x8`, comma-separated or repeated) -> parameter index -> dims (None for `?`)."""
    names = [p.name_hint or str(i) for i, p in enumerate(f.args)]
    out: dict[int, tuple[int | None, ...]] = {}
    for flag in flags or ():
        for item in filter(None, (part.strip() for part in flag.split(","))):
            name, eq, dims = item.partition("=")
            name = name.strip().removeprefix("%")
            if not eq or not name:
                raise GirArgumentError(f"--shape {item!r}: write NAME=DIMS, e.g. xs=50x32x256")
            if name not in names:
                raise GirArgumentError(f"--shape {item!r}: @{f.name} has no parameter %{name}; its parameters are "
                                       + ", ".join("%" + n for n in names), f.loc)
            index = names.index(name)
            if index in out:
                raise GirArgumentError(f"--shape gives %{name} twice")
            out[index] = _parse_dims(item, dims.strip())
    return out


def _parse_dims(item: str, dims: str) -> tuple[int | None, ...]:
    if dims in ("", "scalar", "()"):
        return ()
    parsed: list[int | None] = []
    for d in dims.split("x"):
        d = d.strip()
        if d == "?":
            parsed.append(None)
        elif d.isdigit():
            parsed.append(int(d))
        else:
            raise GirArgumentError(f"--shape {item!r}: {d!r} is not a size; write sizes separated by 'x' "
                                   "(50x32x256), '?' for one left unknown, or 'scalar'")
    return tuple(parsed)


def refine(f: Function, index: int, t: TensorType, dims: tuple[int | None, ...]) -> TensorType:
    """t with the sizes of --shape; its static dims must agree."""
    name = f.args[index].name_hint or str(index)
    if len(dims) != t.rank:
        raise GirArgumentError(f"--shape {name}=...: %{name} of @{f.name} is {t}, of rank {t.rank}, "
                               f"not {len(dims)}", f.loc)
    merged = []
    for axis, (written, given) in enumerate(zip(t.shape, dims)):
        if written is not None and given is not None and written != given:
            raise GirArgumentError(f"--shape {name}=...: %{name} of @{f.name} is {t}: dim {axis} is {written}, "
                                   f"not {given}", f.loc)
        merged.append(written if given is None else given)
    return t.with_shape(tuple(merged))


def entry_types(f: Function, flags: Sequence[str] | None, inputs: Sequence[np.ndarray] | None,
                static_for: str | None = None) -> list[TensorType]:
    """@f's parameter types with their `?` dims fixed by inputs (already checked against f) or by
    --shape: what `compile_entry` specialises the module on (driver/compile.py). With
    static_for (what needs them), a `?` left is an error naming the parameter."""
    given = parse_shape_flags(f, flags)
    if inputs is not None and given:
        raise GirArgumentError("--shape is for --random: with --inputs the arrays give the shapes")
    if inputs is not None:
        types = [t.with_shape(tuple(a.shape)) for t, a in zip(f.arg_types, inputs)]
    else:
        types = [refine(f, i, t, given[i]) if i in given else t for i, t in enumerate(f.arg_types)]
    if static_for is not None:
        require_static(f, static_for, types)
    return types


def require_static(f: Function, what: str, types: Sequence[TensorType] | None = None) -> None:
    """A GirArgumentError naming the first parameter with a `?` dim (in types, else f's own),
    saying that `what` needs the shapes."""
    for i, (p, t) in enumerate(zip(f.args, types if types is not None else f.arg_types)):
        if not t.is_static:
            name = p.name_hint or str(i)
            example = "x".join("N" if d is None else str(d) for d in t.shape)
            raise GirArgumentError(f"{what} needs static shapes: %{name} of @{f.name} is {t}; give its sizes with "
                                   f"--shape {name}={example}", f.loc)
