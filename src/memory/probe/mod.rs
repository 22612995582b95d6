//! Probes for how much memory this device has and what its CPU can do.
//!
//! - Linux: `MemTotal` from `/proc/meminfo`, lowered to the tightest cgroup limit
//!   (v2 `memory.max` or v1 `memory.limit_in_bytes`, see [`cgroup`]).
//! - macOS and iOS: `sysctlbyname("hw.memsize")`, and `hw.optional.arm.FEAT_BF16` as a
//!   proxy for newer Apple silicon.
//! - Elsewhere: unknown (`None`); the caller picks a safe default.
//!
//! The parsers are pure functions over text so they can be tested with fixtures; the
//! functions that touch the system never panic and log a warning when a file that
//! should be there is unreadable or garbled.

#[cfg(target_vendor = "apple")]
mod apple;
// The Linux parsers are plain text functions; they build everywhere so their tests run
// on any host, but only Linux calls them.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) mod cgroup;
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) mod kv_text;

#[cfg_attr(not(target_os = "linux"), allow(unused_imports))]
use crate::memory::files::{warn_once, FileSource, RealFiles};

/// Physical memory available to this process, in bytes: what the OS reports, lowered
/// to a container limit where one applies. `None` when it cannot be read.
pub fn physical_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        physical_bytes_from(&RealFiles)
    }
    #[cfg(target_vendor = "apple")]
    {
        let bytes = apple::physical_bytes();
        if bytes.is_none() {
            tracing::warn!("sysctl hw.memsize is unreadable");
        }
        bytes
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// Whether the CPU has BF16 instructions (Apple silicon only; `None` elsewhere or when
/// the OS does not say).
pub fn bf16_supported() -> Option<bool> {
    #[cfg(target_vendor = "apple")]
    {
        apple::bf16()
    }
    #[cfg(not(target_vendor = "apple"))]
    {
        None
    }
}

/// `MemTotal` lowered to the cgroup limit. If `/proc/meminfo` is unreadable but a
/// cgroup limit exists, the limit alone is the answer.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn physical_bytes_from(fs: &dyn FileSource) -> Option<u64> {
    let total = match fs.read(std::path::Path::new("/proc/meminfo")) {
        None => {
            warn_once!("/proc/meminfo is unreadable; physical memory unknown");
            None
        }
        Some(text) => {
            let total = kv_text::colon_field_bytes(&text, "MemTotal").filter(|&b| b > 0);
            if total.is_none() {
                warn_once!("/proc/meminfo has no usable MemTotal line");
            }
            total
        }
    };
    let limit = cgroup::cgroup_memory(fs).limit_bytes;
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// Live headroom on Linux: `MemAvailable`, lowered to the cgroup headroom.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn available_bytes_from(fs: &dyn FileSource) -> Option<u64> {
    let available =
        fs.read(std::path::Path::new("/proc/meminfo")).and_then(|t| kv_text::colon_field_bytes(&t, "MemAvailable"));
    let headroom = cgroup::cgroup_memory(fs).headroom_bytes;
    match (available, headroom) {
        (Some(a), Some(h)) => Some(a.min(h)),
        (a, h) => a.or(h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::files::FakeFiles;
    use crate::memory::{GIB, MIB};

    const MEMINFO_16G: &str = "MemTotal:       16777216 kB\nMemAvailable:    8388608 kB\n";
    const V2_MOUNTINFO: &str = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn memtotal_without_cgroup() {
        let fs = FakeFiles::new().with("/proc/meminfo", MEMINFO_16G);
        assert_eq!(physical_bytes_from(&fs), Some(16 * GIB));
        assert_eq!(available_bytes_from(&fs), Some(8 * GIB));
    }

    #[test]
    fn cgroup_limit_lowers_memtotal() {
        let fs = FakeFiles::new()
            .with("/proc/meminfo", MEMINFO_16G)
            .with("/proc/self/mountinfo", V2_MOUNTINFO)
            .with("/proc/self/cgroup", "0::/box\n")
            .with("/sys/fs/cgroup/box/memory.max", "6442450944\n")
            .with("/sys/fs/cgroup/box/memory.current", "5368709120\n");
        assert_eq!(physical_bytes_from(&fs), Some(6 * GIB));
        assert_eq!(available_bytes_from(&fs), Some(GIB));
    }

    #[test]
    fn higher_cgroup_limit_does_not_raise_memtotal() {
        let fs = FakeFiles::new()
            .with("/proc/meminfo", MEMINFO_16G)
            .with("/proc/self/mountinfo", V2_MOUNTINFO)
            .with("/proc/self/cgroup", "0::/\n")
            .with("/sys/fs/cgroup/memory.max", "68719476736\n");
        assert_eq!(physical_bytes_from(&fs), Some(16 * GIB));
    }

    #[test]
    fn unreadable_or_garbage_meminfo_is_none() {
        assert_eq!(physical_bytes_from(&FakeFiles::new()), None);
        let fs = FakeFiles::new().with("/proc/meminfo", "\u{fffd}\u{fffd} not meminfo");
        assert_eq!(physical_bytes_from(&fs), None);
        assert_eq!(available_bytes_from(&fs), None);
        let fs = FakeFiles::new().with("/proc/meminfo", "MemTotal: 0 kB\n");
        assert_eq!(physical_bytes_from(&fs), None);
    }

    #[test]
    fn garbage_meminfo_with_cgroup_limit_uses_the_limit() {
        let fs = FakeFiles::new()
            .with("/proc/meminfo", "garbage")
            .with("/proc/self/mountinfo", V2_MOUNTINFO)
            .with("/proc/self/cgroup", "0::/\n")
            .with("/sys/fs/cgroup/memory.max", "536870912\n");
        assert_eq!(physical_bytes_from(&fs), Some(512 * MIB));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_reports_something() {
        let bytes = physical_bytes().expect("a Linux test host has /proc/meminfo");
        assert!(bytes > 64 * MIB);
    }
}
