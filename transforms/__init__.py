"""The passes, one file each (the pass infrastructure is passes/; the table of pass names is
passes/pipeline.py `PASSES`, which imports a pass's module on first use).

Floor: imports `ir`, `analysis` and `passes` (and errors, config, support).
"""
