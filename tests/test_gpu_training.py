"""Training that stays on the device (docs/gpu.md *Training on the device*): a whole training
step of the char-LM of examples/train_charlm.py (loss, BPTT, every gradient, clipping and Adam)
as one `gir.jit(..., device="gpu")` function over pytrees, its parameters and optimizer state
device arrays from one step to the next. Counts, not times: what crosses the bus per step
(`fn.stats.h2d` / `d2h`), what Python issues (`host_launches`, the copies in and out), pinned
here; the loss trajectory against the same training on the CPU backend and the interpreter.

Tiny sizes (T=3, batch 2, hidden 4, embedding 3): the simulator runs every CUDA thread as a
Python thread. Runs in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set already."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import gir
import numpy as np
import pytest
from gir.backend.gpu.device import is_device_array
from gir.driver.pyjit import donation_pairs
from gpu_support import device_or_skip

DEVICE = device_or_skip()

pytestmark = [pytest.mark.gpu]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_charlm.py"
T, B, E, H, STEPS = 3, 2, 3, 4, 4


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_charlm", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHARLM = _example()


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    data, chars = CHARLM.encode(CHARLM.corpus()[:4000])
    rng = np.random.default_rng(1)
    out = []
    for _ in range(STEPS):
        inputs, targets = CHARLM.batch(data, T, B, rng)
        out.append((inputs, CHARLM.flat_targets(targets, len(chars))))
    return out


def _train(device: str, donate: tuple[int, ...] | None = (0, 1), on_device_batches: bool = False
           ) -> tuple[list[float], dict[str, np.ndarray], list[Any], list[dict[str, Any]]]:
    """STEPS steps of the example's training step: (losses, final parameters as NumPy, the
    parameters after each step as the step returned them, each step's stats)."""
    V = len(CHARLM.encode("")[1])
    opt = gir.optim.chain(gir.optim.clip_by_global_norm(5.0), gir.optim.adam(3e-2))
    params = CHARLM.init(V, E, H, np.random.default_rng(0))
    params, state, h0 = gir.device_put((params, opt.init(params), np.zeros((B, H), np.float32)), device)
    step = gir.jit(CHARLM.make_train_step(opt), device=device, donate_argnums=donate)
    batches = _batches()
    if on_device_batches:
        batches = gir.device_put(batches, device)
    losses, seen, stats = [], [], []
    for inputs, targets in batches:
        loss, params, state = step(params, state, inputs, targets, h0)
        losses.append(loss)
        seen.append(params)
        if device == "gpu":
            s = step.stats
            stats.append({"h2d": s.h2d, "d2h": s.d2h, "host_launches": s.host_launches, "graph": s.graph,
                          "arg_copies": s.device_arg_copies, "result_copies": s.result_copies})
    return [float(v) for v in gir.device_get(losses)], gir.device_get(params), seen, stats


LEAVES = 13 + 1 + 2 * 13
"""Parameters (13) and Adam's state (its step count, mu and nu per parameter): the donated leaves."""


def test_a_training_step_keeps_its_state_on_the_device_and_matches_the_cpu() -> None:
    losses, final, seen, stats = _train("gpu")
    for params in seen:  # device arrays every step, never NumPy
        assert all(is_device_array(p) for p in params.values())
    # donated: from the second step on, the step hands back the same buffers it was given
    assert all(seen[2][k] is seen[1][k] for k in seen[1])
    for s in stats:
        assert s["h2d"] == 2, s  # the batch: inputs and targets
        assert s["d2h"] == 0, s  # nothing read back: the loss stays a device array
        assert s["result_copies"] == 1, s  # the loss (donated results are the arguments' buffers)
    assert stats[0]["arg_copies"] == LEAVES + 1  # the first call copies the device_put arrays in
    for s in stats[1:]:
        assert s["graph"] == "replayed", s  # the index range checked outside the graph: it captures
        assert s["arg_copies"] == 1, s  # h0 (a device array, not donated)
        assert s["host_launches"] == 3, s  # one graph launch, h0 in, the loss out
    cpu_losses, cpu_final, _, _ = _train("cpu")
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-5)
    assert losses[-1] < losses[0]  # it learns (a large learning rate on one corpus slice)
    for k in cpu_final:
        np.testing.assert_allclose(final[k], cpu_final[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_the_interpreter_trains_the_same() -> None:
    losses, _, _, _ = _train("gpu", donate=None)
    want, _, _, _ = _train("interp")
    np.testing.assert_allclose(losses, want, rtol=1e-5)


def test_without_donation_every_leaf_is_copied_in_and_out() -> None:
    """Without donate_argnums results are fresh device arrays (the function's memory is reused by
    its next call), so each step copies every leaf in and every result out: what donation saves."""
    _, _, seen, stats = _train("gpu", donate=None)
    assert all(is_device_array(p) for p in seen[-1].values())
    assert not any(seen[2][k] is seen[1][k] for k in seen[1])
    for s in stats[1:]:
        assert (s["h2d"], s["d2h"], s["graph"]) == (2, 0, "replayed"), s
        assert (s["arg_copies"], s["result_copies"]) == (LEAVES + 1, LEAVES + 1), s
        assert s["host_launches"] == 1 + 2 * (LEAVES + 1), s


def test_batches_uploaded_before_training_cost_a_range_check_each() -> None:
    """Device-array indices (batches uploaded beforehand): no upload per step, but each index
    argument is copied into its buffer and its range read back before the graph launch
    (gather.py: min, max and their stack, then one read-back), which an upload of a NumPy batch
    (checked on the host) does not need."""
    losses, _, _, stats = _train("gpu", on_device_batches=True)
    for s in stats[1:]:
        assert (s["h2d"], s["d2h"], s["graph"], s["arg_copies"]) == (0, 2, "replayed", 3), s
        assert s["host_launches"] == 1 + 3 + 1 + 2 * 3, s  # graph, copies in, loss out, range checks
    want, _, _, _ = _train("cpu")
    np.testing.assert_allclose(losses, want, rtol=1e-5)


@pytest.mark.parametrize("on_device", [False, True])
def test_an_index_argument_out_of_range_is_a_located_error(on_device: bool) -> None:
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    f = gir.jit(lambda t, i: gir.sum(t[i]), device="gpu")
    good, bad = np.array([0, 3], np.int32), np.array([1, 4], np.int32)
    if on_device:
        good, bad = gir.device_put((good, bad))
    assert float(gir.device_get(f(table, good))) == 0 + 1 + 2 + 9 + 10 + 11  # rows 0 and 3
    with pytest.raises(gir.GirError, match=r"index out of range at run time: index 4 for a leading dim of 4") as e:
        f(table, bad)
    assert e.value.loc is not None and e.value.loc.file.endswith("test_gpu_training.py")


def test_a_donated_argument_returned_unchanged_or_swapped_stays_correct() -> None:
    """A result that is its donated argument itself needs no copy; results swapping two donated
    arguments leave the pairs out (each buffer is read for the other result): values correct."""
    a0, b0 = np.arange(3, dtype=np.float32), 10 + np.arange(3, dtype=np.float32)
    same = gir.jit(lambda a, b: (a, b + 1.0), device="gpu", donate_argnums=(0, 1))
    a, b = gir.device_put((a0, b0))
    for k in range(1, 4):
        a, b = same(a, b)
        np.testing.assert_array_equal(gir.device_get(a), a0)
        np.testing.assert_array_equal(gir.device_get(b), b0 + k)
    assert same.stats.device_arg_copies == 0 and same.stats.result_copies == 0
    swap = gir.jit(lambda a, b: (b * 1.0, a * 1.0), device="gpu", donate_argnums=(0, 1))
    back = gir.jit(lambda a, b: (b, a), device="gpu", donate_argnums=(0, 1))
    for fn in (swap, back):
        a, b = gir.device_put((a0, b0))
        for k in range(1, 4):
            a, b = fn(a, b)
            want = (a0, b0) if k % 2 == 0 else (b0, a0)
            np.testing.assert_array_equal(gir.device_get(a), want[0])
            np.testing.assert_array_equal(gir.device_get(b), want[1])


def test_donation_pairs_and_arguments() -> None:
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    args = [((2, 3), f32), ((3,), f32), ((), i32), ((2, 3), f32)]
    # each result takes the first free donated leaf of its shape and dtype, in order
    assert donation_pairs(args, [0, 1, 2], [((), f32), ((2, 3), f32), ((3,), f32), ((), i32)]) == [
        (1, 0), (2, 1), (3, 2)]
    assert donation_pairs(args, [3], [((2, 3), f32), ((2, 3), f32)]) == [(0, 3)]
    with pytest.raises(gir.GirArgumentError, match="donate_argnums takes integers"):
        gir.jit(lambda x: x, device="gpu", donate_argnums="x")
    with pytest.raises(gir.GirArgumentError, match="donate_argnums together with static"):
        gir.jit(lambda x, n: x * n, device="gpu", donate_argnums=0, static_argnums=1)
    f = gir.jit(lambda x: x + 1.0, device="gpu", donate_argnums=3)
    with pytest.raises(gir.GirArgumentError, match="donate_argnums 3: .* 1 positional argument"):
        f(np.ones(2, np.float32))
    # on the CPU donation saves nothing and is ignored
    assert gir.jit(lambda x: x + 1.0, device="cpu", donate_argnums=0).donate == ()


def test_device_put_and_get() -> None:
    tree = {"w": np.ones((2, 2), np.float32), "n": (np.int32(3), 0.5)}
    on = gir.device_put(tree)
    assert is_device_array(on["w"]) and is_device_array(on["n"][0]) and on["n"][1] == 0.5
    assert gir.device_put(on)["w"] is not None
    back = gir.device_get(on)
    assert isinstance(back["w"], np.ndarray) and back["w"].dtype == np.float32
    np.testing.assert_array_equal(back["w"], tree["w"])
    assert gir.device_put(on, "cpu")["n"][0] == 3
    with pytest.raises(gir.GirArgumentError, match="not an array or a number"):
        gir.device_put({"x": "text"})
    with pytest.raises(gir.GirArgumentError, match="device 'tpu'"):
        gir.device_put(tree, "tpu")


def test_the_example_trains_on_the_gpu_as_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/train_charlm.py --device gpu prints the losses --device cpu prints."""
    def run(device: str) -> list[str]:
        args = ["--steps", "4", "--seq", "3", "--batch", "2", "--hidden", "4", "--embed", "3", "--eval-every", "4",
                "--eval-batches", "1", "--sample", "0", "--quiet", "--device", device]
        assert CHARLM.main(args) == 0
        return re.findall(r"(?:loss|held-out) (\d+\.\d+)", capsys.readouterr().out)

    gpu = run("gpu")
    assert len(gpu) == 6  # a loss line per step, the held-out line and the summary line
    assert gpu == run("cpu")


def test_closed_over_arrays_go_up_once_for_device_calls() -> None:
    """A large closed-over array is a hidden argument of the trace (tracer.py): a call with device
    arrays passes it uploaded once, copied on the device, not uploaded every call; a call with
    NumPy arrays only still gets NumPy results."""
    table = np.arange(2048, dtype=np.float32).reshape(512, 4)  # > HIDDEN_ARGUMENT_ELEMENTS: hidden
    f = gir.jit(lambda w: gir.sum(table @ w), device="gpu")
    w = np.ones(4, np.float32)
    want = float(table.sum())
    for _ in range(3):
        got = f(gir.device_put(w))
        assert is_device_array(got) and float(gir.device_get(got)) == want
        assert f.stats.h2d == 0 and f.stats.device_arg_copies == 2, f.stats
    got = f(w)
    assert isinstance(got, np.ndarray) and float(got) == want and f.stats.h2d == 2
