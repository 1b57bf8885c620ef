"""The language reference and the examples are tested, not just read.

- Every ```gir block of docs/language.md is a complete module: it parses, round-trips, and its
  last function runs on seeded random inputs through `gir.interpret` (which runs autodiff
  first where the function reaches a `grad`) and gives finite results.
- Every ```gir-error block fails with a GirError whose text contains the substring given in the
  `<!-- error: ... -->` comment on the line before it.
- Every examples/*.gir parses and round-trips, its *_loss function runs and is finite and matches
  a direct NumPy implementation written here (float64 from the same float32 inputs, rtol 1e-4),
  and the `gir run` command examples/README.md gives for it works.
"""

from __future__ import annotations

import re
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.ir.core import Function

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE_MD = ROOT / "docs" / "language.md"
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))

_FENCE = re.compile(r"^```(gir|gir-error)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_EXPECTED = re.compile(r"<!--\s*error:\s*(.*?)\s*-->\s*$")


def _doc_blocks() -> list[tuple[str, int, str, str | None]]:
    """(kind, line number, text, expected error) for every gir / gir-error fence."""
    text = LANGUAGE_MD.read_text(encoding="utf-8")
    blocks = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        expected = None
        if m.group(1) == "gir-error":
            previous = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found = _EXPECTED.search(previous)
            expected = found.group(1) if found else None
        blocks.append((m.group(1), line, m.group(2), expected))
    return blocks


DOC_BLOCKS = _doc_blocks()
GIR_BLOCKS = [(line, text) for kind, line, text, _ in DOC_BLOCKS if kind == "gir"]
ERROR_BLOCKS = [(line, text, expected) for kind, line, text, expected in DOC_BLOCKS if kind == "gir-error"]


def random_arguments(f: Function, seed: int = 0) -> list[np.ndarray]:
    """Floats ~ N(0, 1), integers in [0, 3), fair booleans; a `?` dimension is 3."""
    rng = np.random.default_rng(seed)
    out = []
    for t in f.arg_types:
        shape = tuple(3 if d is None else d for d in t.shape)
        if t.is_float:
            out.append(rng.standard_normal(shape).astype(t.numpy_dtype))
        elif t.dtype == "i1":
            out.append(rng.integers(0, 2, shape).astype(bool))
        else:
            out.append(rng.integers(0, 3, shape).astype(t.numpy_dtype))
    return out


def reaches_grad(module: gir.Module, name: str, seen: set[str] | None = None) -> bool:
    """Whether @name, or a function it calls, contains a `grad` (which needs the autodiff pass)."""
    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    for op in module[name].walk():
        if op.name == "grad":
            return True
        if op.name == "call" and reaches_grad(module, op.attrs["callee"], seen):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# docs/language.md


def test_language_md_has_blocks():
    assert len(GIR_BLOCKS) >= 15
    assert len(ERROR_BLOCKS) >= 5
    for line, _text, expected in ERROR_BLOCKS:
        assert expected, f"docs/language.md:{line}: a gir-error block needs <!-- error: ... --> on the line before"


def test_language_md_describes_every_op():
    from gir.ir.ops import REGISTRY

    reference = LANGUAGE_MD.read_text(encoding="utf-8").split("## Op reference", 1)[-1]
    missing = sorted(name for name in REGISTRY if f"`{name}`" not in reference)
    assert not missing, "docs/language.md's op reference does not describe " + ", ".join(missing)


@pytest.mark.parametrize("line,text", GIR_BLOCKS, ids=[f"line{line}" for line, _ in GIR_BLOCKS])
def test_language_md_block(line: int, text: str):
    module = gir.parse(text, filename=f"language.md:{line}")
    printed = str(module)
    assert str(gir.parse(printed)) == printed
    entry = list(module.functions)[-1]
    results = gir.interpret(module, entry, *random_arguments(module[entry]))
    assert len(results) == len(module[entry].result_types)
    for r, t in zip(results, module[entry].result_types):
        assert r.dtype == t.numpy_dtype
        if r.dtype.kind == "f":
            assert np.all(np.isfinite(r)), f"@{entry} in the block at docs/language.md:{line} gives {r}"


@pytest.mark.parametrize("line,text,expected", ERROR_BLOCKS, ids=[f"line{line}" for line, _, _ in ERROR_BLOCKS])
def test_language_md_error_block(line: int, text: str, expected: str):
    with pytest.raises(gir.GirError) as info:
        module = gir.parse(text, filename="block.gir")
        entry = list(module.functions)[-1]
        gir.interpret(module, entry, *random_arguments(module[entry]))
    message = str(info.value)
    assert expected in message, f"the block at docs/language.md:{line} fails with {message}"
    assert re.match(r"block\.gir:\d+:\d+: error: ", message), message


# ---------------------------------------------------------------------------------------------
# examples/


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"rnn", "gru", "lstm", "mlp"} <= names
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for name in names:
        assert f"{name}.gir" in readme


@pytest.fixture(scope="module", params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request: pytest.FixtureRequest) -> tuple[str, gir.Module, list[np.ndarray], float]:
    """(name, module, the loss function's arguments, its loss), computed once per example."""
    path: Path = request.param
    module = gir.load(str(path))
    losses = [name for name in module.functions if name.endswith("_loss")]
    assert len(losses) == 1, f"{path.name} needs exactly one *_loss function"
    args = random_arguments(module[losses[0]], seed=0)
    for a in args:  # weights of size 256 want a smaller scale to keep the gates unsaturated
        a *= a.dtype.type(0.1)
    (loss,) = gir.interpret(module, losses[0], *args)
    return path.stem, module, args, float(loss)


def test_example_round_trips(example):
    _, module, _, _ = example
    printed = str(module)
    assert str(gir.parse(printed)) == printed


def test_example_loss_is_finite(example):
    name, module, _, loss = example
    assert np.isfinite(loss) and loss != 0.0, f"{name}: loss {loss}"
    grads = [f for f in module.functions if f.endswith("_grads")]
    assert len(grads) == 1 and reaches_grad(module, grads[0])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_readme_command(path: Path, capsys: pytest.CaptureFixture[str]):
    """The command examples/README.md gives for each example works."""
    from gir.cli import main

    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    command = re.search(rf"`gir run examples/{path.name} -e (\w+) --random 0`", readme)
    assert command, f"examples/README.md gives no `gir run examples/{path.name} -e ... --random 0`"
    assert main(["run", str(path), "-e", command.group(1), "--random", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("loss: shape () float32")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gru_reference(xs, h0, w_z, w_r, w_n, u_z, u_r, u_n, b_z, b_r, b_n, b_hn) -> float:
    h, loss = h0.astype(np.float64), 0.0
    for x in xs.astype(np.float64):
        z = _sigmoid(x @ w_z + h @ u_z + b_z)
        r = _sigmoid(x @ w_r + h @ u_r + b_r)
        n = np.tanh(x @ w_n + b_n + r * (h @ u_n + b_hn))
        h = (1 - z) * n + z * h
        loss += float(np.sum(h * h))
    return loss


def lstm_reference(xs, h0, c0, w_i, w_f, w_g, w_o, u_i, u_f, u_g, u_o, b_i, b_f, b_g, b_o) -> float:
    h, c, loss = h0.astype(np.float64), c0.astype(np.float64), 0.0
    for x in xs.astype(np.float64):
        i = _sigmoid(x @ w_i + h @ u_i + b_i)
        f = _sigmoid(x @ w_f + h @ u_f + b_f)
        g = np.tanh(x @ w_g + h @ u_g + b_g)
        o = _sigmoid(x @ w_o + h @ u_o + b_o)
        c = f * c + i * g
        h = o * np.tanh(c)
        loss += float(np.sum(h * h))
    return loss


def rnn_reference(xs, h0, wx, wh, b) -> float:
    h, loss = h0.astype(np.float64), 0.0
    for x in xs.astype(np.float64):
        h = np.tanh(x @ wx + h @ wh + b)
        loss += float(np.sum(h * h))
    return loss


def mlp_reference(x, y, w1, b1, w2, b2) -> float:
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0.0)
    logits = h @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean(np.sum(y * logp, axis=1)))


REFERENCES = {"gru": gru_reference, "lstm": lstm_reference, "rnn": rnn_reference, "mlp": mlp_reference}


def test_example_loss_matches_numpy(example):
    name, _, args, loss = example
    if name not in REFERENCES:
        pytest.skip(f"no NumPy reference for {name}")
    expected = REFERENCES[name](*[a.astype(np.float64) for a in args])
    assert loss == pytest.approx(expected, rel=1e-4)
