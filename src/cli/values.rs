//! The values of flags, parsed with Go's semantics: `strconv.ParseBool`, `ParseInt`/`ParseUint`
//! with base prefixes and `_`, `ParseFloat`, `time.ParseDuration` (and `Duration.String` back),
//! and the lists of `--feature-gates`, `--leader-election-labels`, `--vmodule` and the
//! quantity check of the alpha logging options.

use std::fmt;
use std::time::Duration;

/// Go's `flag` error for a value that does not parse.
pub(crate) const PARSE_ERROR: &str = "parse error";

/// Go's `flag` error for a number out of range.
pub(crate) const RANGE_ERROR: &str = "value out of range";

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(PARSE_ERROR.to_owned()),
    }
}

/// Go's `strconv.ParseUint(value, 0, bits)`: decimal, `0x`/`0o`/`0b`/leading-`0` prefixes and
/// `_` between digits; no sign.
pub(crate) fn parse_go_uint(value: &str, bits: u32) -> Result<u64, String> {
    let syntax = || PARSE_ERROR.to_owned();
    let bytes = value.as_bytes();
    let (radix, digits) = match bytes {
        [] => return Err(syntax()),
        [b'0', p, _, ..] if matches!(p.to_ascii_lowercase(), b'x' | b'o' | b'b') => {
            let radix = match p.to_ascii_lowercase() {
                b'x' => 16,
                b'o' => 8,
                _ => 2,
            };
            (radix, &value[2..])
        }
        [b'0', ..] => (8, &value[1..]),
        _ => (10, value),
    };
    let max = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for c in digits.chars() {
        if c == '_' {
            underscores = true;
            continue;
        }
        let d = c.to_digit(radix).ok_or_else(syntax)?;
        n = n
            .checked_mul(u64::from(radix))
            .and_then(|n| n.checked_add(u64::from(d)))
            .filter(|n| *n <= max)
            .ok_or_else(|| RANGE_ERROR.to_owned())?;
    }
    if underscores && !go_underscores_ok(value) {
        return Err(syntax());
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(value, 0, bits)`.
pub(crate) fn parse_go_int(value: &str, bits: u32) -> Result<i64, String> {
    let (negative, magnitude) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    let limit = 1u64 << (bits.clamp(1, 64) - 1); // |min|; max is limit - 1
    let n = parse_go_uint(magnitude, 64)?;
    if negative {
        if n > limit {
            return Err(RANGE_ERROR.to_owned());
        }
        // n ≤ 2^63, so 0 - n fits in i64.
        Ok(0i64.wrapping_sub_unsigned(n))
    } else {
        i64::try_from(n)
            .ok()
            .filter(|_| n < limit)
            .ok_or_else(|| RANGE_ERROR.to_owned())
    }
}

/// Go's rule for `_` in number literals: only between digits, or between a base prefix and a
/// digit.
pub(crate) fn go_underscores_ok(value: &str) -> bool {
    let mut s = value.as_bytes();
    if let [b'+' | b'-', rest @ ..] = s {
        s = rest;
    }
    // `saw`: '^' start, '0' digit or prefix, '_' underscore, '!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    if let [b'0', p, rest @ ..] = s
        && matches!(p.to_ascii_lowercase(), b'x' | b'o' | b'b')
    {
        hex = p.eq_ignore_ascii_case(&b'x');
        saw = b'0';
        s = rest;
    }
    for &c in s {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// Go's `strconv.ParseFloat(value, 64)` for decimal forms, `Inf`/`Infinity`/`NaN` and `_`
/// separators (hexadecimal floats are not supported).
pub(crate) fn parse_go_float(value: &str) -> Result<f64, String> {
    let cleaned;
    let text = if value.contains('_') {
        if !go_underscores_ok(value) {
            return Err(PARSE_ERROR.to_owned());
        }
        cleaned = value.replace('_', "");
        cleaned.as_str()
    } else {
        value
    };
    let f: f64 = text.parse().map_err(|_| PARSE_ERROR.to_owned())?;
    let lower = text.to_ascii_lowercase();
    if f.is_infinite() && !lower.trim_start_matches(['+', '-']).starts_with("inf") {
        return Err(RANGE_ERROR.to_owned());
    }
    Ok(f)
}

/// A decimal `uint32` (klog's verbosity level).
pub(crate) fn parse_decimal_u32(value: &str) -> Result<u32, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PARSE_ERROR.to_owned());
    }
    value.parse().map_err(|_| RANGE_ERROR.to_owned())
}

/// Go's `time.ParseDuration`, in nanoseconds: a sequence of decimal numbers, each with an
/// optional fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`), optionally signed;
/// a bare `0` needs no unit.
pub fn parse_go_duration(value: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(value.to_owned());
    let (negative, mut s) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let (nanos, rest) = duration_term(s, value)?;
        total = total
            .checked_add(nanos)
            .filter(|t| *t <= DURATION_LIMIT)
            .ok_or_else(invalid)?;
        s = rest;
    }
    if negative {
        Ok(0i64.wrapping_sub_unsigned(total))
    } else {
        i64::try_from(total).map_err(|_| invalid())
    }
}

/// The largest magnitude of a duration, in nanoseconds: Go allows up to 2^63 ns, which only
/// fits when negative.
const DURATION_LIMIT: u64 = 1 << 63;

/// The first term of `s` (a number, with an optional fraction, and its unit): its nanoseconds
/// and what follows it. `value` is the whole duration, for the errors.
fn duration_term<'a>(s: &'a str, value: &str) -> Result<(u64, &'a str), DurationError> {
    let invalid = || DurationError::Invalid(value.to_owned());
    let (whole, int_len) = leading_int(s).ok_or_else(invalid)?;
    let s = &s[int_len..];
    let (fraction, s) = match s.strip_prefix('.') {
        Some(rest) => {
            let fraction = leading_fraction(rest);
            (fraction, &rest[fraction.digits..])
        }
        None if int_len == 0 => return Err(invalid()),
        None => (Fraction::NONE, s),
    };
    if int_len == 0 && fraction.digits == 0 {
        return Err(invalid());
    }
    // The unit: everything up to the next digit or dot.
    let unit_len = s
        .bytes()
        .take_while(|b| *b != b'.' && !b.is_ascii_digit())
        .count();
    let unit = match &s[..unit_len] {
        "" => return Err(DurationError::MissingUnit(value.to_owned())),
        unit => unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_owned(),
            duration: value.to_owned(),
        })?,
    };
    let nanos = term_nanos(whole, fraction, unit).ok_or_else(invalid)?;
    Ok((nanos, &s[unit_len..]))
}

/// The decimal digits at the start of `s`: their value and how many there are; `None` when
/// the value exceeds [`DURATION_LIMIT`].
fn leading_int(s: &str) -> Option<(u64, usize)> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut whole: u64 = 0;
    for b in s[..len].bytes() {
        whole = whole
            .checked_mul(10)
            .and_then(|w| w.checked_add(u64::from(b - b'0')))
            .filter(|w| *w <= DURATION_LIMIT)?;
    }
    Some((whole, len))
}

/// The digits after a decimal point: `value / scale` is the fraction.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fraction {
    value: u64,
    scale: f64,
    /// Digits read, including those past the precision kept.
    digits: usize,
}

impl Fraction {
    /// No fraction written.
    const NONE: Self = Self {
        value: 0,
        scale: 1.0,
        digits: 0,
    };
}

/// The decimal digits at the start of `s`, as a fraction; digits past what [`DURATION_LIMIT`]
/// can hold are read but do not count.
fn leading_fraction(s: &str) -> Fraction {
    let mut f = Fraction {
        digits: s.bytes().take_while(u8::is_ascii_digit).count(),
        ..Fraction::NONE
    };
    for b in s[..f.digits].bytes() {
        match f
            .value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
        {
            Some(v) if v <= DURATION_LIMIT => {
                f.value = v;
                f.scale *= 10.0;
            }
            _ => break, // further digits do not matter
        }
    }
    f
}

/// Nanoseconds of a unit of a duration; `None` for an unknown one.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        _ => return None,
    })
}

/// `whole.fraction` units in nanoseconds (the fraction's part rounded down); `None` above
/// [`DURATION_LIMIT`].
fn term_nanos(whole: u64, fraction: Fraction, unit: u64) -> Option<u64> {
    let v = whole.checked_mul(unit).filter(|v| *v <= DURATION_LIMIT)?;
    if fraction.value == 0 {
        return Some(v);
    }
    v.checked_add((fraction.value as f64 * (unit as f64 / fraction.scale)) as u64)
        .filter(|v| *v <= DURATION_LIMIT)
}

/// Why [`parse_go_duration`] rejected a value (Go's wording).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// Not a duration at all, or out of range.
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    /// A number without a unit (other than a bare `0`).
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    /// A unit other than ns, us, µs, ms, s, m, h.
    #[error("time: unknown unit {unit:?} in duration {duration:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole value.
        duration: String,
    },
}

/// Formats a [`Duration`] as Go's `time.Duration.String` does (`1m30s`, `300ms`, `0s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        /// `whole.fraction` with the fraction's trailing zeros dropped.
        fn decimal(f: &mut fmt::Formatter<'_>, n: u128, per_unit: u128, unit: &str) -> fmt::Result {
            let (whole, frac) = (n / per_unit, n % per_unit);
            write!(f, "{whole}")?;
            if frac > 0 {
                let width = per_unit.ilog10() as usize;
                let digits = format!("{frac:0width$}");
                write!(f, ".{}", digits.trim_end_matches('0'))?;
            }
            f.write_str(unit)
        }
        const SEC: u128 = 1_000_000_000;
        match nanos {
            0 => f.write_str("0s"),
            n if n < 1_000 => write!(f, "{n}ns"),
            n if n < 1_000_000 => decimal(f, n, 1_000, "µs"),
            n if n < SEC => decimal(f, n, 1_000_000, "ms"),
            n => {
                let (hours, rest) = (n / (3600 * SEC), n % (3600 * SEC));
                let (minutes, rest) = (rest / (60 * SEC), rest % (60 * SEC));
                if hours > 0 {
                    write!(f, "{hours}h{minutes}m")?;
                } else if minutes > 0 {
                    write!(f, "{minutes}m")?;
                }
                decimal(f, rest, SEC, "s")
            }
        }
    }
}

/// `--feature-gates`: `Name=bool,Name2=bool` (spaces around names and values allowed).
pub(crate) fn parse_feature_gates(value: &str) -> Result<Vec<(String, bool)>, String> {
    comma_separated(value, |item| {
        let (name, setting) = item
            .split_once('=')
            .ok_or_else(|| format!("malformed pair {item:?}, expected Name=bool"))?;
        let setting = setting.trim();
        let enabled = parse_go_bool(setting)
            .map_err(|_| format!("invalid value of {}: {setting:?}", name.trim()))?;
        Ok((name.trim().to_owned(), enabled))
    })
}

/// `--leader-election-labels`: `key:value,key2:value2`, exactly one `:` per item.
pub(crate) fn parse_labels(value: &str) -> Result<Vec<(String, String)>, String> {
    comma_separated(value, |item| {
        let mut parts = item.split(':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(key), Some(value), None) => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!("{item:?} is not a key:value pair")),
        }
    })
}

/// The items of a comma-separated list (`""`: none), each parsed by `item`; the first error
/// wins.
fn comma_separated<T>(
    value: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value.split(',').map(item).collect()
}

/// `--vmodule`: `pattern=N,...`; empty items are skipped.
pub(crate) fn parse_vmodule(value: &str) -> Result<Vec<(String, u32)>, String> {
    value
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('=') {
            Some((pattern, level))
                if !pattern.is_empty() && !level.is_empty() && !level.contains('=') =>
            {
                let level = parse_decimal_u32(level)
                    .map_err(|_| format!("{item:?} does not have the pattern=N format"))?;
                Ok((pattern.to_owned(), level))
            }
            _ => Err(format!("{item:?} does not have the pattern=N format")),
        })
        .collect()
}

/// Checks a Kubernetes resource quantity (`0`, `64Ki`, `1.5M`, `1e3`) and says whether it is
/// zero.
pub(crate) fn quantity_is_zero(value: &str) -> Result<bool, String> {
    let bad = || {
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'".to_owned()
    };
    let unsigned = value.strip_prefix(['+', '-']).unwrap_or(value);
    let number_len = unsigned
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = unsigned.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(|exp| {
        parse_go_int(exp, 32).is_ok() && !exp.contains(['x', 'X', 'o', 'O', 'b', 'B', '_'])
    });
    if !suffix_ok {
        return Err(bad());
    }
    Ok(number.bytes().all(|b| b == b'0' || b == b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tests::secs;
    use std::time::Duration;

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        // Vectors checked against Go 1.26's time.ParseDuration.
        for (text, nanos) in [
            ("0", 0),
            ("-0", 0),
            ("+0", 0),
            ("1.5s", 1_500_000_000),
            ("-1m30s", -90_000_000_000),
            ("2h", 7_200_000_000_000),
            ("300ms", 300_000_000),
            (".5s", 500_000_000),
            ("5.s", 5_000_000_000),
            ("1µs", 1_000),
            ("1μs", 1_000),
            ("1us", 1_000),
            ("1ns", 1),
            ("1h1m1s", 3_661_000_000_000),
            ("9223372036ns", 9_223_372_036),
            ("-9223372036854775808ns", i64::MIN),
            ("1.0000000000000000001s", 1_000_000_000),
        ] {
            assert_eq!(parse_go_duration(text), Ok(nanos), "{text}");
        }
        for text in [
            "",
            "1",
            "1h1",
            "x",
            ".s",
            "1x",
            "1h 30m",
            "9223372036854775808ns",
            "-",
            "1.2.3s",
        ] {
            assert!(parse_go_duration(text).is_err(), "{text:?} should fail");
        }
        assert_eq!(
            parse_go_duration("1").unwrap_err().to_string(),
            "time: missing unit in duration \"1\""
        );
        assert_eq!(
            parse_go_duration("1d").unwrap_err().to_string(),
            "time: unknown unit \"d\" in duration \"1d\""
        );
    }

    #[test]
    fn go_durations_at_the_edges_parse_and_fail_like_go() {
        // Vectors checked against Go 1.26's time.ParseDuration, with its error texts.
        let vectors: [(&str, Result<i64, &str>); 27] = [
            ("9223372036854775807ns", Ok(i64::MAX)),
            (
                "9223372036854775808ns",
                Err(r#"time: invalid duration "9223372036854775808ns""#),
            ),
            ("-9223372036854775808ns", Ok(i64::MIN)),
            ("2562047h47m16.854775807s", Ok(i64::MAX)),
            (
                "2562047h47m16.854775808s",
                Err(r#"time: invalid duration "2562047h47m16.854775808s""#),
            ),
            ("-2562047h47m16.854775808s", Ok(i64::MIN)),
            (".", Err(r#"time: invalid duration ".""#)),
            ("1.", Err(r#"time: missing unit in duration "1.""#)),
            ("+", Err(r#"time: invalid duration "+""#)),
            ("+.5s", Ok(500000000)),
            ("1.5.5s", Err(r#"time: missing unit in duration "1.5.5s""#)),
            ("0.0000000001s", Ok(0)),
            ("1.9999999999999999999999h", Ok(7200000000000)),
            ("0x", Err(r#"time: unknown unit "x" in duration "0x""#)),
            (
                "1h-1m",
                Err(r#"time: unknown unit "h-" in duration "1h-1m""#),
            ),
            ("00001s", Ok(1000000000)),
            (
                "9223372036854775809ns",
                Err(r#"time: invalid duration "9223372036854775809ns""#),
            ),
            (
                "18446744073709551616ns",
                Err(r#"time: invalid duration "18446744073709551616ns""#),
            ),
            ("1.5h30m", Ok(7200000000000)),
            ("3m0.5s", Ok(180500000000)),
            ("-0s", Ok(0)),
            ("0s", Ok(0)),
            ("1e3s", Err(r#"time: unknown unit "e" in duration "1e3s""#)),
            (
                "100000000000000000000ns",
                Err(r#"time: invalid duration "100000000000000000000ns""#),
            ),
            ("1s1", Err(r#"time: missing unit in duration "1s1""#)),
            ("1sx", Err(r#"time: unknown unit "sx" in duration "1sx""#)),
            ("1ms.5s", Ok(501000000)),
        ];
        for (text, want) in vectors {
            let got = parse_go_duration(text).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_owned), "{text}");
        }
    }

    #[test]
    fn a_durations_number_is_read_digit_by_digit_up_to_two_to_the_63() {
        assert_eq!(leading_int("123s"), Some((123, 3)));
        assert_eq!(leading_int(".5s"), Some((0, 0)));
        assert_eq!(
            leading_int("9223372036854775808ns"),
            Some((DURATION_LIMIT, 19))
        );
        assert_eq!(leading_int("9223372036854775809ns"), None);
        let f = leading_fraction("25s");
        assert_eq!((f.value, f.scale, f.digits), (25, 100.0, 2));
        assert_eq!(leading_fraction("s"), Fraction::NONE);
        // Digits past 2^63 are consumed but not counted.
        let f = leading_fraction("99999999999999999999h");
        assert_eq!(
            (f.value, f.scale, f.digits),
            (999_999_999_999_999_999, 1e18, 20)
        );
    }

    #[test]
    fn a_durations_term_is_its_whole_units_plus_its_fraction_rounded_down() {
        let half = leading_fraction("5");
        assert_eq!(unit_nanos("ms"), Some(1_000_000));
        assert_eq!(unit_nanos("\u{b5}s"), unit_nanos("us"));
        assert_eq!(unit_nanos("d"), None);
        assert_eq!(term_nanos(1, half, 1_000_000_000), Some(1_500_000_000));
        assert_eq!(term_nanos(0, leading_fraction("9"), 1), Some(0));
        assert_eq!(
            term_nanos(2_562_048, Fraction::NONE, 3_600_000_000_000),
            None
        );
        assert_eq!(duration_term("1m30s", "1m30s"), Ok((60_000_000_000, "30s")));
        assert_eq!(
            duration_term("5", "1h5"),
            Err(DurationError::MissingUnit("1h5".into()))
        );
    }

    #[test]
    fn go_duration_display_matches_go() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(5), "5ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_millis(1500), "1.5s"),
            (secs(15), "15s"),
            (secs(90), "1m30s"),
            (secs(600), "10m0s"),
            (secs(7200), "2h0m0s"),
        ] {
            assert_eq!(GoDuration(d).to_string(), text);
        }
    }

    #[test]
    fn integers_parse_like_strconv_with_base_0() {
        for (text, value) in [
            ("0", 0),
            ("10", 10),
            ("010", 8),
            ("0x_1f", 31),
            ("0b101", 5),
            ("0o17", 15),
            ("1_000", 1000),
        ] {
            assert_eq!(parse_go_uint(text, 64), Ok(value), "{text}");
            assert_eq!(parse_go_int(text, 64), Ok(value as i64), "{text}");
        }
        assert_eq!(parse_go_int("-0x10", 64), Ok(-16));
        assert_eq!(parse_go_int("+5", 64), Ok(5));
        assert_eq!(parse_go_int("-9223372036854775808", 64), Ok(i64::MIN));
        assert_eq!(
            parse_go_int("9223372036854775808", 64),
            Err(RANGE_ERROR.to_owned())
        );
        for text in ["", "+5", "-1", "1__0", "_1", "1_", "0x", "08", "1.0"] {
            assert!(parse_go_uint(text, 64).is_err(), "{text:?}");
        }
        assert_eq!(
            parse_go_uint("18446744073709551616", 64),
            Err(RANGE_ERROR.to_owned())
        );
        assert_eq!(parse_decimal_u32("4294967296"), Err(RANGE_ERROR.to_owned()));
        assert_eq!(parse_go_float("1e3"), Ok(1000.0));
        assert_eq!(parse_go_float("1_000"), Ok(1000.0));
        assert_eq!(parse_go_float("inf"), Ok(f64::INFINITY));
        assert_eq!(parse_go_float("1e400"), Err(RANGE_ERROR.to_owned()));
        assert!(parse_go_float("fast").is_err());
    }
}
