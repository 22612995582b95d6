//! RAM tiers and their classification from the physical memory a device reports.

/// The device classes we tune for. Phones are sold as "6 GB" or "8 GB" but report less
/// than that many GiB of physical memory, so classification keeps a margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RamTier {
    /// Phones sold with 6 GB (or less).
    Phone6Gb,
    /// Phones sold with 8 GB.
    Phone8Gb,
    /// Macs, PCs, iPads with more memory.
    Desktop,
}

impl RamTier {
    pub const ALL: [RamTier; 3] = [RamTier::Phone6Gb, RamTier::Phone8Gb, RamTier::Desktop];

    /// Short id used by `POCKETCHAT_TIER` and the settings selector.
    pub fn id(self) -> &'static str {
        match self {
            RamTier::Phone6Gb => "6gb",
            RamTier::Phone8Gb => "8gb",
            RamTier::Desktop => "desktop",
        }
    }

    /// Human label for the settings panel.
    pub fn label(self) -> &'static str {
        match self {
            RamTier::Phone6Gb => "6 GB class",
            RamTier::Phone8Gb => "8 GB class",
            RamTier::Desktop => "Desktop class",
        }
    }

    /// Parses `6gb`, `8gb` or `desktop` (case-insensitive, surrounding spaces ignored).
    pub fn parse(s: &str) -> Option<RamTier> {
        let s = s.trim().to_ascii_lowercase();
        RamTier::ALL.into_iter().find(|t| t.id() == s)
    }
}

/// Classifies reported physical memory. Thresholds sit between the marketing sizes:
/// an 8 GB iPhone reports ~7.5 GiB, a 6 GB one ~5.6 GiB.
///
/// ```text
///   < 6.5 GiB  → 6 GB class (also everything smaller)
///   < 10 GiB   → 8 GB class
///   otherwise  → desktop class
/// ```
pub fn classify(physical_bytes: u64) -> RamTier {
    const GIB: f64 = super::GIB as f64;
    let gib = physical_bytes as f64 / GIB;
    if gib < 6.5 {
        RamTier::Phone6Gb
    } else if gib < 10.0 {
        RamTier::Phone8Gb
    } else {
        RamTier::Desktop
    }
}

/// What was detected and what is in force, kept apart so the UI can show both.
#[derive(Debug, Clone, PartialEq)]
pub struct TierReport {
    /// Physical memory as reported by the OS (lowered to a cgroup limit on Linux).
    pub physical_bytes: u64,
    pub detected: RamTier,
    /// QA override from `POCKETCHAT_TIER` or the settings selector.
    pub overridden: Option<RamTier>,
    /// Apple silicon BF16 support (`hw.optional.arm.FEAT_BF16`), a proxy for newer chips.
    pub bf16: Option<bool>,
}

impl TierReport {
    /// The tier whose policy applies.
    pub fn effective(&self) -> RamTier {
        self.overridden.unwrap_or(self.detected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GIB;

    fn gib(x: f64) -> u64 {
        (x * GIB as f64) as u64
    }

    #[test]
    fn phones_report_less_than_marketed_and_still_classify_right() {
        assert_eq!(classify(gib(5.5)), RamTier::Phone6Gb);
        assert_eq!(classify(gib(3.0)), RamTier::Phone6Gb);
        assert_eq!(classify(gib(6.0)), RamTier::Phone6Gb);
        assert_eq!(classify(gib(7.5)), RamTier::Phone8Gb);
        assert_eq!(classify(gib(8.0)), RamTier::Phone8Gb);
        assert_eq!(classify(gib(16.0)), RamTier::Desktop);
        assert_eq!(classify(gib(24.0)), RamTier::Desktop);
    }

    #[test]
    fn parse_accepts_ids_only() {
        assert_eq!(RamTier::parse(" 8GB "), Some(RamTier::Phone8Gb));
        assert_eq!(RamTier::parse("desktop"), Some(RamTier::Desktop));
        assert_eq!(RamTier::parse("12gb"), None);
        assert_eq!(RamTier::parse(""), None);
    }
}
