"""The shape of the code (docs/architecture.md): op facts live in the registry, scans are read
through one typed view, values know their defining op, and the stages import one way.

Run as a script to print the counts docs/architecture.md quotes:

    python tests/test_architecture.py
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_IR = ["support", "analysis", "passes", "transforms", "backend", "frontend", "driver", "cli.py", "__init__.py",
              "errors.py"]

OP_NAME_LIST = re.compile(r"""\.name\s+(?:not\s+)?in\s+[(\[{]\s*["']|name\s+(?:not\s+)?in\s+\(["']""")
"""A list of op names: `op.name in ("sum", "mean")`, `name in ("call", "grad")`."""
OP_NAME_EQ = re.compile(r"""\.name\s*(?:==|!=)\s*["']""")
"""One op kind matched by name (`op.name == "scan"`): fine in a rewrite pattern, counted anyway."""
POSITIONAL_SCAN = re.compile(r"""\.(?:results|args|operands)\[[^\]\n]*(?::|len\(|\+)[^\]\n]*\]""")
"""A slice of an op's results or operands or a block's arguments, or an index computed from
group sizes (`op.results[len(inits) + i]`): a group decoded by position."""
UNTYPED_DEF = re.compile(r"""getattr\([^,\n]+,\s*["']op["']""")
"""`getattr(v, "op", None)`: the defining op looked up without a type (use `v.defining_op`)."""
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore")


GROUPS = {ROOT / "ir" / "core.py", ROOT / "ir" / "spec.py", ROOT / "ir" / "loops.py"}
"""Where named groups and the loop view are implemented (by position, once); everything else
reads them by name."""


def _files(parts: list[str]) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        path = ROOT / part
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else [])
    return out


def _hits(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if pattern is not TYPE_IGNORE else line
            if pattern.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def counts() -> dict[str, list[str]]:
    library = _files(OUTSIDE_IR + ["ir"])
    return {
        "op-name lists outside ir/": _hits(OP_NAME_LIST, _files(OUTSIDE_IR)),
        "single op-name matches outside ir/": _hits(OP_NAME_EQ, _files(OUTSIDE_IR)),
        "positional scan decoders (library)": _hits(POSITIONAL_SCAN, [p for p in library if p not in GROUPS]),
        "untyped defining-op lookups (library)": _hits(UNTYPED_DEF, library),
        "type: ignore (library)": _hits(TYPE_IGNORE, library),
    }


LIMITS = {
    "op-name lists outside ir/": 0,
    "positional scan decoders (library)": 0,
    "untyped defining-op lookups (library)": 0,
}
"""What must stay at zero; the other counts are reported by the script, not limited."""


def test_op_facts_live_in_the_registry_and_scans_are_read_through_the_view() -> None:
    found = counts()
    for name, limit in LIMITS.items():
        assert len(found[name]) <= limit, f"{name}:\n" + "\n".join(found[name])


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split(".")) if dotted else ROOT
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The import nodes under `if TYPE_CHECKING:` (never run)."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(n for stmt in node.body for n in ast.walk(stmt))
    return found


def _imports(path: Path, *, top_level_only: bool = False, types: bool = True) -> set[str]:
    """Package-relative modules a file imports: at module level and, unless top_level_only,
    inside functions too (a lazy import is still a dependency). `from .. import X` counts as
    importing module X where X is a module, else the package itself ("" is the root package).
    Imports under `if TYPE_CHECKING:` count for the floors (a type is a dependency of the
    design) unless `types` is False (for cycles: they never run)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if not types:
        skip = _type_only(tree)
        nodes = [n for n in nodes if n not in skip]
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                out.add(sub if _is_module(sub) else module)
    return out


def _package_files() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] not in ("tests", "bench", "examples")
            and ".git" not in p.parts]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FLOOR_0 = ("errors", "config", "version", "support")
"""Leaves every floor may import: errors, the options object, the version, the floor-0 services."""

FLOORS = {
    "support": ("config", "support"),
    "ir": FLOOR_0 + ("ir",),
    "analysis": FLOOR_0 + ("ir", "analysis"),
    "passes": FLOOR_0 + ("ir", "analysis", "passes"),
    "transforms": FLOOR_0 + ("ir", "analysis", "passes", "transforms"),
    "frontend": FLOOR_0 + ("ir", "frontend"),
    "backend": FLOOR_0 + ("ir", "analysis", "backend"),
}
"""DESIGN.md §1: what each folder may import, at module level and inside functions."""

KNOWN_FLOOR_BREAKS: set[str] = set()
"""Imports that break a floor: none today (the set may only stay empty). Gone: the tracing
frontend's lazy import of driver.pyjit (its eager runner is now loaded through
frontend/__init__.py EAGER_LOADERS, which gir/__init__.py fills)."""


def floor_breaks() -> set[str]:
    found = set()
    for stage, ok in FLOORS.items():
        for path in _files([stage]):
            for module in _imports(path):
                if not (module in ok or module.startswith(tuple(f"{o}." for o in ok))):
                    found.add(f"{path.relative_to(ROOT)} imports {module or '(the gir package)'}")
    return found


def test_stages_import_one_way() -> None:
    """DESIGN.md §1: ir imports none of the other stages; analysis imports ir; passes and
    transforms import ir and analysis; frontend imports ir; backend imports ir and analysis,
    never a pass; every floor may use errors, config, version and support/ (floor 0, stdlib
    only). Imports inside functions count."""
    found = floor_breaks()
    assert found <= KNOWN_FLOOR_BREAKS, "new imports across floors:\n" + "\n".join(sorted(found - KNOWN_FLOOR_BREAKS))
    assert found == KNOWN_FLOOR_BREAKS, ("fixed, remove from KNOWN_FLOOR_BREAKS:\n"
                                         + "\n".join(sorted(KNOWN_FLOOR_BREAKS - found)))


def import_cycles() -> list[list[str]]:
    """Strongly connected components (more than one module) of the package's import graph,
    function-level imports included (a cycle that only works because one side imports lazily),
    imports for type checking only left out."""
    graph = {_module_name(p): _imports(p, types=False) for p in _package_files()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


KNOWN_CYCLES = [
]
"""The import cycles of today (issue 27 asks for none): each may only shrink or go. Most are lazy
imports back into a module that imports the importer at module level. Gone: `driver.jit ⇢
driver.pyjit → driver.jit` (jit.py hands pyjit its `jit`; the eager runner compiles through
driver/compile.py) and `frontend.python.numpy_api ⇢ driver.pyjit → numpy_api` (the runner's
loader is registered by gir/__init__.py: frontend/__init__.py EAGER_LOADERS)."""


def test_import_cycles_only_shrink() -> None:
    found = import_cycles()
    for cycle in found:
        assert any(set(cycle) <= set(known) for known in KNOWN_CYCLES), f"a new import cycle: {cycle}"
    assert found == KNOWN_CYCLES, f"cycles changed (update KNOWN_CYCLES to what is left): {found}"


DRIVER = ["driver", "cli.py", "__init__.py"]
GETATTR = re.compile(r"""\bgetattr\((?!\s*(?:fn|e|args|python|self\._thread)\s*,)""")
"""A `getattr(x, "name", default)` on anything but a user's function (`fn`), an exception, the
CLI's arguments, the frontend package (`__init__.py`) or a thread-local: a compiled object
probed instead of typed by the `Executable` protocol (driver/compile.py)."""
PASS_MANAGER = re.compile(r"\bPassManager\(")
SPECIALIZE = re.compile(r"\bspecialize\(")
BACKEND_CLASSES = re.compile(r"\b(?:CPUFunction|GPUFunction|SplitFunction)\.compile\(|\bcompile_code\(")
ONE_COMPILE_PATH = {ROOT / "driver" / "compile.py", ROOT / "driver" / "backends.py"}
"""Where the drivers specialise, make a pass manager and call a backend's compile: nowhere else."""


def driver_copies() -> dict[str, list[str]]:
    """What the one compile path (driver/compile.py) replaced, counted in the drivers."""
    driver = [p for p in _files(DRIVER) if p not in ONE_COMPILE_PATH]
    outside_passes = [p for p in _package_files() if p.relative_to(ROOT).parts[0] != "passes"
                      and p not in ONE_COMPILE_PATH]
    return {
        "getattr probes of compiled objects (drivers)": _hits(GETATTR, driver),
        "PassManager( outside passes/ and driver/compile.py": _hits(PASS_MANAGER, outside_passes),
        "specialize( in the drivers outside driver/compile.py": _hits(SPECIALIZE, driver),
        "a backend compiled outside driver/backends.py (drivers)": _hits(BACKEND_CLASSES, driver),
    }


def test_one_compile_path() -> None:
    """Issue 27: specialising, running the pipeline and handing to a backend is written once
    (driver/compile.py `compile_entry`, driver/backends.py); the drivers read compiled objects
    through the `Executable` protocol, never by `getattr` probes."""
    for name, hits in driver_copies().items():
        assert not hits, f"{name}:\n" + "\n".join(hits)


CPU_LAYERS = {
    "runtime": 4,
    "llvm_jit": 3, "code": 3,
    "lower": 2, "gather": 2, "llvm_types": 2, "snapshot": 2,
    "schedule": 1,
}
"""backend/cpu, one way (docs/backend.md, "The schedule"): runtime -> llvm -> lower -> schedule ->
blas (every module not named here: BLAS, its measurements and probes, the IR analyses of the
split and two-core schedules, packed_gemm's kernel, the layout). A module imports only its own
layer or those below it, inside functions too."""


def _cpu_layer(module: str) -> int:
    parts = module.split(".")
    return CPU_LAYERS.get(parts[2] if len(parts) > 2 else "", 0)


def test_the_cpu_backend_imports_one_way() -> None:
    found = []
    for path in _files(["backend/cpu"]):
        module = _module_name(path)
        for target in _imports(path, types=False):
            if target.startswith("backend.cpu.") and _cpu_layer(target) > _cpu_layer(module):
                found.append(f"{module} imports {target}")
    assert not found, "backend/cpu imports upward:\n" + "\n".join(found)


def test_no_environment_read_outside_config() -> None:
    """Every gir switch is a field of config.Options; other programs' variables gir reads (BLAS
    threads, Numba's simulator) are read by functions in config.py too."""
    pattern = re.compile(r"\bos\.environ\b|\bos\.getenv\b|\bgetenv\(|from os import[^\n]*\b(environ|getenv)\b")
    hits = _hits(pattern, [p for p in _package_files() if p != ROOT / "config.py"])
    assert not hits, "environment read outside config.py:\n" + "\n".join(hits)


def test_pyproject_lists_every_package() -> None:
    """A moved or new folder must be in pyproject's `packages`, or an installed gir lacks it."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(gir(?:\.[a-z_]+)*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    found = {".".join(["gir", *p.parent.relative_to(ROOT).parts]) for p in _package_files() if p.name == "__init__.py"}
    assert listed == found


if __name__ == "__main__":
    for name, hits in counts().items():
        print(f"{len(hits):4d}  {name}")
        if "-v" in sys.argv:
            print("".join(f"        {h}\n" for h in hits), end="")
    for name, hits in driver_copies().items():
        print(f"{len(hits):4d}  {name}")
        if "-v" in sys.argv:
            print("".join(f"        {h}\n" for h in hits), end="")
    print(f"{len(import_cycles()):4d}  import cycles (function-level imports included)")
    for cycle in import_cycles():
        print("        " + " ".join(cycle))
    print(f"{len(floor_breaks()):4d}  imports across floors")
    for line in sorted(floor_breaks()):
        print("        " + line)
