//! Platforms without a memory-pressure signal we know how to read: a monitor that never
//! fires. The settings panel's *Simulate memory warning* still works everywhere.

use super::{Callback, MonitorConfig};

pub(super) const SOURCE: &str = "none (no memory-pressure signal on this platform)";

pub(super) struct Inner;

impl Inner {
    pub(super) fn start(_config: MonitorConfig, _on_warning: Callback) -> Inner {
        tracing::info!("no memory monitor on this platform");
        Inner
    }
}
