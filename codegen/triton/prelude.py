"""The helpers every generated Triton module starts with: index arithmetic with Python's
signs, math functions the interpreter lacks, NaN-propagating max/min, argmax/argmin combines."""

PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _floordiv(a, b):
    q = a // b
    return tl.where((a % b != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def _mod(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _expm1(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding error of u = exp(x)
    u = tl.exp(x)
    um1 = u - 1
    r = tl.where(u == 1, x, um1 * x / tl.log(u))
    r = tl.where(um1 == -1, -1.0, r)
    return tl.where((u == u) & (tl.abs(x) < 1e999), r, tl.where(x > 0, x, -1.0 + x * 0))


@triton.jit
def _log1p(x):
    u = 1 + x
    d = u - 1  # where 1 + x is exact (large x, +inf) the Kahan correction is 1: plain log
    return tl.where(u == 1, x, tl.where(d == x, tl.log(u), tl.log(u) * x / tl.where(u == 1, 1, d)))


@triton.jit
def _tanh(x):
    # The interpreter has no libdevice.tanh: evaluated in float64, so float32 results are
    # (nearly always) correctly rounded; saturated beyond 20 (also +-inf; NaN stays NaN).
    xd = x.to(tl.float64)
    e = _expm1(-2 * tl.abs(xd))
    t = tl.where(tl.abs(xd) > 20, 1.0, -e / (2 + e))
    return tl.where(xd < 0, -t, t).to(x.dtype)


@triton.jit
def _rne_bf16(x):
    # float32 -> bfloat16 rounded to nearest even, by its bits (used only under the interpreter:
    # its casts truncate and get subnormals wrong); NaN becomes c10's 0x7FC0
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16_f32(x):
    # bfloat16 -> float32 by its bits (used only under the interpreter)
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _nearbyint(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2 * tl.floor(f * 0.5)) != 0
    return tl.where(d > 0.5, f + 1, tl.where(d < 0.5, f, tl.where(odd, f + 1, f)))


@triton.jit
def _sign(a):
    # +-inf give +-1; NaN and -0.0 give 0, as torch.sign
    return tl.where(a > 0, 1, tl.where(a < 0, -1, 0)).to(a.dtype)


@triton.jit
def _ipow(a, b):
    # interpreter only (no libdevice there): C pow's sign and special cases around exp2/log2;
    # nested where, not &: the interpreter cannot broadcast & between 0-d and tile operands
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    odd = (b - 2 * tl.floor(b * 0.5)) != 0
    r = tl.where(a < 0, tl.where(tl.floor(b) == b, tl.where(odd, -r, r), float('nan')), r)
    r = tl.where(b == 0, 1.0, r)
    return tl.where(a == 1, 1.0, r)


@triton.jit
def _itan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def _iatan(x):
    # interpreter only: in float64, |x| > 1 by pi/2 - atan(1/x), then two halvings
    # (atan(y) = 2 atan(y / (1 + sqrt(1 + y^2)))) to |y| <= 0.2 and a 14-term series; NaN stays
    xd = x.to(tl.float64)
    a = tl.abs(xd)
    big = a > 1
    y = tl.where(big, 1 / tl.where(big, a, 1.0), a)
    y = y / (1 + tl.sqrt(1 + y * y))
    y = y / (1 + tl.sqrt(1 + y * y))
    y2 = y * y
    s = tl.zeros_like(y)
    for k in tl.static_range(13, -1, -1):
        s = s * y2 + (1 - 2 * (k % 2)) / (2 * k + 1)
    r = 4 * y * s
    r = tl.where(big, 1.5707963267948966 - r, r)
    return tl.where(a == 0, xd, tl.where(xd < 0, -r, r)).to(x.dtype)  # (-0 stays -0)


@triton.jit
def _iasin(x):
    # interpreter only: atan(x / sqrt(1 - x^2)) in float64 (+-1: +-pi/2; |x| > 1: NaN)
    xd = x.to(tl.float64)
    return _iatan(xd / tl.sqrt(1 - xd * xd)).to(x.dtype)


@triton.jit
def _iacos(x):
    # interpreter only: 2 atan(sqrt((1 - x) / (1 + x))) in float64, exact near x = 1
    xd = x.to(tl.float64)
    return (2 * _iatan(tl.sqrt((1 - xd) / (1 + xd)))).to(x.dtype)


@triton.jit
def _isinh(x):
    return (_expm1(x) - _expm1(-x)) * 0.5


@triton.jit
def _icosh(x):
    return (tl.exp(x) + tl.exp(-x)) * 0.5


@triton.jit
def _ierfc(x):
    return 1.0 - tl.erf(x)


@triton.jit
def _prod(a, b):
    return a * b


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _argmax_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v1 == v2) | (n1 & n2)
    take = ((v2 > v1) & (n1 == 0)) | (n2 & (n1 == 0)) | (tie & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _argmin_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v1 == v2) | (n1 & n2)
    take = ((v2 < v1) & (n1 == 0)) | (n2 & (n1 == 0)) | (tie & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
'''
