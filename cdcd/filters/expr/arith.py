"""Arithmetic and conversions of numbers, dates and timestamps as PostgreSQL computes them: integer operators
with their overflow checks, exact numeric (Decimal) division, modulo and rounding, float4/float8 rounding and
errors, and the conversions casts use between number, oid, date and timestamp values (the representations are
described in ``types``). Failures raise ``Unevaluable`` with PostgreSQL's message."""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_HALF_UP, Context, Decimal
from fractions import Fraction
from typing import Final

from cdcd.filters.expr.errors import Unevaluable
from cdcd.filters.expr.types import DISPLAY, INT_LIMITS
from cdcd.pgtypes import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, days_from_civil

NCTX: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])  # exact; NaN instead of errors
_NAN: Final = Decimal("NaN")
_INF: Final = Decimal("Infinity")
_NINF: Final = Decimal("-Infinity")
_ONE: Final = Decimal(1)
US_PER_DAY: Final = 86_400_000_000
TS_MIN: Final = days_from_civil(-4713, 11, 24) * US_PER_DAY  # 4714-11-24 BC
TS_END: Final = days_from_civil(294277, 1, 1) * US_PER_DAY  # exclusive
DATE_END: Final = days_from_civil(5874898, 1, 1)
_F4: Final = struct.Struct("<f")
_U32: Final = struct.Struct("<I")
_NAN_F: Final = float("nan")
_F4_TINY: Final = float(_F4.unpack(_U32.pack(1))[0])  # the smallest positive float4


def _f4(x: float) -> float:
    """``x`` rounded to float4 (ties to even); OverflowError when finite ``x`` rounds past the float4 range."""
    return float(_F4.unpack(_F4.pack(x))[0])


def f4_exact(x: Decimal | int | str) -> float:
    """The float4 nearest to ``x`` (one rounding, as strtof), not float4(float8(x)) which can round twice."""
    d = float(x)
    r = _f4(d)
    if r == d or not math.isfinite(d):
        return r
    bits = _U32.unpack(_F4.pack(r))[0]
    step = 1 if (d > r) == (r > 0) else -1
    other = float(_F4.unpack(_U32.pack(bits + step))[0]) if r else math.copysign(_F4_TINY, d)
    if (r + other) / 2 != d:
        return r
    exact = Fraction(Decimal(x) if isinstance(x, str) else x)
    if exact == Fraction(d):
        return r
    return max(r, other) if exact > Fraction(d) else min(r, other)


def _dscale(d: Decimal) -> int:
    exponent = d.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def dec(d: Decimal) -> Decimal:
    """``d`` with a non-positive exponent (numeric has no positive exponents: 1E+3 is 1000, dscale 0)."""
    exponent = d.as_tuple().exponent
    if isinstance(exponent, int) and exponent > 0:
        return d.quantize(_ONE, context=NCTX)
    return d


def int_check(type_name: str) -> Callable[[int], int]:
    lo, hi, message = INT_LIMITS[type_name]

    def check(v: int) -> int:
        if lo <= v <= hi:
            return v
        raise Unevaluable(message)

    return check


def int_div(a: int, b: int) -> int:
    if b == 0:
        raise Unevaluable("division by zero")
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def int_mod(a: int, b: int) -> int:
    if b == 0:
        raise Unevaluable("division by zero")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def checked_int_op(op: Callable[[int, int], int], type_name: str) -> Callable[[int, int], int]:
    lo, hi, message = INT_LIMITS[type_name]

    def apply(a: int, b: int) -> int:
        r = op(a, b)
        if lo <= r <= hi:
            return r
        raise Unevaluable(message)

    return apply


def _weight(d: Decimal) -> tuple[int, int]:
    """PostgreSQL's base-10000 weight and first digit of a nonzero finite numeric."""
    w = d.adjusted() // 4
    return w, int(NCTX.scaleb(abs(d), Decimal(-4 * w)))


def _div_scale(a: Decimal, b: Decimal) -> int:
    """numeric.c select_div_scale: at least 16 significant digits, no less than either input's scale."""
    w1, f1 = _weight(a) if a else (0, 0)
    w2, f2 = _weight(b)
    qweight = w1 - w2 - (1 if f1 <= f2 else 0)
    return min(max(16 - 4 * qweight, _dscale(a), _dscale(b), 0), 1000)


def num_div(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return _NAN
    if not b:
        raise Unevaluable("division by zero")
    if a.is_infinite():
        return _NAN if b.is_infinite() else (_INF if (a > 0) == (b > 0) else _NINF)
    if b.is_infinite():
        return Decimal(0)
    scale = _div_scale(a, b)
    n1, d1 = a.as_integer_ratio()
    n2, d2 = b.as_integer_ratio()
    num, den = n1 * d2 * 10**scale, d1 * n2
    q, r = divmod(abs(num), abs(den))
    q += 2 * r >= abs(den)
    return Decimal(f"{'-' if (num < 0) != (den < 0) and q else ''}{q}E-{scale}")


def num_mod(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return _NAN
    if not b:
        raise Unevaluable("division by zero")
    if a.is_infinite():
        return _NAN
    if b.is_infinite():
        return a
    return NCTX.remainder(a, b)


def num_round(d: Decimal, scale: int, rounding: str) -> Decimal:
    if not d.is_finite():
        return d
    scale = max(min(scale, 1000), -1000)
    r = d.quantize(Decimal(f"1E{-scale}"), rounding=rounding, context=NCTX)
    return r.quantize(_ONE, context=NCTX) if scale < 0 else r


def num_to_int(type_name: str) -> Callable[[Decimal], int]:
    check = int_check(type_name)

    def convert(d: Decimal) -> int:
        if d.is_nan():
            raise Unevaluable(f"cannot convert NaN to {DISPLAY[type_name]}")
        if d.is_infinite():
            raise Unevaluable(f"cannot convert infinity to {DISPLAY[type_name]}")
        return check(int(d.quantize(_ONE, rounding=ROUND_HALF_UP, context=NCTX)))

    return convert


def numeric_precision(precision: int, scale: int) -> Callable[[Decimal], Decimal]:
    def apply(d: Decimal) -> Decimal:
        if d.is_nan():
            return d
        if d.is_infinite():
            raise Unevaluable(f"numeric field overflow: numeric({precision},{scale}) cannot hold an infinite value")
        r = num_round(d, scale, ROUND_HALF_UP)
        if r and r.adjusted() >= precision - scale:
            raise Unevaluable(
                f"numeric field overflow: a field with precision {precision}, scale {scale} must round to an"
                f" absolute value less than 10^{precision - scale}"
            )
        return r

    return apply


def float_to_int(type_name: str) -> Callable[[float], int]:
    check = int_check(type_name)
    message = INT_LIMITS[type_name][2]

    def convert(x: float) -> int:
        if math.isnan(x) or math.isinf(x):
            raise Unevaluable(message)
        return check(round(x))  # round() is rint's round-half-even

    return convert


def float_to_numeric(digits: int) -> Callable[[float], Decimal]:
    def convert(x: float) -> Decimal:
        if math.isnan(x):
            return _NAN
        if math.isinf(x):
            return _INF if x > 0 else _NINF
        d = dec(Decimal(f"{x:.{digits}g}"))
        return d if d else abs(d)

    return convert


def to_float4(x: Decimal | int | float) -> float:
    try:
        r = _f4(x) if isinstance(x, float) else f4_exact(x)
    except OverflowError:
        raise Unevaluable("value out of range: overflow") from None
    if r == 0 and x != 0:
        raise Unevaluable("value out of range: underflow")
    return r


def f8_op(op: str, single: bool) -> Callable[[float, float], float]:
    """PostgreSQL's float8 (or, with ``single``, float4) arithmetic with its overflow/underflow errors."""
    fn: Callable[[float, float], float] = {
        "+": operator.add,
        "-": operator.sub,
        "*": operator.mul,
        "/": operator.truediv,
    }[op]

    def apply(a: float, b: float) -> float:
        if op == "/" and b == 0:
            if math.isnan(a):
                return _NAN_F
            raise Unevaluable("division by zero")
        r = fn(a, b)
        if single and not math.isinf(r):
            try:
                r = _f4(r)
            except OverflowError:
                raise Unevaluable("value out of range: overflow") from None
        if math.isinf(r) and not math.isinf(a) and not math.isinf(b):
            raise Unevaluable("value out of range: overflow")
        if r == 0 and a != 0 and ((op == "*" and b != 0) or (op == "/" and not math.isinf(b))):
            raise Unevaluable("value out of range: underflow")
        return r

    return apply


# ----------------------------------------------------------------------------------------- dates and timestamps


def date_to_ts(days: int) -> int:
    if days == INT32_MAX:
        return INT64_MAX
    if days == INT32_MIN:
        return INT64_MIN
    us = days * US_PER_DAY
    if us >= TS_END:
        raise Unevaluable("date out of range for timestamp")
    return us


def ts_to_date(us: int) -> int:
    if us == INT64_MAX:
        return INT32_MAX
    if us == INT64_MIN:
        return INT32_MIN
    return us // US_PER_DAY


def ts_to_time(us: int) -> int | None:
    return None if us in (INT64_MAX, INT64_MIN) else us % US_PER_DAY


# ----------------------------------------------------------------------------------------- oids


def int_to_oid(v: int) -> int:
    return v & 0xFFFFFFFF


def int8_to_oid(v: int) -> int:
    if 0 <= v <= 0xFFFFFFFF:
        return v
    raise Unevaluable("OID out of range")


def oid_to_int4(v: int) -> int:
    return v - 2**32 if v >= 2**31 else v
