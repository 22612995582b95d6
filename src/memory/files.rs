//! Reading small kernel text files (`/proc`, `/sys/fs/cgroup`) through a seam, so the
//! Linux probes can be tested end to end with text fixtures instead of the real machine.
//!
//! Reads never panic: a missing or unreadable file is `None`. Whether that deserves a
//! warning is the caller's decision, because many of these files are optional (a cgroup
//! without a memory limit, a kernel without PSI).

use std::path::Path;

/// Something that can hand back the whole text of a small file.
pub(crate) trait FileSource {
    fn read(&self, path: &Path) -> Option<String>;
}

/// The real filesystem.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealFiles;

impl FileSource for RealFiles {
    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

/// Logs a warning the first time this call site is reached, and only at `debug` level
/// afterwards. Probes that run every turn (or every 500 ms in the monitor) must not fill
/// the log with the same complaint.
macro_rules! warn_once {
    ($($arg:tt)*) => {{
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::debug!($($arg)*);
        } else {
            tracing::warn!($($arg)*);
        }
    }};
}
pub(crate) use warn_once;

/// A test double holding file contents in memory, keyed by path.
#[cfg(test)]
#[derive(Debug, Default, Clone)]
pub(crate) struct FakeFiles {
    files: std::collections::HashMap<std::path::PathBuf, String>,
}

#[cfg(test)]
impl FakeFiles {
    pub(crate) fn new() -> FakeFiles {
        FakeFiles::default()
    }

    pub(crate) fn with(mut self, path: &str, text: &str) -> FakeFiles {
        self.files.insert(path.into(), text.to_string());
        self
    }
}

#[cfg(test)]
impl FileSource for FakeFiles {
    fn read(&self, path: &Path) -> Option<String> {
        self.files.get(path).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_files_missing_is_none_not_panic() {
        assert_eq!(RealFiles.read(Path::new("/nonexistent/pocketchat/x")), None);
    }

    #[test]
    fn fake_files_answer_only_what_they_hold() {
        let fs = FakeFiles::new().with("/a", "1");
        assert_eq!(fs.read(Path::new("/a")).as_deref(), Some("1"));
        assert_eq!(fs.read(Path::new("/b")), None);
    }
}
