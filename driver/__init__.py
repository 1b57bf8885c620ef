"""The drivers: where the stages are wired together (frontend -> passes -> backend).

- compile.py: `compile_entry`, the one compile path (specialise, run the pipeline, hand to a
  backend), and the `Executable` / `Backend` protocols; backends.py: the targets by name.
- jit.py: `gir.jit` of a .gir text, path or Module (`JitFunction`).
- pyjit.py: `gir.jit` of a Python function (`PythonJit`), through the tracing frontend.
- specialisations.py: the specialisation cache both keep.
- reference.py: `gir.interpret`; shapes.py: `?` dims fixed by arguments or `--shape`.
- compile_cache.py: the compile cache's keys and entries (support/cache.py stores them).
- calling.py, results.py, jitstats.py: the calling convention, named results, compile stats.
- reporting.py: `gir opt --memplan-report` and `--memplan-plot` (the CLI's reports).

cli.py (at the root) and gir/__init__.py call these; every compile goes through compile.py
(docs/architecture.md, "The driver").
"""
