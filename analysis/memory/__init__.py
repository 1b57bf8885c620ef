"""The static memory plan: every intermediate tensor of a function gets an (offset, size) in
one arena, so that no two values live at the same time overlap. The `memplan` pass
(transforms/memplan.py) runs it on every function; the backends compute it for the function they
compile.

Modules, by job:
- plan.py: the data model: `Buffer`, `Slot`, `MemoryPlan`, `PlanError`, alignment, and the
  terms (planned value, view, register, buffer, arena) and report numbers.
- (views: `view_source(op)` in ir/spec.py asks each op's `OpSpec.view` rule which results read
  their operand's memory where it is; the planner and both backends make exactly these views.)
- aliases.py: the strided views a backend makes beyond the registry's (`ViewRules`: `ops`, the
  default and the CPU's; `strided`, the GPU's): slices read through strides are views of their
  sources, a join of arguments read by it alone is their home outside the arena.
- planner.py: `plan_memory` and `MemoryPlanner`: which values need memory and how they are put
  into buffers (in place, carries, new, pinned).
- arena.py: where buffers go in the arena (the placement strategies) and the lower bound.
- checker.py: `check_plan`, an independent check of a plan's rules.
The per-value report and the plot are the CLI's (driver/reporting.py).

The runtime contract the backends follow: at a scan, copy each initial carry into its carry's
buffer unless it is already there; every step, run the body; at the yield, first copy stacked
values into their rows, then each yielded carry not already in its carry's buffer into it (a
parallel copy: a carry's body argument yielded as another carry goes through a temporary).
After the loop, the final carries are in the carries' buffers.

Known gaps: static shapes only (a `?` dimension: the plan says so, the JIT plans after
specialising); one arena per function (calls are not planned across); pre-SSA IR (`var`,
`for`) is not planned; a value is never computed in place through a view, and a `fused` op's
results never overwrite its inputs (its spec declares no in-place operand).
"""
