//! Connects the platform memory monitor ([`crate::memory::MemoryMonitor`]) to the engine:
//! an OS memory warning becomes `Command::MemoryWarning`, sent straight to the engine
//! thread from the monitor's own thread (no UI signal is touched; the engine's
//! `Evicted` event then reaches the UI like any other). The returned guard stops the
//! monitor when dropped; the bridge keeps it as long as the engine, and starts it again
//! with the tier's ceiling once the engine reports its policy (the Linux poller warns
//! when the footprint reaches the ceiling; Apple platforms use the OS signal alone).

use crate::engine::{Command, EngineHandle};
use crate::memory::{MemoryMonitor, MonitorConfig};

/// Keeps the platform monitor running; dropping it stops the monitor.
pub struct MonitorGuard {
    _monitor: MemoryMonitor,
    ceiling_bytes: Option<u64>,
}

impl MonitorGuard {
    /// The ceiling this monitor was started with.
    pub fn ceiling_bytes(&self) -> Option<u64> {
        self.ceiling_bytes
    }
}

/// Starts watching for OS memory pressure and forwards warnings to `engine`.
pub fn start(engine: EngineHandle, ceiling_bytes: Option<u64>) -> MonitorGuard {
    let config = MonitorConfig { ceiling_bytes };
    let monitor = MemoryMonitor::start_with(config, move |reason: String| {
        tracing::warn!(%reason, "memory warning from the OS");
        if let Err(e) = engine.send(Command::MemoryWarning { reason }) {
            tracing::warn!("could not forward the memory warning: {e}");
        }
    });
    MonitorGuard { _monitor: monitor, ceiling_bytes }
}
