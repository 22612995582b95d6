//! Saves the conversation when the app leaves the foreground. On iOS an app in the
//! background can be killed at any moment without another chance to run, so the engine
//! is told to `Save` on `willResignActive` and `didEnterBackground`. Desktop builds save
//! on window close (see `app.rs`) and after every reply (the engine does that).

use crate::engine::EngineHandle;

/// Keeps the lifecycle observers registered; dropping it removes them.
pub struct LifecycleGuard {
    #[cfg(target_os = "ios")]
    _observers: Vec<ios::Observer>,
}

/// Starts forwarding "leaving the foreground" to the engine as `Command::Save`.
pub fn save_when_backgrounded(engine: EngineHandle) -> LifecycleGuard {
    #[cfg(target_os = "ios")]
    {
        LifecycleGuard { _observers: ios::observe(engine) }
    }
    #[cfg(not(target_os = "ios"))]
    {
        let _ = engine;
        LifecycleGuard {}
    }
}

#[cfg(target_os = "ios")]
mod ios {
    use std::ptr::NonNull;

    use block2::RcBlock;
    use objc2::rc::Retained;
    use objc2::runtime::{AnyObject, NSObjectProtocol, ProtocolObject};
    use objc2_foundation::{NSNotification, NSNotificationCenter};
    use objc2_ui_kit::{UIApplicationDidEnterBackgroundNotification, UIApplicationWillResignActiveNotification};

    use crate::engine::{Command, EngineHandle};

    pub struct Observer(Retained<ProtocolObject<dyn NSObjectProtocol>>);

    pub fn observe(engine: EngineHandle) -> Vec<Observer> {
        // SAFETY: the names are UIKit constants.
        let names = unsafe { [UIApplicationWillResignActiveNotification, UIApplicationDidEnterBackgroundNotification] };
        names
            .into_iter()
            .map(|name| {
                let engine = engine.clone();
                let block = RcBlock::new(move |_note: NonNull<NSNotification>| {
                    if let Err(e) = engine.send(Command::Save) {
                        tracing::warn!("could not ask the engine to save: {e}");
                    }
                });
                // SAFETY: as in memory::monitor::ios — a UIKit name, a block that only
                // sends on a channel; the center copies the block.
                let token = unsafe {
                    NSNotificationCenter::defaultCenter().addObserverForName_object_queue_usingBlock(
                        Some(name),
                        None,
                        None,
                        &block,
                    )
                };
                Observer(token)
            })
            .collect()
    }

    impl Drop for Observer {
        fn drop(&mut self) {
            let observer: &AnyObject = (*self.0).as_ref();
            // SAFETY: the token this center returned from addObserverForName.
            unsafe { NSNotificationCenter::defaultCenter().removeObserver(observer) };
        }
    }
}
