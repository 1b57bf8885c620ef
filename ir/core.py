"""The IR: Value, Operation, Block, Region, Function, Module.

Terms. A *Value* is defined once, by an op result or a block argument, and knows its uses as
(op, operand index) pairs. An *Operation* has a kind (`name`, looked up in the op registry),
operands, results, attributes, regions and a source location. A *Block* holds ops in a doubly
linked list, so a rewrite inserts or erases an op in O(1) on a 25,000-op function. A *Region*
holds one block: control flow is structured (`scan`, `for`), never a CFG.

Variadic operands are grouped by name through the op's spec (`op.group("carries")`), never
sliced by position at the call site; the group sizes live in `op.segments`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import UNKNOWN, Location
from .printer import print_module
from .spec import REGISTRY, OpSpec
from .types import TensorType, Type


class Value:
    __slots__ = ("type", "name_hint", "uses")

    def __init__(self, type: Type, name_hint: str | None = None):
        self.type = type
        self.name_hint = name_hint
        """The source name without `%`, kept for printing; the printer makes names unique."""
        self.uses: dict[tuple[Operation, int], None] = {}
        """(user op, operand index) pairs, insertion-ordered; a dict for O(1) removal."""

    @property
    def users(self) -> list[Operation]:
        seen: dict[Operation, None] = {}
        for op, _ in self.uses:
            seen[op] = None
        return list(seen)

    def replace_all_uses_with(self, new: Value) -> None:
        for op, index in list(self.uses):
            op.set_operand(index, new)

    @property
    def tensor_type(self) -> TensorType:
        assert isinstance(self.type, TensorType), self.type
        return self.type

    @property
    def defining_op(self) -> Operation | None:
        """The op whose result this is; None for a block argument."""
        return None

    @property
    def defining_block(self) -> Block | None:
        """The block whose argument this is; None for an op result."""
        return None


class OpResult(Value):
    __slots__ = ("op", "index")

    def __init__(self, type: Type, op: Operation, index: int, name_hint: str | None = None):
        self.type = type  # Value.__init__, inlined: one per result of every op made
        self.name_hint = name_hint
        self.uses = {}
        self.op = op
        self.index = index

    @property
    def owner(self) -> Operation:
        return self.op

    @property
    def defining_op(self) -> Operation:
        return self.op


class BlockArgument(Value):
    __slots__ = ("block", "index")

    def __init__(self, type: Type, block: Block, index: int, name_hint: str | None = None):
        super().__init__(type, name_hint)
        self.block = block
        self.index = index

    @property
    def owner(self) -> Block:
        return self.block

    @property
    def defining_block(self) -> Block:
        return self.block


class Operation:
    """One op. Create through `Operation.create` (or the builder), which infers result types."""

    __slots__ = ("name", "attrs", "loc", "segments", "results", "regions", "parent", "prev", "next", "checked",
                 "operands", "__weakref__")
    # Slots: tens of thousands of ops are made and read per pass; a slot is cheaper than a
    # __dict__ entry to set and to read.

    def __init__(
        self,
        name: str,
        operands: Sequence[Value],
        result_types: Sequence[Type],
        attrs: dict[str, Any] | None = None,
        regions: Sequence[Region] = (),
        loc: Location = UNKNOWN,
        segments: tuple[int, ...] = (),
        result_names: Sequence[str | None] = (),
        _owned: bool = False,
    ):
        self.name = name
        self.attrs: dict[str, Any] = attrs if _owned and attrs is not None else dict(attrs or {})
        """(`_owned`: make_op hands over a dict it made, so it is not copied again.)"""
        self.loc = loc
        self.segments = segments
        """Sizes of the variadic operand groups named in the spec, in order."""
        n_names = len(result_names)
        if len(result_types) == 1:  # most ops: no comprehension, no enumerate (once per op made)
            self.results = [OpResult(result_types[0], self, 0, result_names[0] if n_names else None)]
        else:
            self.results = [OpResult(t, self, i, result_names[i] if i < n_names else None)
                            for i, t in enumerate(result_types)]
        self.regions: list[Region] = []
        if regions:
            for region in regions:
                self.add_region(region)
        self.parent: Block | None = None
        self.prev: Operation | None = None
        self.next: Operation | None = None
        self.checked: tuple | None = None
        """What the verifier's type check last accepted (ops.type_stamp), or None."""
        self.operands: list[Value] = list(operands)
        i = 0
        for value in self.operands:
            value.uses[(self, i)] = None
            i += 1

    # -- registry ---------------------------------------------------------------------------
    @property
    def spec(self) -> OpSpec:
        return REGISTRY[self.name]

    def group(self, name: str) -> list[Value]:
        """The operands of the variadic group `name` declared in the spec."""
        start, size = self.spec.segment_of(self, name)
        return self.operands[start : start + size]

    def result_group(self, name: str) -> list[OpResult]:
        """The results of the group `name` declared in the spec's `results`."""
        start, size = self.spec.derived_range(self, self.spec.results, len(self.results), name)
        return self.results[start : start + size]

    def arg_group(self, name: str) -> list[BlockArgument]:
        """The body arguments of the group `name` declared in the spec's `block_args`."""
        args = self.regions[0].block.args
        start, size = self.spec.derived_range(self, self.spec.block_args, len(args), name)
        return args[start : start + size]

    # -- operands ---------------------------------------------------------------------------
    def add_operand(self, value: Value) -> None:
        self.operands.append(value)
        value.uses[(self, len(self.operands) - 1)] = None

    def set_operand(self, index: int, value: Value) -> None:
        old = self.operands[index]
        del old.uses[(self, index)]
        self.operands[index] = value
        value.uses[(self, index)] = None

    def drop_operands(self) -> None:
        for i, v in enumerate(self.operands):
            v.uses.pop((self, i), None)
        self.operands = []

    @property
    def result(self) -> OpResult:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    # -- regions ----------------------------------------------------------------------------
    def add_region(self, region: Region) -> None:
        region.parent = self
        self.regions.append(region)

    @property
    def body(self) -> Block:
        return self.regions[0].block

    def walk(self) -> Iterator[Operation]:
        """This op and every op nested in its regions, in program order (pre-order)."""
        yield self
        for region in self.regions:
            yield from _walk_from(region.block.first)

    @property
    def parent_op(self) -> Operation | None:
        return self.parent.parent_op if self.parent is not None else None

    def is_ancestor_of(self, other: Operation) -> bool:
        op: Operation | None = other
        while op is not None:
            if op is self:
                return True
            op = op.parent_op
        return False

    def __repr__(self) -> str:
        return f"<op {self.name} at {self.loc}>"

    def clone(self, value_map: dict[Value, Value]) -> Operation:
        """A copy of this op and its regions (unlinked), its operands looked up in value_map
        (outer values not in it are kept); value_map learns the copy's results and block args."""
        regions = [Region(region.block.clone(value_map)) for region in self.regions]
        op = Operation(self.name, [value_map.get(v, v) for v in self.operands], [r.type for r in self.results],
                       _copy_attrs(self.attrs), regions, self.loc, self.segments,
                       [r.name_hint for r in self.results])
        op.checked = self.checked  # the copy's type check saw the same (stamp_holds compares values)
        for old, new in zip(self.results, op.results):
            value_map[old] = new
        return op


class Block:
    def __init__(self, arg_types: Sequence[Type] = (), arg_names: Sequence[str | None] = ()):
        self.args: list[BlockArgument] = [
            BlockArgument(t, self, i, arg_names[i] if i < len(arg_names) else None)
            for i, t in enumerate(arg_types)
        ]
        self.first: Operation | None = None
        self.last: Operation | None = None
        self.parent: Region | None = None
        self._len = 0

    @property
    def parent_op(self) -> Operation | None:
        return self.parent.parent if self.parent is not None else None

    @property
    def ops(self) -> list[Operation]:
        """A snapshot of the ops, so callers may mutate the block while iterating."""
        out = []
        op = self.first
        while op is not None:
            out.append(op)
            op = op.next
        return out

    def __iter__(self) -> Iterator[Operation]:
        op = self.first
        while op is not None:
            nxt = op.next
            yield op
            op = nxt

    def __len__(self) -> int:
        return self._len

    @property
    def terminator(self) -> Operation | None:
        return self.last

    def walk(self) -> Iterator[Operation]:
        """Every op of this block and, right after each, the ops nested in its regions."""
        return _walk_from(self.first)

    def num_ops(self) -> int:
        """The number of ops in this block and in the regions of its ops, at any depth."""
        n = self._len  # this block's own ops, kept by _link and unlink; then the nested ones
        op = self.first
        while op is not None:
            if op.regions:
                for region in op.regions:
                    n += region.block.num_ops()
            op = op.next
        return n

    # -- linked list ------------------------------------------------------------------------
    def _link(self, op: Operation, prev: Operation | None, nxt: Operation | None) -> None:
        assert op.parent is None, "op is already in a block"
        op.parent, op.prev, op.next = self, prev, nxt
        if prev is None:
            self.first = op
        else:
            prev.next = op
        if nxt is None:
            self.last = op
        else:
            nxt.prev = op
        self._len += 1

    def append(self, op: Operation) -> Operation:
        # _link(op, self.last, None), inlined: the parser appends every op it makes
        assert op.parent is None, "op is already in a block"
        last = self.last
        op.parent, op.prev, op.next = self, last, None
        if last is None:
            self.first = op
        else:
            last.next = op
        self.last = op
        self._len += 1
        return op

    def prepend(self, op: Operation) -> Operation:
        self._link(op, None, self.first)
        return op

    def insert_before(self, anchor: Operation, op: Operation) -> Operation:
        assert anchor.parent is self
        self._link(op, anchor.prev, anchor)
        return op

    def insert_after(self, anchor: Operation, op: Operation) -> Operation:
        assert anchor.parent is self
        self._link(op, anchor, anchor.next)
        return op

    def unlink(self, op: Operation) -> None:
        """Takes op out of the block without touching its operands (to move it)."""
        assert op.parent is self
        if op.prev is None:
            self.first = op.next
        else:
            op.prev.next = op.next
        if op.next is None:
            self.last = op.prev
        else:
            op.next.prev = op.prev
        op.parent = op.prev = op.next = None
        self._len -= 1

    def add_arg(self, type: Type, name: str | None = None, index: int | None = None) -> BlockArgument:
        index = len(self.args) if index is None else index
        arg = BlockArgument(type, self, index, name)
        self.args.insert(index, arg)
        for i, a in enumerate(self.args):
            a.index = i
        return arg

    def clone(self, value_map: dict[Value, Value]) -> Block:
        """A copy of this block with copies of its ops (see Operation.clone)."""
        block = Block([a.type for a in self.args], [a.name_hint for a in self.args])
        for old, new in zip(self.args, block.args):
            value_map[old] = new
        for op in self:
            block.append(op.clone(value_map))
        return block

    def erase_arg(self, arg: BlockArgument) -> None:
        assert not arg.uses, "block argument still has uses"
        self.args.remove(arg)
        for i, a in enumerate(self.args):
            a.index = i


def _walk_from(first: Operation | None) -> Iterator[Operation]:
    """Pre-order walk from `first` along its block, into regions, without a generator per op
    (a 25,000-op function is walked several times per pass). Like `Block.__iter__`, the next
    op is read before an op is yielded, and an op's regions after: the caller may erase the
    op it was given, or edit its body, and the walk goes on."""
    stack: list[Operation | None] = [first]
    while stack:
        op = stack.pop()
        if op is None:
            continue
        nxt = op.next
        yield op
        stack.append(nxt)
        regions = op.regions
        if regions:
            stack.extend(region.block.first for region in reversed(regions))


class Region:
    def __init__(self, block: Block | None = None):
        self.block = block if block is not None else Block()
        self.block.parent = self
        self.parent: Operation | None = None


def _copy_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attribute values are numbers, strings, booleans and (nested) lists: lists are copied so
    a pass editing a copy's list never edits the original's."""
    return {k: _copy_value(v) for k, v in attrs.items()}


def _copy_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    return value


def erase_op(op: Operation) -> None:
    """Unlinks op and drops the uses its operands (and its regions' ops) hold."""
    for region in op.regions:
        for inner in reversed(region.block.ops):
            erase_op(inner)
    op.drop_operands()
    if op.parent is not None:
        op.parent.unlink(op)


class Function:
    """`func @name(%a: T, ...) -> (R, ...) { body }`; the body is one block ending in `return`."""

    def __init__(
        self,
        name: str,
        arg_types: Sequence[TensorType],
        result_types: Sequence[TensorType],
        arg_names: Sequence[str | None] = (),
        loc: Location = UNKNOWN,
    ):
        self.name = name
        self.region = Region(Block(arg_types, arg_names))
        self.result_types = list(result_types)
        self.loc = loc
        self.module: Module | None = None

    @property
    def body(self) -> Block:
        return self.region.block

    @property
    def args(self) -> list[BlockArgument]:
        return self.body.args

    @property
    def arg_types(self) -> list[TensorType]:
        return [a.tensor_type for a in self.args]

    def walk(self) -> Iterator[Operation]:
        return self.body.walk()

    def num_ops(self) -> int:
        return self.body.num_ops()

    def clone(self) -> Function:
        """A copy of the function, locations and name hints included (not attached to a module)."""
        f = Function(self.name, self.arg_types, self.result_types, [a.name_hint for a in self.args], self.loc)
        value_map: dict[Value, Value] = dict(zip(self.args, f.args))
        for op in self.body:
            f.body.append(op.clone(value_map))
        return f


class Module:
    def __init__(self, functions: Sequence[Function] = (), filename: str = "<string>"):
        self.functions: dict[str, Function] = {}
        self.filename = filename
        for f in functions:
            self.add(f)

    def add(self, function: Function) -> None:
        function.module = self
        self.functions[function.name] = function

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def walk(self) -> Iterator[Operation]:
        for f in self.functions.values():
            yield from f.walk()

    def num_ops(self) -> int:
        return sum(f.num_ops() for f in self.functions.values())

    def clone(self) -> Module:
        """A deep copy: the same printed form, locations included; no node is shared."""
        return Module([f.clone() for f in self.functions.values()], self.filename)

    def __str__(self) -> str:
        return print_module(self)
