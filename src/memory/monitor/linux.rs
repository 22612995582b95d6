//! Linux: a polling thread. Every 500 ms it reads PSI (`/proc/pressure/memory`), the
//! live headroom (`MemAvailable` ∧ cgroup) and our footprint (`RssAnon`), and lets a
//! [`PressureDetector`] decide whether a new pressure episode began.
//!
//! The thread waits on a channel rather than sleeping, so dropping the monitor (which
//! drops the sender) wakes it at once and the join is prompt.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::detector::{parse_psi_some_avg10, PressureDetector, Reading, Thresholds};
use super::{Callback, MonitorConfig};
use crate::memory::files::{FileSource, RealFiles};
use crate::memory::probe::available_bytes_from;
use crate::memory::probe::kv_text::colon_field_bytes;

pub(super) const SOURCE: &str = "Linux PSI / MemAvailable polling";

const PERIOD: Duration = Duration::from_millis(500);

/// Reads one [`Reading`]; quiet about missing files, which are normal here.
pub(crate) fn sample(fs: &dyn FileSource) -> Reading {
    Reading {
        psi_some_avg10: fs.read(Path::new("/proc/pressure/memory")).and_then(|t| parse_psi_some_avg10(&t)),
        available_bytes: available_bytes_from(fs),
        footprint_bytes: fs.read(Path::new("/proc/self/status")).and_then(|t| colon_field_bytes(&t, "RssAnon")),
    }
}

pub(super) struct Inner {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Inner {
    pub(super) fn start(config: MonitorConfig, on_warning: Callback) -> Inner {
        let first = sample(&RealFiles);
        if first == Reading::default() {
            tracing::warn!(
                "no memory pressure signal is readable (PSI, MemAvailable, RssAnon); the monitor will stay silent"
            );
        } else if first.psi_some_avg10.is_none() {
            tracing::info!("/proc/pressure/memory unavailable; watching MemAvailable and the footprint only");
        }
        let thresholds = Thresholds { ceiling_bytes: config.ceiling_bytes, ..Thresholds::default() };
        let (stop, stopped) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("memory-monitor".into()).spawn(move || {
            let mut detector = PressureDetector::new(thresholds);
            let mut reading = first;
            loop {
                if let Some(reason) = detector.observe(&reading) {
                    tracing::warn!(%reason, "memory warning");
                    on_warning(reason);
                }
                match stopped.recv_timeout(PERIOD) {
                    Err(RecvTimeoutError::Timeout) => reading = sample(&RealFiles),
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        });
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "could not start the memory monitor thread");
                None
            }
        };
        Inner { stop: Some(stop), thread }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // A callback that panicked already reported itself; nothing to add here.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::files::FakeFiles;
    use crate::memory::MIB;

    #[test]
    fn sample_reads_all_three_signals() {
        let fs = FakeFiles::new()
            .with("/proc/pressure/memory", "some avg10=3.50 avg60=0 avg300=0 total=1\n")
            .with("/proc/meminfo", "MemTotal: 1048576 kB\nMemAvailable: 102400 kB\n")
            .with("/proc/self/status", "VmRSS:\t2048 kB\nRssAnon:\t1024 kB\n");
        let r = sample(&fs);
        assert_eq!(r.psi_some_avg10, Some(3.5));
        assert_eq!(r.available_bytes, Some(100 * MIB));
        assert_eq!(r.footprint_bytes, Some(MIB));
    }

    #[test]
    fn sample_of_nothing_is_empty() {
        assert_eq!(sample(&FakeFiles::new()), Reading::default());
    }
}
