//! Ctrl-C stops the work at hand (a reply, a download), not the program.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT; the chat turns it into `Command::Stop` so Ctrl-C stops the reply only.
pub(crate) static CTRL_C: AtomicBool = AtomicBool::new(false);

pub(crate) extern "C" fn on_sigint(_: libc::c_int) {
    CTRL_C.store(true, Ordering::SeqCst);
}
