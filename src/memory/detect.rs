//! Building a [`TierReport`]: the probes say what the device has, `POCKETCHAT_TIER`
//! (read by main and the app, never by the engine) says what QA wants, and both are kept so the settings panel can show them apart.

use super::{classify, probe, RamTier, TierReport};

/// Environment variable for the QA tier override: `6gb`, `8gb` or `desktop`.
pub const TIER_ENV: &str = "POCKETCHAT_TIER";

impl TierReport {
    /// What the device has, without any override: the engine's view (the override,
    /// [`tier_from_env`] or the CLI's `--tier`, arrives in its configuration).
    pub fn probe() -> TierReport {
        TierReport::from_parts(probe::physical_bytes(), probe::bf16_supported(), None)
    }

    /// The pure part of [`TierReport::probe`], with an override as `POCKETCHAT_TIER` gives it.
    ///
    /// Unknown physical memory classifies as the smallest tier (6 GB class): guessing
    /// low costs context length, guessing high can get the app killed. An override that
    /// is not a tier id is ignored with a warning; an empty one counts as unset.
    /// `physical_bytes` is 0 in the report when the OS would not say.
    pub fn from_parts(physical: Option<u64>, bf16: Option<bool>, env_override: Option<&str>) -> TierReport {
        let detected = match physical {
            Some(bytes) => classify(bytes),
            None => {
                tracing::warn!("physical memory is unknown; assuming the {} to stay safe", RamTier::Phone6Gb.label());
                RamTier::Phone6Gb
            }
        };
        let overridden = parse_override(env_override);
        TierReport { physical_bytes: physical.unwrap_or(0), detected, overridden, bf16 }
    }

    /// The same report with the QA override replaced (the settings panel's selector);
    /// `None` goes back to the detected tier.
    pub fn with_override(self, overridden: Option<RamTier>) -> TierReport {
        TierReport { overridden, ..self }
    }
}

/// The QA override in `POCKETCHAT_TIER`, for main and the app to pass to the engine.
pub fn tier_from_env() -> Option<RamTier> {
    parse_override(std::env::var(TIER_ENV).ok().as_deref())
}

/// A tier id; an empty value counts as unset, anything else is ignored with a warning.
fn parse_override(value: Option<&str>) -> Option<RamTier> {
    value.filter(|s| !s.trim().is_empty()).and_then(|s| {
        let tier = RamTier::parse(s);
        if tier.is_none() {
            tracing::warn!(value = %s.escape_debug(), "ignoring {TIER_ENV}: expected one of 6gb, 8gb, desktop");
        }
        tier
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GIB;

    fn gib(x: f64) -> Option<u64> {
        Some((x * GIB as f64) as u64)
    }

    #[test]
    fn detected_from_physical_memory() {
        let r = TierReport::from_parts(gib(7.5), Some(true), None);
        assert_eq!(r.detected, RamTier::Phone8Gb);
        assert_eq!(r.overridden, None);
        assert_eq!(r.effective(), RamTier::Phone8Gb);
        assert_eq!(r.bf16, Some(true));
        assert_eq!(r.physical_bytes, (7.5 * GIB as f64) as u64);
    }

    #[test]
    fn unknown_memory_is_the_safe_small_tier() {
        let r = TierReport::from_parts(None, None, None);
        assert_eq!(r.detected, RamTier::Phone6Gb);
        assert_eq!(r.physical_bytes, 0);
    }

    #[test]
    fn override_is_kept_apart_from_detection() {
        let r = TierReport::from_parts(gib(5.5), None, Some("Desktop"));
        assert_eq!(r.detected, RamTier::Phone6Gb);
        assert_eq!(r.overridden, Some(RamTier::Desktop));
        assert_eq!(r.effective(), RamTier::Desktop);
    }

    #[test]
    fn absurd_override_is_ignored() {
        for bad in ["12gb", "-1", "desktop; rm -rf /", "\u{0}", "8 gb", "💥"] {
            let r = TierReport::from_parts(gib(16.0), None, Some(bad));
            assert_eq!(r.overridden, None, "{bad:?}");
            assert_eq!(r.effective(), RamTier::Desktop);
        }
        let r = TierReport::from_parts(gib(16.0), None, Some("   "));
        assert_eq!(r.overridden, None);
    }

    #[test]
    fn with_override_replaces_and_clears() {
        let r = TierReport::from_parts(gib(16.0), None, Some("6gb"));
        assert_eq!(r.clone().with_override(None).effective(), RamTier::Desktop);
        assert_eq!(r.with_override(Some(RamTier::Phone8Gb)).effective(), RamTier::Phone8Gb);
    }

    #[test]
    fn probe_reads_this_machines_memory() {
        let r = TierReport::probe();
        // Every machine this runs on has more than 256 MiB and less than 64 TiB.
        assert!((256 << 20..64 << 40).contains(&r.physical_bytes), "{r:?}");
        assert!(RamTier::ALL.contains(&r.effective()));
    }
}
