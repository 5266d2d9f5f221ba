//! Kubernetes resource quantities ("100m", "128Mi", "1.5", "2e3") and Go
//! durations ("20s", "1m30s"), as they appear in pod specs and the
//! KubeletConfiguration.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parses a quantity into thousandths of its unit (milli-units), so that CPU
/// ("250m") and byte counts ("64Mi" → 64·2^20·1000) share one exact parser.
pub fn parse_milli(text: &str) -> Result<u128, QuantityError> {
    let err = || QuantityError(text.to_owned());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() {
        return Err(err());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if !int_part.chars().all(|c| c.is_ascii_digit())
        || !frac_part.chars().all(|c| c.is_ascii_digit())
    {
        return Err(err());
    }
    // Work in units of 10^-9 so that fractions like "0.5" or "1.25Gi" stay exact.
    let frac_digits = frac_part.len().min(9);
    let mut nanos: u128 = int_part.parse::<u128>().unwrap_or(0) * 1_000_000_000;
    if frac_digits > 0 {
        let frac: u128 = frac_part[..frac_digits].parse().map_err(|_| err())?;
        nanos += frac * 10u128.pow(9 - frac_digits as u32);
    }
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().map_err(|_| err())?;
            (10u128.checked_pow(exp).ok_or_else(err)?, 1)
        }
        _ => return Err(err()),
    };
    let milli_nanos = nanos.checked_mul(mul).ok_or_else(err)? / div;
    // Kubernetes rounds fractional milli-units up.
    Ok(milli_nanos.div_ceil(1_000_000))
}

/// Bytes from a memory or size quantity, rounded up.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    u64::try_from(parse_milli(text)?.div_ceil(1000)).map_err(|_| QuantityError(text.to_owned()))
}

/// Bytes as Kubernetes writes a binary quantity canonically: the largest
/// suffix that divides it exactly ("8029544Ki", "100Mi", "1000").
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// Millicores as a CPU quantity: whole cores without a suffix.
pub fn format_millicpu(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// A Go duration such as "20s", "1m30s", "500ms", "2h".
pub fn parse_duration(text: &str) -> Result<Duration, QuantityError> {
    let err = || QuantityError(text.to_owned());
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let value: f64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += Duration::from_secs_f64(value * seconds);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(format_bytes(8222253056), "8029544Ki");
        assert_eq!(format_bytes(100 << 20), "100Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_millicpu(2000), "2");
        assert_eq!(format_millicpu(1500), "1500m");
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(parse_milli("250m"), Ok(250));
        assert_eq!(parse_milli("1"), Ok(1000));
        assert_eq!(parse_milli("0.5"), Ok(500));
        assert_eq!(parse_milli("1.0001"), Ok(1001));
        assert!(parse_milli("abc").is_err());
        assert!(parse_milli("").is_err());
        assert!(parse_milli("1x").is_err());
    }

    #[test]
    fn byte_quantities() {
        assert_eq!(parse_bytes("128Mi"), Ok(128 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5Ki"), Ok(1536));
        assert_eq!(parse_bytes("2e3"), Ok(2000));
        assert_eq!(parse_bytes("10"), Ok(10));
        assert!(parse_bytes("10Qi").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5x").is_err());
    }
}
