"""One compile for every sequence length (issue 28): a `?` dim that only sets scan trip counts
is read at run time (analysis/lengths.py, driver/lengths.py, the CPU backend's length area).

Oracle: the interpreter on the same program at each length (float64). Counted: the
specialisations a `gir.jit` function compiled (`fn.specialisations`), which must be one for
ten lengths, and `fn.stats.compile.lengths`, which says which dims are read at run time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import gir
import numpy as np
import pytest
from gir import config
from gir.analysis.lengths import NotALength, compare
from gir.testing import assert_all_close
from rnn_cases import bench_module

LENGTHS = [1, 2, 6, 7, 9, 12, 17, 26, 40, 97]
"""Ten lengths, 1 and a long one included; none equals a batch or hidden size below (3, 4, 5),
so no length dim is mistaken for another `?` dim of the same value."""
B, IN, H = 3, 4, 5


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A cache of its own: what a test counts was compiled here, not loaded. Afterwards the
    functions it made are collected (with the libraries a cache hit mapped), here and not in a
    later test that counts mapped libraries (test_native_load.py)."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    yield
    from gir.backend.cpu import tiers

    tiers.wait_all(120)
    gc.collect()


def _training_step(model: str) -> tuple[str, str]:
    """bench/rnn.py's training step of model in float64, its sequence `%xs: tensor<?x3x4xf64>`."""
    rnn = bench_module("rnn")
    src = rnn.gir_source(model, 17, B, IN, H).replace("f32", "f64")
    return src.replace("%xs: tensor<17x", "%xs: tensor<?x"), f"{model}_grads"


def _arguments(model: str, t: int) -> list[np.ndarray]:
    rnn = bench_module("rnn")
    p = rnn.make_inputs(model, t, B, IN, H, t)
    return [p["xs"].astype(np.float64)] + [p[n].astype(np.float64) for n in rnn.param_names(model)]


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_a_text_training_step_compiles_once_for_ten_lengths(model: str) -> None:
    src, entry = _training_step(model)
    fn = gir.jit(src, entry)
    reference = gir.jit(src, entry, device="interp")
    for t in LENGTHS:
        args = _arguments(model, t)
        assert_all_close(fn(*args), reference(*args), rtol=1e-9)
        assert fn.specialisations == 1, f"length {t} compiled again"
    assert fn.stats.compile.cache == "miss"
    assert fn.stats.compile.lengths.startswith("every length: %xs dim 0 = T"), fn.stats.compile.lengths


def test_length_zero_is_specialised_on_its_own_and_equals_the_interpreter() -> None:
    """The interpreter defines T = 0 (no step: zero gradients); the code for every length serves
    lengths >= 1 (passes may rely on a loop with a known trip count running), so 0 is compiled
    apart, and the lengths after it use the code for every length again."""
    src, entry = _training_step("gru")
    fn = gir.jit(src, entry)
    reference = gir.jit(src, entry, device="interp")
    for t in (0, 5, 8):
        args = _arguments("gru", t)
        assert_all_close(fn(*args), reference(*args), rtol=1e-9)
        if t == 0:
            assert fn.stats.compile.lengths.startswith("specialised: a length of 0"), fn.stats.compile.lengths
    assert fn.specialisations == 2


def _gru_loss(p: dict, xs: object, h0: object) -> object:
    def step(carry: tuple, x: object) -> tuple:
        h, loss = carry
        z = gir.sigmoid(x @ p["w_z"] + h @ p["u_z"] + p["b_z"])
        n = gir.tanh(x @ p["w_n"] + h @ p["u_n"])
        h = (1.0 - z) * n + z * h
        return (h, loss + gir.sum(h * h)), h

    (_, loss), hs = gir.scan(step, (h0, gir.sum(h0) * 0.0), xs)
    return loss + gir.sum(hs[1:] * hs[:-1]) if xs.shape[0] > 1 else loss


def _bidirectional_loss(p: dict, xs: object, h0: object) -> object:
    """An RNN each way over xs, their stacked states combined step by step."""
    def cell(w: str, u: str) -> object:
        return lambda h, x: (gir.tanh(x @ p[w] + h @ p[u]),) * 2

    _, forward = gir.scan(cell("w_z", "u_z"), h0, xs)
    _, backward = gir.scan(cell("w_n", "u_n"), h0, xs, reverse=True)
    return gir.sum(forward * backward) + gir.sum(gir.tanh(forward + p["b_z"]))


def _params(rng: np.random.Generator) -> dict:
    return {"w_z": rng.standard_normal((IN, H)) * 0.3, "w_n": rng.standard_normal((IN, H)) * 0.3,
            "u_z": rng.standard_normal((H, H)) * 0.3, "u_n": rng.standard_normal((H, H)) * 0.3,
            "b_z": rng.standard_normal(H) * 0.1}


@pytest.mark.parametrize("loss", [_gru_loss, _bidirectional_loss])
def test_a_python_value_and_grad_compiles_once_for_ten_lengths(loss: object) -> None:
    """gir.jit(gir.value_and_grad(...)) with xs of ten lengths: traced at two lengths to find
    the length, compiled once. `_gru_loss` reads xs.shape[0] as a Python int (its two branches
    trace the same program from length 2 on: length 1 takes the other, and is its own)."""
    rng = np.random.default_rng(0)
    p = _params(rng)
    step = gir.jit(gir.value_and_grad(loss))  # type: ignore[arg-type]
    reference = gir.jit(gir.value_and_grad(loss), device="interp")  # type: ignore[arg-type]
    for t in LENGTHS:
        xs, h0 = rng.standard_normal((t, B, IN)), rng.standard_normal((B, H))
        value, grads = step(p, xs, h0)
        want_value, want_grads = reference(p, xs, h0)
        assert_all_close([np.asarray(value), *grads.values()], [np.asarray(want_value), *want_grads.values()],
                         rtol=1e-9)
    assert step.specialisations == (2 if loss is _gru_loss else 1)
    assert step.stats.compile.lengths.startswith("every length"), step.stats.compile.lengths


def test_the_gradient_of_a_mean_over_the_length_computes_its_count_at_run_time() -> None:
    """The gradient of a mean over the length divides by T*B*H, a constant that differs at the
    two representative lengths: it is checked at a third and computed from T (float64, as the
    pipeline's literal)."""
    def loss(p: dict, xs: object, h0: object) -> object:
        _, hs = gir.scan(lambda h, x: (gir.tanh(x @ p["w_z"] + h @ p["u_z"]),) * 2, h0, xs)
        return gir.mean(hs) + gir.mean(hs * hs, axis=0).sum()

    rng = np.random.default_rng(1)
    p = _params(rng)
    step = gir.jit(gir.value_and_grad(loss))
    reference = gir.jit(gir.value_and_grad(loss), device="interp")
    for t in (2, 6, 1, 33):
        xs, h0 = rng.standard_normal((t, B, IN)), rng.standard_normal((B, H))
        value, grads = step(p, xs, h0)
        want_value, want_grads = reference(p, xs, h0)
        assert_all_close([np.asarray(value), *grads.values()], [np.asarray(want_value), *want_grads.values()],
                         rtol=1e-9)
    assert step.specialisations == 1
    assert "constants follow the length" in step.stats.compile.lengths, step.stats.compile.lengths


TRANSPOSED = """
func @f(%xs: tensor<?x3xf64>, %h0: tensor<3xf64>, %w: tensor<3x1xf64>) -> tensor<f64> {
  %h = %h0
  for %x in %xs {
    %h = tanh(%x * %h)
    collect %h into %hs
  }
  %t = transpose(%hs)
  return sum(exp(%t) * %w)
}
"""


def test_a_length_moved_off_the_leading_dim_is_specialised_and_says_why() -> None:
    """A transpose that is copied puts the length in dim 1, where it is in the strides: each
    length is specialised (and correct), and the stats say why."""
    fn = gir.jit(TRANSPOSED, "f")
    reference = gir.jit(TRANSPOSED, "f", device="interp")
    rng = np.random.default_rng(3)
    for t in (4, 8):
        args = [rng.standard_normal((t, 3)), rng.standard_normal(3), rng.standard_normal((3, 1))]
        assert_all_close(fn(*args), reference(*args), rtol=1e-9)
    assert fn.specialisations == 2
    assert "the length is in dim [1]" in fn.stats.compile.lengths, fn.stats.compile.lengths


def test_gir_lengths_off_specialises_every_length() -> None:
    src, entry = _training_step("rnn")
    with config.override(lengths=False):
        fn = gir.jit(src, entry)
        for t in (2, 6):
            fn(*_arguments("rnn", t))
    assert fn.specialisations == 2
    assert fn.stats.compile.lengths == ""


def test_a_new_length_in_a_new_process_loads_the_code_for_every_length() -> None:
    """The compile cache keys code for every length by the shapes with the length left out:
    another JitFunction (as a new process makes) loads it for a length never seen."""
    src, entry = _training_step("rnn")
    gir.jit(src, entry)(*_arguments("rnn", 6))
    again = gir.jit(src, entry)
    args = _arguments("rnn", 23)
    assert_all_close(again(*args), gir.jit(src, entry, device="interp")(*args), rtol=1e-9)
    assert again.stats.compile.cache == "hit"
    assert again.stats.compile.lengths.startswith("every length")


def test_compare_and_verify_take_a_constant_that_follows_the_length_and_refuse_one_that_does_not() -> None:
    """sum(%xs) * K with K = 1/T (a mean's count, as a pipeline folds it) follows the length; with
    K = 1/T**2 the two representatives fit a line too (24*T - 143), and the third length refutes it;
    a constant that is no extent at all (0.5 against 0.7) is refused at once."""
    from gir.analysis.lengths import verify
    from gir.ir.specialize import specialize
    from gir.ir.types import TensorType

    text = """
func @f(%xs: tensor<?x3xf64>) -> tensor<f64> {
  %s = sum(%xs) * K
  return %s
}
"""

    def at(t: int, k: float) -> object:
        module = gir.parse(text.replace("K", repr(k)))
        return specialize(module, "f", [TensorType((t, 3), "f64")]).functions["f"]

    lengths = compare(at(11, 1 / 11), at(13, 1 / 13), 11, 13)
    assert lengths.describe().startswith("%xs dim 0 = T;") and "1 constants follow" in lengths.describe()
    verify(lengths, at(17, 1 / 17), 17)
    squared = compare(at(11, 1 / 121), at(13, 1 / 169), 11, 13)
    with pytest.raises(NotALength, match="is not"):
        verify(squared, at(17, 1 / 289), 17)
    with pytest.raises(NotALength, match="attribute value depends on the length"):
        compare(at(11, 0.5), at(13, 0.7), 11, 13)


TWO_SEQUENCES = """
func @f(%xs: tensor<?x3xf64>, %ys: tensor<?x3xf64>, %h0: tensor<3xf64>) -> (tensor<3xf64>, tensor<?x3xf64>) {
  %h = %h0
  for %x in %xs, %y in %ys {
    %h = tanh(%x * %h + %y)
    collect %h into %hs
  }
  return %h, %hs
}
"""


def test_two_sequences_of_one_length_and_a_result_that_follows_it() -> None:
    """%xs and %ys are one length; the stacked %hs is returned at each call's length; two
    sequences of different lengths are the interpreter's located error, not a crash."""
    fn = gir.jit(TWO_SEQUENCES, "f")
    reference = gir.jit(TWO_SEQUENCES, "f", device="interp")
    rng = np.random.default_rng(2)
    for t in (4, 8, 1):
        args = [rng.standard_normal((t, 3)), rng.standard_normal((t, 3)), rng.standard_normal(3)]
        got = fn(*args)
        assert got[1].shape == (t, 3)
        assert_all_close(got, reference(*args), rtol=1e-9)
    assert fn.specialisations == 1
    assert fn.stats.compile.lengths.startswith("every length: %xs dim 0 = T, %ys dim 0 = T")
    with pytest.raises(gir.GirError, match="sequence lengths .* disagree"):
        fn(rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), rng.standard_normal(3))


def test_a_python_function_that_fails_at_the_representative_lengths_is_specialised() -> None:
    """Traced at 11 and 13, fn raises (a Python assert on the length): the call specialises on
    its own shapes as before, with the reason in the stats, instead of failing."""
    def loss(p: dict, xs: object, h0: object) -> object:
        assert xs.shape[0] < 10, "short sequences only"
        _, hs = gir.scan(lambda h, x: (gir.tanh(x @ p["w_z"] + h @ p["u_z"]),) * 2, h0, xs)
        return gir.sum(hs)

    rng = np.random.default_rng(4)
    p = _params(rng)
    step = gir.jit(gir.value_and_grad(loss))
    xs, h0 = rng.standard_normal((4, B, IN)), rng.standard_normal((B, H))
    value, _ = step(p, xs, h0)
    assert np.isclose(value, gir.jit(gir.value_and_grad(loss), device="interp")(p, xs, h0)[0])
    assert "raised AssertionError" in step.stats.compile.lengths, step.stats.compile.lengths


def test_a_gather_over_the_steps_and_its_gradient_serve_every_length() -> None:
    """Rows of the stacked states picked by index (`index` by a tensor) and, in the gradient,
    scattered back (`scatter_add` into the length's rows): both read their rows from T."""
    def loss(p: dict, xs: object, h0: object, ids: object) -> object:
        _, hs = gir.scan(lambda h, x: (gir.tanh(x @ p["w_z"] + h @ p["u_z"]),) * 2, h0, xs)
        return gir.sum(hs[ids] * hs[ids])

    rng = np.random.default_rng(5)
    p = _params(rng)
    step = gir.jit(gir.value_and_grad(loss))
    reference = gir.jit(gir.value_and_grad(loss), device="interp")
    for t in (2, 9, 1, 30):
        xs, h0 = rng.standard_normal((t, B, IN)), rng.standard_normal((B, H))
        ids = np.array([0, t - 1, t // 2], np.int64)
        value, grads = step(p, xs, h0, ids)
        want_value, want_grads = reference(p, xs, h0, ids)
        assert_all_close([np.asarray(value), *grads.values()], [np.asarray(want_value), *want_grads.values()],
                         rtol=1e-9)
    assert step.specialisations == 1, step.stats.compile.lengths
    with pytest.raises(gir.GirError, match="out of range"):
        step(p, rng.standard_normal((4, B, IN)), rng.standard_normal((B, H)), np.array([0, 4, 1], np.int64))
