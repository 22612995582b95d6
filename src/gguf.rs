//! Reading a GGUF file that may be hostile (the app downloads them from the internet):
//! the one header reader the engine (to load), the catalog (to check a download, to
//! quantize) and the CLI share.
//!
//! candle's reader bounds every string and array by the file's size, but it divides by
//! `general.alignment` unchecked (0 panics), and it accepts tensors whose dimensions
//! multiply past 2^64 or whose data lies outside the file: those load, and the first use
//! panics or reads garbage. [`read`] runs candle's reader behind a panic guard and then
//! checks, with checked arithmetic, what it did not: the alignment is a power of two and
//! every tensor's size is representable and its data inside the file. A tensor type it
//! cannot read (llama.cpp's IQ* types, for example) is named with its tensor first. The model loader
//! then checks that the figures in the metadata agree with the tensors present
//! (`Model::load`).

use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::quantized::gguf_file::{Content, Value};

/// Why a file's GGUF header was refused. Its text is what the user reads, after the
/// file's name.
#[derive(Debug)]
pub enum GgufError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The header cannot be walked: cut short, an array longer than the file, a metadata
    /// type that does not exist.
    Malformed(String),
    /// candle's reader refused the header, or failed on it.
    Unreadable(String),
    /// `general.alignment` is not a power of two up to [`MAX_ALIGNMENT`] (`None`: not a
    /// whole number).
    Alignment(Option<u64>),
    /// A tensor of a type this engine does not read: its name and GGML type id.
    UnsupportedType { tensor: String, type_id: u32 },
    /// A tensor whose size or place cannot be right: its name and what is wrong.
    BadTensor { tensor: String, problem: String },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::Io(e) => write!(f, "{e}"),
            GgufError::Malformed(what) => f.write_str(what),
            GgufError::Unreadable(what) => f.write_str(what),
            GgufError::Alignment(None) => f.write_str("`general.alignment` is not a whole number"),
            GgufError::Alignment(Some(n)) => {
                write!(f, "`general.alignment` is {n}: not a power of two up to {MAX_ALIGNMENT}")
            }
            GgufError::UnsupportedType { tensor, type_id } => write!(
                f,
                "tensor `{tensor}` is {}, which pocketchat does not read (it reads F32, F16, BF16, Q4_0, Q4_1, \
                 Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K)",
                ggml_type_name(*type_id)
            ),
            GgufError::BadTensor { tensor, problem } => write!(f, "tensor `{tensor}` {problem}"),
        }
    }
}

impl std::error::Error for GgufError {}

impl From<std::io::Error> for GgufError {
    fn from(e: std::io::Error) -> Self {
        GgufError::Io(e)
    }
}

/// The largest alignment accepted (llama.cpp writes 32; more is padding nobody needs).
const MAX_ALIGNMENT: u64 = 1 << 16;

/// Reads the header of the GGUF behind `reader` and checks it against the file's size.
pub fn read(reader: &mut BufReader<File>) -> Result<Content, GgufError> {
    let file_len = reader.get_ref().metadata()?.len();
    // candle divides by the alignment before anyone can look at it: look first.
    let start = reader.stream_position()?;
    let scan = scan_header(reader, file_len);
    reader.seek(SeekFrom::Start(start))?;
    let scan = scan?;
    if let Some(alignment) = scan.alignment {
        check_alignment(alignment)?;
    }
    if let Some((tensor, type_id)) = scan.unsupported {
        return Err(GgufError::UnsupportedType { tensor, type_id });
    }
    let mut reader = Positioned { inner: reader, at: start };
    let content = match catch_unwind(AssertUnwindSafe(|| Content::read(&mut reader))) {
        Ok(read) => read.map_err(|e| GgufError::Unreadable(e.to_string()))?,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let what = format!("the file's header is malformed (the GGUF reader failed: {what})");
            return Err(GgufError::Unreadable(what));
        }
    };
    check(&content, file_len)?;
    Ok(content)
}

/// The checks candle's reader leaves out; see the module docs.
fn check(content: &Content, file_len: u64) -> Result<(), GgufError> {
    let alignment = match content.metadata.get("general.alignment") {
        None => 32,
        Some(v) => integer(v).ok_or(GgufError::Alignment(None))?,
    };
    check_alignment(alignment)?;
    for (name, info) in &content.tensor_infos {
        let bad = |problem: String| GgufError::BadTensor { tensor: name.clone(), problem };
        let dims = info.shape.dims();
        let elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        let elements = elements.ok_or_else(|| bad(format!("has dimensions {dims:?} that overflow")))?;
        let block = info.ggml_dtype.block_size() as u64;
        if elements == 0 || elements % block != 0 {
            return Err(bad(format!("has {elements} values, which do not fill blocks of {block}")));
        }
        let bytes = (elements / block).checked_mul(info.ggml_dtype.type_size() as u64);
        let end = bytes
            .and_then(|b| content.tensor_data_offset.checked_add(info.offset)?.checked_add(b))
            .ok_or_else(|| bad("has a size that overflows".into()))?;
        if end > file_len {
            return Err(bad(format!("ends at byte {end}, past the end of the file ({file_len} bytes)")));
        }
        if info.offset % alignment != 0 {
            return Err(bad(format!("is not aligned to {alignment} bytes")));
        }
    }
    Ok(())
}

fn check_alignment(alignment: u64) -> Result<(), GgufError> {
    if alignment == 0 || !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
        return Err(GgufError::Alignment(Some(alignment)));
    }
    Ok(())
}

/// What [`scan_header`] finds before candle's reader runs.
#[derive(Debug, Default, PartialEq)]
struct HeaderScan {
    /// `general.alignment`, when the metadata has it.
    alignment: Option<u64>,
    /// The first tensor whose type this engine does not read: its name and type id.
    unsupported: Option<(String, u32)>,
}

/// Walks the metadata entries and the tensor infos (every length checked against the
/// file's size) for `general.alignment` and for tensor types candle cannot read (its
/// reader fails on them without naming the tensor). Errors only where the file cannot
/// be a GGUF at all; candle's reader reports the rest.
fn scan_header(r: &mut BufReader<File>, file_len: u64) -> Result<HeaderScan, GgufError> {
    let at = r.stream_position()?;
    let mut walk = Walk { r, at, file_len, wide: true };
    let mut scan = HeaderScan::default();
    let magic = walk.u32()?;
    if magic != u32::from_le_bytes(*b"GGUF") {
        return Ok(scan);
    }
    walk.wide = walk.u32()? >= 2; // version 1 has 32-bit lengths
    let tensors = walk.len()?;
    let entries = walk.len()?;
    for _ in 0..entries {
        let key = walk.string()?;
        let ty = walk.u32()?;
        if key == b"general.alignment" {
            scan.alignment = Some(match ty {
                0 | 1 => walk.bytes(1)?[0] as u64,
                2 | 3 => u16::from_le_bytes(walk.bytes(2)?.try_into().expect("2")) as u64,
                4 | 5 => u32::from_le_bytes(walk.bytes(4)?.try_into().expect("4")) as u64,
                10 | 11 => u64::from_le_bytes(walk.bytes(8)?.try_into().expect("8")),
                _ => return Err(GgufError::Alignment(None)),
            });
            continue;
        }
        walk.skip_value(ty, 0)?;
    }
    for _ in 0..tensors {
        let name = walk.string()?;
        let n_dims = walk.u32()?;
        if n_dims > 4 {
            return Ok(scan); // candle's reader says what is wrong
        }
        walk.skip(8 * n_dims as u64)?;
        let ty = walk.u32()?;
        walk.skip(8)?; // offset
        if !READABLE_TYPES.contains(&ty) {
            scan.unsupported = Some((String::from_utf8_lossy(&name).into_owned(), ty));
            break;
        }
    }
    Ok(scan)
}

/// GGML type ids candle's reader and this engine read (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, Q8_1, Q2_K … Q6_K, Q8_K, BF16).
const READABLE_TYPES: &[u32] = &[0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// llama.cpp's name of a GGML type id, for the error.
fn ggml_type_name(id: u32) -> String {
    let name = match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("type {id}"),
    };
    format!("{name} (type {id})")
}

/// A reader that keeps its own position: candle's header reader asks for it before every
/// string, a system call each time on a `BufReader<File>` (262,144 of them for Gemma 3's
/// vocabulary).
struct Positioned<'a> {
    inner: &'a mut BufReader<File>,
    at: u64,
}

impl Read for Positioned<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.at += n as u64;
        Ok(n)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.at += buf.len() as u64;
        Ok(())
    }
}

impl Seek for Positioned<'_> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        if pos != SeekFrom::Current(0) {
            self.at = self.inner.seek(pos)?;
        }
        Ok(self.at)
    }
}

/// A bounded walk over a GGUF header.
struct Walk<'a> {
    r: &'a mut BufReader<File>,
    /// The reader's position, kept here: asking the reader costs a system call, and a
    /// vocabulary of 262,144 strings asks a million times.
    at: u64,
    file_len: u64,
    wide: bool,
}

impl Walk<'_> {
    fn remaining(&mut self) -> Result<u64, GgufError> {
        Ok(self.file_len.saturating_sub(self.at))
    }

    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, GgufError> {
        if n > self.remaining()? {
            return Err(cut_short());
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf)?;
        self.at += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64) -> Result<(), GgufError> {
        if n > self.remaining()? {
            return Err(cut_short());
        }
        self.r.seek_relative(n as i64)?;
        self.at += n;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    fn len(&mut self) -> Result<u64, GgufError> {
        if self.wide {
            Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
        } else {
            self.u32().map(u64::from)
        }
    }

    fn string(&mut self) -> Result<Vec<u8>, GgufError> {
        let n = self.len()?;
        self.bytes(n)
    }

    fn skip_value(&mut self, ty: u32, depth: usize) -> Result<(), GgufError> {
        if let Some(size) = fixed_size(ty) {
            return self.skip(size);
        }
        match ty {
            8 => {
                let n = self.len()?;
                self.skip(n)
            }
            9 if depth < 2 => {
                let elem = self.u32()?;
                let count = self.len()?;
                if count > self.remaining()? {
                    return Err(GgufError::Malformed("an array is longer than the file".into()));
                }
                match fixed_size(elem) {
                    // One skip for the whole array (a vocabulary's scores are 262,144 of them).
                    Some(size) => self.skip(count.checked_mul(size).ok_or_else(cut_short)?),
                    None => (0..count).try_for_each(|_| self.skip_value(elem, depth + 1)),
                }
            }
            _ => Err(GgufError::Malformed(format!("unknown metadata type {ty}"))),
        }
    }
}

/// The size of a metadata value of type `ty` that has one (not a string or an array).
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn cut_short() -> GgufError {
    GgufError::Malformed("the file's header is cut short".into())
}

fn integer(v: &Value) -> Option<u64> {
    match v {
        Value::U8(v) => Some(*v as u64),
        Value::U16(v) => Some(*v as u64),
        Value::U32(v) => Some(*v as u64),
        Value::U64(v) => Some(*v),
        Value::I8(v) => u64::try_from(*v).ok(),
        Value::I16(v) => u64::try_from(*v).ok(),
        Value::I32(v) => u64::try_from(*v).ok(),
        Value::I64(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A GGUF v3 header with `entries` of metadata and no tensors.
    fn header(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((entries.len() as u64).to_le_bytes());
        for (key, ty, value) in entries {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(ty.to_le_bytes());
            out.extend(value);
        }
        out
    }

    fn array(elem: u32, count: u64, items: &[u8]) -> Vec<u8> {
        [elem.to_le_bytes().as_slice(), &count.to_le_bytes(), items].concat()
    }

    fn scan(bytes: &[u8]) -> Result<HeaderScan, GgufError> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file.rewind().unwrap();
        let len = bytes.len() as u64;
        scan_header(&mut BufReader::new(file), len)
    }

    #[test]
    fn the_walk_skips_arrays_and_finds_the_alignment_after_them() {
        let floats: Vec<u8> = (0..1000u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let strings: Vec<u8> =
            ["a", "bc", ""].iter().flat_map(|s| [&(s.len() as u64).to_le_bytes(), s.as_bytes()].concat()).collect();
        let bytes = header(&[
            ("scores", 9, array(6, 1000, &floats)),
            ("tokens", 9, array(8, 3, &strings)),
            ("flag", 7, vec![1]),
            ("general.alignment", 4, 64u32.to_le_bytes().to_vec()),
        ]);
        assert_eq!(scan(&bytes).unwrap().alignment, Some(64));
    }

    #[test]
    fn an_array_longer_than_the_file_is_cut_short() {
        // 20 f32s claimed, 10 present: the count alone is under the 40 bytes left.
        let floats: Vec<u8> = (0..10u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let bytes = header(&[("scores", 9, array(6, 20, &floats))]);
        let e = scan(&bytes).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
    }
}
