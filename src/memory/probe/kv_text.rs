//! Parsers for the `Key: value [kB]` text of `/proc/meminfo` and `/proc/self/status`,
//! and the `key value` text of cgroup `memory.stat`. Pure functions over strings.

/// Finds `key:` at the start of a line and returns its value in bytes. Values with a
/// `kB` unit (the kernel means KiB) are scaled by 1024; values without a unit are taken
/// as they are. Returns `None` when the key is absent or its value is not a number.
///
/// ```text
/// MemTotal:       24684092 kB   → 24684092 × 1024
/// VmRSS:\t    2116 kB           → 2116 × 1024
/// ```
pub(crate) fn colon_field_bytes(text: &str, key: &str) -> Option<u64> {
    let rest = text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then_some(v)
    })?;
    let mut parts = rest.split_whitespace();
    let number: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        None => Some(number),
        Some(unit) if unit.eq_ignore_ascii_case("kB") => number.checked_mul(1024),
        Some(_) => None,
    }
}

/// Finds `key value` (one space-separated pair per line, as in cgroup `memory.stat`).
pub(crate) fn space_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        if parts.next()? != key {
            return None;
        }
        parts.next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24684092 kB\n\
        MemFree:         1000000 kB\n\
        MemAvailable:   23402192 kB\n\
        HugePages_Total:       0\n";

    #[test]
    fn meminfo_fields_are_kib() {
        assert_eq!(colon_field_bytes(MEMINFO, "MemTotal"), Some(24684092 * 1024));
        assert_eq!(colon_field_bytes(MEMINFO, "MemAvailable"), Some(23402192 * 1024));
        assert_eq!(colon_field_bytes(MEMINFO, "HugePages_Total"), Some(0));
    }

    #[test]
    fn status_fields_with_tabs() {
        let status = "Name:\tpocketchat\nVmHWM:\t    2116 kB\nVmRSS:\t    2000 kB\nRssAnon:\t     152 kB\n";
        assert_eq!(colon_field_bytes(status, "VmRSS"), Some(2000 * 1024));
        assert_eq!(colon_field_bytes(status, "VmHWM"), Some(2116 * 1024));
        assert_eq!(colon_field_bytes(status, "RssAnon"), Some(152 * 1024));
    }

    #[test]
    fn key_must_match_whole_name() {
        // "MemTotal" must not be found by asking for "Mem".
        assert_eq!(colon_field_bytes(MEMINFO, "Mem"), None);
    }

    #[test]
    fn garbage_is_none() {
        assert_eq!(colon_field_bytes("", "MemTotal"), None);
        assert_eq!(colon_field_bytes("MemTotal: lots kB", "MemTotal"), None);
        assert_eq!(colon_field_bytes("MemTotal: 12 parsecs", "MemTotal"), None);
        assert_eq!(colon_field_bytes("MemTotal:", "MemTotal"), None);
        assert_eq!(colon_field_bytes("MemTotal: 99999999999999999999 kB", "MemTotal"), None);
        assert_eq!(colon_field_bytes("\u{0}\u{1}binary", "MemTotal"), None);
    }

    #[test]
    fn overflowing_kib_is_none() {
        let text = format!("MemTotal: {} kB", u64::MAX / 2);
        assert_eq!(colon_field_bytes(&text, "MemTotal"), None);
    }

    #[test]
    fn memory_stat_pairs() {
        let stat = "anon 1000\nfile 2000\ninactive_file 1500\n";
        assert_eq!(space_field(stat, "inactive_file"), Some(1500));
        assert_eq!(space_field(stat, "file"), Some(2000));
        assert_eq!(space_field(stat, "missing"), None);
        assert_eq!(space_field("inactive_file x", "inactive_file"), None);
    }
}
