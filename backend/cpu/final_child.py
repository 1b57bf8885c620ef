"""The -O3 tier's compile, in a process of its own (tiers.py runs this file as a script).

Why a process: llvmlite serialises every LLVM call of a process with one lock, and LLVM's -O3
pipeline is one call of seconds (5 s for a GRU step's gradient): in the parent's background
thread it made every other compile of the process (a new shape's quick code) wait for it. Here
it holds no lock of the parent's, runs at the lowest priority (nice 19: the step and the
parent's quick compiles come first) and is killed, not waited for, when the parent stops it.

Protocol: stdin is one JSON line {"cpu", "features", "opt"} and then the LLVM IR; stdout is the
optimised IR and the object, each as an 8-byte big-endian length and the bytes, then a JSON line
of CPU seconds per stage. Standard library and llvmlite only: this file imports nothing of gir
(the script's own folder, which holds gir's CPU backend modules, is taken off `sys.path`).
"""

import sys

del sys.path[0]  # the backend's folder: its module names must not shadow anything below

import json  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402


def _lower_priority() -> None:
    """nice 19. SCHED_IDLE (allowed per thread, unprivileged) was considered: it runs only on
    a core nothing else wants, so on a busy machine the -O3 code would never come; at nice 19 it
    gets a small share and still ends."""
    try:
        os.nice(19)
    except OSError:
        pass


def _compile(request: dict, llvm_ir: str) -> tuple[bytes, bytes, dict]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    opt = int(request["opt"])
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(cpu=request["cpu"], features=request["features"], opt=opt,
                                      reloc="pic", codemodel="jitdefault")
    c0 = time.process_time()
    mod = llvm.parse_assembly(llvm_ir)
    mod.verify()
    c1 = time.process_time()
    if opt:  # llvm_jit.optimize, the same pipeline
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pto.loop_vectorization = opt >= 2
        pto.slp_vectorization = opt >= 2
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
    optimized = str(mod).encode()
    c2 = time.process_time()
    obj = tm.emit_object(mod)
    c3 = time.process_time()
    return optimized, obj, {"llvm_parse": c1 - c0, "llvm_opt": c2 - c1, "llvm_emit": c3 - c2}


def main() -> None:
    _lower_priority()
    data = sys.stdin.buffer.read()
    header, _, body = data.partition(b"\n")
    optimized, obj, seconds = _compile(json.loads(header), body.decode())
    out = sys.stdout.buffer
    for part in (optimized, obj):
        out.write(struct.pack(">Q", len(part)))
        out.write(part)
    out.write(json.dumps(seconds).encode() + b"\n")
    out.flush()


if __name__ == "__main__":
    main()
