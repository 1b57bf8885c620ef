"""The device copies a call makes outside its loops (backend/gpu/aliasing.py, docs/gpu.md
*Copies outside the loops*): pinned per model for the rnn/gru/lstm training steps, and each
aliasing mechanism checked against the interpreter (the oracle) on programs that exercise it,
in the arena and with a buffer per value, with NumPy and with device arrays.

Runs in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set already (as
tests/test_gpu_backend.py)."""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gir.driver.jit import JitFunction
from gpu_support import device_or_skip

DEVICE = device_or_skip()

pytestmark = [pytest.mark.gpu]


# ---------------------------------------------------------------------------------------------
# The training steps: every count of a call, per model

CALL_COUNTS = {
    # model: (kernel_launches, gemm_calls, xp_launches, copies inside the call's device work)
    "rnn": (10, 10, 0, 0),
    "gru": (10, 10, 0, 0),
    "lstm": (10, 10, 0, 0),
}
"""Per call at T=3, batch 2, input 3, hidden 4, the same eager and replayed (a replay reports
the graph's work). Kernels: 1 per forward step + 2 per backward step + 1 after the loops (the
sum of the two weight-gradient GEMMs of the recurrent weights). GEMMs: 1 per step and
direction + 1 before the loops (%xs @ [w...], every step at once) + 3 after them (the input
and recurrent weight gradients). Copies inside the call: none. Before this work (the same
call): rnn 8, gru 29, lstm 38 (initial carries copied into their buffers and final ones out,
the weights concatenated, the gate columns of %xs @ [w...] sliced out, the returned gradient
blocks sliced out of their GEMM). What is left is outside the call's device work (below)."""

ARGS_AND_RESULTS = {"rnn": (5, 5), "gru": (12, 12), "lstm": (15, 15)}
"""With device arrays in and out, the copies around the call: (arguments, results). Each
argument is copied into the function's own buffer (the CUDA graph's addresses are fixed, and
the caller may change its array after the call); each result is copied out of the function's
memory into a fresh array (the next call reuses that memory). Both stay by design."""


def _training_step(model: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    from rnn_cases import training_step

    return training_step(model, 3, 2, 3, 4)


def _in_call(fn: JitFunction) -> tuple[int, ...]:
    s = fn.stats
    return (s.kernel_launches, s.gemm_calls, s.xp_launches, s.copies - s.device_arg_copies - s.result_copies)


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_training_step_copies_nothing_outside_its_loops(model: str) -> None:
    """Device arrays in and out, eager (call 1) and replayed (calls 2, 3): every count of the
    call pinned, the results the interpreter's; NumPy in and out: no copy at all."""
    from gir.testing import assert_all_close

    src, args, want = _training_step(model)
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(src, f"{model}_grads", device="gpu")
    xp = DEVICE.xp
    for call in range(3):
        got = fn(*[xp.asarray(a) for a in args])
        assert_all_close([g.get() for g in got], want, what=f"{model} call {call + 1}")
        s = fn.stats
        assert _in_call(fn) == CALL_COUNTS[model], (s.graph, s)
        assert (s.device_arg_copies, s.result_copies) == ARGS_AND_RESULTS[model], s
        assert (s.h2d, s.d2h) == (0, 0), s
    assert fn.stats.graph == "replayed" and fn.stats.host_launches == 1 + sum(ARGS_AND_RESULTS[model])
    assert_all_close(fn(*args), want, what=f"{model} NumPy")
    assert fn.stats.copies == 0 and _in_call(fn) == CALL_COUNTS[model], fn.stats


# ---------------------------------------------------------------------------------------------
# Each mechanism against the interpreter

CARRIES = """\
func @f(%xs: tensor<4x2xf32>, %h0: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<2xf32>) {
  %z = constant 0.5 : tensor<2xf32>
  %a.1, %h.1, %u.1, %ys = scan DIR(%x in %xs) carry (%a = %z, %h = %h0, %u = %z) {
    %n = tanh(%h + %x)
    %m = %a * 0.5 + %n * 2.0
    %v = %u - %x
    yield (%m, %n, %v) stack (%n)
  } : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>
  %w = exp(%a.1) + %h.1
  return %h.1, %w, %ys, %z
}
"""
"""%a: double-buffered, its initial value a constant read in place, its final value left in
its buffer (and read by a kernel that may write in place); %h: from its stack row, its initial
value an argument read in place, its final value copied out of the arena stack; %u: final value
read by nobody, not copied out; the constant %z returned unchanged."""


def _close(fn: JitFunction, source: str, entry: str, args: list[np.ndarray]) -> None:
    want = gir.jit(source, entry, device="interp")(*args)
    for g, w in zip(fn(*args), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize("arena", ["1", "0"])
@pytest.mark.parametrize("direction", ["", "reverse "])
def test_carries_read_and_left_in_place(direction: str, arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    source = CARRIES.replace("DIR", direction)
    fn = gir.jit(source, "f", device="gpu")
    rng = np.random.default_rng(1)
    for _ in range(2):  # the constant read in place stays as it was for the next call
        _close(fn, source, "f", [rng.standard_normal((4, 2)).astype(np.float32),
                                 rng.standard_normal(2).astype(np.float32)])
    assert fn.stats.copies == 1, fn.stats  # %h.1 out of its stack row (in the arena)


NESTED = """\
func @g(%xs: tensor<3x4x2xf32>) -> (tensor<2xf32>, tensor<3x2xf32>) {
  %z = constant 0.25 : tensor<2xf32>
  %s.1, %rs = scan (%row in %xs) carry (%s = %z) {
    %in.1 = scan (%x in %row) carry (%in = %z) {
      %k = tanh(%in + %x)
      yield (%k)
    } : tensor<2xf32>
    %t = %s + %in.1 * %in.1
    yield (%t) stack (%in.1)
  } : tensor<2xf32>, tensor<3x2xf32>
  return %s.1, %rs
}
"""
"""The inner scan runs once per outer step, each time reading the constant in place and
leaving its final carry in one of its buffers, read by the outer step and copied into its
stack before the next outer step runs the inner scan again."""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_nested_scans_read_and_leave_carries_in_place(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    fn = gir.jit(NESTED, "g", device="gpu")
    xs = np.random.default_rng(2).standard_normal((3, 4, 2)).astype(np.float32)
    _close(fn, NESTED, "g", [xs])
    _close(fn, NESTED, "g", [xs * 0.5])


PIECES = """\
func @h(%a: tensor<2x3xf32>, %b: tensor<2x2xf32>, %c: tensor<3xf32>, %d: tensor<3xf32>, %e: tensor<2x3xf32>)
    -> (tensor<2x3xf32>, tensor<2x2xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<3x5xf32>) {
  %ab = concat %a, %b {axis = 1} : tensor<2x5xf32>
  %cd = stack %c, %d {axis = 0} : tensor<2x3xf32>
  %ee = concat %e, %e {axis = 0} : tensor<4x3xf32>
  %y = tanh(%ab)
  %y1 = slice %y {limits = [2, 3], starts = [0, 0]} : tensor<2x3xf32>
  %y2 = slice %y {limits = [2, 5], starts = [0, 3]} : tensor<2x2xf32>
  %p = transpose %cd {perm = [1, 0]} : tensor<3x2xf32>
  %q = matmul %p, %ab : tensor<3x5xf32>
  %e1 = slice %ee {limits = [2, 3], starts = [0, 0]} : tensor<2x3xf32>
  return %y1, %y2, %cd, %e1, %q
}
"""
"""%ab and %cd: concat and stack of arguments read by them alone (packed: the arguments'
buffers are their pieces, one upload for NumPy arguments); %ee: one argument twice (copied);
%y1, %y2: slices of a kernel result read only by `return` (strided views, one download of %y
for both; a copy each when handed out as device arrays); %e1: a slice of a concat (copied)."""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_packed_arguments_and_returned_slices(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 2), (3,), (3,), (2, 3))]
    fn = gir.jit(PIECES, "h", device="gpu")
    _close(fn, PIECES, "h", args)
    low = fn.compiled.lowering
    assert len(low.packs) == 2 and len(low.returned_views) == 2
    assert fn.stats.h2d == 3 and fn.stats.d2h == 4, fn.stats  # (%a %b), (%c %d), %e; %y once
    want = gir.jit(PIECES, "h", device="interp")(*args)
    xp = DEVICE.xp
    for on_device in ([0, 1, 2, 3, 4], [1, 3]):  # all device arrays; a pack half on the device
        mixed = [xp.asarray(a) if k in on_device else a for k, a in enumerate(args)]
        got = fn(*mixed)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.get(), w, rtol=0, atol=1e-5)
        assert all(g.flags.c_contiguous for g in got)
    # %b and %d copied in; %a through the device (its piece is strided); %c's piece, a row of
    # the stack, takes its upload as it is; %e uploaded
    assert fn.stats.h2d == 3 and fn.stats.device_arg_copies == 3, fn.stats


SEQUENCES = """\
func @k(%xs: tensor<3x2x2xf32>, %w: tensor<2x6xf32>, %h0: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<f32>) {
  %z = constant 0.0 : tensor<f32>
  %g = matmul %xs, %w : tensor<3x2x6xf32>
  %g1 = slice %g {limits = [3, 2, 2], starts = [0, 0, 0]} : tensor<3x2x2xf32>
  %g2 = slice %g {limits = [3, 2, 6], starts = [0, 0, 4]} : tensor<3x2x2xf32>
  %h.1, %s.1 = scan (%x in %g1, %y in %g2) carry (%h = %h0, %s = %z) {
    %n = tanh(%h + %x) * %y
    %t = %s + sum(%y)
    yield (%n, %t)
  } : tensor<2x2xf32>, tensor<f32>
  return %h.1, %s.1
}
"""
"""%g1: a gate block of a GEMM that the scan walks, its element read by a kernel alone: read in
place in row t of %g (no copy); %g2: its element also read by a sum (copied out, as before)."""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_sequence_slices_read_in_place(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    source = SEQUENCES
    rng = np.random.default_rng(4)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 2), (2, 6), (2, 2))]
    fn = gir.jit(source, "k", device="gpu")
    _close(fn, source, "k", args)
    low = fn.compiled.lowering
    assert len(low.sequence_rows) >= 1, low.sequence_rows


def test_a_call_without_error_sites_reads_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step (float: no kernel can flag an error) with device arrays in and out
    downloads nothing, not even the error flag, eager or replayed; a function with an integer
    division still reads its flag and raises."""
    src, args, _ = _training_step("rnn")
    fn = gir.jit(src, "rnn_grads", device="gpu")
    xp = DEVICE.xp
    on_device = [xp.asarray(a) for a in args]
    downloads = []
    real = DEVICE.download
    monkeypatch.setattr(DEVICE, "download", lambda a: downloads.append(a.shape) or real(a))
    for _ in range(3):
        fn(*on_device)
    assert downloads == [] and fn.stats.graph == "replayed", downloads
    div = gir.jit("func @d(%a: tensor<2xi32>, %b: tensor<2xi32>) -> tensor<2xi32> {\n  return %a / %b\n}\n",
                  "d", device="gpu")
    with pytest.raises(gir.GirError, match="division by zero"):
        div(np.array([1, 2], np.int32), np.array([1, 0], np.int32))
    assert (1,) in downloads  # the flag


def test_split_style_calls_fill_packed_argument_buffers() -> None:
    """The split executor fills `arg_buffers` itself (an upload or a device copy each) and calls
    `run_on_device`: a packed argument's buffer is a strided piece of its concat, which an
    upload reaches through a temporary (`Device.upload`; CuPy's `set` refuses strides)."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 2), (3,), (3,), (2, 3))]
    fn = gir.jit(PIECES, "h", device="gpu")
    fn(*args)  # compiles
    compiled = fn.compiled
    buffers = compiled.arg_buffers
    assert not buffers[0].flags.c_contiguous  # %a: columns 0-2 of %ab
    for k, (buffer, a) in enumerate(zip(buffers, args)):
        if k % 2:
            buffer[...] = DEVICE.xp.asarray(a * 2)  # as a value of an earlier GPU segment
        else:
            DEVICE.upload(buffer, a * 2)
    with compiled.graphs.stream_context():
        got = [DEVICE.download(r) for r in compiled.run_on_device()]
    want = gir.jit(PIECES, "h", device="interp")(*[a * 2 for a in args])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Memory: the plan knows the strided views (memplan{views=strided}, analysis/memory/aliases.py)

DEVICE_MEMORY_AT_S = {
    # model: (arena bytes, bytes outside the arena) of @<model>_grads at the examples' own
    # sizes (T=50, batch 32, input = hidden = 256, float32)
    "rnn": (5046272, 2330652),
    "gru": (18222080, 5190684),
    "lstm": (16777216, 5747740),
}
"""Device memory of a compiled training step (`fn.compiled.memory`), deterministic. Before the
plan knew the loop buffers (loop_buffers.py: a shifted carry's stack of T + 1 rows, double
buffers, claimed concats each had a buffer outside the arena and an unused arena slot): rnn
(5046336, 2330652), gru (21667904, 5194780) = 26.9 MB, lstm (18481216, 5750812) = 24.2 MB. Before the
plan knew the strided views: rnn 7.4 MB, gru 34.2 MB (22454336 + 11781148), lstm 34.1 MB
(19529792 + 14532636): the walked GEMM result, the returned gradient blocks' sources and the
packed weights each had a buffer outside the arena while the plan still reserved slots for the
slices and concats. Before the aliasing that removed the copies: gru 27.8 MB, lstm 25.4 MB."""


def _compiled_at_s(model: str, pipeline: str | None = None):  # noqa: ANN202
    """@<model>_grads compiled for the GPU at the example's own sizes (no call: device memory
    is allocated when compiling)."""
    from pathlib import Path

    from gir.driver.compile import compile_entry
    from gir.passes.pipeline import get_mode

    module = gir.load(str(Path(__file__).resolve().parent.parent / "examples" / f"{model}.gir"))
    f = module.functions[f"{model}_grads"]
    return compile_entry(module, f.name, list(f.arg_types), "gpu", pipeline or get_mode("fast-run").pipeline("gpu"))


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_device_memory_of_training_steps_at_s(model: str) -> None:
    """Pinned bytes; the sources of the strided views stay in the arena (their slots held by the
    plan), the packed weights are counted once (their concat has no slot)."""
    compiled = _compiled_at_s(model)
    memory, low = compiled.memory, compiled.lowering
    assert (memory.arena_bytes, memory.own_bytes) == DEVICE_MEMORY_AT_S[model]
    plan = memory.plan
    assert plan is not None and plan.view_rules.name == "strided"
    kept = {plan.views[r] for r in (*low.sequence_rows, *low.returned_views)}
    assert kept <= plan.slots.keys() and not kept & low.owned, "a strided view's source left the arena"
    assert all(pack.op.result not in plan.slots for pack in low.packs)
    if model != "rnn":
        assert low.sequence_rows and low.returned_views and low.packs


def test_a_plan_without_strided_views_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline whose `memplan` does not know the strided views (the CPU's plan): the lowering
    still reads the slices in place, moving their sources out of the arena, and is right."""
    from gir.passes.pipeline import get_mode

    plain = get_mode("fast-run").pipeline("cpu")
    assert plain.endswith(",memplan") and get_mode("fast-run").pipeline("gpu").endswith("memplan{views=strided}")
    rng = np.random.default_rng(6)
    for source, entry, shapes in ((SEQUENCES, "k", ((3, 2, 2), (2, 6), (2, 2))),
                                  (PIECES, "h", ((2, 3), (2, 2), (3,), (3,), (2, 3)))):
        args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for pipeline, moved in ((plain, True), (None, False)):
            fn = gir.jit(source, entry, device="gpu", pipeline=pipeline)
            _close(fn, source, entry, args)
            low = fn.compiled.lowering
            sources = {x for x, _ in (*low.sequence_rows.values(), *low.returned_views.values())}
            assert sources and (sources <= low.owned) == moved, (pipeline, sources, low.owned)


FOLDED = """\
func @s(%a: tensor<4x6xf32>, %acc: tensor<3xf32>) -> (tensor<3xf32>, tensor<4x6xf32>) {
  %t = tanh(%a)
  %c = slice %t {limits = [4, 6], starts = [0, 3]} : tensor<4x3xf32>
  %u = sum %c {axes = [0]} : tensor<3xf32>
  %big = exp(%a)
  %o = %acc + %u
  return %o, %big
}
"""
"""%c: an absorbed slice (a strided view in the plan, %t held until the sum); the sum is folded
into the kernel of %o, which runs after %big's kernel, which the plan may put in %t's block:
the folded read moves %t out of the arena."""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_folded_sum_of_a_strided_view(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    fn = gir.jit(FOLDED, "s", device="gpu")
    _close(fn, FOLDED, "s", args)
    low = fn.compiled.lowering
    assert low.folded and low.absorbed, (low.folded, low.absorbed)
