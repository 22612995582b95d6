//! The device the model runs on and the CPU kernels' threads.

use candle_core::Device;

use crate::engine::cpu::pool;

/// Metal on Apple devices when built with `metal`, CUDA with `cuda`, else the CPU.
pub(super) fn pick_device() -> Device {
    #[cfg(feature = "metal")]
    if let Ok(d) = Device::new_metal(0) {
        return d;
    }
    #[cfg(feature = "cuda")]
    if let Ok(d) = Device::new_cuda(0) {
        return d;
    }
    Device::Cpu
}

pub(super) fn device_label(device: &Device) -> String {
    match device {
        Device::Cpu => "CPU".into(),
        Device::Metal(_) => "Metal".into(),
        Device::Cuda(_) => "CUDA".into(),
    }
}

/// Sets the CPU kernels' thread count; `None` uses every available core.
pub(super) fn set_threads(threads: Option<usize>) {
    let wanted = threads.unwrap_or_else(pool::available_cores);
    let got = pool::global().set_threads(wanted);
    if got != wanted {
        tracing::warn!("{wanted} compute threads asked for; using {got}, the cores available");
    }
}

/// candle's Metal backend leaks autoreleased objects when run outside a pool
/// (huggingface/candle#2271), so every decode step runs in one on Apple platforms.
pub(super) fn with_autorelease_pool<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_vendor = "apple")]
    {
        objc2::rc::autoreleasepool(|_| f())
    }
    #[cfg(not(target_vendor = "apple"))]
    {
        f()
    }
}
