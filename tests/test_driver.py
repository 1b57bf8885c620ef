"""The one compile path (driver/compile.py): what every driver hands a backend, the
`Executable` protocol, the one specialisation cache, and arguments checked once per call."""

from __future__ import annotations

import threading
from typing import Any

import gir
import numpy as np
import pytest
from gir.driver import jit as jit_module
from gir.driver.backends import BACKENDS
from gir.driver.compile import CompileOptions, Executable, compile_entry
from gir.ir import interpreter

SOURCE = """
func @f(%x: tensor<?x3xf32>, %w: tensor<3x2xf32>) -> tensor<?x2xf32> {
  %y = matmul %x, %w : tensor<?x2xf32>
  %z = tanh %y : tensor<?x2xf32>
  return %z
}
"""


def _args(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_compile_entry_specialises_a_copy_and_gives_an_executable(device: str) -> None:
    module = gir.parse(SOURCE)
    before = str(module)
    f = module.functions["f"]
    types = [f.arg_types[0].with_shape((4, 3)), f.arg_types[1]]
    pipeline = "" if device == "interp" else "canonicalize,memplan"
    executable = compile_entry(module, "f", types, device, pipeline, CompileOptions(progress=False))
    assert isinstance(executable, Executable)  # every member of the protocol is there
    assert str(module) == before  # the module given is never changed
    assert "tensor<4x2xf32>" in executable.ir and executable.function.arg_types == types
    x, w = _args(4)
    want = gir.interpret(module, "f", x, w)[0]
    np.testing.assert_allclose(executable(x, w)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(executable.run([x, w])[0], want, rtol=1e-5, atol=1e-6)
    stats = executable.compile_stats
    assert stats is not None and stats.device == device and stats.shapes == ((4, 3), (3, 2))
    assert {"specialize", "passes"} <= set(stats.stages)
    assert executable.preparing == "" or device == "cpu"


def test_every_backend_has_a_target_key_and_an_unknown_one_is_named() -> None:
    assert set(BACKENDS) == {"cpu", "gpu", "auto", "interp"} == set(jit_module.DEVICES)
    for backend in BACKENDS.values():
        assert isinstance(backend.target_key(), tuple)
    with pytest.raises(gir.GirArgumentError, match="unknown device 'tpu'; devices: cpu, gpu, auto, interp"):
        compile_entry(gir.parse(SOURCE), "f", gir.parse(SOURCE).functions["f"].arg_types, "tpu", "")


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_arguments_are_checked_once_per_call(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """JitFunction checks them; the backend's `run` does not check again."""
    calls = []
    original = interpreter.check_arguments

    def counted(f: Any, args: Any, *rest: Any) -> Any:
        calls.append(f.name)
        return original(f, args, *rest)

    fn = gir.jit(SOURCE, "f", device=device)
    x, w = _args(5)
    fn(x, w)  # compiled now: only the call below is counted
    for module in ("gir.driver.jit", "gir.backend.cpu.runtime", "gir.ir.interpreter"):
        monkeypatch.setattr(f"{module}.check_arguments", counted)
    fn(x, w)
    assert calls == ["f"]


def test_python_jit_inspects_the_calling_threads_last_specialisation() -> None:
    """One cache class for JitFunction and PythonJit: each thread sees what it called last."""
    step = gir.jit(lambda x: gir.tanh(x) * 2.0)
    step(np.ones((2,), np.float32))
    seen: list[str] = []
    other = threading.Thread(target=lambda: (step(np.ones((3,), np.float32)), seen.append(step.ir)))
    other.start()
    other.join()
    assert "tensor<3xf32>" in seen[0] and "tensor<3xf32>" not in step.ir and "tensor<2xf32>" in step.ir
    assert step.specialisations == 2
    fn = gir.jit(SOURCE, "f", device="interp")
    fn(*_args(2))
    box: list[str] = []
    worker = threading.Thread(target=lambda: (fn(*_args(7)), box.append(fn.ir)))
    worker.start()
    worker.join()
    assert "tensor<7x2xf32>" in box[0] and "tensor<2x2xf32>" in fn.ir and len(fn._compiled) == 2


def test_static_shape_of_a_type_with_unknown_dims_is_a_located_error() -> None:
    f = gir.parse(SOURCE).functions["f"]
    assert f.arg_types[1].static_shape == (3, 2)
    with pytest.raises(gir.GirTypeError, match=r"tensor<\?x3xf32> has a `\?` dim") as info:
        f.arg_types[0].static_shape_at(f.loc)
    assert info.value.loc == f.loc


@pytest.mark.parametrize("text", ["", "// nothing\n"])
def test_a_program_without_functions_is_a_located_error(text: str) -> None:
    with pytest.raises(gir.GirArgumentError, match="defines no function"):
        gir.jit(text)


def test_a_python_function_gets_the_same_argument_checks_as_text() -> None:
    """The device and the mode/pipeline choice are checked in gir.jit for Python functions too,
    not at the first call (they had drifted: a mode and a pipeline were both accepted)."""
    with pytest.raises(gir.GirArgumentError, match="a mode or a pipeline, not both"):
        gir.jit(lambda x: x * 2.0, pipeline="ssa", mode="fast-compile")
    with pytest.raises(gir.GirArgumentError, match="unknown device 'cuda'"):
        gir.jit(lambda x: x * 2.0, device="cuda")
