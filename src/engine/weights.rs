//! Weights read from the GGUF file's own pages.
//!
//! The file is mapped read-only ([`MappedFile`]) and every matrix our kernels read in its
//! on-disk layout is used where it lies ([`MappedTensor`]): those pages are *clean*, the
//! OS can drop them under pressure and read them again, and neither iOS's memory limit
//! (jetsam counts dirty memory) nor `RssAnon` counts them. What cannot run in place (a
//! type without a native kernel, candle's path, a GPU) is copied out of the mapping once
//! ([`MappedTensor::to_qtensor`]) and counted as heap.
//!
//! The file must not change under the mapping. Files pocketchat writes are replaced by
//! rename, which leaves a mapped file intact; a file truncated in place by another program
//! would fault on the next read of a lost page (as in llama.cpp, which maps the same way).

use std::borrow::Cow;
use std::fs::File;
use std::sync::Arc;

use candle_core::quantized::k_quants::*;
use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::Device;
use half::{bf16, f16};

/// A GGUF file mapped read-only for the life of the model.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `file`. On Linux the pages are read in as the file is mapped (`MAP_POPULATE`,
    /// llama.cpp's default too): one sequential read instead of a page fault per 4 KiB
    /// during the first forward pass; elsewhere the OS is told they will be needed.
    pub fn map(file: &File) -> std::io::Result<Arc<MappedFile>> {
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut options = memmap2::MmapOptions::new();
        #[cfg(target_os = "linux")]
        options.populate();
        // SAFETY: the mapping is read-only; a file changed by another process while mapped
        // is the documented limit of this module.
        let map = unsafe { options.map(file)? };
        #[cfg(all(unix, not(target_os = "linux")))]
        let _ = map.advise(memmap2::Advice::WillNeed);
        Ok(Arc::new(MappedFile { map }))
    }

    /// The tensor `info` of a file whose tensor data starts at `data_offset`.
    pub fn tensor(self: &Arc<Self>, info: &gguf_file::TensorInfo, data_offset: u64) -> Result<MappedTensor, String> {
        let dtype = info.ggml_dtype;
        let elements = info.shape.elem_count();
        if !elements.is_multiple_of(dtype.block_size()) {
            return Err(format!("{elements} values are not whole blocks of {}", dtype.block_size()));
        }
        let len = elements / dtype.block_size() * dtype.type_size();
        let start = data_offset
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s.checked_add(len).is_some_and(|end| end <= self.map.len()))
            .ok_or_else(|| format!("its {len} bytes lie outside the file"))?;
        Ok(MappedTensor { file: self.clone(), start, len, dtype, dims: info.shape.dims().to_vec() })
    }
}

/// One tensor's bytes inside a [`MappedFile`]; cloning shares the mapping.
#[derive(Clone)]
pub struct MappedTensor {
    file: Arc<MappedFile>,
    start: usize,
    len: usize,
    dtype: GgmlDType,
    dims: Vec<usize>,
}

impl std::fmt::Debug for MappedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedTensor").field("dtype", &self.dtype).field("dims", &self.dims).finish()
    }
}

impl MappedTensor {
    /// The tensor's bytes, in the file's block layout.
    pub fn bytes(&self) -> &[u8] {
        &self.file.map[self.start..self.start + self.len]
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// Dimensions, outermost first (a matrix is `[rows, columns]`).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Whether the bytes are aligned for reading `dtype`'s blocks in place (GGUF aligns
    /// tensors to `general.alignment`, 32 unless a file says otherwise).
    fn aligned(&self) -> bool {
        (self.bytes().as_ptr() as usize).is_multiple_of(block_align(self.dtype))
    }

    /// A copy in candle's own storage on `device`: for what cannot run in place.
    pub fn to_qtensor(&self, device: &Device) -> candle_core::Result<QTensor> {
        let bytes = self.bytes();
        let storage = if self.aligned() {
            QStorage::from_data(Cow::Borrowed(bytes), device, self.dtype)?
        } else {
            // A file aligned below the block's alignment: copy through an aligned buffer.
            QStorage::from_data(Cow::Borrowed(aligned_copy(bytes, &mut Vec::new())), device, self.dtype)?
        };
        QTensor::new(storage, self.dims.clone())
    }

    /// Drops the tensor's pages from this process's resident memory once it has been
    /// copied out ([`MappedTensor::to_qtensor`]): they are clean, and reading them again
    /// (should anything) pages them back in from the file. Only pages wholly inside the
    /// tensor are dropped, so its neighbours stay resident.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
            let first = self.start.div_ceil(page) * page;
            let end = (self.start + self.len) / page * page;
            if end > first {
                // SAFETY: the mapping is read-only and backed by the file, so MADV_DONTNEED
                // only drops clean copies: the next read sees the same bytes from the file.
                let _ = unsafe {
                    self.file.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
                };
            }
        }
    }

    /// Rows `ids` of a matrix, dequantized to f32 (`ids.len() x columns`): embedding lookups
    /// that read only the rows they need.
    pub fn rows_f32(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        let &[rows, columns] = self.dims.as_slice() else {
            candle_core::bail!("embedding table of shape {:?}, a matrix expected", self.dims)
        };
        if !columns.is_multiple_of(self.dtype.block_size()) {
            candle_core::bail!("rows of {columns} values are not whole blocks of {}", self.dtype.block_size())
        }
        let row_bytes = columns / self.dtype.block_size() * self.dtype.type_size();
        let mut out = vec![0f32; ids.len() * columns];
        let mut scratch = Vec::new();
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(columns)) {
            let id = id as usize;
            if id >= rows {
                candle_core::bail!("token id {id} is out of range for {rows} embedding rows")
            }
            let mut row = &self.bytes()[id * row_bytes..(id + 1) * row_bytes];
            if !(row.as_ptr() as usize).is_multiple_of(block_align(self.dtype)) {
                row = aligned_copy(row, &mut scratch);
            }
            dequantize_row(self.dtype, row, dst);
        }
        Ok(out)
    }
}

/// `bytes` copied into `buffer`, whose u32 words align them for any block type.
fn aligned_copy<'a>(bytes: &[u8], buffer: &'a mut Vec<u32>) -> &'a [u8] {
    buffer.clear();
    buffer.resize(bytes.len().div_ceil(4), 0);
    // SAFETY: `buffer` holds at least `bytes.len()` bytes; u8 has no alignment.
    let aligned = unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr() as *mut u8, bytes.len()) };
    aligned.copy_from_slice(bytes);
    aligned
}

/// The alignment `dtype`'s blocks need.
fn block_align(dtype: GgmlDType) -> usize {
    use std::mem::align_of;
    match dtype {
        GgmlDType::F32 => align_of::<f32>(),
        GgmlDType::F16 => align_of::<f16>(),
        GgmlDType::BF16 => align_of::<bf16>(),
        GgmlDType::Q4_0 => align_of::<BlockQ4_0>(),
        GgmlDType::Q4_1 => align_of::<BlockQ4_1>(),
        GgmlDType::Q5_0 => align_of::<BlockQ5_0>(),
        GgmlDType::Q5_1 => align_of::<BlockQ5_1>(),
        GgmlDType::Q8_0 => align_of::<BlockQ8_0>(),
        GgmlDType::Q8_1 => align_of::<BlockQ8_1>(),
        GgmlDType::Q2K => align_of::<BlockQ2K>(),
        GgmlDType::Q3K => align_of::<BlockQ3K>(),
        GgmlDType::Q4K => align_of::<BlockQ4K>(),
        GgmlDType::Q5K => align_of::<BlockQ5K>(),
        GgmlDType::Q6K => align_of::<BlockQ6K>(),
        GgmlDType::Q8K => align_of::<BlockQ8K>(),
    }
}

/// `dst = row` as f32, `row` being whole blocks of `dtype`, aligned for them.
fn dequantize_row(dtype: GgmlDType, row: &[u8], dst: &mut [f32]) {
    fn run<T: GgmlType>(row: &[u8], dst: &mut [f32]) {
        let size = std::mem::size_of::<T>();
        debug_assert!(
            row.len().is_multiple_of(size) && (row.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        );
        // SAFETY: the blocks are plain old data (any bit pattern is valid), `row` holds
        // whole blocks and is aligned for them (checked by the caller).
        let blocks = unsafe { std::slice::from_raw_parts(row.as_ptr() as *const T, row.len() / size) };
        T::to_float(blocks, dst);
    }
    match dtype {
        GgmlDType::F32 => run::<f32>(row, dst),
        GgmlDType::F16 => run::<f16>(row, dst),
        GgmlDType::BF16 => run::<bf16>(row, dst),
        GgmlDType::Q4_0 => run::<BlockQ4_0>(row, dst),
        GgmlDType::Q4_1 => run::<BlockQ4_1>(row, dst),
        GgmlDType::Q5_0 => run::<BlockQ5_0>(row, dst),
        GgmlDType::Q5_1 => run::<BlockQ5_1>(row, dst),
        GgmlDType::Q8_0 => run::<BlockQ8_0>(row, dst),
        GgmlDType::Q8_1 => run::<BlockQ8_1>(row, dst),
        GgmlDType::Q2K => run::<BlockQ2K>(row, dst),
        GgmlDType::Q3K => run::<BlockQ3K>(row, dst),
        GgmlDType::Q4K => run::<BlockQ4K>(row, dst),
        GgmlDType::Q5K => run::<BlockQ5K>(row, dst),
        GgmlDType::Q6K => run::<BlockQ6K>(row, dst),
        GgmlDType::Q8K => run::<BlockQ8K>(row, dst),
    }
}
