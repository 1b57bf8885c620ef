"""The drivers: where the stages are wired together (frontend -> passes -> backend).

- jit.py: `gir.jit` of a .gir text, path or Module (`JitFunction`, the specialisation cache).
- pyjit.py: `gir.jit` of a Python function (`PythonJit`), through the tracing frontend.
- reference.py: `gir.interpret`; shapes.py: `?` dims fixed by arguments or `--shape`.
- compile_cache.py: the compile cache's keys and entries (support/cache.py stores them).
- calling.py, results.py, jitstats.py: the calling convention, named results, compile stats.
- reporting.py: `gir opt --memplan-report` and `--memplan-plot` (the CLI's reports).

cli.py (at the root) and gir/__init__.py call these. Issue 27 asks for one compile path here
(`Executable`); today jit.py, pyjit.py, reference.py, shapes.py and cli.py each specialise and
run the pipeline (docs/architecture.md).
"""
