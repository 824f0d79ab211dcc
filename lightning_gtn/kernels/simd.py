"""Eight-lane vectors for numba kernels: a value type the compiler keeps in registers.

numba's loop vectoriser gives up on the gather loops of the shared-graph kernel
(:mod:`lightning_gtn.kernels.mmi_numba`): ``y[g, :] += x[src, :] * p`` over several source
rows needs a runtime overlap check per source row, and past a handful of them LLVM keeps the
scalar loop. Here a vector of eight float32 or float64 values is a numba type of its own
(:class:`Vec8`, an LLVM ``<8 x float>`` or ``<8 x double>``), loaded from and stored to
C-contiguous arrays at a flat element offset, so a kernel spells its vector code out and keeps
its accumulators in registers. LLVM lowers the eight lanes to what the machine has (one AVX
register, two SSE or NEON registers, ...).

The loads and stores do no bounds checks and no negative-index wrap (as numba's own indexing,
which checks no bounds either): the kernel that calls them proves its offsets in range, and
:func:`ld` is for index arrays whose values its caller has range-checked.
"""

from __future__ import annotations

from typing import Any, Callable

from llvmlite import ir  # type: ignore[import-untyped]
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = [
    "Vec8",
    "vzero",
    "vsplat",
    "vload",
    "vstore",
    "vfma",
    "vadd",
    "vsub",
    "vmul",
    "vmax",
    "vexp",
    "vtrans8",
    "ld",
    "st",
    "LANES",
]

#: values per vector
LANES = 8


class Vec8(types.Type):
    """Eight float32 or float64 values (``dtype``) held as one LLVM vector."""

    def __init__(self, dtype: types.Type) -> None:
        self.dtype = dtype
        super().__init__(name=f"Vec8({dtype})")


_VEC = {types.float32: Vec8(types.float32), types.float64: Vec8(types.float64)}


@register_model(Vec8)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        elt = ir.FloatType() if fe_type.dtype == types.float32 else ir.DoubleType()
        super().__init__(dmm, fe_type, ir.VectorType(elt, LANES))


def _float_array(a) -> bool:
    return isinstance(a, types.Array) and a.layout == "C" and a.dtype in _VEC


def _pointer(context, builder, aty, aval, off):
    """The address of element ``off`` (flat) of the C-contiguous array ``aval``."""
    arr = context.make_array(aty)(context, builder, aval)
    return builder.gep(arr.data, [off])


@intrinsic
def _vzero(typingctx, a):
    """Eight zeros of the dtype of the array ``a``."""
    if not _float_array(a):
        return None
    vt = _VEC[a.dtype]

    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(vt), None)

    return vt(a), codegen


@intrinsic
def _vsplat(typingctx, x):
    """Eight copies of the float ``x``."""
    if x not in _VEC:
        return None
    vt = _VEC[x]

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(vt)
        one = builder.insert_element(ir.Constant(ty, ir.Undefined), args[0], ir.Constant(ir.IntType(32), 0))
        mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(one, ir.Constant(ty, ir.Undefined), mask)

    return vt(x), codegen


@intrinsic
def _vload(typingctx, a, off):
    """The eight elements of ``a`` (C-contiguous, any rank) from flat offset ``off``."""
    if not _float_array(a) or not isinstance(off, types.Integer):
        return None
    vt = _VEC[a.dtype]

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1])
        vp = builder.bitcast(ptr, context.get_value_type(vt).as_pointer())
        return builder.load(vp, align=a.dtype.bitwidth // 8)

    return vt(a, types.intp), codegen


@intrinsic
def _vstore(typingctx, a, off, v):
    """Writes the vector ``v`` to the eight elements of ``a`` from flat offset ``off``."""
    if not _float_array(a) or not isinstance(off, types.Integer) or v != _VEC.get(a.dtype):
        return None

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(ptr, args[2].type.as_pointer()), align=a.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(a, types.intp, v), codegen


@intrinsic
def _vfma(typingctx, acc, x, y):
    """``acc + x * y`` lane by lane (fused where the machine has it)."""
    if not isinstance(acc, Vec8) or x != acc or y != acc:
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        name = f"llvm.fmuladd.v{LANES}f{32 if ty.element == ir.FloatType() else 64}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), name)
        return builder.call(fn, [args[1], args[2], args[0]])

    return acc(acc, x, y), codegen


@intrinsic
def _vadd(typingctx, x, y):
    """``x + y`` lane by lane."""
    if not isinstance(x, Vec8) or y != x:
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return x(x, y), codegen


@intrinsic
def _vmul(typingctx, x, y):
    """``x * y`` lane by lane."""
    if not isinstance(x, Vec8) or y != x:
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])

    return x(x, y), codegen


@intrinsic
def _vsub(typingctx, x, y):
    """``x - y`` lane by lane."""
    if not isinstance(x, Vec8) or y != x:
        return None

    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], args[1])

    return x(x, y), codegen


@intrinsic
def _vmax(typingctx, x, y):
    """``x if x > y else y`` lane by lane (``y`` where ``x`` is NaN)."""
    if not isinstance(x, Vec8) or y != x:
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return x(x, y), codegen


def _const(ty, value):
    return ir.Constant(ty, [value] * LANES)


@intrinsic
def _vexp(typingctx, x):
    """``exp(x)`` lane by lane. float32, for ``x <= 0`` (no vector math library here): ``2^k e^r``
    with ``k`` the nearest integer to ``x / ln 2``, ``r = x - k ln 2`` (``ln 2`` in two parts, so
    ``r`` is exact to float32), ``e^r`` (``|r| <= ln 2 / 2``) by its degree-6 Taylor polynomial
    (relative error below ``2.5e-7`` measured against float64; its multiply-adds fused) and
    ``2^k`` added into the exponent bits; 0 below -87 (float32's normal range) and for ``-inf``.
    float64: LLVM's ``exp``."""
    if not isinstance(x, Vec8):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        if ty.element != ir.FloatType():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty]), f"llvm.exp.v{LANES}f64")
            return builder.call(fn, [args[0]])
        ity = ir.VectorType(ir.IntType(32), LANES)
        v = args[0]
        lo = _const(ty, -87.0)
        xc = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)
        hi = _const(ty, 88.0)
        xc = builder.select(builder.fcmp_ordered("<", xc, hi), xc, hi)
        floor = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty]), f"llvm.floor.v{LANES}f32")
        fma_ty = ir.FunctionType(ty, [ty, ty, ty])
        fma = cgutils.get_or_insert_function(builder.module, fma_ty, f"llvm.fmuladd.v{LANES}f32")

        def mad(a, b, c):  # a * b + c, one instruction where the machine fuses
            return builder.call(fma, [a, b, c])

        k = builder.call(floor, [mad(xc, _const(ty, 1.4426950408889634), _const(ty, 0.5))])
        r = mad(k, _const(ty, 2.12194440e-4), mad(k, _const(ty, -0.693359375), xc))
        q = _const(ty, 1.0 / 720.0)
        for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
            q = mad(q, r, _const(ty, c))
        ki = builder.shl(builder.fptosi(k, ity), _const(ity, 23))
        y = builder.bitcast(builder.add(builder.bitcast(q, ity), ki), ty)
        return builder.select(builder.fcmp_ordered(">", v, lo), y, ir.Constant(ty, None))

    return x(x), codegen


@intrinsic
def _ld(typingctx, a, i):
    """``a.flat[i]`` of a C-contiguous array of any rank, without numba's negative-index wrap
    (``0 <= i < a.size`` is the caller's guarantee)."""
    if not isinstance(a, types.Array) or a.layout != "C" or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1]))

    return a.dtype(a, types.intp), codegen


@intrinsic
def _st(typingctx, a, i, x):
    """``a.flat[i] = x`` for a C-contiguous array of any rank (``0 <= i < a.size`` is the
    caller's guarantee)."""
    if not isinstance(a, types.Array) or a.layout != "C" or not isinstance(i, types.Integer):
        return None
    if not isinstance(x, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        val = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
        builder.store(val, _pointer(context, builder, sig.args[0], args[0], args[1]))
        return context.get_dummy_value()

    return types.none(a, types.intp, x), codegen


def _transpose8(builder, rows):
    """The 8x8 transpose of eight ``<8 x T>`` vectors (``out[j][i] = rows[i][j]``) in three rounds
    of two-vector shuffles (LLVM lowers them to the machine's unpack / shuffle / permute)."""

    def shuf(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), LANES), idx))

    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for i in range(0, 8, 2):
        t += [shuf(rows[i], rows[i + 1], lo), shuf(rows[i], rows[i + 1], hi)]
    lo2, hi2 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = []
    for i in (0, 4):
        u += [shuf(t[i], t[i + 2], lo2), shuf(t[i], t[i + 2], hi2), shuf(t[i + 1], t[i + 3], lo2)]
        u += [shuf(t[i + 1], t[i + 3], hi2)]
    lo4, hi4 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    out = [None] * 8
    for j in range(4):
        out[j], out[j + 4] = shuf(u[j], u[j + 4], lo4), shuf(u[j], u[j + 4], hi4)
    return out


@intrinsic
def _vtrans8(typingctx, src, soff, sbase, dst, doff, dbase):
    """Eight vectors read from ``src.flat[soff[i] + sbase:][:8]`` (``i < 8``), transposed, and
    written to ``dst.flat[doff[j] + dbase:][:8]`` (``j < 8``): vector ``j`` written holds element
    ``j`` of each vector read. ``soff`` and ``doff``: int64 arrays of eight offsets. No bounds
    checks (the caller's offsets are in range)."""
    if not (_float_array(src) and _float_array(dst) and src.dtype == dst.dtype):
        return None
    for off in (soff, doff):
        if not (isinstance(off, types.Array) and off.dtype == types.int64 and off.layout == "C"):
            return None
    if not isinstance(sbase, types.Integer) or not isinstance(dbase, types.Integer):
        return None
    vt = _VEC[src.dtype]

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(vt)
        align = src.dtype.bitwidth // 8
        so = context.make_array(sig.args[1])(context, builder, args[1]).data
        do = context.make_array(sig.args[4])(context, builder, args[4]).data
        sb = context.cast(builder, args[2], sig.args[2], types.intp)
        db = context.cast(builder, args[5], sig.args[5], types.intp)
        rows = []
        for i in range(LANES):
            o = builder.add(builder.load(builder.gep(so, [ir.Constant(ir.IntType(64), i)])), sb)
            ptr = _pointer(context, builder, sig.args[0], args[0], o)
            rows.append(builder.load(builder.bitcast(ptr, vty.as_pointer()), align=align))
        for j, v in enumerate(_transpose8(builder, rows)):
            o = builder.add(builder.load(builder.gep(do, [ir.Constant(ir.IntType(64), j)])), db)
            ptr = _pointer(context, builder, sig.args[3], args[3], o)
            builder.store(v, builder.bitcast(ptr, vty.as_pointer()), align=align)
        return context.get_dummy_value()

    return types.none(src, soff, types.intp, dst, doff, types.intp), codegen


# typed as the kernels call them (an intrinsic's own signature takes the typing context first)
vzero: Callable[..., Any] = _vzero
vsplat: Callable[..., Any] = _vsplat
vload: Callable[..., Any] = _vload
vstore: Callable[..., Any] = _vstore
vfma: Callable[..., Any] = _vfma
vadd: Callable[..., Any] = _vadd
vmul: Callable[..., Any] = _vmul
ld: Callable[..., Any] = _ld
st: Callable[..., Any] = _st
vsub: Callable[..., Any] = _vsub
vmax: Callable[..., Any] = _vmax
vexp: Callable[..., Any] = _vexp
vtrans8: Callable[..., Any] = _vtrans8
