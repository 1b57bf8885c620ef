"""Hints for syntax errors that are habits from NumPy and Python: gir's spelling, at the token.

`parser.py` asks `numpy_hint` first when Lark rejects the text; a hint replaces the generic
"unexpected ..." message with what to write instead, located where the habit starts:

    x[:, 0:32]     slice(%x, starts=[0, 0], limits=[N0, 32]) (or index(%x, 3) for x[3])
    a ** b         pow(a, b)
    a > b, a <= b  gt(a, b), le(a, b), ... (the comparisons of the op registry)
    np.tanh(x)     tanh(x): builtins have no module prefix
    %x.sum()       sum(%x): values have no methods
    (2, 3)         shape=[2, 3]: lists, as keyword arguments
    where(...)     select(...): NumPy's names of gir's ops (ir/numpy_names.py)
    True, False    true, false
    y = ...        %y = ...: value names start with %
    # comment      // comment
    a; b           statements need no `;`

`%w.T` lexes as one value name (names may contain `.`), so the emitter gives that hint when
`%w` exists and `%w.T` does not (`_FunctionEmitter.undefined`). The rules look at the text
around the error only; each gives up (None) unless the habit is plain there.

Linear time: a rule that searches for a pattern ending at the error (`...\\s*$` over the text
before it) lets the pattern start only at a token boundary (a lookbehind such as `(?<!\\w)`), so
the regex engine tries each character as a start at most once. Without it, a search for
`\\d+...$` starts again at every digit of a long name and scans to its end: quadratic (a 32 KB
name took 53 s to report).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import GirSyntaxError, Location, did_you_mean
from ..ir.numpy_names import NUMPY_NAMES
from ..ir.ops import ONE_ARGUMENT_ALIASES, REGISTRY
from ..ir.spec import REQUIRED
from ..ir.types import DTYPES

if TYPE_CHECKING:
    from lark.exceptions import UnexpectedInput

_COMPARISONS = {">=": "ge", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", "<": "lt"}
"""Python's comparison operators -> the op of the registry that computes them (Python's own
`operator` module uses the same names)."""

_MODULE_PREFIXES = ("np", "numpy", "jnp", "torch", "math")
"""Module prefixes of array libraries that users write before a function name."""

_IDENT = re.compile(r"(?<![%@\w.$])([A-Za-z_]\w*)\s*$")
"""A bare identifier (not part of a %value or @function) ending the text before a position."""

_VALUE_END = re.compile(r"(%[A-Za-z0-9_.$]+)\s*$")


def numpy_name_hint(name: str) -> str:
    """`; NumPy's where is select(...) in gir` for a NumPy name of a gir op, else ''."""
    gir = NUMPY_NAMES.get(name)
    return f"; NumPy's {name} is {gir}(...) in gir" if gir is not None else ""


def function_names() -> list[str]:
    """What `name(...)` may call: every op of the registry that is not structural."""
    names = {n for n, s in REGISTRY.items() if s.category != "structural"}
    return sorted(names | set(ONE_ARGUMENT_ALIASES))


def dtype_hint(dtype: Any) -> str:
    """`; gir spells it 'f32'` for a NumPy dtype name ("float32", "float64", "int32", "bool"), else ''."""
    try:
        wanted = np.dtype(dtype) if isinstance(dtype, str) and dtype not in DTYPES else None
    except Exception:  # NumPy refuses names in several ways (TypeError, ValueError, SyntaxError)
        return ""
    names = [name for name, dt in DTYPES.items() if dt == wanted]
    return f"; gir spells it '{names[0]}'" if names else ""


def numpy_hint(e: UnexpectedInput, filename: str, text: str) -> GirSyntaxError | None:
    """A located hint if the text at the error is a NumPy or Python spelling, else None."""
    from lark.exceptions import UnexpectedCharacters, UnexpectedToken  # here: only Lark's errors come here

    if isinstance(e, UnexpectedToken):
        if e.token.type == "$END" or e.token.start_pos is None:
            return None
        pos, expected = e.token.start_pos, set(e.expected)
    elif isinstance(e, UnexpectedCharacters):
        pos, expected = e.pos_in_stream, set(e.allowed or ())
    else:
        return None
    for rule in (_mlir_spelling, _power, _comparison, _subscript, _module_prefix, _method, _python_literal,
                 _tuple_keyword, _tuple_argument, _bare_name, _python_comment, _semicolon):
        found = rule(text, pos, expected)
        if found is not None:
            message, start, *note = found
            return GirSyntaxError(message, location_of(filename, text, start), note=note[0] if note else None)
    return None


def location_of(filename: str, text: str, pos: int) -> Location:
    """The line and column of offset pos, counted as the lexer counts (lines end at '\\n')."""
    line_start = text.rfind("\n", 0, pos) + 1
    return Location(filename, text.count("\n", 0, pos) + 1, pos - line_start + 1)


Found = tuple[str, int] | tuple[str, int, str] | None
"""(message, offset where the caret goes[, note]), or None when the rule does not apply."""


def functions_note() -> str:
    return "gir's functions: " + ", ".join(function_names())


_ATOM_BEFORE = re.compile(r"(%[A-Za-z0-9_.$]+|(?<![\w$])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$")
_ATOM_AFTER = re.compile(r"\s*(%[A-Za-z0-9_.$]+|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _operands(text: str, start: int, end: int) -> tuple[str, str]:
    """The value names or numbers on either side of an operator at text[start:end], as written,
    or `a` and `b` where an operand is more than that."""
    left = _ATOM_BEFORE.search(text[:start])
    right = _ATOM_AFTER.match(text, end)
    return (left.group(1) if left else "a"), (right.group(1) if right else "b")


def _power(text: str, pos: int, expected: set[str]) -> Found:
    if text.startswith("*", pos) and pos > 0 and text[pos - 1] == "*":
        a, b = _operands(text, pos - 1, pos + 1)
        return f"gir has no '**' operator; write pow({a}, {b}) for {a} ** {b}", pos - 1
    return None


def _comparison(text: str, pos: int, expected: set[str]) -> Found:
    start = pos - 1 if text.startswith("==", pos - 1) and pos > 0 else pos
    before = text[:start].rstrip()
    if not (_ATOM_BEFORE.search(before) or before.endswith(")")):
        return None  # not after an operand: no comparison was meant (`tensor<` is a malformed type)
    for symbol, name in _COMPARISONS.items():
        if text.startswith(symbol, start) and name in REGISTRY:
            a, b = _operands(text, start, start + len(symbol))
            return (f"gir has no infix comparisons; write {name}({a}, {b}) for {a} {symbol} {b} (an i1 tensor, "
                    "for select)"), start
    return None


def _subscript(text: str, pos: int, expected: set[str]) -> Found:
    if not text.startswith("[", pos) or not expected & {"PLUS", "STAR", "AT"}:
        return None  # not where an expression could go on (a parameter list, an attribute)
    before = text[:pos].rstrip()
    m = _VALUE_END.search(before)
    if before.endswith(")"):
        value = _parenthesized(before)
    elif m is not None:
        value = m.group(1)
    else:
        return None
    close = text.find("]", pos)
    items = [i.strip() for i in text[pos + 1 : close].split(",")] if close != -1 and "\n" not in text[pos:close] \
        else None
    return f"gir has no subscripts; write {_subscript_spelling(value, items)}", pos


def _subscript_spelling(value: str, items: list[str] | None) -> str:
    """`slice(%x, starts=[0, 0], limits=[N0, 32])` for `%x[:, 0:32]`, `index(%x, 3)` for `%x[3]`."""
    generic = (f"slice({value}, starts=[...], limits=[...]) for {value}[a:b] (a start and a limit per axis) "
               f"or index({value}, i) for {value}[i]")
    if items is None:
        return generic
    if len(items) == 1 and re.fullmatch(r"-?\d+|%[A-Za-z0-9_.$]+", items[0]):
        return f"index({value}, {items[0]}) for {value}[{items[0]}] (the leading axis)"
    starts, limits = [], []
    for axis, item in enumerate(items):
        m = re.fullmatch(r"(\d*)\s*:\s*(\d*)", item)
        if m is None:
            return generic
        starts.append(m.group(1) or "0")
        limits.append(m.group(2) or f"N{axis}")
    sizes = [f"N{a}" for a, limit in enumerate(limits) if limit == f"N{a}"]
    where = f" ({', '.join(sizes)}: the size of {'that axis' if len(sizes) == 1 else 'those axes'})" if sizes else ""
    return (f"slice({value}, starts=[{', '.join(starts)}], limits=[{', '.join(limits)}]) for "
            f"{value}[{', '.join(items)}]{where}")


def _parenthesized(before: str) -> str:
    """The `( ... )` or `f( ... )` that `before` ends with, on its last line, else `(...)`."""
    depth = 0
    for i in range(len(before) - 1, -1, -1):
        c = before[i]
        if c == "\n":
            break
        depth += c == ")"
        depth -= c == "("
        if depth == 0:
            m = re.search(r"(?<![\w.$%@])[%@]?[A-Za-z_][\w.$]*$", before[:i])
            return before[m.start() if m else i:]
    return "(...)"


def _module_prefix(text: str, pos: int, expected: set[str]) -> Found:
    if not text.startswith(".", pos):
        return None
    for prefix in sorted(_MODULE_PREFIXES, key=len, reverse=True):
        start = pos - len(prefix)
        if start >= 0 and text.startswith(prefix, start) and (start == 0 or not _is_name_char(text[start - 1])):
            m = re.match(r"\.([A-Za-z_]\w*)", text[pos:])
            name = m.group(1) if m else "f"
            known = function_names()
            if name in known:
                return f"gir's functions have no module prefix; write {name}(...) instead of {prefix}.{name}(...)", \
                    start
            if name in NUMPY_NAMES:
                return (f"gir's functions have no module prefix; write {NUMPY_NAMES[name]}(...) instead of "
                        f"{prefix}.{name}(...)"), start
            return (f"gir's functions have no module prefix, and gir has no function '{name}'"
                    + did_you_mean(name, known), start, functions_note())
    return None


def _is_name_char(c: str) -> bool:
    return c.isalnum() or c in "_%@.$"


def _method(text: str, pos: int, expected: set[str]) -> Found:
    """`%x.sum(...)`: the value name took `.sum` in (names may contain dots), then `(` came."""
    if not text.startswith("(", pos):
        return None
    m = re.search(r"(%[A-Za-z0-9_$]+(?:\.\d+)*)\.([A-Za-z_]\w*)\s*$", text[:pos])
    if m is None:
        return None
    value, method = m.group(1), m.group(2)
    method_op = method if method in function_names() else NUMPY_NAMES.get(method)
    if method_op is not None:
        return (f"gir values have no methods; write {method_op}({value}, ...) instead of {value}.{method}(...)",
                m.end(1))
    return (f"gir values have no methods ('.{method}')" + did_you_mean(method, function_names()), m.end(1),
            functions_note())


def _python_literal(text: str, pos: int, expected: set[str]) -> Found:
    for word, gir in (("True", "true"), ("False", "false")):
        if text.startswith(word, pos) and not _is_name_char(text[pos + len(word): pos + len(word) + 1] or " "):
            return f"booleans are written {gir}, not {word}", pos
    return None


def _bare_name(text: str, pos: int, expected: set[str]) -> Found:
    """`y = tanh(x)` or `tanh(x)`: a name without `%` where a value goes."""
    m = _IDENT.search(text[:pos])
    if m is None or m.group(1) in REGISTRY or m.group(1) in ONE_ARGUMENT_ALIASES:
        return None
    name = m.group(1)
    line_start = text.rfind("\n", 0, m.start()) + 1
    assigned = text.startswith("=", pos) and not text.startswith("==", pos) and not text[line_start:m.start()].strip()
    ends_line = "\n" in text[m.end(1):pos]
    used = "LPAR" in expected and (ends_line or _starts_any(text, pos, (")", ",", "+", "-", "*", "/", "@")))
    if assigned or used:
        return f"'{name}' is not a value name: value names start with '%' (write %{name})", m.start(1)
    return None


def _starts_any(text: str, pos: int, prefixes: tuple[str, ...]) -> bool:
    return any(text.startswith(p, pos) for p in prefixes)


def _tuple_keyword(text: str, pos: int, expected: set[str]) -> Found:
    """`sum(%x, axes=(0, 1))`: an attribute written as a tuple."""
    m = re.search(r"(?<!\w)([A-Za-z_]\w*)\s*=\s*$", text[:pos])
    if not text.startswith("(", pos) or m is None:
        return None
    close = text.find(")", pos)
    items = text[pos + 1 : close] if close != -1 and "\n" not in text[pos:close] else "..."
    return f"attribute values are lists, not tuples; write {m.group(1)}=[{items.strip().rstrip(',')}]", pos


def _tuple_argument(text: str, pos: int, expected: set[str]) -> Found:
    """`reshape(%x, (2, 12))`, `zeros((2, 3))`: a shape passed as a tuple, by position."""
    if not text.startswith(",", pos):
        return None
    m = re.search(r"(?<!\w)([A-Za-z_]\w*)\s*\((?:[^()]*,)?\s*(\()\s*-?\d+\s*$", text[:pos])
    if m is None:
        return None
    start = m.start(2)
    close = text.find(")", pos)
    items = text[start + 1 : close] if close != -1 and "\n" not in text[start:close] else "..."
    spec = REGISTRY.get(ONE_ARGUMENT_ALIASES.get(m.group(1), m.group(1)))
    lists = [k for k, v in spec.attrs.items() if v is None or v is REQUIRED] if spec is not None else []
    keyword = lists[0] if lists else "shape" if spec is not None and spec.written_type else None
    shown = f"[{items.strip().rstrip(',')}]"
    if keyword is None:
        return f"gir has no tuples; write the list {shown} as a keyword argument (name={shown})", start
    return f"gir has no tuples; write {keyword}={shown} (a list, as a keyword argument)", start


def _python_comment(text: str, pos: int, expected: set[str]) -> Found:
    if text.startswith("#", pos):
        return "unexpected character '#': comments start with // in gir", pos
    return None


def _semicolon(text: str, pos: int, expected: set[str]) -> Found:
    if text.startswith(";", pos):
        return "unexpected character ';': gir statements end at the next statement, without ';'", pos
    return None


_MLIR_TYPE = re.compile(r":\s*(f16|bf16|f32|f64|i1|i8|i16|i32|i64|index|(?:vector|memref)<[^>]*>)")
_MLIR_DIALECT = re.compile(r"(func|arith|math|tensor|linalg|scf)\.([A-Za-z_]\w*)")


def _mlir_spelling(text: str, pos: int, expected: set[str]) -> Found:
    """MLIR habits: `%x: f32` (a scalar is `tensor<f32>`), `vector<...>`, `func.func`, `arith.addf`,
    `module { ... }`, `dense<[...]>`."""
    m = _MLIR_TYPE.match(text, pos)
    if m is None and "TYPE" in expected:  # `-> f32`: a bare type where a tensor type goes
        m = _MLIR_TYPE.match(": " + text[pos:pos + 40])
    if m is not None:
        written = m.group(1)
        if written.startswith(("vector", "memref")):
            return f"gir has tensor types only: write tensor<{written.split('<', 1)[1]} instead of {written}", pos
        if written in DTYPES:
            return f"every gir value is a tensor: a scalar {written} is written tensor<{written}>", pos
        return f"gir has no type {written}; its dtypes are " + ", ".join(DTYPES) + " (tensor<4xf32>)", pos
    start = pos
    if text.startswith(".", pos):  # `func.func`, `arith.addf`: the lexer stopped at the dot
        back = re.search(r"(?<!\w)[A-Za-z_]\w*$", text[:pos])
        start = back.start() if back else pos
    d = _MLIR_DIALECT.match(text, start)
    if d is not None and (start == 0 or not _is_name_char(text[start - 1])):
        dialect, name = d.groups()
        plain = {"func": "func", "return": "return", "call": "call"}.get(name, name)
        if plain in REGISTRY or plain == "func":
            return f"gir has no dialect prefixes; write {plain} instead of {dialect}.{name}", start
        return (f"gir has no dialect prefixes, and no op '{name}'" + did_you_mean(name, function_names()), start,
                functions_note())
    if text.startswith("module", pos) and not text[:pos].strip():
        return "a .gir file is a list of func definitions, without a `module { ... }` around them", pos
    if text.startswith("dense<", pos):
        return "gir writes constants without dense<...>: constant [1.0, 2.0] : tensor<2xf32>", pos
    return None
