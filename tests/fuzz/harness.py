"""Runs a fuzz campaign of numbered inputs in a watched worker process.

Input `i` of seed `s` is a pure function of (s, i), so any finding is reproduced with
`--only I`. The worker runs inputs in order and writes the index it is on to shared memory;
this process watches it: a worker killed by a signal, or stuck on one input past `--timeout`
seconds, is recorded as a `signal` or `hang` finding for that input and a fresh worker goes on
from the next one. The worker's address space is capped (`--memory-gib`) so a runaway
allocation is a MemoryError finding, not the machine's OOM killer.

A campaign module defines `run_one(seed, index, counters) -> None`, which raises `Finding`
for a broken oracle and updates `counters` (a dict of name -> int) for what it tried.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Counters = dict[str, int]
RunOne = Callable[[int, int, Counters], None]


class Finding(Exception):
    """A broken oracle: `kind` (escape, roundtrip, mismatch, ...), a message, and the input."""

    def __init__(self, kind: str, message: str, text: str = ""):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.text = kind, message, text


def _worker(run_one: RunOne, seed: int, start: int, end: int, current: Any, queue: Any, memory_gib: float) -> None:
    if memory_gib > 0:
        limit = int(memory_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    counters: Counters = {}
    last_flush = time.monotonic()
    for index in range(start, end):
        current.value = index
        try:
            run_one(seed, index, counters)
        except Finding as f:
            queue.put(("finding", index, f.kind, f.message, f.text))
        except BaseException as e:  # the campaign's own code failed: still a finding, with its traceback
            queue.put(("finding", index, "harness", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", ""))
        counters["inputs"] = counters.get("inputs", 0) + 1
        if time.monotonic() - last_flush > 2.0:
            queue.put(("counters", counters))
            counters, last_flush = {}, time.monotonic()
    queue.put(("counters", counters))
    current.value = end


def campaign(run_one: RunOne, seed: int, n: int, timeout: float, memory_gib: float, out_dir: Path,
             progress: bool = True, first: int = 0) -> tuple[Counters, list[dict[str, Any]]]:
    """Runs inputs first..n-1 of `seed`; returns the summed counters and the findings."""
    ctx = mp.get_context("fork")
    totals: Counters = {}
    findings: list[dict[str, Any]] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    start, began = first, time.monotonic()

    def drain(queue: Any) -> None:
        while True:
            try:
                item = queue.get(timeout=0.05)
            except Exception:
                return
            if item[0] == "counters":
                for k, v in item[1].items():
                    totals[k] = totals.get(k, 0) + v
            else:
                record(item[1], item[2], item[3], item[4])

    def record(index: int, kind: str, message: str, text: str) -> None:
        findings.append({"index": index, "kind": kind, "message": message[:2000]})
        (out_dir / f"finding-{seed}-{index}-{kind}.txt").write_text(f"{kind}: {message}\n----\n{text}",
                                                                      encoding="utf-8", errors="replace")
        print(f"[{seed}:{index}] {kind}: {message.splitlines()[0] if message else ''}", file=sys.stderr, flush=True)

    while start < n:
        current, queue = ctx.Value("q", start), ctx.Queue()
        proc = ctx.Process(target=_worker, args=(run_one, seed, start, n, current, queue, memory_gib), daemon=True)
        proc.start()
        seen, since, last_report = current.value, time.monotonic(), time.monotonic()
        killed = False
        while proc.is_alive():
            drain(queue)
            if current.value != seen:
                seen, since = current.value, time.monotonic()
            elif time.monotonic() - since > timeout:
                proc.kill()
                proc.join()
                killed = True
                record(seen, "hang", f"input {seen} ran past {timeout:g} s", "")
                totals["hangs"] = totals.get("hangs", 0) + 1
                break
            if progress and time.monotonic() - last_report > 60:
                rate = totals.get("inputs", 0) / (time.monotonic() - began)
                print(f"... {totals.get('inputs', 0)} inputs ({rate:.1f}/s), at {seen}: {json.dumps(totals)}",
                      file=sys.stderr, flush=True)
                last_report = time.monotonic()
        proc.join()
        drain(queue)
        if proc.exitcode is not None and proc.exitcode < 0 and not killed:
            record(current.value, "signal", f"worker killed by signal {-proc.exitcode}", "")
            totals["signals"] = totals.get("signals", 0) + 1
        elif proc.exitcode not in (0, None, -9):
            record(current.value, "exit", f"worker exited with {proc.exitcode}", "")
        start = current.value + 1 if current.value < n else n
    totals["seconds"] = int(time.monotonic() - began)
    return totals, findings


def main(run_one: RunOne, description: str, defaults: dict[str, Any], argv: list[str] | None = None,
         show_one: Callable[[int, int], None] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=defaults.get("n", 1000), help="inputs up to (not including) N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first input (to split one campaign over processes)")
    parser.add_argument("--timeout", type=float, default=defaults.get("timeout", 60.0),
                        help="seconds one input may run before it counts as a hang")
    parser.add_argument("--memory-gib", type=float, default=defaults.get("memory_gib", 6.0))
    parser.add_argument("--out", default=f"/tmp/gir-fuzz-{os.getpid()}", help="folder for finding files")
    parser.add_argument("--only", type=int, default=None, help="run input ONLY in this process, with tracebacks")
    parser.add_argument("--json", default=None, help="write the counters and findings to this file")
    args = parser.parse_args(argv)
    if args.only is not None:
        if show_one is not None:
            show_one(args.seed, args.only)
        counters: Counters = {}
        run_one(args.seed, args.only, counters)
        print(json.dumps(counters))
        return 0
    totals, findings = campaign(run_one, args.seed, args.n, args.timeout, args.memory_gib, Path(args.out),
                                first=args.start)
    summary = {"seed": args.seed, "start": args.start, "n": args.n, "counters": dict(sorted(totals.items())),
               "findings": findings}
    print(json.dumps(summary["counters"], indent=1))
    print(f"{len(findings)} finding(s)" + (f"; files in {args.out}" if findings else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if findings else 0
