"""Grammar-aware mutation campaign: the parser, the pass pipelines and `gir opt`.

    nice -n 19 python tests/fuzz/mutate.py --n 100000 --seed 0
    python tests/fuzz/mutate.py --seed 0 --only 1234        # one input, in this process

The corpus is every example (examples/*.gir) and every ```gir block of docs/*.md, as written,
printed as parsed (with and without locations), and printed after the `ssa` pass, the default
pipeline and the backend pipeline (so mutants of `fused` ops, scans with carries and lowered
gradients are tried too). Each input takes one text and applies 1-4 token-level mutations:
tokens deleted, duplicated, swapped, replaced by a token of the same class (a name, a type, a
number, a word) or of any class, numbers replaced by extremes (0, -1, 2**63, 1e400, ...), types
replaced by odd ones (rank > 64, huge or zero dims, `?`), lines moved, unicode or invalid UTF-8
inserted, truncation.

Oracle, per input:
- `gir.parse` (or `gir.load` for bytes) raises nothing but a `GirError`, which has a location;
- a module that parses prints, and the printed text parses to the same text;
- a pipeline over it (the default one, default+backend, or a random sub-pipeline such as
  `fuse,fuse` or `canonicalize,canonicalize,inline`) raises nothing but a `GirError`, and its
  output round-trips the same way;
- one input in 1,000 (CLI_FRACTION) goes through `python -m gir.cli opt` in a subprocess: exit 0 or 1,
  no traceback, no "internal error";
- no input runs past `--timeout` seconds and no signal kills the worker (tests/fuzz/harness.py).
"""

from __future__ import annotations

import io
import os
import random
import re
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import gir  # noqa: E402
from gir.ir.printer import print_module  # noqa: E402
from gir.passes.pass_manager import PassManager  # noqa: E402
from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE  # noqa: E402
from harness import Counters, Finding, main  # noqa: E402

ROOT = Path(gir.__file__).resolve().parent
TOKEN = re.compile(r"""\s+|//[^\n]*|loc\("[^"\n]*":\d+:\d+\)|tensor<[^>\n]*>|%[\w.$]+|@[\w.$]+|"[^"\n]*"
                   |\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[A-Za-z_]\w*|->|.""", re.S | re.X)
NUMBER = re.compile(r"\d")
EXTREME_NUMBERS = ["0", "-1", "1", "2", "-0.0", "2147483648", "-2147483649", str(2**63), str(2**63 - 1),
                   str(-(2**63)), str(2**64), "1e400", "-1e400", "1e-400", "3.4e38", "3.5e38", "nan", "inf",
                   "-inf", "1e", "0.5", "00", "9" * 25, "9" * 5000, "65", "4096", "1000000000"]
ODD_TYPES = ["tensor<f32>", "tensor<0xf32>", "tensor<?xf32>", "tensor<?x?xf64>", "tensor<0x3xf32>",
             "tensor<3x0x2xf64>", "tensor<4294967296xf32>", "tensor<1000000x1000000xf32>",
             "tensor<" + "1x" * 65 + "f32>", "tensor<" + "1x" * 64 + "f32>", "tensor<" + "2x" * 40 + "f32>",
             "tensor<3xi32>", "tensor<i64>", "tensor<3xi1>", "tensor<2x3xf16>", "tensor<-1xf32>",
             "tensor<?x3xi32>", "tensor<9223372036854775807xf32>", "tensor<1x?x1xf32>", "tensor<xf32>"]
SPICE = list("{}()[]<>,:=%@+-*/\"'.x?\\#$;\t\n\r\x00\x0b\x0c\x85\u2028\u00e9\U0001f600\ufeff") + [
    "tensor<", "scan", "for", "yield", "stack", "carry", "reverse", "length", "loc(", "func", "return",
    "collect", "into", "wrt", "grad", "call", "in", "%x", "@f", "true", "[", "[[", "{axes = ", "// ", "\n}\n",
    "fused", "var", "load", "store", "transfer", "{device = \"gpu\"}", "length 0", "reverse length 3",
    "\u0130", "\u212a", "\u00a0", "\ud7ff", "𝟘", "%\u00e9", "@\u00e9",
]
BAD_BYTES = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\x00", b"\xef\xbb\xbf",
             b"\xf4\x90\x80\x80"]
SUBPASSES = ["ssa", "canonicalize", "scan-grad", "autodiff", "inline", "fuse", "place", "place{policy=aggressive}",
             "place{min_elements=1}", "liveness", "memplan", "memplan{strategy=size}", "memplan{strategy=program}",
             "scan-grad{max-extra-bytes=0}", "scan-grad{hoist=false}", "scan-grad{merge=false,push_out=false}"]
PIPELINES = [DEFAULT_PIPELINE, f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}", "ssa,fuse,fuse",
             "ssa,canonicalize,canonicalize", "ssa,inline,inline,canonicalize", "ssa,autodiff,autodiff",
             "ssa,fuse,canonicalize,fuse", "ssa,canonicalize,fuse,memplan,fuse,memplan"]


def doc_blocks() -> list[str]:
    out = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        out += re.findall(r"```gir\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    return out


@lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    texts: list[str] = []
    sources = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.gir"))] + doc_blocks()
    for text in sources:
        try:
            module = gir.parse(text, filename="corpus.gir")
        except gir.GirError:
            continue  # a docs block that needs another block, or a gir-error example
        texts += [text, str(module), print_module(module, print_locations=True)]
        for pipeline in ("ssa", DEFAULT_PIPELINE, f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}"):
            try:
                m = gir.parse(text, filename="corpus.gir")
                PassManager(pipeline).run(m)
                texts.append(str(m))
            except gir.GirError:
                pass
    return tuple(dict.fromkeys(texts))


def classify(token: str) -> str:
    if token[:1] in "%@":
        return token[0]
    if token.startswith("tensor<"):
        return "type"
    if NUMBER.match(token):
        return "number"
    if token[:1].isalpha() or token[:1] == "_":
        return "word"
    return "space" if token.isspace() else "punct"


GENTLE = ["same-class", "same-class", "number", "type", "lines", "duplicate"]


def mutate(rng: random.Random, text: str) -> str | bytes:
    toks = TOKEN.findall(text)
    raw: list[tuple[int, bytes]] = []
    # Half the inputs get one or two gentle mutations that often still parse, so the passes see
    # many nearly valid programs; the rest get up to four of any kind.
    gentle = rng.random() < 0.5
    for _ in range(rng.randint(1, 2) if gentle else rng.randint(1, 4)):
        n = len(toks)
        if n == 0:
            toks = [rng.choice(SPICE)]
            continue
        i = rng.randrange(n)
        kind = rng.choice(GENTLE if gentle else ["delete", "duplicate", "swap", "same-class", "any-token", "number",
                                                 "number", "type", "type", "spice", "unicode", "bytes", "lines",
                                                 "truncate"])
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        elif kind == "swap":
            j = rng.randrange(n)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "same-class":
            cls = classify(toks[i])
            same = [t for t in toks if classify(t) == cls]
            toks[i] = rng.choice(same)
        elif kind == "any-token":
            toks[i] = toks[rng.randrange(n)]
        elif kind == "number":
            nums = [k for k, t in enumerate(toks) if classify(t) == "number"] or [i]
            toks[rng.choice(nums)] = rng.choice(EXTREME_NUMBERS)
        elif kind == "type":
            types = [k for k, t in enumerate(toks) if classify(t) == "type"] or [i]
            k = rng.choice(types)
            toks[k] = rng.choice(ODD_TYPES) if rng.random() < 0.7 else _perturb_type(rng, toks[k])
        elif kind == "spice":
            toks.insert(i, rng.choice(SPICE))
        elif kind == "unicode":
            points = [rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800), rng.randrange(0xE000, 0x110000)]
            toks.insert(i, "".join(chr(rng.choice(points)) for _ in range(rng.randint(1, 3))))
        elif kind == "bytes":
            raw.append((i, rng.choice(BAD_BYTES)))
        elif kind == "lines":
            lines = "".join(toks).split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            op = rng.choice(["delete", "duplicate", "swap"])
            if op == "delete":
                del lines[a]
            elif op == "duplicate":
                lines.insert(a, lines[b])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            toks = TOKEN.findall("\n".join(lines))
        else:
            toks = toks[:i]
    if not raw:
        return "".join(toks)
    out = bytearray()
    inserts = dict(raw)
    for k, t in enumerate(toks):
        out += inserts.get(k, b"") + t.encode("utf-8", "surrogatepass")
    return bytes(out)


def _perturb_type(rng: random.Random, t: str) -> str:
    """The type with one dim changed (to 0, ?, 1 or a neighbour) or its dtype changed."""
    parts = t[len("tensor<"):-1].split("x")
    k = rng.randrange(len(parts))
    if k == len(parts) - 1:
        parts[k] = rng.choice(["f32", "f64", "i32", "i64", "i1", "bf16"])
    else:
        d = parts[k]
        parts[k] = rng.choice(["0", "?", "1", str(int(d) + 1) if d.isdigit() else "2", "2"])
    return "tensor<" + "x".join(parts) + ">"


def make_input(seed: int, index: int) -> tuple[str | bytes, str, bool]:
    """(mutant, pipeline, through the CLI?) of input `index` of `seed`."""
    rng = random.Random(seed * 1_000_003 + index)
    texts = corpus()
    mutant = mutate(rng, rng.choice(texts))
    r = rng.random()
    if r < 0.35:
        pipeline = DEFAULT_PIPELINE
    elif r < 0.5:
        pipeline = f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}"
    elif r < 0.6:
        pipeline = rng.choice(PIPELINES)
    else:
        pipeline = ",".join(rng.choice(SUBPASSES) for _ in range(rng.randint(1, 5)))
    return mutant, pipeline, rng.random() < CLI_FRACTION


CLI_FRACTION = 1 / 1000
INTERNAL = ("crashed", "produced invalid IR", "internal error", "numerics differ")


def _parse(mutant: str | bytes, counters: Counters) -> gir.Module | None:
    try:
        if isinstance(mutant, bytes):
            with tempfile.NamedTemporaryFile("wb", suffix=".gir", delete=False) as f:
                f.write(mutant)
            try:
                return gir.load(f.name)
            finally:
                os.unlink(f.name)
        return gir.parse(mutant, filename="fuzz.gir")
    except gir.GirError as e:
        counters["parse_errors"] = counters.get("parse_errors", 0) + 1
        if e.loc is None:
            raise Finding("unlocated", f"parse error without a location: {e}", _show(mutant)) from None
        return None
    except RecursionError:
        raise Finding("escape", "RecursionError from the parser", _show(mutant)) from None
    except Exception as e:
        raise Finding("escape", f"{type(e).__name__} from the parser: {e}", _show(mutant)) from e


def _show(mutant: str | bytes) -> str:
    return mutant if isinstance(mutant, str) else mutant.decode("utf-8", "backslashreplace")


def _roundtrip(module: gir.Module, what: str, mutant: str | bytes) -> None:
    printed = str(module)
    try:
        again = str(gir.parse(printed, filename="printed.gir"))
    except gir.GirError as e:
        raise Finding("roundtrip", f"{what}: the printed module does not parse: {e}", printed) from None
    except Exception as e:
        raise Finding("roundtrip", f"{what}: {type(e).__name__} parsing the printed module: {e}", printed) from e
    if again != printed:
        raise Finding("roundtrip", f"{what}: print(parse(print(m))) != print(m)", printed)


def run_one(seed: int, index: int, counters: Counters) -> None:
    mutant, pipeline, cli = make_input(seed, index)
    if cli:
        _through_cli(mutant, counters)
    module = _parse(mutant, counters)
    if module is None:
        return
    counters["parsed"] = counters.get("parsed", 0) + 1
    _roundtrip(module, "as parsed", mutant)
    try:
        PassManager(pipeline, out=io.StringIO()).run(module)
    except gir.GirError as e:
        # A pass that crashed or broke the IR is reported as a GirPassError too: a bug in gir.
        if any(s in e.message for s in INTERNAL):
            raise Finding("internal", f"-p {pipeline}: {e}", _show(mutant)) from None
        counters["pipeline_errors"] = counters.get("pipeline_errors", 0) + 1
        return
    except RecursionError:
        raise Finding("escape", f"RecursionError from -p {pipeline}", _show(mutant)) from None
    except Exception as e:
        raise Finding("escape", f"{type(e).__name__} from -p {pipeline}: {e}", _show(mutant)) from e
    counters["pipelines_ok"] = counters.get("pipelines_ok", 0) + 1
    _roundtrip(module, f"after -p {pipeline}", mutant)


def _through_cli(mutant: str | bytes, counters: Counters) -> None:
    counters["cli"] = counters.get("cli", 0) + 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutant.gir"
        path.write_bytes(mutant if isinstance(mutant, bytes) else mutant.encode("utf-8", "surrogatepass"))
        env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
        try:
            proc = subprocess.run([sys.executable, "-m", "gir.cli", "opt", str(path)], capture_output=True,
                                  text=True, errors="replace", timeout=120, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise Finding("hang", "gir opt ran past 120 s", _show(mutant)) from None
    if proc.returncode < 0:
        raise Finding("signal", f"gir opt killed by signal {-proc.returncode}", _show(mutant))
    if proc.returncode not in (0, 1) or "Traceback" in proc.stderr or "internal error" in proc.stderr:
        raise Finding("cli", f"gir opt exit {proc.returncode}: {proc.stderr[-1500:]}", _show(mutant))
    if proc.returncode == 1 and not re.match(r"[^\n]+:\d+:\d+: error: ", proc.stderr):
        raise Finding("cli", f"gir opt error without a location: {proc.stderr[-500:]}", _show(mutant))


def show(seed: int, index: int) -> None:
    mutant, pipeline, cli = make_input(seed, index)
    print(f"// pipeline: {pipeline}  cli: {cli}\n{_show(mutant)}")


if __name__ == "__main__":
    corpus()  # once, before the worker forks
    sys.exit(main(run_one, __doc__.splitlines()[0], {"n": 1000, "timeout": 90.0}, show_one=show))
