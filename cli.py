"""The `gir` command: `gir opt`, `gir run` (and `gir compile` with the CPU backend).

Errors are printed as `file:line:col: error: ...` with the source line and a caret, never as
a Python traceback; the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import current
from .driver.calling import bind_arguments
from .driver.compile import CompileOptions, compile_entry, run_passes
from .driver.jitstats import CompileStats
from .driver.results import result_names
from .errors import GirArgumentError, GirError, Location, did_you_mean, source_text
from .frontend.parser import decode_source, parse
from .frontend.parser import load as load_file
from .ir.core import Function, Module
from .ir.gcpause import gc_paused, skip_final_collection
from .ir.interpreter import check_arguments, random_inputs
from .ir.printer import print_module
from .ir.types import TensorType
from .passes.pass_manager import DebugOptions, Report
from .passes.pipeline import DEFAULT_MODE, DEFAULT_PIPELINE, MODES, get_mode, parse_bytes, with_memory_budget
from .support import timing

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
"""How an .npy file and a zip archive (an .npz, or an empty one) start."""


def load_inputs(f: Function, path: str) -> list[np.ndarray]:
    try:
        with open(path, "rb") as file:
            magic = file.read(6)
        if not magic.startswith((NPY_MAGIC, *ZIP_MAGICS)):  # np.load would call it pickled data
            raise GirArgumentError(f"cannot read inputs from {path}: it is not an .npz archive with one array "
                                   "per parameter (np.savez)")
        data = np.load(path)
    except (OSError, ValueError, EOFError) as e:
        raise GirArgumentError(f"cannot read inputs from {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise GirArgumentError(f"cannot read inputs from {path}: it is a single array, not an .npz archive with "
                               "one array per parameter (np.savez)")
    out = []
    with data:
        for arg in f.args:
            key = arg.name_hint or ""
            if key not in data:
                raise GirArgumentError(f"{path} has no array named '{key}' for argument %{key} of @{f.name}; it "
                                       "has " + ", ".join(sorted(data.keys())), f.loc)
            try:  # an NpzFile reads each array when it is asked for
                array = data[key]
            except (OSError, ValueError, EOFError) as e:
                raise GirArgumentError(f"cannot read array '{key}' from {path}: {e}") from None
            if not isinstance(array, np.ndarray):  # a member that is not an .npy file reads as bytes
                raise GirArgumentError(f"cannot read array '{key}' from {path}: {key}.npy is not a NumPy array")
            out.append(array)
    return out


def cannot_write(path: str, e: OSError) -> GirArgumentError:
    return GirArgumentError(f"cannot write {path}: {e.strerror or e}")


def load(path: str) -> Module:
    """The module in FILE; `-` reads standard input, as mlir-opt does."""
    if path == "-":
        return parse(decode_source(sys.stdin.buffer.read(), "<stdin>"), filename="<stdin>")
    return load_file(path)


def check_seed(flag: str, seed: int | None) -> None:
    """NumPy's generators take seeds >= 0 only."""
    if seed is not None and seed < 0:
        raise GirArgumentError(f"{flag}: a seed must be >= 0, got {seed}")


def summarize(name: str, a: np.ndarray) -> str:
    flat = a.reshape(-1)[:4]
    values = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat)
    more = ", ..." if a.size > 4 else ""
    return f"{name}: shape {tuple(a.shape)} {a.dtype} [{values}{more}]"


def entry_of(module: Module, name: str | None) -> Function:
    if not module.functions:
        raise GirArgumentError(f"{module.filename} defines no function")
    if name is None:
        return list(module.functions.values())[-1]
    name = name.lstrip("@")
    if name not in module.functions:
        raise GirArgumentError(f"no function @{name} in {module.filename}; it has "
                               + ", ".join("@" + n for n in module.functions)
                               + did_you_mean(name, module.functions, prefix="@"), Location(module.filename, 1, 1))
    return module.functions[name]


def debug_options(args: argparse.Namespace, input_text: str | None = None,
                  input_verified: bool = False) -> DebugOptions:
    """The pass manager's options from the debugging flags. input_text: the text the module was
    parsed from, unchanged since (its reproducers replay from it)."""
    seed = getattr(args, "check_numerics", None)
    check_seed("--check-numerics", seed)
    return DebugOptions(
        verify_each=not getattr(args, "no_verify_each", False),
        print_ir_before=frozenset(getattr(args, "print_ir_before", None) or ()),
        print_ir_after=frozenset(getattr(args, "print_ir_after", None) or ()),
        print_ir_after_all=getattr(args, "print_ir_after_all", False),
        print_ir_after_change=getattr(args, "print_ir_after_change", False),
        print_ir_after_failure=getattr(args, "print_ir_after_failure", False),
        print_locations=getattr(args, "print_locations", False),
        dump_dir=getattr(args, "dump_dir", None),
        check_numerics=seed,
        input_verified=input_verified,
        input_text=input_text,
        reproducer=True,
        reproducer_dir=getattr(args, "reproducer_dir", None),
        reparse=parse,
    )


def report_pipeline(args: argparse.Namespace, report: Report) -> None:
    """--timing (the table of passes) and --stats-json, after a pipeline has run."""
    if getattr(args, "timing", False):
        sys.stderr.write(report.timing_table())
    if getattr(args, "stats_json", None):
        try:
            with open(args.stats_json, "w", encoding="utf-8") as f:
                json.dump(report.as_dict(), f, indent=2)
                f.write("\n")
        except OSError as e:
            raise cannot_write(args.stats_json, e) from None


def compile_options(args: argparse.Namespace, module: Module, f: Function, types: Sequence[TensorType],
                    tiered: bool | None = None) -> CompileOptions:
    """`compile_entry`'s options for `gir run` and `gir compile`: the debugging flags, and
    --timing's table once the pipeline has run."""
    unchanged = list(types) == list(f.arg_types)  # else the passes see a specialised copy, not the text
    debug = debug_options(args, source_text(module.filename) if unchanged else None)
    return CompileOptions(tiered=tiered, debug=debug, on_report=lambda report: report_pipeline(args, report))


def opt_pipeline(args: argparse.Namespace) -> str:
    """-p, else --mode's whole pipeline as device="auto" compiles it (placed), else the default;
    with --memory-budget, made to fit it (passes/pipeline.py with_memory_budget)."""
    if args.mode is not None:
        if args.pipeline is not None:
            raise GirArgumentError("give -p or --mode, not both")
        return budgeted(args, get_mode(args.mode).pipeline("auto"))
    return budgeted(args, args.pipeline if args.pipeline is not None else DEFAULT_PIPELINE)


def budgeted(args: argparse.Namespace, pipeline: str) -> str:
    """pipeline with --memory-budget's checkpointing, when the flag is given."""
    budget = parse_bytes(getattr(args, "memory_budget", None))
    return with_memory_budget(pipeline, budget) if budget is not None else pipeline


def cmd_opt(args: argparse.Namespace) -> int:
    skip_final_collection()  # ir/gcpause.py: a short process building a large IR
    with gc_paused():
        return _opt(args)


def _opt(args: argparse.Namespace) -> int:
    module = load(args.file)
    debug = debug_options(args, source_text(module.filename), input_verified=True)  # the parser's, unchanged
    report = run_passes(module, opt_pipeline(args), debug)
    report_pipeline(args, report)
    if args.placement_report:
        from .analysis.placement import placement_reports

        sys.stderr.write(placement_reports(report.analyses))
    if args.cpu_schedule:
        sys.stderr.write(_cpu_schedules(module, report.analyses))
    if args.memplan_report or args.memplan_plot:
        from .analysis.memory.plan import MemoryPlan
        from .driver.reporting import checkpoint_report, memplan_reports, peaks_before_checkpointing, plot_plans
        from .transforms.checkpoint import checkpoint_decisions
        from .transforms.memplan import plan_module

        # The pipeline's plans when it ended with `memplan{...}` (its options), else default plans.
        plans = report.analyses.all(MemoryPlan) or plan_module(module)
        if args.memplan_report:
            sys.stderr.write(checkpoint_report(checkpoint_decisions(report.records)))
            sys.stderr.write(memplan_reports(plans))
        if args.memplan_plot:
            try:
                plot_plans(plans, args.memplan_plot, peaks_before_checkpointing(checkpoint_decisions(report.records)))
            except OSError as e:
                raise cannot_write(args.memplan_plot, e) from None
    with timing.phase("print IR (output)"):
        text = print_module(module, print_locations=args.print_locations)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise cannot_write(args.output, e) from None
    else:
        sys.stdout.write(text)
    return 0


def _cpu_schedules(module: Module, analyses: Any) -> str:
    """`--cpu-schedule`: the CPU backend's schedule of each function of the module as the pipeline
    left it (its memory plan where the pipeline made one), from this machine's measurements
    now; nothing is measured or queued (GIR_GEMM_MEASURE=now measures what is missing)."""
    from .analysis.memory.plan import MemoryPlan
    from .backend.cpu import snapshot
    from .backend.cpu.schedule import plan
    from .config import current

    plans = {p.function: p for p in analyses.all(MemoryPlan)}
    out = []
    for f in module.functions.values():
        measured, _ = snapshot.take(f, current())
        out.append(plan(f, plans.get(f), measured, current()).format())
    return "".join(out)


def cmd_run(args: argparse.Namespace) -> int:
    from .driver.jit import usable_device
    from .driver.shapes import entry_types

    check_seed("--random", args.random)
    if args.repeat < 1:
        raise GirArgumentError(f"--repeat: run at least once, got {args.repeat}")
    mode = get_mode(args.mode or DEFAULT_MODE)
    args.device = usable_device(args.device)  # auto without a GPU: the CPU
    cached = _cached_runner(args, mode)
    run: Callable[..., Sequence[np.ndarray]]
    if cached is not None:  # the compile cache may skip parsing, the passes and LLVM
        f: Function = cached.signature
        names = list(cached.result_names)
        inputs = check_arguments(f, bind_arguments(f, load_inputs(f, args.inputs), {})) if args.inputs else None
        run = cached
        compile_stats: Callable[[], CompileStats | None] = lambda: cached.stats.compile  # read after the call
        call_stats: Callable[[], Any] = lambda: cached.stats
        if inputs is None:
            inputs = random_inputs(f, args.random if args.random is not None else 0)
    else:
        module = load(args.file)
        f = entry_of(module, args.entry)
        names = list(result_names(f))  # as written: passes rename values
        # The arrays follow gir.jit's calling convention (driver/calling.py): exact widening only.
        inputs = check_arguments(f, bind_arguments(f, load_inputs(f, args.inputs), {})) if args.inputs else None
        # `?` dims are fixed before any pass (autodiff needs static shapes): by the inputs, or by --shape.
        types = entry_types(f, args.shape, inputs, None if inputs else "random inputs (--random)")
        front = budgeted(args, args.pipeline if args.pipeline is not None else mode.front)
        backend = mode.backend_pipeline(args.device) if args.device != "interp" else ""  # interp: the front only
        executable = compile_entry(module, f.name, types, args.device, ",".join(p for p in (front, backend) if p),
                                   compile_options(args, module, f, types))
        run = executable
        compile_stats = lambda: executable.compile_stats  # noqa: E731
        call_stats = lambda: executable.stats  # noqa: E731
        if inputs is None:
            inputs = random_inputs(executable.function, args.random if args.random is not None else 0)
    results = run(*inputs)
    compiled = compile_stats() if args.verbose else None
    if compiled is not None:
        print(compiled.describe(), file=sys.stderr)
        if args.device == "cpu":
            print(_blas_line(compiled.gemms), file=sys.stderr)
    if args.verbose and args.device == "auto":
        _describe_split(run)
    times = []
    if args.repeat > 1:
        _wait_for_final_code()  # time the -O3 code, not the quick code of tiered compilation
    slow: list[str] = []
    for _ in range(max(0, args.repeat - 1)):
        start = time.perf_counter()
        run(*inputs)
        times.append(time.perf_counter() - start)
        note = _slow_note(call_stats())
        if note:
            slow.append(note)
    if args.verbose:
        _print_steady_notes(call_stats(), slow, len(times))
    print(f"@{f.name} on {args.device}:")
    for name, a in zip(names, results):
        print(summarize(name, a))
    if times:
        print(f"median of {len(times)} repeated runs: {sorted(times)[len(times) // 2] * 1e3:.3f} ms ({args.device})")
    if args.outputs:
        save_outputs(args.outputs, names, results)
    _wait_for_final_code()  # the -O3 code reaches the compile cache: the next `gir run` is a hit
    return 0


def _describe_split(run: Any) -> None:
    """`gir run -v --device auto`: the split's segments and the transfers the call executed."""
    from .backend.split import SplitFunction

    if isinstance(run, SplitFunction):
        sys.stderr.write(run.describe())
        stats = run.stats
        print(f"transfers executed: {stats.h2d} h2d ({stats.h2d_bytes} bytes), {stats.d2h} d2h "
              f"({stats.d2h_bytes} bytes)", file=sys.stderr)


def _blas_line(gemms: Sequence[Any]) -> str:
    """`-v`'s BLAS line: the providers this function's GEMMs call (not what is installed), and
    why MKL is not among them where it is not there to choose."""
    from .backend.cpu.blas import provider_of, providers

    called = sorted({provider_of(g.path) for g in gemms})
    notice = providers().notice
    return (f"BLAS: the code calls {', '.join(called) if called else 'none (no matrix product)'}"
            + (f" ({notice})" if notice else ""))


def _wait_for_final_code() -> None:
    """Tiered compilation (backend/cpu/tiers.py): waits for the background -O3 compiles."""
    tiers = sys.modules.get(f"{__package__}.backend.cpu.tiers")  # not imported: nothing compiled for the CPU
    if tiers is not None:
        tiers.wait_all()


def save_outputs(path: str, names: Sequence[str], results: Sequence[np.ndarray]) -> None:
    """An .npz with out0, out1, ... and, beside them, each result under its name where it has one."""
    arrays: dict[str, Any] = {f"out{i}": a for i, a in enumerate(results)}  # numpy's stub: a kwarg may be allow_pickle
    arrays.update({name: a for name, a in zip(names, results) if name not in arrays})
    try:
        np.savez(path, **arrays)
    except OSError as e:
        raise cannot_write(path, e) from None


def _cpu_stats(stats: Any) -> Any:
    """The CPU backend's call statistics (backend/cpu/runtime.py `Stats`), None for another backend."""
    from .backend.cpu.runtime import Stats

    return stats if isinstance(stats, Stats) else None


def _slow_note(stats: Any) -> str:
    """The last call's note when it ran much slower than its quiet time (`Stats.slow_note`), ''
    otherwise or off the CPU."""
    cpu = _cpu_stats(stats)
    return cpu.slow_note() if cpu is not None else ""


def _print_steady_notes(stats: Any, slow: list[str], calls: int) -> None:
    """`-v`: background work still pending (GEMM measurements, better code), and the calls
    that ran slower than their quiet time with what competed (docs/performance.md, "Performance
    on a shared machine")."""
    cpu = _cpu_stats(stats)
    if cpu is not None and cpu.background:
        print("background work pending: " + "; ".join(cpu.background), file=sys.stderr)
    if slow:
        print(f"{len(slow)} of {calls} repeated calls ran slower than their quiet time; first: {slow[0]}",
              file=sys.stderr)
    threads = cpu.blas_threads if cpu is not None else ""
    if threads and threads != "all threads":
        print(f"BLAS threads now: {threads}", file=sys.stderr)


def _cached_runner(args: argparse.Namespace, mode: Any) -> Any:
    """`gir run` on the CPU of a file with static shapes (or --inputs) and without the pass
    manager's debugging flags is `gir.jit` of the file, so the compile cache can skip parsing,
    the passes and LLVM; None when the run needs the pass manager's own run."""
    if args.device != "cpu" or getattr(args, "stats_json", None) or args.shape or args.file == "-":
        return None
    from .driver.jit import jit

    front = budgeted(args, args.pipeline if args.pipeline is not None else mode.front)
    fn = jit(Path(args.file), args.entry, "cpu", ",".join(p for p in (front, mode.backend_pipeline("cpu")) if p))
    if args.inputs is None and not all(t.is_static for t in fn.signature.arg_types):
        return None  # --random needs --shape: the pass manager's path says which
    return fn


def cmd_compile(args: argparse.Namespace) -> int:
    from .backend.cpu.llvm_jit import target_machine
    from .backend.cpu.runtime import CPUFunction
    from .driver.shapes import entry_types

    module = load(args.file)
    f = entry_of(module, args.entry)
    types = entry_types(f, args.shape, None, "gir compile")
    pipeline = get_mode(args.mode or DEFAULT_MODE).pipeline("cpu")
    compiled = compile_entry(module, f.name, types, "cpu", pipeline,
                             compile_options(args, module, f, types, tiered=False))  # files get -O3 code
    assert isinstance(compiled, CPUFunction)  # the cpu target's Executable: its optimised IR and object
    if args.emit == "llvm":
        data: str | bytes = compiled.optimized_ir
    elif args.emit == "asm":
        data = compiled.asm
    else:
        import llvmlite.binding as llvm

        data = target_machine().emit_object(llvm.parse_assembly(compiled.optimized_ir))
    try:
        with open(args.output, "wb" if isinstance(data, bytes) else "w") as out:
            out.write(data)
    except OSError as e:
        raise GirArgumentError(f"cannot write {args.output}: {e.strerror or e}") from None
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from .support import cache

    if args.action == "clear":
        print(f"removed {cache.clear()} files from {cache.cache_root()}")
    else:
        sys.stdout.write(cache.info().text())
    return 0


def add_pipeline_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--pipeline", help=f"comma-separated passes, options as name{{key=value}} "
                   f"(default: {DEFAULT_PIPELINE}; '' runs none)")
    p.add_argument("--no-verify-each", action="store_true", help="do not verify the IR after every pass")
    p.add_argument("--print-ir-before", action="append", metavar="PASS", help="print the IR before PASS")
    p.add_argument("--print-ir-after", action="append", metavar="PASS", help="print the IR after PASS")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--print-ir-after-change", action="store_true", help="print the IR after passes that changed it")
    p.add_argument("--print-ir-after-failure", action="store_true", help="print the IR after a pass that failed")
    p.add_argument("--dump-dir", metavar="DIR", help="write 00-input.gir, 01-<pass>.gir, ... into DIR")
    p.add_argument("--timing", action="store_true", help="print time per pass and per rewrite pattern")
    p.add_argument("--stats-json", metavar="OUT.json", help="write timing, pattern counts and op counts as JSON")
    p.add_argument(_SEED_FLAG, nargs="?", const=0, type=int, metavar="SEED",
                   help="run the interpreter before and after every pass on seeded inputs (--check-numerics=SEED; "
                        "seed 0 when not given); stop at the first pass that changes a result")
    p.add_argument("--reproducer-dir", metavar="DIR",
                   help="where a failing pass writes its reproducer (default: the dump dir or the temp dir)")


def add_budget_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-budget", metavar="BYTES",
                   help="bytes the planned peak should fit (e.g. 256MB, 1GB, or an integer): backward scans whose "
                        "residuals do not fit are checkpointed, recomputing the forward steps segment by segment "
                        "(the checkpoint pass; docs/memplan.md)")


def add_shape_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", metavar="NAME=DIMS",
                   help="the shape of parameter NAME, e.g. xs=50x32x256 (fixes its `?` dims; a `?` written here "
                        "stays unknown); repeat it or separate with commas: xs=5x2x3,h0=2x3")
def add_mode_flag(p: argparse.ArgumentParser, what: str) -> None:
    modes = "; ".join(f"{m.name} gives up {m.gives_up}" for m in MODES.values())
    p.add_argument("--mode", metavar="MODE", help=f"compile mode ({', '.join(MODES)}; default {DEFAULT_MODE}): "
                   f"{what}. {modes}".replace("%", "%%"))


def build_parser() -> argparse.ArgumentParser:
    from .version import __version__

    p = argparse.ArgumentParser(prog="gir", description="gir: a compiler for tensor programs with loops")
    p.add_argument("--version", action="version", version=f"gir {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("opt", help="parse, verify, transform and print a .gir file")
    opt.add_argument("file", help="a .gir file, or - for standard input")
    opt.add_argument("-o", "--output", help="write the IR here instead of stdout")
    opt.add_argument("--print-locations", action="store_true", help="print loc(...) on every op")
    opt.add_argument("--cpu-schedule", action="store_true",
                     help="print the CPU backend's schedule of each function (BLAS family, GEMM paths, packed weights, "
                          "split loops, two-core windows, with reasons; docs/backend.md) to stderr")
    opt.add_argument("--memplan-report", action="store_true",
                     help="after the passes, print each function's memory plan, a row per value, to stderr")
    opt.add_argument("--memplan-plot", metavar="FILE.png",
                     help="after the passes, draw the memory plans (needs matplotlib: pip install 'gir[plot]')")
    opt.add_argument("--placement-report", action="store_true",
                     help="after the passes, print where the place pass put each op and why, and the transfers, "
                          "to stderr")
    add_pipeline_flags(opt)
    add_budget_flag(opt)
    add_mode_flag(opt, "run the mode's whole pipeline, placed as --device auto compiles it, instead of the "
                       "default pipeline; not with -p")
    opt.set_defaults(func=cmd_opt)

    run = sub.add_parser("run", help="run a function of a .gir file")
    run.add_argument("file", help="a .gir file, or - for standard input")
    run.add_argument("-e", "--entry", help="function to run (default: the last one)")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--inputs", help=".npz with one array per parameter name (without %%)")
    src.add_argument("--random", type=int, metavar="SEED", help="seeded random inputs (the default, seed 0)")
    run.add_argument("--outputs", help="save results as out0, out1, ... in this .npz (and by name beside them)")
    add_shape_flag(run)
    run.add_argument("--device", choices=["cpu", "gpu", "auto", "interp"], default="cpu",
                     help="cpu: compiled with llvmlite (default); gpu: numba.cuda kernels and CuPy (the CUDA "
                          "simulator under NUMBA_ENABLE_CUDASIM=1); auto: placed by the place pass and run split "
                          "between the two (-v prints the split and the transfers); interp: the NumPy reference "
                          "interpreter")
    run.add_argument("--repeat", type=int, default=1, metavar="N", help="run N times and print the median time")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="say how the entry was compiled (time per stage, code cache hit or miss, BLAS threads, "
                          "the GEMM path of each product) and which BLAS providers the CPU backend uses")
    run.add_argument("-p", "--pipeline", help="passes to run first, instead of the mode's (fast-run: "
                     f"{DEFAULT_PIPELINE})")
    add_mode_flag(run, "the passes before the backend's and the backend's own (with --device auto, the place "
                       "policy)")
    run.add_argument("--timing", action="store_true", help="print the pass timing report to stderr")
    add_budget_flag(run)
    run.set_defaults(func=cmd_run)
    comp = sub.add_parser("compile", help="compile a function for the CPU and write LLVM IR, assembly or an object")
    comp.add_argument("file", help="a .gir file, or - for standard input")
    comp.add_argument("-e", "--entry", help="function to compile (default: the last one)")
    comp.add_argument("--emit", choices=["llvm", "asm", "obj"], required=True)
    comp.add_argument("-o", "--output", required=True)
    add_shape_flag(comp)
    add_mode_flag(comp, "the pipeline run before compiling")
    comp.set_defaults(func=cmd_compile)
    cache = sub.add_parser("cache", help="show or empty the compile cache (GIR_CACHE_DIR, default ~/.cache/gir)")
    cache.add_argument("action", choices=["info", "clear"])
    cache.set_defaults(func=cmd_cache)
    return p


_SEED_FLAG = "--check-numerics"


def seed_only_after_equals(argv: Sequence[str]) -> list[str]:
    """`--check-numerics[=SEED]` takes its seed only after `=`: a bare flag becomes
    `--check-numerics=0`, so the word after it is never read as its seed (`gir opt
    --check-numerics model.gir` took model.gir for the seed: argparse's optional value, nargs='?',
    consumes the next word). The flag's abbreviations (`--check`) are rewritten too."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        bare = len(arg) >= len("--ch") and "=" not in arg and _SEED_FLAG.startswith(arg)
        out.append(f"{_SEED_FLAG}=0" if bare else arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(seed_only_after_equals(sys.argv[1:] if argv is None else argv))
    try:
        if getattr(args, "timing", False):  # one tree: parse, passes, verify, print, backend, LLVM, cache
            with timing.collect(f"gir {args.command}") as root:
                code = args.func(args)
            sys.stderr.write(root.tree())
            return code
        return args.func(args)
    except GirError as e:
        if current().traceback and e.__cause__ is not None and not isinstance(e.__cause__, GirError):
            # A pass crashed (a bug in gir, reported as a located GirPassError with a
            # reproducer): show the crash's traceback too, as for any other internal error.
            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(e, file=sys.stderr)
        return 1
    except RecursionError:
        print("error: the program is nested too deeply", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gir opt FILE | head`: the reader left; not an error of ours
        # Point stdout at devnull, or Python's flush at exit fails again and prints
        # "Exception ignored" (the recipe in the docs of the signal module).
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (captured by a test)
            pass
        return 0
    except Exception as e:  # a bug in gir, not in the program: say so, without a traceback
        if current().traceback:
            raise
        print(f"gir: internal error: {type(e).__name__}: {e}\n(this is a bug in gir; run with GIR_TRACEBACK=1 "
              "for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
