//! `/proc/self/status` readers.

use std::path::Path;

use crate::memory::files::{warn_once, FileSource};
use crate::memory::probe::kv_text::colon_field_bytes;

/// One `Key: N kB` field of `/proc/self/status`, in bytes. Warns (once) when the file is
/// unreadable or the field is missing or garbled.
pub(crate) fn status_field(fs: &dyn FileSource, key: &str) -> Option<u64> {
    let Some(text) = fs.read(Path::new("/proc/self/status")) else {
        warn_once!("/proc/self/status is unreadable; process memory unknown");
        return None;
    };
    let value = colon_field_bytes(&text, key);
    if value.is_none() {
        warn_once!(key, "/proc/self/status lacks a usable field");
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::files::FakeFiles;

    const STATUS: &str = "Name:\tpocketchat\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t   51200 kB\n";

    #[test]
    fn reads_fields() {
        let fs = FakeFiles::new().with("/proc/self/status", STATUS);
        assert_eq!(status_field(&fs, "VmRSS"), Some(100 << 20));
        assert_eq!(status_field(&fs, "VmHWM"), Some(200 << 20));
        assert_eq!(status_field(&fs, "RssAnon"), Some(50 << 20));
    }

    #[test]
    fn unreadable_or_garbage_is_none() {
        assert_eq!(status_field(&FakeFiles::new(), "VmRSS"), None);
        let fs = FakeFiles::new().with("/proc/self/status", "VmRSS: ??? kB\n");
        assert_eq!(status_field(&fs, "VmRSS"), None);
        assert_eq!(status_field(&fs, "RssAnon"), None);
    }
}
