//! PostgreSQL text and binary forms to Avro bytes, for the forms PostgreSQL's output functions print.
//!
//! Every function answers `None` when the input is not in the plain form it knows; the caller then asks the
//! Python reference (`cdcd.pgtypes`, `cdcd.avro.types`), which either converts it or raises the typed error.
//! So these functions must never accept an input the reference would convert differently: each follows the
//! reference's arithmetic exactly (no range checks the reference does not make, none it makes skipped).

use crate::avro;
use crate::frame::PG_EPOCH_OFFSET_US;

const US_PER_DAY: i64 = 86_400_000_000;
/// Debezium's average month, 30.4375 days (365.25 / 12), in µs.
const US_PER_MONTH: i128 = 2_629_800_000_000;
const PG_EPOCH_DAYS: i64 = 10_957;

/// Which conversion a column takes (the codes `cdcd.native` assigns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Python,
    Bool,
    Int2,
    Int4,
    Int8,
    Oid,
    Float4,
    Float8,
    Text,     // text form kept; binary form UTF-8
    TextOnly, // text form kept; binary form left to Python
    Jsonb,    // text form kept; binary form version 1 + UTF-8
    Bytea,
    Uuid,
    Date,
    Time,
    Timestamp,
    Timestamptz,
    Decimal(u32), // numeric(p, s): the scale
    /// A one-dimensional array (lower bound 1) of an element kind: `code | param << 8` of the element.
    Array(u32),
    // Debezium's type map (`cdcd.avro.debezium`), each cdcd's conversion followed by Debezium's form:
    /// timestamptz as `io.debezium.time.ZonedTimestamp` text with this many fraction digits
    ZonedTimestamp(u32),
    /// timestamp as `MicroTimestamp` (µs, the JDBC driver's infinities)
    MicroTimestamp,
    /// timestamp(0-3) as `Timestamp` (ms)
    MilliTimestamp,
    /// time(0-3) as `Time` (ms)
    MilliTime,
    /// interval as `MicroDuration` (binary form, and IntervalStyle postgres's text form)
    MicroDuration,
    /// numeric(p, s) as Kafka Connect's Decimal (Java's shortest two's complement): the scale
    ConnectDecimal(u32),
    /// numeric without a typmod as the `VariableScaleDecimal` record
    VariableScaleDecimal,
    /// timetz as `io.debezium.time.ZonedTime`: the time of day in UTC, `HH:MM:SS[.f]Z`
    ZonedTime,
}

impl Kind {
    pub fn from_code(code: u32, param: u32) -> Option<Kind> {
        Some(match code {
            0 => Kind::Python,
            1 => Kind::Bool,
            2 => Kind::Int2,
            3 => Kind::Int4,
            4 => Kind::Int8,
            5 => Kind::Oid,
            6 => Kind::Float4,
            7 => Kind::Float8,
            8 => Kind::Text,
            9 => Kind::TextOnly,
            10 => Kind::Jsonb,
            11 => Kind::Bytea,
            12 => Kind::Uuid,
            13 => Kind::Date,
            14 => Kind::Time,
            15 => Kind::Timestamp,
            16 => Kind::Timestamptz,
            17 if param <= 1000 => Kind::Decimal(param),
            18 if Kind::from_code(param & 0xff, param >> 8).is_some_and(|k| !matches!(k, Kind::Array(_))) => {
                Kind::Array(param)
            }
            19 if param <= 6 => Kind::ZonedTimestamp(param),
            20 => Kind::MicroTimestamp,
            21 => Kind::MilliTimestamp,
            22 => Kind::MilliTime,
            23 => Kind::MicroDuration,
            24 if param <= 1000 => Kind::ConnectDecimal(param),
            25 => Kind::VariableScaleDecimal,
            26 => Kind::ZonedTime,
            _ => return None,
        })
    }

    fn element(param: u32) -> Kind {
        Kind::from_code(param & 0xff, param >> 8).unwrap_or(Kind::Python)
    }
}

/// The Avro array of a text array literal `{a,b,NULL}` whose elements need no quoting (no quotes,
/// backslashes or braces: PostgreSQL quotes those), every element converted here; the union branch is written
/// by the caller. `None` for anything else (quoted elements, other dimensions or bounds: the reference).
fn text_array(element: Kind, b: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(inner) = b.strip_prefix(b"{").and_then(|r| r.strip_suffix(b"}")) else {
        return false;
    };
    if inner.is_empty() {
        out.push(0);
        return true;
    }
    if inner.iter().any(|c| matches!(c, b'"' | b'\\' | b'{' | b'}')) {
        return false;
    }
    let Ok(inner) = std::str::from_utf8(inner) else {
        return false;
    };
    avro::long(out, inner.split(',').count() as i64);
    for item in inner.split(',') {
        if item == "NULL" {
            out.push(0);
        } else {
            out.push(2);
            if !text(element, item, out) {
                return false;
            }
        }
    }
    out.push(0);
    true
}

/// The Avro array of array_send's form: one dimension with lower bound 1, or none (empty).
fn binary_array(element: Kind, b: &[u8], out: &mut Vec<u8>) -> bool {
    let i32_at = |at: usize| b.get(at..at + 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]));
    match i32_at(0) {
        Some(0) if b.len() >= 12 => {
            out.push(0);
            return true;
        }
        Some(1) => {}
        _ => return false,
    }
    let (Some(size), Some(1)) = (i32_at(12), i32_at(16)) else {
        return false;
    };
    let Ok(size) = usize::try_from(size) else { return false };
    if size > 0 {
        avro::long(out, size as i64);
    }
    let mut pos = 20;
    for _ in 0..size {
        let Some(n) = i32_at(pos) else { return false };
        pos += 4;
        if n < 0 {
            out.push(0);
            continue;
        }
        let Some(value) = b.get(pos..pos + n as usize) else {
            return false;
        };
        pos += n as usize;
        out.push(2);
        if !binary(element, value, out) {
            return false;
        }
    }
    out.push(0);
    pos == b.len()
}

/// Append the Avro datum of a text-form value; false when the reference must do it.
pub fn text(kind: Kind, s: &str, out: &mut Vec<u8>) -> bool {
    let b = s.as_bytes();
    match kind {
        Kind::Python => return false,
        Kind::Bool => match b {
            b"t" => out.push(1),
            b"f" => out.push(0),
            _ => return false,
        },
        Kind::Int2 | Kind::Int4 | Kind::Int8 | Kind::Oid => match int(b) {
            Some(n) => avro::long(out, n),
            None => return false,
        },
        Kind::Float4 => match float(b) {
            Some(x) => {
                let y = x as f32;
                if y.is_infinite() && !x.is_infinite() {
                    return false; // Python: "float too large to pack with f format"
                }
                out.extend_from_slice(&y.to_le_bytes());
            }
            None => return false,
        },
        Kind::Float8 => match float(b) {
            Some(x) => out.extend_from_slice(&x.to_le_bytes()),
            None => return false,
        },
        Kind::Text | Kind::TextOnly | Kind::Jsonb | Kind::Uuid => avro::bytes(out, b),
        Kind::Bytea => match hex(b) {
            Some(v) => avro::bytes(out, &v),
            None => return false,
        },
        Kind::Date => match date(b) {
            Some(d) => avro::long(out, d),
            None => return false,
        },
        Kind::Time => match time_of_day(b) {
            Some(us) => avro::long(out, us),
            None => return false,
        },
        Kind::Timestamp | Kind::Timestamptz => match timestamp(b, kind == Kind::Timestamptz) {
            Some(us) => avro::long(out, us),
            None => return false,
        },
        Kind::Decimal(scale) => match decimal(b, scale) {
            Some(n) => avro::decimal(out, n),
            None => return false,
        },
        Kind::Array(param) => return text_array(Kind::element(param), b, out),
        Kind::ZonedTimestamp(_) | Kind::MicroTimestamp | Kind::MilliTimestamp => {
            match timestamp(b, matches!(kind, Kind::ZonedTimestamp(_))) {
                Some(us) => return debezium_timestamp(kind, us, out),
                None => return false,
            }
        }
        Kind::MilliTime => match time_of_day(b) {
            Some(us) => avro::long(out, us.div_euclid(1000)),
            None => return false,
        },
        Kind::ConnectDecimal(scale) => match decimal(b, scale) {
            Some(n) => avro::bytes(out, &java_decimal(n)),
            None => return false,
        },
        Kind::VariableScaleDecimal => return variable_scale_decimal(b, out),
        Kind::ZonedTime => match zoned_time_text(b) {
            Some(us) => avro::bytes(out, zoned_time(us).as_bytes()),
            None => return false,
        },
        Kind::MicroDuration => match interval_text(b) {
            Some(us) => avro::long(out, us),
            None => return false,
        },
    }
    true
}

/// `cdcd.pgtypes.parse_interval_text` of IntervalStyle postgres's form (`1 year -2 mons +3 days -04:05:06.5`,
/// what a walsender prints) as `MicroDuration`; None for the other forms (iso_8601, infinity), anything unusual
/// and what a long cannot hold: the reference decides those.
fn interval_text(b: &[u8]) -> Option<i64> {
    let (mut months, mut days, mut micros) = (0i64, 0i64, 0i64);
    let mut tokens = b.split(|&c| c == b' ').filter(|t| !t.is_empty());
    let (mut any, mut seen_time) = (false, false);
    while let Some(token) = tokens.next() {
        any = true;
        if token.contains(&b':') {
            if seen_time {
                return None;
            }
            seen_time = true;
            micros = interval_time(token)?;
            continue;
        }
        let n = signed(token)?;
        match tokens.next()? {
            b"year" | b"years" => months = months.checked_add(n.checked_mul(12)?)?,
            b"mon" | b"mons" => months = months.checked_add(n)?,
            b"day" | b"days" => days = days.checked_add(n)?,
            _ => return None,
        }
    }
    if !any {
        return None;
    }
    let total = i128::from(months) * US_PER_MONTH + i128::from(days) * i128::from(US_PER_DAY) + i128::from(micros);
    i64::try_from(total).ok()
}

/// An interval's `[+-]HH:MM:SS[.ffffff]` in µs.
fn interval_time(token: &[u8]) -> Option<i64> {
    let (neg, body) = match token.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, token),
    };
    let mut parts = body.split(|&c| c == b':');
    let (h, m, s) = (digits(parts.next()?)?, digits(parts.next()?)?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (whole, fraction) = match s.iter().position(|&c| c == b'.') {
        Some(dot) => (&s[..dot], &s[dot + 1..]),
        None => (s, &s[s.len()..]),
    };
    if fraction.len() > 6 || (fraction.is_empty() && whole.len() < s.len()) {
        return None;
    }
    let mut frac_us = if fraction.is_empty() { 0 } else { digits(fraction)? };
    for _ in fraction.len()..6 {
        frac_us *= 10;
    }
    let seconds = h
        .checked_mul(3600)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(digits(whole)?)?;
    let us = seconds.checked_mul(1_000_000)?.checked_add(frac_us)?;
    Some(if neg { -us } else { us })
}

/// `[+-]?[0-9]+` within the i64 range.
fn signed(b: &[u8]) -> Option<i64> {
    match b.split_first() {
        Some((b'+', rest)) => digits(rest),
        Some((b'-', rest)) => digits(rest).map(|n| -n),
        _ => digits(b),
    }
}

/// The UTC time of day (µs) of timetz text `HH:MM:SS[.f]±HH[:MM[:SS]]` (split at its last `+`, else its last
/// `-`, as `cdcd.avro.debezium` splits it).
fn zoned_time_text(b: &[u8]) -> Option<i64> {
    let sign = if b.contains(&b'+') { b'+' } else { b'-' };
    let at = b.iter().rposition(|&c| c == sign).filter(|&i| i > 0)?;
    let local = time_of_day(&b[..at])?;
    Some((local - utc_offset(&b[at..])? * 1_000_000).rem_euclid(US_PER_DAY))
}

/// The UTC time of day (µs) of timetz_send's (µs, seconds west of UTC); None for what PostgreSQL would not
/// send (the reference decides those).
fn zoned_time_binary(b: &[u8]) -> Option<i64> {
    let us = i64::from_be_bytes(b.get(..8)?.try_into().ok()?);
    let west = i32::from_be_bytes(b.get(8..)?.try_into().ok()?);
    let valid = (0..US_PER_DAY).contains(&us) && west.unsigned_abs() < 16 * 3600;
    valid.then(|| (us + i64::from(west) * 1_000_000).rem_euclid(US_PER_DAY))
}

/// `HH:MM:SS[.f]Z`, as few fraction digits as the value needs (Java's ISO_LOCAL_TIME, `_time_of_day`).
fn zoned_time(us: i64) -> String {
    let (secs, frac) = (us / 1_000_000, us % 1_000_000);
    let mut text = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac != 0 {
        let digits = format!(".{frac:06}");
        text.push_str(digits.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

/// A timestamp's µs (cdcd's conversion) in Debezium's form of ``kind``.
fn debezium_timestamp(kind: Kind, us: i64, out: &mut Vec<u8>) -> bool {
    const POSITIVE_INFINITY: i64 = 9_223_372_036_825_200_000;
    const NEGATIVE_INFINITY: i64 = -9_223_372_036_832_400_000;
    let jdbc = match us {
        i64::MAX => POSITIVE_INFINITY,
        i64::MIN => NEGATIVE_INFINITY,
        _ => us,
    };
    match kind {
        Kind::ZonedTimestamp(digits) => avro::bytes(out, zoned_timestamp(us, digits).as_bytes()),
        Kind::MicroTimestamp => avro::long(out, jdbc),
        _ => avro::long(out, jdbc.div_euclid(1000)),
    }
    true
}

/// `cdcd.avro.debezium.zoned_timestamp`: ISO-8601 in UTC with ``digits`` fraction digits.
fn zoned_timestamp(us: i64, digits: u32) -> String {
    match us {
        i64::MAX => return "infinity".to_owned(),
        i64::MIN => return "-infinity".to_owned(),
        _ => {}
    }
    let (days, tod) = (us.div_euclid(US_PER_DAY), us.rem_euclid(US_PER_DAY));
    let (year, month, day) = civil_from_days(days);
    let (secs, frac) = (tod / 1_000_000, tod % 1_000_000);
    let year = match year {
        0..=9999 => format!("{year:04}"),
        y if y > 0 => format!("+{y}"),
        y => format!("-{:04}", -y),
    };
    let mut text = format!(
        "{year}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    );
    if digits > 0 {
        let fraction = format!(".{frac:06}");
        text.push_str(&fraction[..digits as usize + 1]);
    }
    text.push('Z');
    text
}

/// (year, month, day) of a day count since 1970-01-01 (`cdcd.avro.debezium.civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Java's BigInteger.toByteArray: the shortest two's complement (-128 is one byte).
fn java_decimal(n: i128) -> Vec<u8> {
    let magnitude = if n >= 0 { n } else { !n };
    let bits = 128 - magnitude.leading_zeros() as usize;
    n.to_be_bytes()[16 - (bits + 8) / 8..].to_vec()
}

/// `cdcd.avro.debezium.variable_scale_decimal` of a numeric's text form: `{scale, value}`, the fraction's
/// trailing zeros dropped; NaN and the infinities (null) are the reference's.
fn variable_scale_decimal(b: &[u8], out: &mut Vec<u8>) -> bool {
    let (neg, body) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    let (whole, fraction) = match body.iter().position(|&c| c == b'.') {
        Some(dot) => (&body[..dot], &body[dot + 1..]),
        None => (body, &body[body.len()..]),
    };
    let keep = fraction.iter().rposition(|&c| c != b'0').map_or(0, |i| i + 1);
    let fraction = &fraction[..keep];
    if whole.is_empty() || !whole.iter().chain(fraction).all(u8::is_ascii_digit) {
        return false;
    }
    let mut n: i128 = 0;
    for &d in whole.iter().chain(fraction) {
        let Some(next) = n.checked_mul(10).and_then(|n| n.checked_add(i128::from(d - b'0'))) else {
            return false;
        };
        n = next;
    }
    let unscaled = java_decimal(if neg { -n } else { n });
    avro::long(out, fraction.len() as i64);
    avro::bytes(out, &unscaled);
    true
}

/// Append the Avro datum of a binary-form (send function) value; false when the reference must do it.
pub fn binary(kind: Kind, b: &[u8], out: &mut Vec<u8>) -> bool {
    match kind {
        Kind::Bool => match b {
            [1] => out.push(1),
            [0] => out.push(0),
            _ => return false,
        },
        Kind::Int2 => match <[u8; 2]>::try_from(b) {
            Ok(a) => avro::long(out, i16::from_be_bytes(a).into()),
            Err(_) => return false,
        },
        Kind::Int4 => match <[u8; 4]>::try_from(b) {
            Ok(a) => avro::long(out, i32::from_be_bytes(a).into()),
            Err(_) => return false,
        },
        Kind::Oid => match <[u8; 4]>::try_from(b) {
            Ok(a) => avro::long(out, u32::from_be_bytes(a).into()),
            Err(_) => return false,
        },
        Kind::Int8 | Kind::Time => match <[u8; 8]>::try_from(b) {
            Ok(a) => avro::long(out, i64::from_be_bytes(a)),
            Err(_) => return false,
        },
        Kind::Float4 => match <[u8; 4]>::try_from(b) {
            // a NaN's payload may change on its way through a Python float: the reference decides
            Ok(a) if !f32::from_be_bytes(a).is_nan() => out.extend_from_slice(&f32::from_be_bytes(a).to_le_bytes()),
            _ => return false,
        },
        Kind::Float8 => match <[u8; 8]>::try_from(b) {
            Ok(a) => out.extend_from_slice(&f64::from_be_bytes(a).to_le_bytes()),
            Err(_) => return false,
        },
        Kind::Text => match std::str::from_utf8(b) {
            Ok(_) => avro::bytes(out, b),
            Err(_) => return false,
        },
        Kind::Jsonb => match b.split_first() {
            Some((1, rest)) if std::str::from_utf8(rest).is_ok() => avro::bytes(out, rest),
            _ => return false,
        },
        Kind::Bytea => avro::bytes(out, b),
        Kind::Uuid => match <[u8; 16]>::try_from(b) {
            Ok(a) => avro::bytes(out, &uuid_text(&a)),
            Err(_) => return false,
        },
        Kind::Date => match <[u8; 4]>::try_from(b) {
            Ok(a) => {
                let d = i32::from_be_bytes(a);
                let days = if d == i32::MAX || d == i32::MIN {
                    d.into()
                } else {
                    i64::from(d) + PG_EPOCH_DAYS
                };
                avro::long(out, days);
            }
            Err(_) => return false,
        },
        Kind::Timestamp | Kind::Timestamptz => match <[u8; 8]>::try_from(b) {
            Ok(a) => {
                let t = i64::from_be_bytes(a);
                let us = if t == i64::MAX || t == i64::MIN {
                    t
                } else {
                    match t.checked_add(PG_EPOCH_OFFSET_US) {
                        Some(us) if us < i64::MAX => us,
                        _ => return false,
                    }
                };
                avro::long(out, us);
            }
            Err(_) => return false,
        },
        Kind::Array(param) => return binary_array(Kind::element(param), b, out),
        Kind::ZonedTimestamp(_) | Kind::MicroTimestamp | Kind::MilliTimestamp => {
            let Some(us) = timestamp_binary(b) else { return false };
            return debezium_timestamp(kind, us, out);
        }
        Kind::MilliTime => match <[u8; 8]>::try_from(b) {
            Ok(a) => avro::long(out, i64::from_be_bytes(a).div_euclid(1000)),
            Err(_) => return false,
        },
        Kind::ZonedTime => match zoned_time_binary(b) {
            Some(us) => avro::bytes(out, zoned_time(us).as_bytes()),
            None => return false,
        },
        Kind::MicroDuration => match micro_duration(b) {
            Some(us) => avro::long(out, us),
            None => return false,
        },
        Kind::Decimal(scale) => match numeric_binary(b).and_then(|n| n.unscaled(scale)) {
            Some(n) => avro::decimal(out, n),
            None => return false,
        },
        Kind::ConnectDecimal(scale) => match numeric_binary(b).and_then(|n| n.unscaled(scale)) {
            Some(n) => avro::bytes(out, &java_decimal(n)),
            None => return false,
        },
        Kind::VariableScaleDecimal => match numeric_binary(b).and_then(|n| n.variable_scale()) {
            Some((scale, n)) => {
                avro::long(out, scale);
                avro::bytes(out, &java_decimal(n));
            }
            None => return false,
        },
        Kind::Python | Kind::TextOnly => return false,
    }
    true
}

/// numeric_send's form: the magnitude of its base-10000 digits, the power of ten it is scaled by, the display
/// scale and the sign (`cdcd.pgtypes.numeric_binary_parts`).
struct Numeric {
    negative: bool,
    magnitude: i128,
    exponent: i64,
    display_scale: i64,
}

/// None for NaN, the infinities, a malformed form and a magnitude beyond an i128: the reference's.
fn numeric_binary(b: &[u8]) -> Option<Numeric> {
    let head = b.get(..8)?;
    let field = |i: usize| i16::from_be_bytes([head[i], head[i + 1]]);
    let (ndigits, weight, sign, dscale) = (field(0), field(2), u16::from_be_bytes([head[4], head[5]]), field(6));
    if ndigits < 0 || dscale < 0 || (sign != 0 && sign != 0x4000) || b.len() != 8 + 2 * ndigits as usize {
        return None;
    }
    let mut magnitude: i128 = 0;
    for pair in b[8..].chunks_exact(2) {
        let d = u16::from_be_bytes([pair[0], pair[1]]);
        if d > 9999 {
            return None;
        }
        magnitude = magnitude.checked_mul(10_000)?.checked_add(i128::from(d))?;
    }
    Some(Numeric {
        negative: sign == 0x4000,
        magnitude,
        exponent: 4 * (i64::from(weight) - i64::from(ndigits) + 1),
        display_scale: i64::from(dscale),
    })
}

/// `n` times 10 to the `k` (a negative `k` divides, truncating), and whether anything was cut off.
fn shifted(n: i128, k: i64) -> Option<(i128, bool)> {
    if k >= 0 {
        if n == 0 {
            return Some((0, false));
        }
        return Some((n.checked_mul(10i128.checked_pow(u32::try_from(k).ok()?)?)?, false));
    }
    match u32::try_from(-k).ok().and_then(|k| 10i128.checked_pow(k)) {
        Some(d) => Some((n / d, n % d != 0)),
        None => Some((0, n != 0)), // 10^k beyond an i128 exceeds every magnitude
    }
}

impl Numeric {
    /// The unscaled value at `scale` fraction digits; None when it has more (the reference raises).
    fn unscaled(&self, scale: u32) -> Option<i128> {
        let (n, cut) = shifted(self.magnitude, self.exponent + i64::from(scale))?;
        if cut {
            return None;
        }
        Some(if self.negative { -n } else { n })
    }

    /// `{scale, unscaled}` of `variable_scale_decimal(numeric_binary_to_text(b))`: the value at its display scale
    /// (truncated, as numeric_out prints it), the fraction's trailing zeros dropped.
    fn variable_scale(&self) -> Option<(i64, i128)> {
        let (mut n, _) = shifted(self.magnitude, self.exponent + self.display_scale)?;
        let mut scale = self.display_scale;
        while scale > 0 && n % 10 == 0 {
            n /= 10;
            scale -= 1;
        }
        Some((scale, if self.negative { -n } else { n }))
    }
}

/// A binary timestamp's µs since the Unix epoch, as the `Timestamp` kind converts it.
fn timestamp_binary(b: &[u8]) -> Option<i64> {
    let t = i64::from_be_bytes(<[u8; 8]>::try_from(b).ok()?);
    if t == i64::MAX || t == i64::MIN {
        return Some(t);
    }
    t.checked_add(PG_EPOCH_OFFSET_US).filter(|us| *us < i64::MAX)
}

/// interval_send's (µs, days, months) as `MicroDuration`: a month is 30.4375 days; None beyond a long.
fn micro_duration(b: &[u8]) -> Option<i64> {
    let a = <[u8; 16]>::try_from(b).ok()?;
    let micros = i64::from_be_bytes(a[..8].try_into().ok()?);
    let days = i32::from_be_bytes(a[8..12].try_into().ok()?);
    let months = i32::from_be_bytes(a[12..].try_into().ok()?);
    let total = i128::from(months) * US_PER_MONTH + i128::from(days) * i128::from(US_PER_DAY) + i128::from(micros);
    i64::try_from(total).ok()
}

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 18 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
}

/// `-?[0-9]+` within the i64 range (Python's int() accepts more: the reference handles the rest).
fn int(b: &[u8]) -> Option<i64> {
    let (neg, body) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if body.is_empty() || body.len() > 19 || !body.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i64 = 0;
    for d in body {
        n = n.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?; // negative: reaches i64::MIN
    }
    if neg {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// Decimal float literals only (no NaN, Infinity, spaces or underscores: the reference handles those).
fn float(b: &[u8]) -> Option<f64> {
    if b.is_empty()
        || !b
            .iter()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// `\x` and pairs of hex digits (bytea_output = hex).
fn hex(b: &[u8]) -> Option<Vec<u8>> {
    let body = b.strip_prefix(b"\\x")?;
    if body.len() % 2 != 0 {
        return None;
    }
    body.chunks_exact(2)
        .map(|p| Some((nibble(p[0])? << 4) | nibble(p[1])?))
        .collect()
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn uuid_text(a: &[u8; 16]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = Vec::with_capacity(36);
    for (i, byte) in a.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push(b'-');
        }
        s.push(HEX[usize::from(byte >> 4)]);
        s.push(HEX[usize::from(byte & 15)]);
    }
    s
}

/// Days since 1970-01-01 of a proleptic Gregorian date (`cdcd.pgtypes.days_from_civil`, which checks only
/// that the month is 1-12 and the day 1-31).
fn days_from_civil(y: i64, m: i64, d: i64) -> Option<i64> {
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = y - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    Some(era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468)
}

/// `YYYY-MM-DD` (four-digit years, AD), `infinity`, `-infinity`.
fn date(b: &[u8]) -> Option<i64> {
    match b {
        b"infinity" => Some(i32::MAX.into()),
        b"-infinity" => Some(i32::MIN.into()),
        _ => ymd(b),
    }
}

fn ymd(b: &[u8]) -> Option<i64> {
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    days_from_civil(digits(&b[..4])?, digits(&b[5..7])?, digits(&b[8..10])?)
}

/// `HH:MM:SS` with an optional fraction of 1-6 digits (no range checks, as the reference).
fn time_of_day(b: &[u8]) -> Option<i64> {
    if b.len() < 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let secs = digits(&b[..2])? * 3600 + digits(&b[3..5])? * 60 + digits(&b[6..8])?;
    Some(secs * 1_000_000 + fraction(&b[8..])?)
}

/// Microseconds of `.f{1,6}`, or 0 for nothing.
fn fraction(b: &[u8]) -> Option<i64> {
    match b.split_first() {
        None => Some(0),
        Some((b'.', f)) if (1..=6).contains(&f.len()) => Some(digits(f)? * 10i64.pow(6 - f.len() as u32)),
        _ => None,
    }
}

/// `YYYY-MM-DD HH:MM:SS[.f{1,6}]` and, with a time zone, `±HH[:MM[:SS]]`; `infinity`, `-infinity`.
fn timestamp(b: &[u8], with_tz: bool) -> Option<i64> {
    match b {
        b"infinity" => return Some(i64::MAX),
        b"-infinity" => return Some(i64::MIN),
        _ => {}
    }
    if b.len() < 19 || b[10] != b' ' {
        return None;
    }
    let days = ymd(&b[..10])?;
    let (tod, offset) = if with_tz {
        let i = b[19..].iter().position(|&c| c == b'+' || c == b'-')? + 19;
        (&b[11..i], utc_offset(&b[i..])?)
    } else {
        (&b[11..], 0)
    };
    Some(days * US_PER_DAY + time_of_day(tod)? - offset * 1_000_000)
}

/// Seconds east of UTC of `±HH`, `±HH:MM` or `±HH:MM:SS`.
fn utc_offset(b: &[u8]) -> Option<i64> {
    let (sign, body) = match b.split_first()? {
        (b'+', rest) => (1, rest),
        (b'-', rest) => (-1, rest),
        _ => return None,
    };
    let mut seconds = 0;
    let mut parts = 0;
    for (i, part) in body.split(|&c| c == b':').enumerate() {
        if part.len() != 2 || i > 2 {
            return None;
        }
        seconds += digits(part)? * [3600, 60, 1][i];
        parts += 1;
    }
    (parts > 0).then_some(sign * seconds)
}

/// The unscaled value of `-?[0-9]+(\.[0-9]+)?` with at most `scale` fraction digits, within i128.
fn decimal(b: &[u8], scale: u32) -> Option<i128> {
    let (neg, body) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    let (ip, fp) = match body.iter().position(|&c| c == b'.') {
        Some(dot) => (&body[..dot], &body[dot + 1..]),
        None => (body, &body[body.len()..]),
    };
    if ip.is_empty() || fp.len() > scale as usize || (fp.is_empty() && ip.len() < body.len()) {
        return None;
    }
    let mut n: i128 = 0;
    for &d in ip.iter().chain(fp) {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i128::from(d - b'0'))?;
    }
    n = n.checked_mul(10i128.checked_pow(scale - fp.len() as u32)?)?;
    Some(if neg { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(b"1970-01-01 00:00:00", false), Some(0));
        assert_eq!(timestamp(b"1970-01-01 01:00:00+01", true), Some(0));
        assert_eq!(timestamp(b"1970-01-01 00:00:00.5-00:30", true), Some(1_800_500_000));
        assert_eq!(timestamp(b"1970-01-01 00:00:00.", false), None);
        assert_eq!(timestamp(b"1970-01-01 00:00:00+01", false), None);
    }

    #[test]
    fn decimals() {
        assert_eq!(decimal(b"-1.5", 2), Some(-150));
        assert_eq!(decimal(b"12", 0), Some(12));
        assert_eq!(decimal(b"1.", 2), None);
        assert_eq!(decimal(b"1.234", 2), None);
    }

    #[test]
    fn debezium_forms() {
        assert_eq!(zoned_timestamp(1_714_732_496_123_456, 6), "2024-05-03T10:34:56.123456Z");
        assert_eq!(zoned_timestamp(1_714_732_496_500_000, 3), "2024-05-03T10:34:56.500Z");
        assert_eq!(zoned_timestamp(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(zoned_timestamp(-62_198_755_200_000_000, 0), "-0001-01-01T00:00:00Z");
        assert_eq!(zoned_timestamp(i64::MAX, 6), "infinity");
        assert_eq!(java_decimal(-128), [0x80]);
        assert_eq!(java_decimal(128), [0, 0x80]);
        assert_eq!(java_decimal(0), [0]);
        let mut out = Vec::new();
        assert!(variable_scale_decimal(b"-0.000100", &mut out));
        assert_eq!(out, [8, 2, 0xff]); // scale 4, unscaled -1
        assert!(!variable_scale_decimal(b"NaN", &mut Vec::new()));
        assert!(!variable_scale_decimal(b".5", &mut Vec::new()));
        assert_eq!(
            micro_duration(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]),
            Some(2_716_200_000_001)
        );
    }

    #[test]
    fn intervals_in_text() {
        assert_eq!(interval_text(b"1 mon 1 day 00:00:00.000001"), Some(2_716_200_000_001));
        assert_eq!(
            interval_text(b"-1 years +2 mons -3 days -04:05:06.5"),
            Some(-31_557_600_000_000 + 5_259_600_000_000 - 259_200_000_000 - 14_706_500_000)
        );
        assert_eq!(interval_text(b"00:00:00"), Some(0));
        assert_eq!(interval_text(b"2 days"), Some(172_800_000_000));
        for other in [
            &b"P1Y"[..],
            b"infinity",
            b"",
            b"1",
            b"1 week",
            b"1:2",
            b"1 day 1:00:00 2:00:00",
            b"00:00:00.1234567",
            b"00:00:01.",
        ] {
            assert_eq!(interval_text(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    fn numeric(ndigits: i16, weight: i16, sign: u16, dscale: i16, digits: &[u16]) -> Vec<u8> {
        let mut b = Vec::new();
        for field in [
            ndigits.to_be_bytes(),
            weight.to_be_bytes(),
            sign.to_be_bytes(),
            dscale.to_be_bytes(),
        ] {
            b.extend_from_slice(&field);
        }
        for d in digits {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b
    }

    #[test]
    fn numerics_in_binary() {
        let n = numeric_binary(&numeric(2, 0, 0x4000, 4, &[12, 3400])).unwrap(); // -12.3400
        assert_eq!(n.unscaled(2), Some(-1234));
        assert_eq!(n.unscaled(1), None); // 12.34 has two fraction digits
        assert_eq!(n.variable_scale(), Some((2, -1234)));
        let whole = numeric_binary(&numeric(1, 1, 0, 0, &[5])).unwrap(); // 50000
        assert_eq!(
            (whole.unscaled(3), whole.variable_scale()),
            (Some(50_000_000), Some((0, 50_000)))
        );
        let zero = numeric_binary(&numeric(0, 0, 0x4000, 3, &[])).unwrap();
        assert_eq!((zero.unscaled(2), zero.variable_scale()), (Some(0), Some((0, 0))));
        assert!(numeric_binary(&numeric(0, 0, 0xC000, 0, &[])).is_none()); // NaN: the reference's
        assert!(numeric_binary(&numeric(1, 0, 0, 0, &[10_000])).is_none());
        assert!(numeric_binary(&numeric(2, 0, 0, 0, &[1])).is_none());
    }

    #[test]
    fn ints() {
        assert_eq!(int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(int(b"9223372036854775808"), None);
        assert_eq!(int(b"+1"), None);
    }
}
