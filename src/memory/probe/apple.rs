//! `sysctlbyname` readers for macOS and iOS.

use std::ffi::CStr;

/// Reads an integer sysctl of 4 or 8 bytes. `None` when the name does not exist on this
/// OS version or chip (e.g. `hw.optional.arm.FEAT_BF16` on Intel or older systems).
pub(crate) fn sysctl_u64(name: &CStr) -> Option<u64> {
    let mut buf = [0u8; 8];
    let mut len: libc::size_t = buf.len();
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `len` bytes and the kernel
    // writes at most `len` bytes and stores the real length back into `len`.
    let rc = unsafe { libc::sysctlbyname(name.as_ptr(), buf.as_mut_ptr().cast(), &mut len, std::ptr::null_mut(), 0) };
    if rc != 0 {
        return None;
    }
    match len {
        4 => Some(u64::from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))),
        8 => Some(u64::from_ne_bytes(buf)),
        _ => None,
    }
}

/// Physical memory in bytes (`hw.memsize`).
pub(crate) fn physical_bytes() -> Option<u64> {
    sysctl_u64(c"hw.memsize").filter(|&b| b > 0)
}

/// Whether the CPU implements BF16 (`hw.optional.arm.FEAT_BF16`; A15/M2 and newer).
pub(crate) fn bf16() -> Option<bool> {
    sysctl_u64(c"hw.optional.arm.FEAT_BF16").map(|v| v != 0)
}
