//! Saving a conversation's [`Session`] (token ids, turns, text and the K/V cache as f16,
//! or as q8_0 blocks for a q8_0 cache) so it survives the app being killed, and restoring
//! it without re-prefill.
//!
//! ```text
//!   "PCSTATE\0" | u32 version | u32 header length | JSON header | per layer with K/V of its own: K, V (f16 or q8_0)
//!   | per saved recurrent state (now, then each checkpoint): every recurrent tensor, f32 (format 3 on)
//!   | u32 CRC-32 of everything before it (format 2)
//! ```
//!
//! A hybrid model's recurrent layers (short convolutions, gated delta-net) are saved with
//! their turn checkpoints, so a restored chat regenerates and edits as the live one did.
//! Format 4 lists each layer's head size (Gemma 4's layers differ, and some keep no K/V of
//! their own); older files hold every attention layer at one `head_dim`. Format 5 names
//! the K/V type (`kv_type`: "f16", or "q8_0" for ggml's 34-byte blocks of 32 values, as a
//! q8_0 cache holds them; older files are f16), and saves a sliding-window layer's held
//! positions only, from the session's `window_base` on (Gemma's: see `State`'s window;
//! older files hold every position of every layer). A file restores into a cache of either
//! type: values of the other type are converted (quantized, or widened) as they are read.
//! Files of format 1 and 2 have no recurrent tensors: they are read for a plain
//! transformer and refused ("different layer shapes") for a hybrid model.
//!
//! The header names the model file (sha256 and size) and the shapes of the cache. A file
//! from another model, a truncated or altered file, a newer version or garbage is refused
//! with a [`StateFileError`] and the caller starts a fresh conversation.
//!
//! Every file is hostile until checked, and nothing is lost:
//! - **Reading** checks the sizes the header describes against the file's length before
//!   the body is read, the checksum before any of it is used, and every cache value for
//!   being finite.
//! - **Writing** never replaces a file that is not a state file of this model
//!   ([`StateFileError::WontOverwrite`]; the engine then saves beside it, see
//!   [`free_path_beside`]). It writes a temporary file with a unique name in the same
//!   folder, syncs it, renames it into place and syncs the folder; the temporary file is
//!   removed on every failure. A process holds a [`StateLock`] on the file it saves to.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::kv_type::{KvDtype, Q8_0_BYTES};
use super::session::{Session, SessionSnapshot};
use super::state::LayerMemory;
use super::Cause;
use crate::files::TempFile;

const MAGIC: &[u8; 8] = b"PCSTATE\0";
pub const FORMAT_VERSION: u32 = 5;
/// Magic, version and header length.
const PREFIX_BYTES: u64 = 16;
/// Headers longer than this are refused unread (a 100k-token conversation's is ~2 MB).
const MAX_HEADER_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    #[error("no saved conversation at {0}")]
    Missing(PathBuf),
    #[error("the saved conversation is not a pocketchat state file")]
    NotAStateFile,
    #[error("the saved conversation was written by a newer pocketchat (format {0})")]
    NewerFormat(u32),
    #[error("the saved conversation belongs to another model ({0})")]
    OtherModel(String),
    #[error("the saved conversation is damaged: {0}")]
    Damaged(String),
    #[error("could not read the saved conversation: {0}")]
    Unreadable(#[source] Cause),
    /// A FIFO, a device, a folder: never opened, read or replaced.
    #[error("{}", .0)]
    NotRegular(String),
    #[error("{} was left as it is: {why}", path.display())]
    WontOverwrite { path: PathBuf, why: String },
    #[error("could not write the conversation: {0}")]
    Io(#[source] Cause),
    #[error("could not encode the conversation: {0}")]
    Encode(#[source] Cause),
}

impl StateFileError {
    /// The file at the path is something that must be kept: not ours to replace.
    pub fn keeps_the_file(&self) -> bool {
        !matches!(self, StateFileError::Missing(_) | StateFileError::Io(_) | StateFileError::Encode(_))
    }
}

/// Which model a state belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Serialize, Deserialize)]
struct Header {
    model: ModelIdentity,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Per layer, the shapes of its recurrent tensors (empty for attention); absent before
    /// format 3, whose files hold attention layers only.
    #[serde(default)]
    recurrent: Vec<Vec<Vec<usize>>>,
    /// Token counts of the saved recurrent states: now, then each checkpoint (empty for
    /// a plain transformer or an empty conversation).
    #[serde(default)]
    recurrent_lengths: Vec<usize>,
    /// Per layer, the head size of the K/V saved for it (0: none saved); absent before
    /// format 4, whose files save each layer without recurrent tensors at `head_dim`.
    #[serde(default)]
    kv_head_dims: Vec<usize>,
    /// The saved K/V's type: "f16" or "q8_0"; absent before format 5, whose files are f16.
    #[serde(default)]
    kv_type: Option<String>,
    session: SessionSnapshot,
}

/// The K/V type a state is saved in: q8_0 as it is, anything else as f16.
fn saved_kv_type(state: &super::State) -> KvDtype {
    match state.dtype() {
        KvDtype::Q8_0 => KvDtype::Q8_0,
        KvDtype::F16 | KvDtype::F32 => KvDtype::F16,
    }
}

/// Per layer, the shapes of the recurrent tensors `state` keeps (empty for attention).
fn recurrent_shapes(state: &super::State) -> Vec<Vec<Vec<usize>>> {
    state
        .memory()
        .iter()
        .map(|m| match m {
            LayerMemory::KeysValues | LayerMemory::SharedKeysValues(_) => Vec::new(),
            LayerMemory::Recurrent(shapes) => shapes.clone(),
        })
        .collect()
}

/// Writes `session` to `path` atomically; refuses to replace a file that is not a state
/// file of `model`.
pub fn save(session: &Session, model: &ModelIdentity, path: &Path) -> Result<u64, StateFileError> {
    let _span = tracing::info_span!("save", path = %path.display()).entered();
    if let Err(e) = check_replaceable(path, model) {
        return Err(StateFileError::WontOverwrite { path: path.to_path_buf(), why: e.to_string() });
    }
    let io = |e: std::io::Error| StateFileError::Io(Cause::new(e));
    let (n_kv_heads, head_dim) = session.state.shape();
    let snapshots = session.state.recurrent_snapshots();
    let header = Header {
        model: model.clone(),
        n_layers: session.state.n_layers(),
        n_kv_heads,
        head_dim,
        recurrent: recurrent_shapes(&session.state),
        recurrent_lengths: snapshots.iter().map(|(len, _)| *len).collect(),
        kv_head_dims: session.state.stored_head_dims(),
        kv_type: Some(saved_kv_type(&session.state).name().into()),
        session: session.snapshot(),
    };
    let json = serde_json::to_vec(&header).map_err(|e| StateFileError::Encode(Cause::new(e)))?;
    let dir = crate::files::folder_of(path);
    // No folder is made on the way: a path in a folder that is not there is a mistake.
    check_folder(&dir).map_err(StateFileError::Io)?;
    let tmp = TempFile::new(&dir, path);
    let mut f = Checksummed::new(BufWriter::new(File::create_new(tmp.path()).map_err(io)?));
    f.write_all(MAGIC).map_err(io)?;
    f.write_all(&FORMAT_VERSION.to_le_bytes()).map_err(io)?;
    f.write_all(&(json.len() as u32).to_le_bytes()).map_err(io)?;
    f.write_all(&json).map_err(io)?;
    let q8_0 = saved_kv_type(&session.state) == KvDtype::Q8_0;
    for layer in session.state.export() {
        let (k, v) = layer.map_err(|e| StateFileError::Encode(Cause::new(e)))?;
        for t in [k, v] {
            let bytes: Vec<u8> = if q8_0 {
                // The blocks as the cache holds them.
                t.flatten_all().and_then(|t| t.to_vec1()).map_err(|e| StateFileError::Encode(Cause::new(e)))?
            } else {
                let data: Vec<half::f16> = t
                    .to_dtype(DType::F16)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1())
                    .map_err(|e| StateFileError::Encode(Cause::new(e)))?;
                data.iter().flat_map(|x| x.to_le_bytes()).collect()
            };
            f.write_all(&bytes).map_err(io)?;
        }
    }
    for t in snapshots.iter().flat_map(|(_, tensors)| tensors) {
        let data: Vec<f32> = t
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .map_err(|e| StateFileError::Encode(Cause::new(e)))?;
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        f.write_all(&bytes).map_err(io)?;
    }
    let Checksummed { inner: mut f, crc } = f;
    let crc = crc.finalize();
    f.write_all(&crc.to_le_bytes()).map_err(io)?;
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(tmp.path(), path).map_err(io)?;
    tmp.keep();
    // The rename itself survives a power cut once the folder is synced (not possible on
    // every platform: best effort).
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
}

/// Ok when `path` is absent or holds a state file of `model` (of this format or older):
/// only those may be replaced.
fn check_replaceable(path: &Path, model: &ModelIdentity) -> Result<(), StateFileError> {
    let mut f = match open_state_file(path) {
        Ok(f) => f,
        Err(StateFileError::Missing(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    check_model(&read_header(&mut f, path)?.header, model)
}

/// Opens a state file for reading without blocking on a FIFO or reading a device
/// ([`crate::files::open_regular`]).
fn open_state_file(path: &Path) -> Result<File, StateFileError> {
    crate::files::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StateFileError::Missing(path.to_path_buf()),
        std::io::ErrorKind::InvalidInput => StateFileError::NotRegular(e.to_string()),
        _ => StateFileError::Unreadable(Cause::new(e)),
    })
}

/// Ok when `dir` is an existing folder (a state file can be written in it).
fn check_folder(dir: &Path) -> Result<(), Cause> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(m) => Err(Cause::msg(format!("{} is {}, not a folder", dir.display(), crate::files::kind_of(&m)))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Cause::msg(format!("the folder {} does not exist", dir.display())))
        }
        Err(e) => Err(Cause::msg(format!("{}: {e}", dir.display()))),
    }
}

/// Whether `path` can be used as a conversation's state file (`--session`): absent or a
/// regular file, in a folder that exists. A FIFO, a device such as `/dev/null` or a
/// folder is refused before anything is opened or written beside it.
pub fn check_state_path(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(format!("{} is {}, not a regular file", path.display(), crate::files::kind_of(&m)))
        }
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    if path.is_symlink() {
        return Err(format!("{} is a symbolic link to nothing", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    check_folder(dir).map_err(|e| e.to_string())
}

/// An advisory lock on a state file, held on a hidden `.NAME.lock` beside it for as long
/// as a conversation is saved there: a second pocketchat on the same file finds it taken
/// and saves elsewhere, so two processes never replace each other's conversation.
pub struct StateLock {
    _file: Option<File>,
}

impl StateLock {
    /// Takes the lock for `path`; `None` when another process holds it. Where no lock
    /// file can be made (a read-only folder) there is nothing to protect: no lock, `Some`.
    pub fn try_acquire(path: &Path) -> Option<StateLock> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let lock_path = path.with_file_name(format!(".{name}.lock"));
        let mut options = std::fs::OpenOptions::new();
        options.create(true).truncate(false).write(true);
        #[cfg(unix)]
        {
            // A FIFO in the lock file's place must not block the start.
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NONBLOCK);
        }
        let file = match options.open(&lock_path) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!("no lock file at {}: {e}", lock_path.display());
                return Some(StateLock { _file: None });
            }
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            // Something else sits where the lock goes: this file cannot be claimed.
            tracing::warn!("{} is not a regular file: the state file is treated as taken", lock_path.display());
            return None;
        }
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor we own; released when the file is closed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                return None;
            }
        }
        Some(StateLock { _file: Some(file) })
    }
}

/// Picks a name beside `path` that nothing uses yet: `chat.pcstate` → `chat-2.pcstate`, …
pub fn free_path_beside(path: &Path) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "conversation".into());
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    (2u32..)
        .map(|n| path.with_file_name(format!("{stem}-{n}{ext}")))
        .find(|p| !p.exists() && !p.is_symlink())
        .expect("some name is free")
}

/// Reads a state file into `session` (whose State must come from the same model).
/// On any error `session` is left empty and usable.
pub fn restore(session: &mut Session, model: &ModelIdentity, path: &Path) -> Result<(), StateFileError> {
    let _span = tracing::info_span!("restore", path = %path.display()).entered();
    let result = read_into(session, model, path);
    if result.is_err() {
        session.clear();
    }
    result
}

/// A state file's prefix and header, read and checked.
struct Prefix {
    version: u32,
    header: Header,
    header_len: u64,
    file_len: u64,
}

/// Reads and checks the prefix and the header (at most [`MAX_HEADER_BYTES`]).
fn read_header(f: &mut File, path: &Path) -> Result<Prefix, StateFileError> {
    let meta = f.metadata().map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
    if !meta.is_file() {
        return Err(StateFileError::Unreadable(Cause::msg(format!("{} is not a file", path.display()))));
    }
    let len = meta.len();
    let mut prefix = [0u8; PREFIX_BYTES as usize];
    if len < PREFIX_BYTES {
        f.read_exact(&mut prefix[..len as usize]).map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
        let n = (len as usize).min(MAGIC.len());
        return Err(if n > 0 && prefix[..n] == MAGIC[..n] {
            StateFileError::Damaged("the file is cut short".into())
        } else {
            StateFileError::NotAStateFile
        });
    }
    f.read_exact(&mut prefix).map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
    if &prefix[..8] != MAGIC {
        return Err(StateFileError::NotAStateFile);
    }
    let version = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if version > FORMAT_VERSION {
        return Err(StateFileError::NewerFormat(version));
    }
    let header_len = u32::from_le_bytes(prefix[12..16].try_into().expect("4 bytes")) as u64;
    if header_len > MAX_HEADER_BYTES || PREFIX_BYTES + header_len > len {
        return Err(StateFileError::Damaged("the header is cut short or too long".into()));
    }
    let mut json = vec![0u8; header_len as usize];
    f.read_exact(&mut json).map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
    let header: Header = serde_json::from_slice(&json).map_err(|e| StateFileError::Damaged(e.to_string()))?;
    Ok(Prefix { version, header, header_len, file_len: len })
}

fn check_model(header: &Header, model: &ModelIdentity) -> Result<(), StateFileError> {
    if header.model != *model {
        return Err(StateFileError::OtherModel(format!("sha256 {}…", header.model.sha256.get(..12).unwrap_or(""))));
    }
    Ok(())
}

fn read_into(session: &mut Session, model: &ModelIdentity, path: &Path) -> Result<(), StateFileError> {
    let mut f = open_state_file(path)?;
    let Prefix { version, header, header_len, file_len } = read_header(&mut f, path)?;
    check_model(&header, model)?;
    let (n_kv, hd) = session.state.shape();
    let saved_kv = match header.kv_type.as_deref() {
        None | Some("f16") => KvDtype::F16,
        Some("q8_0") => KvDtype::Q8_0,
        Some(other) => return Err(StateFileError::Damaged(format!("its cache is of an unknown type ({other})"))),
    };
    let shapes = recurrent_shapes(&session.state);
    let saved_shapes = if header.recurrent.is_empty() { vec![Vec::new(); header.n_layers] } else { header.recurrent };
    let dims = session.state.stored_head_dims();
    let saved_dims = if header.kv_head_dims.is_empty() {
        saved_shapes.iter().map(|s| if s.is_empty() { header.head_dim } else { 0 }).collect()
    } else {
        header.kv_head_dims
    };
    if (header.n_layers, header.n_kv_heads, header.head_dim) != (session.state.n_layers(), n_kv, hd)
        || saved_shapes != shapes
        || saved_dims != dims
    {
        return Err(StateFileError::OtherModel("different layer shapes".into()));
    }
    // The layers with K/V in the body (and their head sizes), and each recurrent tensor's
    // shape.
    let kv_layers: Vec<(usize, usize)> = dims.iter().copied().enumerate().filter(|&(_, d)| d > 0).collect();
    let recurrent_tensors: Vec<&Vec<usize>> = shapes.iter().flatten().collect();
    let len = header.session.tokens.len();
    let lengths = &header.recurrent_lengths;
    // A recurrent state is saved now and at each checkpoint (earlier, increasing), or not
    // at all for an empty conversation.
    let lengths_ok = match lengths.split_first() {
        None => recurrent_tensors.is_empty() || len == 0,
        Some((&now, checkpoints)) => {
            !recurrent_tensors.is_empty()
                && now == len
                && checkpoints.len() <= super::state::MAX_CHECKPOINTS
                && checkpoints.iter().all(|&c| c <= len)
                && checkpoints.windows(2).all(|w| w[0] < w[1])
        }
    };
    if !lengths_ok {
        return Err(StateFileError::Damaged("its recurrent state does not match its conversation".into()));
    }
    if len > session.state.max_tokens() {
        return Err(StateFileError::Damaged(format!(
            "{len} tokens do not fit the budget of {}",
            session.state.max_tokens()
        )));
    }
    if kv_layers.iter().any(|&(_, d)| saved_kv.check_head_dim(d).is_err()) {
        return Err(StateFileError::Damaged("q8_0 values of heads that are not whole blocks".into()));
    }
    // Every size is checked against the file's length before the body is read. A sliding
    // layer's positions start at the saved base (checked with the session's bookkeeping).
    let base = header.session.window_base;
    let sliding = session.state.sliding_layers().to_vec();
    if base > len {
        return Err(StateFileError::Damaged("its window starts past its conversation".into()));
    }
    let held = |layer: usize| if sliding[layer] { len - base } else { len };
    let tensor_bytes = |layer: usize, dim: usize| n_kv * held(layer) * saved_kv.row_bytes(dim);
    let kv_bytes: u64 = kv_layers.iter().map(|&(l, d)| 2 * tensor_bytes(l, d) as u64).sum();
    let recurrent_bytes: u64 = recurrent_tensors.iter().map(|s| s.iter().product::<usize>() as u64 * 4).sum();
    let body = kv_bytes + lengths.len() as u64 * recurrent_bytes;
    let trailer = if version >= 2 { 4 } else { 0 };
    let expected_len = PREFIX_BYTES + header_len + body + trailer;
    if file_len != expected_len {
        return Err(StateFileError::Damaged(format!(
            "the file is {file_len} bytes; its header describes {expected_len}"
        )));
    }
    // Two passes, one tensor at a time, so restoring never holds a second copy of the
    // cache: the first checks the checksum and the values without keeping them, the
    // second writes each layer into the cache (and checks the checksum again, in case the
    // file changed in between).
    let kv_saved = if len > 0 { kv_layers.as_slice() } else { &[] };
    let tensors = 2 * kv_saved.len() + lengths.len() * recurrent_tensors.len();
    let unreadable = |e: std::io::Error| StateFileError::Unreadable(Cause::new(e));
    let mut body = Body::open(f, version, header_len, tensors).map_err(unreadable)?;
    // The checksum speaks first: an altered file is "altered", whatever its values.
    let mut values = Ok(());
    for &(layer, dim) in kv_saved {
        let mut chunk = vec![0u8; tensor_bytes(layer, dim)];
        for _ in 0..2 {
            body.next(&mut chunk).map_err(unreadable)?;
            if values.is_ok() {
                values = check_values(&chunk, saved_kv);
            }
        }
    }
    for _ in 0..lengths.len() {
        for shape in &recurrent_tensors {
            let mut chunk = vec![0u8; shape.iter().product::<usize>() * 4];
            body.next(&mut chunk).map_err(unreadable)?;
            if values.is_ok() {
                values = check_f32_values(&chunk);
            }
        }
    }
    body.check_sum()?;
    values?;
    let device = session.state.device().clone();
    // f16 values, or q8_0 rows as bytes: `State::import_layer` converts them to its type.
    let tensor = |chunk: &[u8], layer: usize, dim: usize| -> Result<Tensor, StateFileError> {
        let rows = held(layer);
        let t = match saved_kv {
            KvDtype::Q8_0 => Tensor::from_vec(chunk.to_vec(), (n_kv, rows, saved_kv.row_width(dim)), &Device::Cpu),
            _ => {
                let data: Vec<half::f16> =
                    chunk.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]])).collect();
                Tensor::from_vec(data, (n_kv, rows, dim), &Device::Cpu)
            }
        };
        t.and_then(|t| t.to_device(&device)).map_err(|e| StateFileError::Damaged(e.to_string()))
    };
    session.restore(header.session, |state| {
        let mut body = body.reopen().map_err(unreadable)?;
        for &(layer, dim) in kv_saved {
            // `next` is true for each of the tensors the first pass counted.
            let bytes = tensor_bytes(layer, dim);
            let (mut k_chunk, mut v_chunk) = (vec![0u8; bytes], vec![0u8; bytes]);
            body.next(&mut k_chunk).map_err(unreadable)?;
            body.next(&mut v_chunk).map_err(unreadable)?;
            let (k, v) = (tensor(&k_chunk, layer, dim)?, tensor(&v_chunk, layer, dim)?);
            state.import_layer(layer, &k, &v)?;
        }
        let mut snapshots = Vec::with_capacity(lengths.len());
        for &at in lengths {
            let mut tensors = Vec::with_capacity(recurrent_tensors.len());
            for shape in &recurrent_tensors {
                let mut chunk = vec![0u8; shape.iter().product::<usize>() * 4];
                body.next(&mut chunk).map_err(unreadable)?;
                let data: Vec<f32> =
                    chunk.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                let t = Tensor::from_vec(data, shape.as_slice(), &Device::Cpu)
                    .map_err(|e| StateFileError::Damaged(e.to_string()))?;
                tensors.push(t);
            }
            snapshots.push((at, tensors));
        }
        state.import_recurrent(snapshots)?;
        body.check_sum().map_err(|_| StateFileError::Damaged("it changed while it was read".into()))
    })?;
    Ok(())
}

impl From<super::EngineError> for StateFileError {
    fn from(e: super::EngineError) -> Self {
        StateFileError::Damaged(e.to_string())
    }
}

/// A state file's recurrent values (f32) must all be numbers.
fn check_f32_values(chunk: &[u8]) -> Result<(), StateFileError> {
    if chunk.chunks_exact(4).all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()) {
        Ok(())
    } else {
        Err(StateFileError::Damaged("the recurrent state holds values that are not numbers".into()))
    }
}

/// A state file's values must all be numbers: every f16, or every q8_0 block's scale (its
/// quants are small integers whatever their bytes).
fn check_values(chunk: &[u8], kv: KvDtype) -> Result<(), StateFileError> {
    let scales_or_values = match kv {
        KvDtype::Q8_0 => Q8_0_BYTES,
        _ => 2,
    };
    if chunk.chunks_exact(scales_or_values).all(|b| half::f16::from_le_bytes([b[0], b[1]]).is_finite()) {
        Ok(())
    } else {
        Err(StateFileError::Damaged("the cache holds values that are not numbers".into()))
    }
}

/// A state file read from the start, its K/V tensors one at a time through the CRC-32
/// that covers the header and the body.
struct Body {
    reader: BufReader<File>,
    crc: crc32fast::Hasher,
    version: u32,
    header_len: u64,
    /// Tensors in the body, and how many were read.
    tensors: usize,
    read: usize,
}

impl Body {
    /// Reads the prefix and header (into the checksum) from the start of `file`.
    fn open(file: File, version: u32, header_len: u64, tensors: usize) -> std::io::Result<Body> {
        let mut reader = BufReader::new(file);
        reader.seek(SeekFrom::Start(0))?;
        let mut head = vec![0u8; (PREFIX_BYTES + header_len) as usize];
        reader.read_exact(&mut head)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        Ok(Body { reader, crc, version, header_len, tensors, read: 0 })
    }

    /// The same file, from the start again.
    fn reopen(self) -> std::io::Result<Body> {
        Body::open(self.reader.into_inner(), self.version, self.header_len, self.tensors)
    }

    /// Reads the next tensor into `chunk`; false when every tensor was read.
    fn next(&mut self, chunk: &mut [u8]) -> std::io::Result<bool> {
        if self.read == self.tensors {
            return Ok(false);
        }
        self.reader.read_exact(chunk)?;
        self.crc.update(chunk);
        self.read += 1;
        Ok(true)
    }

    /// Compares the stored checksum (format 2 on) with what was read.
    fn check_sum(&mut self) -> Result<(), StateFileError> {
        if self.version < 2 {
            return Ok(());
        }
        let mut stored = [0u8; 4];
        self.reader.read_exact(&mut stored).map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
        if u32::from_le_bytes(stored) != self.crc.clone().finalize() {
            return Err(StateFileError::Damaged("its checksum does not match: it was altered or corrupted".into()));
        }
        Ok(())
    }
}

/// A writer that keeps a CRC-32 of what passed through it.
struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Checksummed<W> {
    fn new(inner: W) -> Self {
        Checksummed { inner, crc: crc32fast::Hasher::new() }
    }
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
