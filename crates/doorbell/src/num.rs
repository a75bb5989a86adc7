//! Numbers and durations from the command line: one parser for every numeric flag.
//!
//! Every count, size and dimension the CLI takes goes through [`parse_in`] (or [`within`], its
//! clap form), so every flag answers bad input the same way and before anything reaches the
//! device: text that is not a whole number says so; a whole number outside the flag's range
//! (too large for its type, or a count of 0 that would measure nothing) says it is out of range
//! and gives the range. clap prefixes each message with the flag and the value, so a refusal
//! names all three: `invalid value '0' for '--samples <SAMPLES>': 0 is out of range: expected
//! 1 to 10000000`.
//!
//! Messages quote at most [`EXCERPT`] characters of the input ([`excerpt`]): a megabyte of
//! garbage is refused with its first characters and its length, not echoed whole.
//!
//! Invariant: a value these parsers return is inside the range they were given.

use std::fmt::Display;
use std::time::Duration;

/// Most characters of user input an error message quotes.
pub const EXCERPT: usize = 32;

/// `s` quoted in backticks, or its first [`EXCERPT`] characters, an ellipsis and its length when
/// it is longer.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(EXCERPT) {
        None => format!("`{s}`"),
        Some((cut, _)) => format!("`{}…` ({} bytes)", &s[..cut], s.len()),
    }
}

/// Why a number was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumError {
    /// The text is not a whole number (the excerpt of it).
    NotWhole(String),
    /// A whole number outside `lo..=hi` (the excerpt of the text, the range).
    OutOfRange {
        /// The text, as an excerpt.
        text: String,
        /// The least value allowed.
        lo: String,
        /// The greatest value allowed.
        hi: String,
    },
}

impl std::fmt::Display for NumError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NumError::NotWhole(t) => write!(f, "{t} is not a whole number"),
            NumError::OutOfRange { text, lo, hi } => write!(f, "{text} is out of range: expected {lo} to {hi}"),
        }
    }
}

/// Parses a whole number (decimal, or hex after `0x`; `_` separators allowed) and checks it is
/// in `lo..=hi`.
pub fn parse_in<T>(s: &str, lo: T, hi: T) -> Result<T, NumError>
where
    T: TryFrom<i128> + Into<i128> + Display + Copy,
{
    let t = s.trim().replace('_', "");
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(&t)),
    };
    let (radix, digits) = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(h) => (16, h),
        None => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(NumError::NotWhole(excerpt(s)));
    }
    let out_of_range = || NumError::OutOfRange { text: excerpt(s), lo: lo.to_string(), hi: hi.to_string() };
    // Any digit string too long for an i128 is far outside every range a flag has.
    let magnitude = u128::from_str_radix(digits, radix).map_err(|_| out_of_range())?;
    let v = i128::try_from(magnitude).map_err(|_| out_of_range())?;
    let v = if neg { -v } else { v };
    if v < lo.into() || v > hi.into() {
        return Err(out_of_range());
    }
    T::try_from(v).map_err(|_| out_of_range())
}

/// [`parse_in`] as a clap value parser: `#[arg(value_parser = num::within(1u32, 1024))]`.
pub fn within<T>(lo: T, hi: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128> + Into<i128> + Display + Copy + Send + Sync + 'static,
{
    move |s| parse_in(s, lo, hi).map_err(|e| e.to_string())
}

/// Parses a duration: a number followed by `ms`, `s`, `m` or `h` (`500ms`, `10s`, `1.5m`); a
/// bare number is seconds. It must be more than 0 and at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{} is not a duration: expected e.g. 500ms, 10s, 2m or 1h", excerpt(s))),
    };
    let x: f64 =
        num.parse().map_err(|_| format!("{} is not a duration: expected e.g. 500ms, 10s, 2m or 1h", excerpt(s)))?;
    let secs = x * scale;
    const DAY: f64 = 86_400.0;
    if !(secs > 0.0 && secs <= DAY) {
        return Err(format!("{} is out of range: expected more than 0 and at most 24h", excerpt(s)));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses seconds as a positive number (fractions allowed) up to `max`.
pub fn parse_seconds(s: &str, max: f64) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("{} is not a number of seconds", excerpt(s)))?;
    if !(x > 0.0 && x <= max) {
        return Err(format!("{} is out of range: expected more than 0 and at most {max} seconds", excerpt(s)));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_large_is_out_of_range_with_the_range_not_a_bad_number() {
        let msg = |s: &str, lo: u32, hi: u32| parse_in(s, lo, hi).unwrap_err().to_string();
        assert_eq!(msg("99999999999", 1, u32::MAX), "`99999999999` is out of range: expected 1 to 4294967295");
        assert_eq!(msg("0", 1, 1024), "`0` is out of range: expected 1 to 1024");
        assert_eq!(msg("-1", 1, 1024), "`-1` is out of range: expected 1 to 1024");
        let huge = "9".repeat(60);
        assert!(matches!(parse_in(&huge, 1u64, u64::MAX), Err(NumError::OutOfRange { .. })));
    }

    #[test]
    fn not_a_number_says_so() {
        assert_eq!(parse_in("12x", 1u32, 9).unwrap_err().to_string(), "`12x` is not a whole number");
        assert_eq!(parse_in("", 1u32, 9), Err(NumError::NotWhole("``".into())));
        assert_eq!(parse_in("1.5", 1u32, 9), Err(NumError::NotWhole("`1.5`".into())));
    }

    #[test]
    fn accepts_the_whole_range_in_decimal_and_hex() {
        assert_eq!(parse_in("18446744073709551615", 0u64, u64::MAX), Ok(u64::MAX));
        assert_eq!(parse_in("0xffffffff", 0u32, u32::MAX), Ok(u32::MAX));
        assert_eq!(parse_in("-9223372036854775808", i64::MIN, i64::MAX), Ok(i64::MIN));
        assert_eq!(parse_in("1_000", 1u32, 1000), Ok(1000));
    }

    #[test]
    fn long_input_is_quoted_as_an_excerpt() {
        let junk = "z".repeat(1 << 20);
        let e = parse_in(&junk, 1u32, 9).unwrap_err().to_string();
        assert!(e.len() < 100, "{e}");
        assert!(e.contains(&format!("`{}…` (1048576 bytes)", "z".repeat(EXCERPT))), "{e}");
        assert_eq!(excerpt("short"), "`short`");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").unwrap_err().contains("out of range"));
        assert!(parse_duration("25h").unwrap_err().contains("out of range"));
        assert!(parse_duration("10 parsecs").unwrap_err().contains("not a duration"));
        assert!(parse_seconds("0", 3600.0).unwrap_err().contains("out of range"));
        assert_eq!(parse_seconds("0.5", 3600.0), Ok(0.5));
    }
}
