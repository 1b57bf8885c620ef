"""`index` as a gather, `scatter_add` and `logsumexp` on every backend against the interpreter.

The ops a language model's training step needs: an embedding lookup (`index` by an integer
tensor), its gradient (`scatter_add`, repeated rows accumulating) and a cross-entropy
(`logsumexp`). Each case runs on the CPU backend and on the GPU backend (Numba's CUDA simulator
where there is no GPU, as in tests/test_backend_conformance.py) and is compared with the
interpreter; logsumexp also with float64 math on values whose exp overflows or underflows.
Their gradients against finite differences are in tests/test_vjp.py.
"""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gir.testing import assert_all_close

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _gpu_missing() -> str | None:
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "the GPU backend needs numba-cuda (pip install 'gir[gpu]')"
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except gir.GirError as e:
        return f"no GPU backend here: {e.message}"
    return None


GPU_MISSING = _gpu_missing()
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu]
                        + ([pytest.mark.skip(reason=GPU_MISSING)] if GPU_MISSING else []))]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True, scope="module")
def fresh_code_cache(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIR_CACHE_DIR", str(tmp_path_factory.mktemp("gir-cache")))
        yield


def run_both(device: str, source: str, args: list[np.ndarray], rtol: float | None = None) -> list[np.ndarray]:
    want = gir.jit(source, "f", device="interp")(*args)
    got = gir.jit(source, "f", device=device)(*args)
    assert_all_close(got, want, rtol, device)
    return got


NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}

GATHER = """\
func @f(%e: tensor<5x3xDT>, %i0: tensor<IT>, %i1: tensor<7xIT>, %i2: tensor<2x4xIT>)
    -> (tensor<3xDT>, tensor<7x3xDT>, tensor<2x4x3xDT>, tensor<7x3xDT>) {
  %twice = index(%e * %e, %i1)
  return index(%e, %i0), index(%e, %i1), index(%e, %i2), %twice
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
@pytest.mark.parametrize("index_dtype", ["i32", "i64"])
def test_gather(device: str, dtype: str, index_dtype: str) -> None:
    """By a scalar (a row), a vector and a matrix of rows, with repeats; from an argument and
    from a computed value."""
    source = GATHER.replace("DT", dtype).replace("IT", index_dtype)
    e = (np.arange(15).reshape(5, 3) * 1.5 - 4).astype(NP[dtype])
    it = NP[index_dtype]
    args = [e, np.array(3, it), np.array([0, 4, 4, 1, 0, 2, 4], it), np.array([[1, 1, 1, 3], [4, 0, 2, 2]], it)]
    got = run_both(device, source, args, rtol=0.0)
    np.testing.assert_array_equal(got[2], e[args[3]])  # and NumPy's fancy indexing agrees


SCATTER = """\
func @f(%base: tensor<4x3xDT>, %i: tensor<6xi32>, %u: tensor<6x3xDT>, %j: tensor<2x2xi64>, %v: tensor<2x2x3xDT>)
    -> (tensor<4x3xDT>, tensor<4x3xDT>, tensor<4x3xDT>) {
  %a = scatter_add(%base, %i, %u)
  %b = scatter_add(%base * 2, %j, %v)
  %c = scatter_add(%b + %a, %i, %u)
  return %a, %b, %c
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_scatter_add(device: str, dtype: str) -> None:
    """Repeated rows accumulate; the base is an argument (not written), a dying temporary (the
    result may take its buffer: `inplace`) and a value used again."""
    source = SCATTER.replace("DT", dtype)
    rng = np.random.default_rng(1)
    base = rng.integers(-5, 5, (4, 3)).astype(NP[dtype])
    i = np.array([1, 3, 1, 1, 0, 3], np.int32)
    u = rng.integers(-5, 5, (6, 3)).astype(NP[dtype])
    j = np.array([[2, 2], [0, 2]], np.int64)
    v = rng.integers(-5, 5, (2, 2, 3)).astype(NP[dtype])
    kept = base.copy()
    got = run_both(device, source, [base, i, u, j, v], rtol=0.0)
    np.testing.assert_array_equal(base, kept)
    want = base.copy()
    np.add.at(want, i, u)
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("op,source", [
    ("index", "func @f(%e: tensor<3x2xf32>, %i: tensor<4xi32>) -> tensor<4x2xf32> {\n  return index(%e, %i)\n}\n"),
    ("scatter_add", "func @f(%e: tensor<3x2xf32>, %i: tensor<4xi32>) -> tensor<3x2xf32> {\n"
                    "  return scatter_add(%e, %i, ones(shape=[4, 2], dtype=\"f32\"))\n}\n"),
])
def test_row_out_of_range_is_an_error(device: str, op: str, source: str) -> None:
    fn = gir.jit(source, "f", device=device)
    e = np.zeros((3, 2), np.float32)
    for bad in ([0, 1, 3, 2], [0, -1, 0, 0]):
        with pytest.raises(gir.GirError, match="out of range"):
            fn(e, np.array(bad, np.int32))
    fn(e, np.array([2, 2, 0, 1], np.int32))


LOGSUMEXP = """\
func @f(%x: tensor<5x4xDT>)
    -> (tensor<5xDT>, tensor<4xDT>, tensor<DT>, tensor<5x1xDT>) {
  return logsumexp(%x, axes=[1]), logsumexp(%x, axes=[0]), logsumexp(%x), logsumexp(%x, axes=[-1], keepdims=true)
}
"""


def edge_rows(dtype: type) -> np.ndarray:
    """Rows whose exp overflows (1e30: logsumexp is the max, plus log of the count of ties), all
    underflow (-1e30), all -inf (-inf), hold +inf (+inf), and ordinary values."""
    inf = np.inf
    return np.array([[1e30, 1e30, 0.0, -1.0],
                     [-1e30, -1e30 - 1e24, -1e30, -1e30],
                     [-inf, -inf, -inf, -inf],
                     [1.0, inf, -inf, 2.0],
                     [0.5, -0.25, 3.0, -2.0]], dtype)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_logsumexp_does_not_overflow(device: str, dtype: str) -> None:
    x = edge_rows(NP[dtype])
    got = run_both(device, LOGSUMEXP.replace("DT", dtype), [x])
    rows = got[0]
    assert rows[0] == pytest.approx(1e30, rel=1e-6) and np.isfinite(rows[0])
    assert rows[1] == pytest.approx(-1e30, rel=1e-6) and np.isfinite(rows[1])
    assert rows[2] == -np.inf and rows[3] == np.inf
    ordinary = x[4].astype(np.float64)
    assert rows[4] == pytest.approx(np.log(np.exp(ordinary).sum()), rel=1e-6)


def test_logsumexp_propagates_nan(device: str) -> None:
    x = np.array([[1.0, np.nan, 2.0, 3.0], [1e30, np.nan, 0, 0], *edge_rows(np.float32)[2:]], np.float32)
    got = run_both(device, LOGSUMEXP.replace("DT", "f32"), [x])
    assert np.isnan(got[0][0]) and np.isnan(got[0][1]) and np.isnan(got[2])


CROSS_ENTROPY = """\
func @loss(%emb: tensor<6x4xf32>, %w: tensor<4x6xf32>, %ids: tensor<3x2xi32>, %next: tensor<6xi32>) -> tensor<f32> {
  %x = reshape(index(%emb, %ids), shape=[6, 4])
  %logits = tanh(%x) @ %w
  %picked = index(reshape(%logits, shape=[36]), %next)
  return mean(logsumexp(%logits, axes=[1]) - %picked)
}

func @f(%emb: tensor<6x4xf32>, %w: tensor<4x6xf32>, %ids: tensor<3x2xi32>, %next: tensor<6xi32>)
    -> (tensor<f32>, tensor<6x4xf32>, tensor<4x6xf32>) {
  %l, %demb, %dw = grad @loss(%emb, %w, %ids, %next) wrt (%emb, %w)
  return %l, %demb, %dw
}
"""


def test_cross_entropy_training_step(device: str) -> None:
    """An embedding lookup with repeated ids, a projection and a softmax cross-entropy: the loss
    and both gradients (scatter_add of the embedding rows) agree with the interpreter. The
    target logits are picked by a gather from the flattened logits (row * 6 + target)."""
    rng = np.random.default_rng(7)
    emb = rng.standard_normal((6, 4)).astype(np.float32)
    w = (rng.standard_normal((4, 6)) * 5).astype(np.float32)
    ids = np.array([[1, 1], [5, 1], [0, 5]], np.int32)
    nxt = np.array([1, 5, 1, 0, 5, 2], np.int32)
    loss, demb, _ = run_both(device, CROSS_ENTROPY, [emb, w, ids, np.arange(6, dtype=np.int32) * 6 + nxt])
    assert np.all(demb[[2, 3, 4]] == 0) and np.any(demb[1] != 0)
    logits = np.tanh(emb[ids.reshape(-1)].astype(np.float64)) @ w
    want = np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(6), nxt])
    assert float(loss) == pytest.approx(want, rel=1e-5)


TABLE_IN_LOOP = """\
func @f(%e: tensor<7x3xf64>, %ids: tensor<5x2xi32>, %h0: tensor<2x3xf64>) -> tensor<f64> {
  %h = %h0
  for %i in %ids {
    %h = tanh(index(%e, %i) + %h)
  }
  return sum(%h * %h)
}

func @g(%e: tensor<7x3xf64>, %ids: tensor<5x2xi32>, %h0: tensor<2x3xf64>) -> (tensor<f64>, tensor<7x3xf64>) {
  %l, %de = grad @f(%e, %ids, %h0) wrt (%e)
  return %l, %de
}
"""


def test_table_read_at_every_step_accumulates_rows_in_place(device: str) -> None:
    """An embedding read inside the loop: canonicalize's AddIntoScatter turns the backward
    scan's `acc + scatter_add(0, i, g)` into `scatter_add(acc, i, g)` on the carry (no
    table-sized zeros or add per step); the gradient matches finite differences and the
    backends match the interpreter."""
    from gir.ir.loops import LoopView
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    module = gir.parse(TABLE_IN_LOOP, filename="table.gir")
    PassManager(DEFAULT_PIPELINE).run(module)
    backward = [op for op in module["g"].body if op.name == "scan" and op.attrs.get("reverse")]
    assert len(backward) == 1
    body = list(backward[0].body)
    scatters = [op for op in body if op.name == "scatter_add"]
    assert len(scatters) == 1 and scatters[0].operands[0] in LoopView(backward[0]).carry_args
    assert not [op for op in body if op.name in ("add", "constant") and op.result.tensor_type.shape == (7, 3)]

    rng = np.random.default_rng(3)
    e, h0 = rng.standard_normal((7, 3)), rng.standard_normal((2, 3))
    ids = np.array([[1, 1], [4, 0], [1, 6], [6, 6], [2, 1]], np.int32)
    reference = gir.parse(TABLE_IN_LOOP, filename="table.gir")
    want = np.zeros_like(e)
    for k in np.ndindex(e.shape):
        plus, minus = e.copy(), e.copy()
        plus[k] += 1e-6
        minus[k] -= 1e-6
        f_plus, f_minus = gir.interpret(reference, "f", plus, ids, h0), gir.interpret(reference, "f", minus, ids, h0)
        want[k] = (f_plus[0] - f_minus[0]) / 2e-6
    got = gir.jit(TABLE_IN_LOOP, "g", device=device)(e, ids, h0)
    assert_all_close(got, gir.jit(TABLE_IN_LOOP, "g", device="interp")(e, ids, h0))
    assert np.max(np.abs(got[1] - want)) < 1e-6 * max(1.0, float(np.max(np.abs(want))))
