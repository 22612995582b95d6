//! What this process uses now, and how much more it may use.
//!
//! | function             | Linux                          | macOS / iOS                               |
//! |----------------------|--------------------------------|-------------------------------------------|
//! | [`rss_bytes`]        | `VmRSS`                        | `task_info(TASK_VM_INFO).resident_size`   |
//! | [`peak_rss_bytes`]   | `VmHWM`                        | `getrusage().ru_maxrss` (bytes on Darwin)  |
//! | [`footprint_bytes`]  | `RssAnon`                      | `task_info(TASK_VM_INFO).phys_footprint`  |
//! | [`available_bytes`]  | `MemAvailable` ∧ cgroup room   | iOS `os_proc_available_memory()`; macOS `None` |
//!
//! "Footprint" is what a jetsam-like killer counts: memory that only this process can
//! give back (anonymous/dirty pages, compressed pages), not clean file pages the kernel
//! can drop. Every function returns `None` instead of guessing when the OS will not say.

#[cfg(target_vendor = "apple")]
mod apple;
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) mod linux;

/// Resident set size now, in bytes.
pub fn rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        linux::status_field(&crate::memory::files::RealFiles, "VmRSS")
    }
    #[cfg(target_vendor = "apple")]
    {
        apple::task_vm_info().map(|i| i.resident_size)
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// Highest resident set size so far, in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        linux::status_field(&crate::memory::files::RealFiles, "VmHWM")
    }
    #[cfg(target_vendor = "apple")]
    {
        apple::max_rss_bytes()
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// Memory the OS would charge this process for when deciding whom to kill, in bytes.
pub fn footprint_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        linux::status_field(&crate::memory::files::RealFiles, "RssAnon")
    }
    #[cfg(target_vendor = "apple")]
    {
        apple::task_vm_info().and_then(|i| i.phys_footprint)
    }
    #[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
    {
        None
    }
}

/// How many more bytes this process can allocate before the OS steps in. `None` where
/// the platform has no such figure (macOS, which swaps and compresses instead).
pub fn available_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        crate::memory::probe::available_bytes_from(&crate::memory::files::RealFiles)
    }
    #[cfg(target_os = "ios")]
    {
        Some(apple::os_proc_available_bytes())
    }
    #[cfg(not(any(target_os = "linux", target_os = "ios")))]
    {
        None
    }
}

/// Hands freed heap memory back to the OS. glibc keeps freed chunks in its arenas, so
/// after the engine drops a large KV cache the resident size stays high until this
/// runs; the engine should call it after every eviction or trim. A no-op where the
/// allocator returns memory on its own (Darwin's) or where we cannot ask.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas; any pad value is valid.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_os = "linux", target_vendor = "apple"))]
    #[test]
    fn this_process_has_a_size() {
        let rss = rss_bytes().expect("rss");
        let peak = peak_rss_bytes().expect("peak");
        let footprint = footprint_bytes().expect("footprint");
        assert!(rss > 0);
        assert!(peak >= rss / 2, "peak {peak} vs rss {rss}");
        assert!(footprint <= peak.max(rss) * 2);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_has_headroom() {
        assert!(available_bytes().expect("MemAvailable") > 0);
    }
}
