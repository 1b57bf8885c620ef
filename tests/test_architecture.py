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
OUTSIDE_IR = ["passes", "backend", "frontend", "cli.py", "jit.py", "reporting.py", "__init__.py", "errors.py"]

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


def _top_level_imports(path: Path) -> set[str]:
    """Package-relative modules imported at module level (not under TYPE_CHECKING, not lazily)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            out.add(".".join(base + ([node.module] if node.module else [])))
    return out


def test_stages_import_one_way() -> None:
    """DESIGN.md §1: ir imports none of the other stages; passes imports only ir; frontend
    imports only ir; backend imports ir and passes' analyses, never a pass module. The disk
    cache (support/cache.py) and the timing tree (support/timing.py), standard library only, are used by the stages."""
    allowed = {"ir": ("ir", "errors", "support", "config"), "passes": ("ir", "passes", "errors", "support", "config"),
               "frontend": ("ir", "frontend", "errors", "support", "config"),
               "backend": ("ir", "backend", "errors", "support", "config", "passes.memory", "passes.analysis",
                           "passes.liveness")}
    for stage, ok in allowed.items():
        for path in _files([stage]):
            for module in _top_level_imports(path):
                assert module.startswith(ok) or module == "", f"{path.relative_to(ROOT)} imports {module}"


if __name__ == "__main__":
    for name, hits in counts().items():
        print(f"{len(hits):4d}  {name}")
        if "-v" in sys.argv:
            print("".join(f"        {h}\n" for h in hits), end="")
