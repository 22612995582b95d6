//! Number formatting for people: bytes in binary units, rates with one decimal.

/// `1536` → `1.5 KiB`, `98_000_000` → `93.5 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `31.46` → `31.5 tok/s`.
pub fn format_rate(tok_s: f64) -> String {
    if tok_s.is_finite() && tok_s > 0.0 {
        format!("{tok_s:.1} tok/s")
    } else {
        "—".to_string()
    }
}

/// `1234.5` ms → `1.23 s`, `87.2` → `87 ms`.
pub fn format_ms(ms: f64) -> String {
    if !ms.is_finite() || ms <= 0.0 {
        "—".to_string()
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// Percentage for a bar's width, clamped to 0..=100.
pub fn percent(part: f64, whole: f64) -> f64 {
    if whole > 0.0 && part.is_finite() {
        (part / whole * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(20 * 1024 * 1024), "20.0 MiB");
        assert_eq!(format_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn rates_and_times() {
        assert_eq!(format_rate(31.46), "31.5 tok/s");
        assert_eq!(format_rate(0.0), "—");
        assert_eq!(format_ms(87.2), "87 ms");
        assert_eq!(format_ms(1234.5), "1.23 s");
        assert_eq!(percent(50.0, 200.0), 25.0);
        assert_eq!(percent(500.0, 200.0), 100.0);
        assert_eq!(percent(1.0, 0.0), 0.0);
    }
}
