"""Scalar math for fused loops, as straight-line LLVM IR that the loop vectoriser can widen:
the CPU's emitters of ir/scalar.py's math primitives (sigmoid is built from tanh there).

float32 exp/tanh are Cephes-style polynomial approximations (a few ulp): LLVM's
`llvm.exp.f32` would become a call to libm's expf, which does not vectorise and on an RNN
step costs as much as the GEMMs. float64 calls libm, so float64 results match NumPy closely.
"""

from __future__ import annotations

from llvmlite import ir

F32, F64 = ir.FloatType(), ir.DoubleType()


def _c(t: ir.Type, v: float) -> ir.Constant:
    return ir.Constant(t, v)


def _intrinsic(b: ir.IRBuilder, name: str, t: ir.Type, *args: ir.Value) -> ir.Value:
    fn = b.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t] * len(args)))
    return b.call(fn, list(args))


def _libm(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    module = b.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(F64, [F64] * len(args)), name)
    return b.call(fn, list(args))


def _poly(b: ir.IRBuilder, x: ir.Value, coeffs: list[float]) -> ir.Value:
    acc = _c(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = b.fadd(b.fmul(acc, x), _c(x.type, c))
    return acc


def exp_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x: x = n ln2 + r, a degree-7 polynomial for e**r, times 2**n (built from exponent
    bits in two halves, so that n = 128 near the overflow and subnormal results both work)."""
    hi = _c(F32, 88.72283905206835)  # ln(FLT_MAX): above it the result is inf
    lo = _c(F32, -103.972077083991796)  # below it the result is 0
    xc = b.select(b.fcmp_ordered(">", x, hi), hi, x)
    xc = b.select(b.fcmp_ordered("<", xc, lo), lo, xc)
    n = _intrinsic(b, "llvm.floor", F32, b.fadd(b.fmul(xc, _c(F32, 1.44269504088896341)), _c(F32, 0.5)))
    r = b.fsub(b.fsub(xc, b.fmul(n, _c(F32, 0.693359375))), b.fmul(n, _c(F32, -2.12194440e-4)))
    p = _poly(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                     5.0000001201e-1])
    y = b.fadd(b.fadd(b.fmul(b.fmul(p, r), r), r), _c(F32, 1.0))
    i32 = ir.IntType(32)
    ni = b.fptosi(n, i32)
    half = b.ashr(ni, ir.Constant(i32, 1))
    rest = b.sub(ni, half)

    def pow2(k: ir.Value) -> ir.Value:
        return b.bitcast(b.shl(b.add(k, ir.Constant(i32, 127)), ir.Constant(i32, 23)), F32)

    out = b.fmul(b.fmul(y, pow2(half)), pow2(rest))
    out = b.select(b.fcmp_ordered("<", x, lo), _c(F32, 0.0), out)  # the clamp at lo leaves 1.4e-45, not 0
    return b.select(b.fcmp_ordered(">", x, hi), _c(F32, float("inf")), out)


TANH_P = [1.3357844330652568e-08, 2.0611403273744933e-05, 0.0034957301914166935, 0.13381145591745078,
          0.9999999795105982]
TANH_Q = [7.77786808785208e-07, 0.000328586643378135, 0.02587752370594229, 0.46714461228330867, 1.0]
"""tanh(x) = x P(x^2) / Q(x^2) on [-9, 9] (highest power first): a (4, 4) rational fit of
relative error 2e-8 in float64, at most 7 ulp evaluated in float32 (worst near |x| = 7).
Beyond 9 tanh is 1 in float32. Fitted for gir by weighted least squares on the relative
error, iterated toward minimax (docs/backend.md, "Math")."""


def tanh_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A rational approximation: 9 multiply-adds and one division, no exp. The exp-based form
    (1 - 2 / (e^2x + 1), a polynomial near 0) took ~45 vector instructions a lane group and
    made the LSTM's five activations per element 4 of a forward scan's ms. Ordered compares:
    NaN passes through."""
    nine = _c(F32, 9.0)
    xc = b.select(b.fcmp_ordered(">", x, nine), nine, x)
    xc = b.select(b.fcmp_ordered("<", xc, _c(F32, -9.0)), _c(F32, -9.0), xc)
    z = b.fmul(xc, xc)
    r = b.fdiv(b.fmul(xc, _poly(b, z, TANH_P)), _poly(b, z, TANH_Q))
    r = b.select(b.fcmp_ordered(">", r, _c(F32, 1.0)), _c(F32, 1.0), r)  # the fit reaches 1 + 1 ulp
    return b.select(b.fcmp_ordered("<", r, _c(F32, -1.0)), _c(F32, -1.0), r)


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return exp_f32(b, x) if x.type == F32 else _libm(b, "exp", x)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return tanh_f32(b, x) if x.type == F32 else _libm(b, "tanh", x)


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.log", x.type, x)


def sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.sqrt", x.type, x)


def sin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.sin", x.type, x)


def cos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.cos", x.type, x)


def fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.fabs", x.type, x)


def pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return _intrinsic(b, "llvm.pow", x.type, x, y)
