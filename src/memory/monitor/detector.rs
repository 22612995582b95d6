//! The decision behind the polling monitor: given periodic readings of memory pressure,
//! say when a pressure episode begins, once, and only re-arm after it has clearly
//! ended. Pure, so it is tested with fake readings.
//!
//! ```text
//!   signal          enters pressure when     leaves pressure when (all of them)
//!   PSI some avg10  > 10 %                   < 2 %
//!   headroom        < 128 MiB                > 256 MiB
//!   footprint       ≥ ceiling                < 90 % of ceiling
//! ```
//!
//! A signal that could not be read counts neither for entering nor against leaving.

use crate::memory::MIB;

/// One poll's worth of signals; `None` where a source was unreadable or absent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// Share of the last 10 s in which some task stalled on memory (`/proc/pressure/memory`).
    pub psi_some_avg10: Option<f64>,
    /// Bytes the process may still allocate (`MemAvailable` ∧ cgroup headroom).
    pub available_bytes: Option<u64>,
    /// This process's footprint (`RssAnon`).
    pub footprint_bytes: Option<u64>,
}

/// Where the detector trips and re-arms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub psi_enter_percent: f64,
    pub psi_exit_percent: f64,
    pub headroom_enter_bytes: u64,
    pub headroom_exit_bytes: u64,
    /// The tier's memory ceiling; `None` disables this signal.
    pub ceiling_bytes: Option<u64>,
    /// Fraction of the ceiling the footprint must fall under to end an episode.
    pub ceiling_exit_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            psi_enter_percent: 10.0,
            psi_exit_percent: 2.0,
            headroom_enter_bytes: 128 * MIB,
            headroom_exit_bytes: 256 * MIB,
            ceiling_bytes: None,
            ceiling_exit_ratio: 0.9,
        }
    }
}

/// Hysteresis over [`Reading`]s: one warning per pressure episode.
#[derive(Debug, Clone)]
pub struct PressureDetector {
    thresholds: Thresholds,
    in_episode: bool,
}

impl PressureDetector {
    pub fn new(thresholds: Thresholds) -> PressureDetector {
        PressureDetector { thresholds, in_episode: false }
    }

    /// Whether the last readings left us inside a pressure episode.
    pub fn in_episode(&self) -> bool {
        self.in_episode
    }

    /// Feeds one reading. Returns the reason when a new episode begins, else `None`.
    pub fn observe(&mut self, r: &Reading) -> Option<String> {
        if self.in_episode {
            if self.calm(r) {
                self.in_episode = false;
                tracing::debug!("memory pressure episode ended");
            }
            return None;
        }
        let reason = self.trigger(r)?;
        self.in_episode = true;
        Some(reason)
    }

    fn trigger(&self, r: &Reading) -> Option<String> {
        let t = &self.thresholds;
        if let Some(psi) = r.psi_some_avg10.filter(|&p| p > t.psi_enter_percent) {
            return Some(format!("memory pressure: tasks stalled on memory {psi:.1}% of the last 10 s"));
        }
        if let Some(avail) = r.available_bytes.filter(|&a| a < t.headroom_enter_bytes) {
            return Some(format!("low memory: only {} MiB left", avail / MIB));
        }
        if let (Some(fp), Some(ceiling)) = (r.footprint_bytes, t.ceiling_bytes) {
            if fp >= ceiling {
                return Some(format!("memory ceiling reached: using {} MiB of {} MiB", fp / MIB, ceiling / MIB));
            }
        }
        None
    }

    fn calm(&self, r: &Reading) -> bool {
        let t = &self.thresholds;
        let psi_calm = r.psi_some_avg10.is_none_or(|p| p < t.psi_exit_percent);
        let headroom_calm = r.available_bytes.is_none_or(|a| a > t.headroom_exit_bytes);
        let ceiling_calm = match (r.footprint_bytes, t.ceiling_bytes) {
            (Some(fp), Some(ceiling)) => (fp as f64) < ceiling as f64 * t.ceiling_exit_ratio,
            _ => true,
        };
        psi_calm && headroom_calm && ceiling_calm
    }
}

/// Parses `/proc/pressure/memory` and returns the `some` line's `avg10` (percent).
///
/// ```text
/// some avg10=0.00 avg60=0.00 avg300=0.00 total=0
/// full avg10=0.00 avg60=0.00 avg300=0.00 total=0
/// ```
pub fn parse_psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let value = line.split_whitespace().find_map(|f| f.strip_prefix("avg10="))?;
    value.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psi(p: f64) -> Reading {
        Reading { psi_some_avg10: Some(p), ..Reading::default() }
    }

    fn avail_mib(m: u64) -> Reading {
        Reading { available_bytes: Some(m * MIB), ..Reading::default() }
    }

    fn warnings(d: &mut PressureDetector, readings: &[Reading]) -> Vec<String> {
        readings.iter().filter_map(|r| d.observe(r)).collect()
    }

    #[test]
    fn quiet_readings_give_no_warning() {
        let mut d = PressureDetector::new(Thresholds::default());
        assert!(warnings(&mut d, &[psi(0.0), psi(5.0), avail_mib(4096), Reading::default()]).is_empty());
    }

    #[test]
    fn one_episode_gives_one_warning() {
        let mut d = PressureDetector::new(Thresholds::default());
        let w = warnings(&mut d, &[psi(0.0), psi(30.0), psi(45.0), psi(12.0), psi(5.0), psi(15.0)]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("30.0%"), "{}", w[0]);
        assert!(d.in_episode());
    }

    #[test]
    fn episode_rearms_after_calm() {
        let mut d = PressureDetector::new(Thresholds::default());
        let w = warnings(&mut d, &[psi(20.0), psi(1.0), psi(20.0)]);
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn low_headroom_with_hysteresis() {
        let mut d = PressureDetector::new(Thresholds::default());
        let w = warnings(
            &mut d,
            &[avail_mib(1000), avail_mib(100), avail_mib(200), avail_mib(90), avail_mib(300), avail_mib(64)],
        );
        assert_eq!(w, vec!["low memory: only 100 MiB left".to_string(), "low memory: only 64 MiB left".to_string()]);
    }

    #[test]
    fn ceiling_with_hysteresis() {
        let mut d = PressureDetector::new(Thresholds { ceiling_bytes: Some(1000 * MIB), ..Thresholds::default() });
        let fp = |m: u64| Reading { footprint_bytes: Some(m * MIB), ..Reading::default() };
        let w = warnings(&mut d, &[fp(500), fp(1000), fp(950), fp(1100), fp(899), fp(1000)]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("1000 MiB of 1000 MiB"), "{}", w[0]);
    }

    #[test]
    fn footprint_ignored_without_ceiling() {
        let mut d = PressureDetector::new(Thresholds::default());
        let r = Reading { footprint_bytes: Some(u64::MAX), ..Reading::default() };
        assert_eq!(d.observe(&r), None);
    }

    #[test]
    fn unreadable_signals_do_not_end_an_episode_by_themselves() {
        let mut d = PressureDetector::new(Thresholds::default());
        assert!(d
            .observe(&Reading { psi_some_avg10: Some(50.0), available_bytes: Some(50 * MIB), footprint_bytes: None })
            .is_some());
        // PSI calms, headroom is still low: still the same episode.
        assert!(d
            .observe(&Reading { psi_some_avg10: Some(0.0), available_bytes: Some(50 * MIB), footprint_bytes: None })
            .is_none());
        assert!(d.in_episode());
        // Nothing readable: counts as calm, so a later spike warns again.
        assert!(d.observe(&Reading::default()).is_none());
        assert!(!d.in_episode());
    }

    #[test]
    fn psi_parsing() {
        let text =
            "some avg10=12.34 avg60=1.00 avg300=0.10 total=123\nfull avg10=3.00 avg60=0.00 avg300=0.00 total=5\n";
        assert_eq!(parse_psi_some_avg10(text), Some(12.34));
        assert_eq!(parse_psi_some_avg10("full avg10=3.00\n"), None);
        assert_eq!(parse_psi_some_avg10("some avg10=NaN avg60=0\n"), None);
        assert_eq!(parse_psi_some_avg10("some avg10=-1\n"), None);
        assert_eq!(parse_psi_some_avg10("garbage"), None);
        assert_eq!(parse_psi_some_avg10(""), None);
    }
}
