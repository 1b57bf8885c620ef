"""The fast parser's shipped terminal table (frontend/terminals_table.json, frontend/terminals.py):
current with grammar.lark and lexer.py, equal to what the Lark parser builds, used without
importing Lark, and rebuilt from Lark when its key does not match (another Lark version).

After editing grammar.lark or lexer.py:  python -m gir.frontend.make_terminals_table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gir
import pytest
from gir.frontend import terminals as terminals_module
from gir.frontend.terminals import SHIPPED, build, lark_version, sources_digest, terminals

REGENERATE = "run `python -m gir.frontend.make_terminals_table` and commit frontend/terminals_table.json"

SOURCE = """\
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  // a comment
  %y = tanh(%x @ %w) * 2.0 loc("a.py":3:4)
  return %y
}
"""


@pytest.fixture
def fresh_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """terminals() computed again, with its own cache directory; the process's memo restored after."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    terminals.cache_clear()
    yield tmp_path
    terminals.cache_clear()


def test_the_shipped_table_is_current_with_the_grammar_and_lexer() -> None:
    shipped = json.loads(Path(SHIPPED).read_text(encoding="utf-8"))
    assert shipped["sources"] == sources_digest(), f"grammar.lark or lexer.py changed: {REGENERATE}"


def test_the_shipped_table_is_what_lark_builds() -> None:
    shipped = json.loads(Path(SHIPPED).read_text(encoding="utf-8"))
    if shipped["lark"] != lark_version():
        pytest.skip(f"the table was made with Lark {shipped['lark']}, Lark {lark_version()} is installed "
                    "(it is not used: terminals() builds its own)")
    built = build()
    assert shipped["keywords"] == built.keywords, REGENERATE
    assert shipped["punct"] == built.punct, REGENERATE
    assert shipped["skipping_regex"] == built.skipping_regex.pattern, REGENERATE


def test_the_shipped_table_is_used(fresh_table: Path) -> None:
    table = terminals()
    built = build()
    assert (table.keywords, table.punct) == (built.keywords, built.punct)
    assert table.skipping_regex.pattern == built.skipping_regex.pattern
    assert not list(fresh_table.glob("parser-*.terminals.json"))  # nothing built, nothing written


def test_valid_text_from_an_empty_cache_imports_no_lark(tmp_path: Path) -> None:
    code = "import gir, sys; m = gir.parse(sys.argv[1]); print(len(m.functions), 'lark' in sys.modules)"
    env = {**os.environ, "GIR_CACHE_DIR": str(tmp_path / "empty")}
    proc = subprocess.run([sys.executable, "-c", code, SOURCE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "False"]
    assert not (tmp_path / "empty").exists() or not list((tmp_path / "empty").glob("parser-*"))


@pytest.mark.parametrize("stale", ["lark", "sources"])
def test_a_table_with_another_key_is_built_from_lark(fresh_table: Path, monkeypatch: pytest.MonkeyPatch,
                                                     stale: str) -> None:
    if stale == "lark":  # another Lark version installed than the one the table was made with
        monkeypatch.setattr(terminals_module, "lark_version", lambda: "0.0.0-other")
    else:  # grammar.lark or lexer.py edited without regenerating the table
        monkeypatch.setattr(terminals_module, "sources_digest", lambda: "0" * 64)
    table = terminals()
    built = build()
    assert (table.keywords, table.punct) == (built.keywords, built.punct)
    assert table.skipping_regex.pattern == built.skipping_regex.pattern
    saved = list(fresh_table.glob("parser-*.terminals.json"))
    assert len(saved) == 1  # kept in the cache for the next process
    terminals.cache_clear()
    assert terminals().skipping_regex.pattern == built.skipping_regex.pattern  # read back from the cache
    assert len(gir.parse(SOURCE).functions) == 1


def test_a_damaged_shipped_table_is_built_from_lark(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    damaged = fresh_table / "terminals_table.json"
    damaged.write_text("{not json")
    monkeypatch.setattr(terminals_module, "SHIPPED", str(damaged))
    assert terminals().skipping_regex.pattern == build().skipping_regex.pattern
    assert len(list(fresh_table.glob("parser-*.terminals.json"))) == 1
