//! [`MemoryMonitor`]: turns the platform's memory-pressure signal into a callback,
//! which the app uses to send `Command::MemoryWarning` to the engine.
//!
//! | platform | signal                                                        | file        |
//! |----------|---------------------------------------------------------------|-------------|
//! | iOS      | `UIApplicationDidReceiveMemoryWarningNotification`            | `ios.rs`    |
//! | macOS    | dispatch source `DISPATCH_SOURCE_TYPE_MEMORYPRESSURE` (warn, critical) | `macos.rs` |
//! | Linux    | 500 ms polling of PSI, `MemAvailable` ∧ cgroup, `RssAnon` vs ceiling | `linux.rs` |
//! | other    | none                                                          | `other.rs`  |
//!
//! The callback runs on whatever thread the platform uses (the main thread on iOS, a
//! dispatch queue on macOS, the monitor's own thread on Linux), so it must be quick and
//! must not touch the engine directly: send a message. Dropping the monitor stops it.

use std::sync::Arc;

pub mod detector;

#[cfg(target_os = "ios")]
#[path = "ios.rs"]
mod platform;
#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod platform;
#[cfg(target_os = "macos")]
#[path = "macos.rs"]
mod platform;
#[cfg(not(any(target_os = "ios", target_os = "macos", target_os = "linux")))]
#[path = "other.rs"]
mod platform;

pub use detector::{PressureDetector, Reading, Thresholds};

type Callback = Arc<dyn Fn(String) + Send + Sync + 'static>;

/// Settings for [`MemoryMonitor::start_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonitorConfig {
    /// The tier's memory ceiling ([`crate::memory::Policy::ceiling_bytes`]). Only the
    /// Linux poller uses it (warns when the footprint reaches it); Apple platforms have
    /// their own signal.
    pub ceiling_bytes: Option<u64>,
}

/// A running platform memory monitor; dropping it stops it.
pub struct MemoryMonitor {
    _inner: platform::Inner,
}

impl MemoryMonitor {
    /// Starts watching with default settings. `on_warning` receives a short reason
    /// ("iOS memory warning", "low memory: only 90 MiB left", …).
    pub fn start(on_warning: impl Fn(String) + Send + Sync + 'static) -> MemoryMonitor {
        MemoryMonitor::start_with(MonitorConfig::default(), on_warning)
    }

    /// Starts watching with `config`.
    pub fn start_with(config: MonitorConfig, on_warning: impl Fn(String) + Send + Sync + 'static) -> MemoryMonitor {
        tracing::info!(source = platform::SOURCE, "memory monitor started");
        MemoryMonitor { _inner: platform::Inner::start(config, Arc::new(on_warning)) }
    }

    /// Which OS signal this build listens to, for the settings panel and the log.
    pub fn source() -> &'static str {
        platform::SOURCE
    }
}

impl std::fmt::Debug for MemoryMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryMonitor").field("source", &platform::SOURCE).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn monitor_is_send_and_sync() {
        assert_send_sync::<MemoryMonitor>();
    }

    #[test]
    fn start_and_drop_promptly() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let started = Instant::now();
        let monitor = MemoryMonitor::start(move |_| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        drop(monitor);
        assert!(started.elapsed() < Duration::from_secs(2), "drop must not wait out a poll period");
        assert!(!MemoryMonitor::source().is_empty());
    }

    /// With a ceiling of one byte, the Linux poller must fire on its first reading and
    /// only once for the episode.
    #[cfg(target_os = "linux")]
    #[test]
    fn linux_ceiling_fires_once() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let c = calls.clone();
        let monitor = MemoryMonitor::start_with(MonitorConfig { ceiling_bytes: Some(1) }, move |why| {
            if let Ok(mut v) = c.lock() {
                v.push(why);
            }
        });
        std::thread::sleep(Duration::from_millis(1200));
        drop(monitor);
        let calls = calls.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(calls[0].contains("ceiling"), "{calls:?}");
    }
}
