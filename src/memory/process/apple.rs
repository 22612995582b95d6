//! Mach and BSD calls for process memory on macOS and iOS.
//!
//! `libc` has `task_info` but not `struct task_vm_info`, so the part of it we read is
//! declared here, laid out as in `<mach/task_info.h>` (`#pragma pack(4)`), up to
//! `phys_footprint` (revision 1 of the struct; the kernel fills as much as we ask for).

use std::mem::size_of;

/// `TASK_VM_INFO` flavor of `task_info`.
const TASK_VM_INFO: libc::task_flavor_t = 22;

/// `struct task_vm_info` through revision 1.
#[repr(C, packed(4))]
#[derive(Clone, Copy, Default)]
struct TaskVmInfoRev1 {
    virtual_size: u64,
    region_count: i32,
    page_size: i32,
    resident_size: u64,
    resident_size_peak: u64,
    device: u64,
    device_peak: u64,
    internal: u64,
    internal_peak: u64,
    external: u64,
    external_peak: u64,
    reusable: u64,
    reusable_peak: u64,
    purgeable_volatile_pmap: u64,
    purgeable_volatile_resident: u64,
    purgeable_volatile_virtual: u64,
    compressed: u64,
    compressed_peak: u64,
    compressed_lifetime: u64,
    /// Added in revision 1: what jetsam charges the process for.
    phys_footprint: u64,
}

const REV1_COUNT: libc::mach_msg_type_number_t =
    (size_of::<TaskVmInfoRev1>() / size_of::<libc::natural_t>()) as libc::mach_msg_type_number_t;
// 38 naturals, as TASK_VM_INFO_REV1_COUNT in the SDK.
const _: () = assert!(REV1_COUNT == 38);

/// The figures we use from `task_vm_info`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VmInfo {
    pub resident_size: u64,
    /// `None` on kernels that only fill revision 0 of the struct.
    pub phys_footprint: Option<u64>,
}

pub(crate) fn task_vm_info() -> Option<VmInfo> {
    let mut info = TaskVmInfoRev1::default();
    let mut count = REV1_COUNT;
    // SAFETY: `info` is writable for `count` naturals; the kernel writes at most that
    // many and stores how many it wrote in `count`. `mach_task_self()` reads a global
    // that libSystem initialises before `main`.
    let kr = unsafe {
        #[allow(deprecated)]
        let task = libc::mach_task_self();
        libc::task_info(task, TASK_VM_INFO, (&mut info as *mut TaskVmInfoRev1).cast(), &mut count)
    };
    if kr != libc::KERN_SUCCESS {
        tracing::debug!(kr, "task_info(TASK_VM_INFO) failed");
        return None;
    }
    let resident_size = info.resident_size;
    let phys_footprint = info.phys_footprint;
    Some(VmInfo { resident_size, phys_footprint: (count >= REV1_COUNT).then_some(phys_footprint) })
}

/// `ru_maxrss` from `getrusage`, which Darwin reports in bytes (Linux uses KiB).
pub(crate) fn max_rss_bytes() -> Option<u64> {
    // SAFETY: `rusage` is plain data; getrusage fills it or fails.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to an owned `rusage`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return None;
    }
    u64::try_from(usage.ru_maxrss).ok().filter(|&b| b > 0)
}

#[cfg(target_os = "ios")]
extern "C" {
    /// iOS 13+: bytes this app may still allocate before hitting its jetsam limit.
    fn os_proc_available_memory() -> usize;
}

/// Live headroom to the jetsam limit.
#[cfg(target_os = "ios")]
pub(crate) fn os_proc_available_bytes() -> u64 {
    // SAFETY: no arguments, no preconditions; returns 0 when not applicable.
    unsafe { os_proc_available_memory() as u64 }
}
