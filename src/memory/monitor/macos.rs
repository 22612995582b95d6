//! macOS: libdispatch memory-pressure sources (`DISPATCH_SOURCE_TYPE_MEMORYPRESSURE`).
//!
//! One source per level (warn, critical), so each handler knows which level fired
//! without reading the source back; the OS's own hysteresis means one event per
//! transition. Handlers run on a global utility queue. Dropping the monitor cancels the
//! sources; libdispatch then releases the handler blocks.

use std::ptr::addr_of;

use block2::RcBlock;
use dispatch2::{
    dispatch_source_memorypressure_flags_t as Flags, DispatchObject, DispatchQoS, DispatchQueue, DispatchRetained,
    DispatchSource, GlobalQueueIdentifier,
};

use super::{Callback, MonitorConfig};

pub(super) const SOURCE: &str = "macOS dispatch memory-pressure source";

pub(super) struct Inner {
    sources: Vec<DispatchRetained<DispatchSource>>,
}

fn pressure_source(
    queue: &DispatchQueue,
    level: Flags,
    reason: &'static str,
    on_warning: Callback,
) -> DispatchRetained<DispatchSource> {
    // SAFETY: the memory-pressure type takes handle 0 and a mask of pressure flags.
    let source = unsafe {
        DispatchSource::new(
            addr_of!(dispatch2::_dispatch_source_type_memorypressure).cast_mut(),
            0,
            level.0 as usize,
            Some(queue),
        )
    };
    let handler = RcBlock::new(move || {
        tracing::warn!(reason, "memory warning");
        on_warning(reason.to_string());
    });
    // SAFETY: libdispatch copies the block (Block_copy), so it outlives `handler`; the
    // closure is Send + Sync because the callback is.
    unsafe { source.set_event_handler_with_block(RcBlock::as_ptr(&handler)) };
    source.activate();
    source
}

impl Inner {
    pub(super) fn start(_config: MonitorConfig, on_warning: Callback) -> Inner {
        let queue = DispatchQueue::global_queue(GlobalQueueIdentifier::QualityOfService(DispatchQoS::Utility));
        let sources = vec![
            pressure_source(
                &queue,
                Flags::DISPATCH_MEMORYPRESSURE_WARN,
                "macOS memory pressure: warning",
                on_warning.clone(),
            ),
            pressure_source(
                &queue,
                Flags::DISPATCH_MEMORYPRESSURE_CRITICAL,
                "macOS memory pressure: critical",
                on_warning,
            ),
        ];
        Inner { sources }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for source in &self.sources {
            source.cancel();
        }
    }
}
