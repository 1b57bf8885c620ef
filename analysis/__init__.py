"""Analyses: objects computed from a function's IR that do not change it, each with a stable
printed form, cached for the pipeline by the analysis manager (manager.py `Analyses`).

- liveness.py: `Liveness`, what is live at every op (loops read through `LoopView`).
- memory/: the static memory plan (`MemoryPlan`, `plan_memory`, `check_plan`).
- placement.py: the `place` pass's report (`PlacementReport`) and its options.

Floor: imports `ir` (and errors, config, support) only; never a pass or a transform.
"""
