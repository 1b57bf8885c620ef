"""Runs every tests/filecheck/*.gir through `gir opt` and LLVM-style FileCheck.

The convention (lit-like, kept small):

- Line 1 is `// RUN: gir opt %s <flags>`: the `gir opt` command line, `%s` standing for the
  input. It applies to every chunk of the file. `NAME=value` words before `gir` set
  environment variables for it (`// RUN: GIR_CPU_SPLIT=0 gir opt %s --cpu-schedule`): a report
  that depends on GIR_* switches is pinned under fixed ones.
- `// -----` lines split the file into chunks, each run on its own (like mlir-opt's
  -split-input-file). A chunk is written to a temporary file of the same name, padded with
  blank lines so that the `file:line:col` of a diagnostic is the line in the original file
  (CHECK lines can say `[[# @LINE - 2]]`).
- `gir opt` runs through a subprocess; its stdout and stderr together are piped into
  `python -m filecheck CHUNK` (the `filecheck` package), which reads the chunk's CHECK lines.
- A chunk whose CHECK lines expect `error:` is a negative case: `gir opt` must exit with
  status 1 and print no traceback. Any other chunk must exit with status 0.
- A chunk with a line `// XFAIL: reason` documents a known bug: it is expected to fail
  (pytest xfail, strict, so it is noticed when the bug is fixed).
- Every chunk needs at least one CHECK line. Printed IR never contains `//`, so CHECK lines
  cannot match themselves; the tests check that too.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

FILECHECK_DIR = Path(__file__).resolve().parent / "filecheck"
SPLIT = re.compile(r"^// -----[ \t]*$", re.MULTILINE)
CHECK_LINE = re.compile(r"//\s*CHECK(?:-[A-Z]+)?:")
ERROR_CHECK = re.compile(r"//\s*CHECK(?:-NEXT|-SAME)?:.*error:")
XFAIL = re.compile(r"^//\s*XFAIL:\s*(.+)$", re.MULTILINE)
GIR = [sys.executable, "-m", "gir.cli"]
"""`gir` on PATH is the same entry point; this is the interpreter pytest runs under."""


@dataclass(frozen=True)
class Chunk:
    path: Path
    index: int
    first_line: int
    """1-based line of the original file where the chunk starts."""
    text: str
    run: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.path.name}#{self.index}@{self.first_line}"

    @property
    def expects_error(self) -> bool:
        return bool(ERROR_CHECK.search(self.text))

    @property
    def xfail_reason(self) -> str | None:
        m = XFAIL.search(self.text)
        return m.group(1).strip() if m else None


def run_line(path: Path, text: str) -> tuple[str, ...]:
    first = text.split("\n", 1)[0]
    m = re.fullmatch(r"//\s*RUN:\s*(.+)", first.strip())
    assert m, f"{path.name}: line 1 must be '// RUN: gir opt %s ...', got {first!r}"
    argv = shlex.split(m.group(1))
    _, command = split_environment(tuple(argv))
    assert command[:2] == ("gir", "opt") and "%s" in command, f"{path.name}: RUN must be 'gir opt %s ...', got {argv}"
    return tuple(argv)


ASSIGNMENT = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)", re.DOTALL)


def split_environment(run: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The leading `NAME=value` words of a RUN line as environment variables, and the command."""
    env: dict[str, str] = {}
    i = 0
    while i < len(run) and (m := ASSIGNMENT.fullmatch(run[i])):
        env[m.group(1)] = m.group(2)
        i += 1
    return env, run[i:]


def split_chunks(path: Path) -> list[Chunk]:
    text = path.read_text(encoding="utf-8")
    run = run_line(path, text)
    chunks, start, line = [], 0, 1
    for index, m in enumerate([*SPLIT.finditer(text), None]):
        end = m.start() if m is not None else len(text)
        body = text[start:end]
        chunks.append(Chunk(path, index, line, body, run))
        if m is not None:
            line += text.count("\n", start, m.end())
            start = m.end()
    return chunks


def discover() -> list[Chunk]:
    return [c for path in sorted(FILECHECK_DIR.glob("*.gir")) for c in split_chunks(path)]


CHUNKS = discover()


@dataclass
class Outcome:
    returncode: int
    output: str
    """stdout then stderr of `gir opt`."""
    stdout: str
    filecheck_rc: int
    filecheck_output: str


def run_chunk(chunk: Chunk, folder: Path) -> Outcome:
    folder = folder / f"{chunk.path.stem}-{chunk.index}"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / chunk.path.name
    source.write_text("\n" * (chunk.first_line - 1) + chunk.text, encoding="utf-8")
    assigned, command = split_environment(chunk.run)
    argv = GIR + [str(source) if a == "%s" else a for a in command[1:]]
    env = {**os.environ, "GIR_TRACEBACK": "", **assigned}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=folder)
    output = proc.stdout + proc.stderr
    check = subprocess.run([sys.executable, "-m", "filecheck", str(source)], input=output, capture_output=True,
                           text=True, timeout=120)
    return Outcome(proc.returncode, output, proc.stdout, check.returncode, check.stdout + check.stderr)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every chunk, run once; subprocesses in parallel (each `gir opt` starts a Python)."""
    folder = tmp_path_factory.mktemp("filecheck")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = pool.map(lambda c: run_chunk(c, folder), CHUNKS)
        return {c.id: r for c, r in zip(CHUNKS, results)}


def test_every_pass_has_a_filecheck_file() -> None:
    """tests/filecheck/<pass>.gir for every pass in the pass table (the liveness analysis is
    tested through the pass that prints it, print-liveness)."""
    from gir.passes.pipeline import PASSES

    names = {c.path.stem for c in CHUNKS}
    assert set(PASSES) - {"liveness"} <= names, sorted(set(PASSES) - {"liveness"} - names)


@pytest.mark.parametrize("chunk", CHUNKS, ids=[c.id for c in CHUNKS])
def test_chunk_has_checks(chunk: Chunk) -> None:
    assert CHECK_LINE.search(chunk.text), f"{chunk.id}: a FileCheck chunk without CHECK lines tests nothing"


def _params() -> list:
    out = []
    for c in CHUNKS:
        reason = c.xfail_reason
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.mark.parametrize("chunk", _params())
def test_filecheck(chunk: Chunk, outcomes: dict[str, Outcome]) -> None:
    result = outcomes[chunk.id]
    assert "Traceback" not in result.output, result.output
    want = 1 if chunk.expects_error else 0
    assert result.returncode == want, (
        f"{chunk.id}: gir opt exited {result.returncode}, expected {want}:\n{result.output}")
    assert result.filecheck_rc == 0, f"{chunk.id}: FileCheck failed:\n{result.filecheck_output}"


@pytest.mark.parametrize("chunk", CHUNKS, ids=[c.id for c in CHUNKS])
def test_output_cannot_match_check_lines(chunk: Chunk, outcomes: dict[str, Outcome]) -> None:
    """Printed IR has no `//` comments, so a CHECK line never matches its own text."""
    result = outcomes[chunk.id]
    assert "CHECK" not in result.output
    assert "//" not in result.stdout


def test_split_keeps_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.gir"
    path.write_text("// RUN: gir opt %s -p ssa\na\n// -----\nb\n\n// -----\nc\n", encoding="utf-8")
    chunks = split_chunks(path)
    assert [c.first_line for c in chunks] == [1, 3, 6]
    original = path.read_text(encoding="utf-8").splitlines()
    for c in chunks:
        padded = ("\n" * (c.first_line - 1) + c.text).splitlines()
        assert [i for i, line in enumerate(padded) if line and line != original[i]] == []
