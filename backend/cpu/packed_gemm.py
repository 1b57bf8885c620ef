"""gir's own GEMM for a loop-invariant weight: the `gir-packed` path.

A scan step's GEMMs are small (32 x 256 by 256 x 768 for an LSTM at batch 32) and their weight
is the same at every step. OpenBLAS packs that weight again at every call (~10 % of an LSTM-S
step in `perf`, docs/performance-rnn.md) and reaches ~70 GFLOP/s a core at these shapes. Here
the weight is packed once per scan, before its loop, into panels of `width` columns (row k of a
panel holds its columns' k-th weights, contiguous), and each step's product runs a register
tile of MR rows x NV vectors over K: 4 x 24 floats on AVX2, 12 accumulators in 12 of the 16
vector registers, one FMA per accumulator per k, three vector loads and four broadcasts. On
this EPYC it runs at 84-92 GFLOP/s on one core where OpenBLAS's one-thread GEMM reaches 64-80
(`python bench/packed_gemm.py`). Whether a shape takes it is measured beside the BLAS paths
(blas.py).

The work splits by blocks of MR rows: `task` has the signature of OpenBLAS's level-1 routines,
so lower/gemm.py hands it to `blas_level1_thread` (team.py), which runs half the blocks on the
calling thread and half on OpenBLAS's pool thread; every thread reads the whole packed weight
and writes its own rows of C.

Only LLVM IR builders here (llvmlite.ir, no LLVM library): lower/gemm.py emits these functions
into the compiled function's module, blas.py into a module of their own to measure them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .ir_loops import counted

MR = 4
"""Rows of A in a register tile."""
NV = 3
"""Vectors of the weight in a register tile (MR * NV accumulators)."""
LANES = {"f32": 8, "f64": 4}
"""Elements of a 256-bit vector (AVX2)."""
TYPES = {"f32": ir.FloatType(), "f64": ir.DoubleType()}
I64 = ir.IntType(64)
PTR = ir.PointerType()


@dataclass(frozen=True)
class Shape:
    """C (m x n, row-major) = A B, plus C when beta is 1: A is m x k (k x m when ta), B k x n
    (n x k when tb)."""

    dtype: str
    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    beta: float = 0.0

    @property
    def lanes(self) -> int:
        return LANES[self.dtype]

    @property
    def width(self) -> int:
        """Columns of a panel of the packed weight."""
        return self.lanes * NV

    @property
    def panels(self) -> int:
        return -(-self.n // self.width)

    @property
    def blocks(self) -> int:
        """Blocks of MR rows (the last may be short): the units the work splits into."""
        return -(-self.m // MR)

    @property
    def packed_bytes(self) -> int:
        return self.panels * self.width * self.k * (4 if self.dtype == "f32" else 8)

    @property
    def tag(self) -> str:
        return f"{self.dtype}_{self.m}x{self.n}x{self.k}_{int(self.ta)}{int(self.tb)}_{int(self.beta)}"


def _const(x: int) -> ir.Constant:
    return ir.Constant(I64, x)


def _function(module: ir.Module, name: str, args: list[ir.Type], internal: bool = True) -> ir.Function:
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)
    if internal:
        fn.linkage = "internal"
    return fn


def _fma(module: ir.Module, vec: ir.VectorType) -> ir.Function:
    name = f"llvm.fma.v{vec.count}{'f32' if vec.element == ir.FloatType() else 'f64'}"
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(vec, [vec, vec, vec]), name=name)


def emit_pack(module: ir.Module, s: Shape) -> ir.Function:
    """`gir_pack_<dtype>_<tb>(src, dest, n, k)`: the k x n weight (n x k when tb) at src into
    panels at dest; the last panel's missing columns are zeros. One function per dtype and
    orientation, its sizes arguments: with constant sizes LLVM unrolled the transposed pack
    into 0.6 MB of IR (0.5 s to compile one shape), and a pack runs once per scan."""
    fn = _function(module, f"gir_pack_{s.dtype}_{int(s.tb)}", [PTR, PTR, I64, I64], internal=False)
    if fn.blocks:
        return fn
    fn.attributes.add("noinline")  # inlined into gir_main, its sizes would be constants again
    src, dest, n, k = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ty, w = TYPES[s.dtype], s.width

    def put(p: ir.Value, kk: ir.Value, j: ir.Value, value: ir.Value) -> None:
        at = b.add(b.mul(b.add(b.mul(p, k), kk), _const(w)), j)
        b.store(value, b.gep(dest, [at], source_etype=ty))

    def get(col: ir.Value, kk: ir.Value) -> ir.Value:
        at = b.add(b.mul(col, k), kk) if s.tb else b.add(b.mul(kk, n), col)
        return b.load(b.gep(src, [at], source_etype=ty), typ=ty)

    with counted(b, _const(0), b.udiv(b.add(n, _const(w - 1)), _const(w)), "p") as p:
        first = b.mul(p, _const(w))
        left = b.sub(n, first)
        cols = b.select(b.icmp_signed("<", left, _const(w)), left, _const(w))
        # The source read along its rows: kk inner when tb (the panel being written, k x
        # width, stays in L1). Reading down its columns took 355 us for LSTM-S's 1024 x 256
        # weight (timed once by hand), this order 234 us (`python bench/packed_gemm.py --pack`).
        outer, inner = (cols, k) if s.tb else (k, cols)
        with counted(b, _const(0), outer, "i") as i:
            with counted(b, _const(0), inner, "i2") as i2:
                kk, j = (i2, i) if s.tb else (i, i2)
                put(p, kk, j, get(b.add(first, j), kk))
        with counted(b, _const(0), k, "kz") as kk:
            with counted(b, cols, _const(w), "z") as j:
                put(p, kk, j, ir.Constant(ty, 0.0))
    b.ret_void()
    return fn


def _tile(module: ir.Module, s: Shape, rows: int, cols: int) -> ir.Function:
    """`tile(c, a, bp)`: C[rows x cols] (+)= A[rows x k] times one panel, the accumulators in
    registers; c, a and bp point at the tile's first element of C, A and the panel."""
    fn = _function(module, f"gir_ptile_{s.tag}_{rows}x{cols}", [PTR, PTR, PTR])
    if fn.blocks:
        return fn
    for arg in fn.args:
        arg.add_attribute("noalias")
    c, a, bp = fn.args
    vec = ir.VectorType(TYPES[s.dtype], s.lanes)
    nv = -(-cols // s.lanes)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    acc = [[ir.Constant(vec, [0.0] * s.lanes)] * nv for _ in range(rows)]
    if s.k > 0:
        acc = _k_loop(module, b, s, a, bp, acc)
    for r in range(rows):
        for j in range(nv):
            _store(b, s, c, r * s.n + j * s.lanes, acc[r][j], min(s.lanes, cols - j * s.lanes))
    b.ret_void()
    return fn


def _k_loop(module: ir.Module, b: ir.IRBuilder, s: Shape, a: ir.Value, bp: ir.Value,
            init: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """The tile's loop over k (k >= 1), its accumulators phis: at each k, NV vectors of the
    panel's row k, and per row of A one element broadcast and NV FMAs. Returns the sums."""
    ty, lanes, entry = TYPES[s.dtype], s.lanes, b.block
    vec = ir.VectorType(ty, lanes)
    body = b.append_basic_block("k")
    b.branch(body)
    b.position_at_end(body)
    kk = b.phi(I64, "kk")
    kk.add_incoming(_const(0), entry)
    phis = [[b.phi(vec) for _ in row] for row in init]
    base = b.mul(kk, _const(s.width))
    weights = [b.load(b.gep(bp, [b.add(base, _const(j * lanes))], source_etype=ty), typ=vec, align=4)
               for j in range(len(init[0]))]
    fma = _fma(module, vec)
    i32 = ir.IntType(32)
    broadcast = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
    out = []
    for r, row in enumerate(phis):
        at = b.add(b.mul(kk, _const(s.m)), _const(r)) if s.ta else b.add(_const(r * s.k), kk)
        x = b.load(b.gep(a, [at], source_etype=ty), typ=ty)
        one = b.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(i32, 0))
        splat = b.shuffle_vector(one, ir.Constant(vec, ir.Undefined), broadcast)
        out.append([b.call(fma, [splat, weights[j], phi]) for j, phi in enumerate(row)])
    nxt = b.add(kk, _const(1))
    kk.add_incoming(nxt, body)
    for r, row in enumerate(phis):
        for j, phi in enumerate(row):
            phi.add_incoming(init[r][j], entry)
            phi.add_incoming(out[r][j], body)
    done = b.append_basic_block("store")
    b.cbranch(b.icmp_signed("<", nxt, _const(s.k)), body, done)
    b.position_at_end(done)
    return out


def _store(b: ir.IRBuilder, s: Shape, c: ir.Value, at: int, value: ir.Value, valid: int) -> None:
    """C[at : at + valid] = value's first `valid` lanes (plus what C held, when beta is 1)."""
    ty = TYPES[s.dtype]
    if valid == s.lanes:
        ptr = b.gep(c, [_const(at)], source_etype=ty)
        if s.beta:
            value = b.fadd(value, b.load(ptr, typ=value.type, align=4))
        b.store(value, ptr, align=4)
        return
    for lane in range(valid):  # the last panel's ragged edge
        ptr = b.gep(c, [_const(at + lane)], source_etype=ty)
        x = b.extract_element(value, ir.Constant(ir.IntType(32), lane))
        b.store(b.fadd(x, b.load(ptr, typ=ty)) if s.beta else x, ptr)


def emit_rows(module: ir.Module, s: Shape) -> ir.Function:
    """`gir_pgemm_<tag>(c, a, bp, lo, hi)`: rows [lo * MR, hi * MR) of C (blocks lo to hi),
    panel by panel: a panel is read once and stays in L1 for all of its blocks."""
    fn = _function(module, f"gir_pgemm_{s.tag}", [PTR, PTR, PTR, I64, I64])
    if fn.blocks:
        return fn
    c, a, bp, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ty, w = TYPES[s.dtype], s.width
    full_blocks, short_rows = divmod(s.m, MR)
    full_panels, short_cols = divmod(s.n, w)

    def panel(p: ir.Value, cols: int) -> None:
        def tile(blk: ir.Value, rows: int) -> None:
            r0 = b.mul(blk, _const(MR))
            pc = b.gep(c, [b.add(b.mul(r0, _const(s.n)), b.mul(p, _const(w)))], source_etype=ty)
            pa = b.gep(a, [r0 if s.ta else b.mul(r0, _const(s.k))], source_etype=ty)
            pb = b.gep(bp, [b.mul(p, _const(w * s.k))], source_etype=ty)
            b.call(_tile(module, s, rows, cols), [pc, pa, pb])

        top = b.select(b.icmp_signed("<", hi, _const(full_blocks)), hi, _const(full_blocks))
        with counted(b, lo, top, "blk") as blk:
            tile(blk, MR)
        if short_rows:  # the last block, when in [lo, hi)
            inside = b.and_(b.icmp_signed("<=", lo, _const(full_blocks)), b.icmp_signed(">", hi, _const(full_blocks)))
            with b.if_then(inside):
                tile(_const(full_blocks), short_rows)

    with counted(b, _const(0), _const(full_panels), "p") as p:
        panel(p, w)
    if short_cols:
        panel(_const(full_panels), short_cols)
    b.ret_void()
    return fn


TASK_ARGS = 3
"""Words of a task's `args`: the addresses of C, A and the packed weight."""


def emit_task(module: ir.Module, s: Shape, unit: int, internal: bool = True) -> ir.Function:
    """`gir_ptask_<tag>(m, n, k, args, lda, b)`, OpenBLAS's level-1 routine signature (team.py):
    blocks [b / unit, b / unit + m) of the product whose C, A and packed weight are `args`."""
    name = f"gir_ptask_{s.tag}"
    if name in module.globals:
        return module.globals[name]
    fn = _function(module, name, [I64, I64, I64, PTR, I64, PTR], internal)
    count, _, _, args, _, start = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c, a, bp = (b.inttoptr(b.load(b.gep(args, [_const(8 * i)], source_etype=ir.IntType(8)), typ=I64), PTR)
                for i in range(TASK_ARGS))
    lo = b.udiv(b.ptrtoint(start, I64), _const(unit))
    b.call(emit_rows(module, s), [c, a, bp, lo, b.add(lo, count)])
    b.ret_void()
    return fn


def standalone(s: Shape, unit: int) -> ir.Module:
    """A module of its own with `gir_pack_<dtype>_<tb>` and `gir_ptask_<tag>` (for measuring)."""
    module = ir.Module(name=f"packed_{s.tag}")
    emit_pack(module, s)
    emit_task(module, s, unit, internal=False)
    return module

