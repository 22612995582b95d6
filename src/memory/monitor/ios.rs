//! iOS: an observer for `UIApplicationDidReceiveMemoryWarningNotification`, the signal
//! iOS sends shortly before jetsam would kill a foreground app.
//!
//! The observer is registered with no queue, so the block runs on the posting thread
//! (the main thread); the callback only has to send a command. Dropping the monitor
//! removes the observer.

use std::ptr::NonNull;

use block2::RcBlock;
use objc2::rc::Retained;
use objc2::runtime::{AnyObject, NSObjectProtocol, ProtocolObject};
use objc2_foundation::{NSNotification, NSNotificationCenter};
use objc2_ui_kit::UIApplicationDidReceiveMemoryWarningNotification;

use super::{Callback, MonitorConfig};

pub(super) const SOURCE: &str = "iOS UIApplicationDidReceiveMemoryWarningNotification";

pub(super) struct Inner {
    token: Retained<ProtocolObject<dyn NSObjectProtocol>>,
}

// SAFETY: the token is an opaque observer handle that we only pass back to
// `-[NSNotificationCenter removeObserver:]`, which is thread-safe; retain and release
// of Objective-C objects are atomic. So the monitor may be moved to and dropped on any
// thread.
unsafe impl Send for Inner {}
// SAFETY: `Inner` offers no methods through `&self`.
unsafe impl Sync for Inner {}

impl Inner {
    pub(super) fn start(_config: MonitorConfig, on_warning: Callback) -> Inner {
        let block = RcBlock::new(move |_note: NonNull<NSNotification>| {
            tracing::warn!("iOS memory warning");
            on_warning("iOS memory warning".to_string());
        });
        let center = NSNotificationCenter::defaultCenter();
        // SAFETY: the notification name is a UIKit constant; the block only captures a
        // Send + Sync callback, as "usingBlock" requires of a block that may run on any
        // thread. NSNotificationCenter copies the block.
        let token = unsafe {
            center.addObserverForName_object_queue_usingBlock(
                Some(UIApplicationDidReceiveMemoryWarningNotification),
                None,
                None,
                &block,
            )
        };
        Inner { token }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let observer: &AnyObject = (*self.token).as_ref();
        // SAFETY: `observer` is the token this center returned from addObserverForName.
        unsafe { NSNotificationCenter::defaultCenter().removeObserver(observer) };
    }
}
