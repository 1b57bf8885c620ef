"""LLVM's part of the CPU backend: lowering to LLVM IR (lower/), LLVM's passes, emitting an
object, and loading one with LLVM's JIT linker. Imported only when something is compiled or
a cached object cannot be loaded as a shared library: a compile-cache hit runs without
loading LLVM (runtime.py, native.py)."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

import llvmlite.binding as llvm
from llvmlite.binding.ffi import ObjectRef
from llvmlite.binding.newpassmanagers import NewPassManager

from ...analysis.lengths import LengthDims
from ...analysis.memory.plan import MemoryPlan
from ...config import current
from ...ir.core import Function
from ...support import cache as disk
from ...support import timing
from . import blas, snapshot, tiers
from .code import Code, CompileInfo, cache_key, has_worker, host, opt_level, target_key
from .layout import Layout
from .lower import lower_function
from .schedule import CpuSchedule


def new_target_machine(opt: int | None = None) -> llvm.TargetMachine:
    """The host CPU with all its features. An execution engine takes ownership of the target
    machine it is given, so every engine gets a machine of its own. Position-independent code:
    the final code's object is also linked into a shared library (native.py)."""
    cpu, features = host()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=opt_level() if opt is None else opt,
                                        reloc="pic", codemodel="jitdefault")


@cache
def _target_machine(opt: int) -> llvm.TargetMachine:
    return new_target_machine(opt)


def target_machine() -> llvm.TargetMachine:
    """A machine for optimising and printing assembly; never handed to an engine."""
    return _target_machine(opt_level())


def optimize(mod: llvm.ModuleRef, opt: int | None = None, tm: llvm.TargetMachine | None = None) -> None:
    """LLVM's -O<opt> pipeline; tm: a target machine of the caller's own (another thread)."""
    opt = opt_level() if opt is None else opt
    if opt == 0:
        return
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pb = llvm.create_pass_builder(tm if tm is not None else _target_machine(opt), pto)
    run_and_free(pb.getModulePassManager(), mod, pb)


def optimize_quick(mod: llvm.ModuleRef) -> None:
    """The quick tier's passes (tiers.QUICK_PASSES): values in registers instead of stack
    slots, then instcombine and simplifycfg; no loop passes, no vectorisation."""
    if tiers.QUICK_PASSES == "none":
        return
    pb = llvm.create_pass_builder(_target_machine(tiers.QUICK_CODEGEN), llvm.create_pipeline_tuning_options(0))
    pm = llvm.create_new_module_pass_manager()
    pm.add_sroa_pass()
    pm.add_instruction_combine_pass()
    pm.add_simplify_cfg_pass()
    run_and_free(pm, mod, pb)


def run_and_free(pm: Any, mod: llvm.ModuleRef, pb: Any) -> None:
    """Runs a pass manager of llvmlite's new pass manager API on mod, then frees it.

    llvmlite (0.44 to 0.50 at least) never frees a pass manager: `ModulePassManager` derives
    from `ObjectRef` before `NewPassManager`, so the `_dispose` that `close()` and `__del__`
    call is ObjectRef's no-op, not NewPassManager's, and every -O3 pipeline built (its few
    hundred pass objects and their state) stayed in native memory: about 0.78 MB per compiled
    program (docs/reliability.md). Here the right `_dispose` is called by name, once, and the
    object detached so that nothing disposes it again. Where llvmlite's own `close()` does free
    it (a fixed MRO), that is called instead. A pass manager, and a pass builder, are not
    reused: llvmlite's run registers instrumentation callbacks into the builder that point into
    the run's stack frame."""
    try:
        pm.run(mod, pb)
    finally:
        if type(pm)._dispose is ObjectRef._dispose and isinstance(pm, NewPassManager):
            NewPassManager._dispose(pm)
            pm.detach()
        else:
            pm.close()


def compile_code(function: Function, plan: MemoryPlan | None = None, tiered: bool | None = None,
                 best: bool = False, lengths: LengthDims | None = None) -> Code:
    """Lowers function to LLVM, optimises and emits an object: or loads the object of the same
    function (printed after the passes) from the object cache. tiered (default: tiers.enabled())
    and a miss: quick code now, and the -O3 compile as `code.final` (tiers.py; CPUFunction
    queues it). An object whose GEMM paths came from the model, measured since, is used all the
    same, its better code made in the background as its `final`; best: compiled again instead
    (what that background job does). lengths: code for every length (analysis/lengths.py)."""
    key = cache_key(function, plan, lengths)
    tiers.wait_for_key(key)
    with timing.phase("cache: object lookup"):
        found = disk.load("objects", key) if disk.enabled() else None
    if found is not None:
        try:
            code = Code.from_entry(found[0], found[1], "objects")
        except (KeyError, TypeError, ValueError, AttributeError):
            code = None  # another format: compile again
        if code is not None and not code.stale():
            return code
        if code is not None and not best:
            root: str | None = disk.cache_root()
            switches = target_key()
            # a schedule of its own, from the measurements of when it runs
            make = lambda: _final_code(*_lowered(function, plan, switches, None, lengths), key, root)  # noqa: E731
            code.final = tiers.FinalCompile(make, key, what="code with the measured GEMM paths")
            return code
    t0 = time.perf_counter()
    tiered = tiers.enabled() if tiered is None else tiered
    with timing.phase("backend: schedule"):
        schedule = snapshot.schedule(function, plan, current())
    with timing.phase("backend: lower to LLVM IR"):
        module, layout = lower_function(function, plan, schedule, quick=tiered, lengths=lengths)
        llvm_ir = str(module)
    lower = time.perf_counter() - t0
    if best:  # a background job (better code for a cache hit): LLVM in a process of its own, as -O3's tier
        code = _final_code(llvm_ir, layout, key, disk.cache_root() if disk.enabled() else None)
        code.info.seconds["lower"] = lower
        return code
    if not tiered:
        code = _llvm_compile(llvm_ir, layout, opt_level(), lower)
        if disk.enabled():
            with timing.phase("cache: store"):
                disk.store("objects", key, *code.to_entry())
        return code
    code = _llvm_compile(llvm_ir, layout, -1, lower)
    # queued by CPUFunction once the quick code is loaded: llvmlite serialises every LLVM call
    # with one lock, so loading it while the background holds that lock would wait for -O3
    root = disk.cache_root() if disk.enabled() else None  # the cache this compile looked up, for its -O3 object
    if schedule.quick_differs:  # the -O3 code takes gir-packed where the quick code did not
        switches = target_key()  # the environment `key` was made in: the job lowers under it or not at all
        job = lambda: _final_code(*_lowered(function, plan, switches, schedule, lengths), key, root)  # noqa: E731
    else:
        job = lambda: _final_code(llvm_ir, layout, key, root)  # noqa: E731
    code.final = tiers.FinalCompile(job, key if root else None)
    return code


def _lowered(function: Function, plan: MemoryPlan | None, switches: tuple,
             schedule: CpuSchedule | None, lengths: LengthDims | None = None) -> tuple[str, Layout]:
    """function lowered for the -O3 tier (on the background thread: the IR is not changed once
    compiled), by the quick code's schedule, or (None: code whose GEMM paths were measured
    since) a new one from the measurements of now. The schedule step reads the GIR_* switches
    of target_key (GIR_PACKED_GEMM, GIR_CPU_OVERLAP, ...) and the cache key was made under them:
    if one changed since the quick compile (the job may wait behind others), code lowered now
    would go into the caches under the key of another environment, so none is made (the quick
    code keeps running; CPUFunction.final_error says why)."""
    if target_key() != switches:
        raise RuntimeError("a switch of the cache key (GIR_*, BLAS threads) changed between the quick compile and "
                           "its -O3 job: the final code is not lowered under another environment")
    if schedule is None:
        schedule = snapshot.schedule(function, plan, current())
    module, layout = lower_function(function, plan, schedule, lengths=lengths)
    return str(module), layout


def parse_own(llvm_ir: str) -> llvm.ModuleRef:
    """llvm_ir parsed into an LLVM context of its own, freed with the module. In LLVM's global
    context every compile left its uniqued constants, types and names behind for the life of
    the process (about 3 KB per compile of a small function: each shape has constants of its
    own; docs/reliability.md)."""
    return llvm.parse_assembly(llvm_ir, context=llvm.create_context())


def _llvm_compile(llvm_ir: str, layout: Layout, opt: int, lower: float) -> Code:
    """Parses, optimises (opt -1: the quick tier) and emits llvm_ir (a context of its own)."""
    t1 = time.perf_counter()
    with timing.phase("LLVM: parse and verify"):
        mod = parse_own(llvm_ir)
        mod.verify()
    t2, c2 = time.perf_counter(), time.thread_time()
    with timing.phase(f"LLVM: optimise (-O{opt})" if opt >= 0 else "LLVM: optimise (quick tier)"):
        optimize_quick(mod) if opt < 0 else optimize(mod, opt)
        optimized_ir = str(mod)
    t3, c3 = time.perf_counter(), time.thread_time()
    with timing.phase("LLVM: emit object"):
        obj = _target_machine(tiers.QUICK_CODEGEN if opt < 0 else opt).emit_object(mod)
    t4, c4 = time.perf_counter(), time.thread_time()
    seconds = {"lower": lower, "llvm_parse": t2 - t1, "llvm_opt": t3 - t2, "llvm_emit": t4 - t3,
               "llvm_opt_cpu": c3 - c2, "llvm_emit_cpu": c4 - c3}
    info = CompileInfo(max(opt, 0), "", seconds, layout.measured, "quick" if opt < 0 else "")
    return Code(obj, layout, optimized_ir, llvm_ir, info)


def _final_code(llvm_ir: str, layout: Layout, key: str, root: str | None) -> Code:
    """The -O3 code of llvm_ir, on the background thread, compiled by a process of its own
    (tiers.compile_in_child: no LLVM lock of this process is held meanwhile, so a quick compile
    of another shape never waits behind it); stored in the object cache of folder root (None:
    not stored), the one the compile looked up, wherever GIR_CACHE_DIR points when the job ends."""
    opt = opt_level()
    cpu, features = host()
    try:
        optimized_ir, obj, seconds = tiers.compile_in_child(llvm_ir, cpu, features, opt)
    except tiers.NoChild:
        optimized_ir, obj, seconds = _compile_here(llvm_ir, opt)
    seconds = {**seconds, "llvm_opt_cpu": seconds["llvm_opt"], "llvm_emit_cpu": seconds["llvm_emit"]}
    # CPU seconds of the child (its wall clock is shared, at nice 19)
    code = Code(obj, layout, optimized_ir, llvm_ir, CompileInfo(opt, "", seconds, layout.measured, "final"))
    if root is not None:
        disk.store("objects", key, *code.to_entry(), root=root)
    return code


def _compile_here(llvm_ir: str, opt: int) -> tuple[str, bytes, dict[str, float]]:
    """-O<opt> of llvm_ir in this process, where no process could be started for it: a target
    machine and an LLVM context of its own (llvmlite's lock: other compiles wait meanwhile)."""
    tm = new_target_machine(opt)
    c0 = time.thread_time()
    mod = parse_own(llvm_ir)
    mod.verify()
    c1 = time.thread_time()
    optimize(mod, opt, tm)
    optimized_ir = str(mod)
    c2 = time.thread_time()
    if tiers.stopping():
        raise RuntimeError("process exiting")
    obj = tm.emit_object(mod)
    return optimized_ir, obj, {"llvm_parse": c1 - c0, "llvm_opt": c2 - c1, "llvm_emit": time.thread_time() - c2}


def load_object(code: Code) -> tuple[Any, Any, Any]:
    """Links code's object into this process with LLVM's JIT linker: (engine, gir_main, gir_worker
    or None); the engine owns the code, so it lives as long as a call holds it. Its module is
    empty and in the global context: it uniques nothing there, and a context of its own would
    be freed before the engine's module (llvmlite drops an engine's modules, and with them their
    contexts, before disposing of the engine)."""
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(code.obj))
    engine.finalize_object()
    worker = engine.get_function_address("gir_worker") if has_worker(code.layout) else None
    return engine, engine.get_function_address("gir_main"), worker


def assembly(code: Code) -> str:
    """The host assembly of code's optimised LLVM IR (as costly as compiling it)."""
    opt = tiers.QUICK_CODEGEN if code.info.tier == "quick" else code.info.opt_level
    return _target_machine(opt).emit_assembly(parse_own(code.optimized_ir))


def packed_caller(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool,
                  a: Any, b: Any, c: Any) -> Any:
    """blas.gemm_caller's `gir-packed` (registered with blas below: blas.py is the floor under
    this one and imports no LLVM): the weight packed once (not timed), each call run as compiled
    code runs it: on both threads through OpenBLAS's blas_level1_thread when its pool and
    setting have two, else on this thread (packed_gemm.py, lower/two_core.py `_Split.dispatch`)."""
    import ctypes

    import numpy as np

    from . import packed_gemm, team

    entry = team.level1_entry()
    shape = packed_gemm.Shape(dtype, m, n, k, ta, tb)
    engine, pack, task = packed_functions(shape, entry[2] if entry is not None else 1)
    packed = np.zeros(shape.packed_bytes // c.itemsize, c.dtype)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(pack)(
        b.ctypes.data, packed.ctypes.data, n, k)
    args = (ctypes.c_int64 * packed_gemm.TASK_ARGS)(c.ctypes.data, a.ctypes.data, packed.ctypes.data)
    long = ctypes.c_int64
    blocks = shape.blocks
    keep = (engine, packed, args, a, c)
    if entry is None or blocks < 2 or team.cpu_number() < 2:
        alone = ctypes.CFUNCTYPE(None, long, long, long, ctypes.c_void_p, long, ctypes.c_void_p)(task)
        return lambda: (alone(blocks, blocks, 0, ctypes.addressof(args), 0, None), keep)
    both = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, long, long, long, ctypes.c_void_p, ctypes.c_void_p, long,
                            ctypes.c_void_p, long, ctypes.c_void_p, long, ctypes.c_void_p, ctypes.c_int)(entry[0])
    alpha = (ctypes.c_double * 4)()
    call = (entry[1], blocks, blocks, 0, ctypes.addressof(alpha), ctypes.addressof(args), 0, None, 1, None, 0, task, 2)
    return lambda: (both(*call), keep, alpha)


blas.register_caller("gir-packed", packed_caller)


def packed_functions(shape: Any, unit: int) -> tuple[Any, int, int]:
    """(engine, address of gir_pack_<dtype>_<tb>, of gir_ptask_<tag>) of packed_gemm.py's functions for
    shape (a packed_gemm.Shape), compiled at -O3 in a module of their own: blas.py measures them,
    on the measurer's thread, with target machines of their own as the -O3 tier's (an engine
    owns the machine it is given). A crash of LLVM's instruction selection once blamed on a
    shared machine was a process exiting while this ran (llvm_exit.py)."""
    from . import packed_gemm

    mod = llvm.parse_assembly(str(packed_gemm.standalone(shape, unit)))
    mod.verify()
    optimize(mod, 3, new_target_machine(3))
    engine = llvm.create_mcjit_compiler(mod, new_target_machine(3))
    engine.finalize_object()
    return (engine, engine.get_function_address(f"gir_pack_{shape.dtype}_{int(shape.tb)}"),
            engine.get_function_address(f"gir_ptask_{shape.tag}"))
