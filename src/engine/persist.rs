//! Saving a conversation's [`Session`] (token ids, turns, text and the K/V cache as f16)
//! so it survives the app being killed, and restoring it without re-prefill.
//!
//! ```text
//!   "PCSTATE\0" | u32 version | u32 header length | JSON header | per layer: K f16, V f16
//! ```
//!
//! The header names the model file (sha256 and size) and the policy budget the state was
//! made under. A file from another model, a truncated file, a newer version or garbage is
//! refused with a [`StateFileError`] and the caller starts a fresh conversation.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::session::{Session, SessionSnapshot};

const MAGIC: &[u8; 8] = b"PCSTATE\0";
pub const FORMAT_VERSION: u32 = 1;

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
    #[error("could not write the conversation: {0}")]
    Io(String),
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
    budget: usize,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    session: SessionSnapshot,
}

/// Writes `session` to `path` atomically (a `.part` file renamed into place).
pub fn save(session: &Session, model: &ModelIdentity, path: &Path) -> Result<u64, StateFileError> {
    let _span = tracing::info_span!("save", path = %path.display()).entered();
    let io = |e: std::io::Error| StateFileError::Io(e.to_string());
    let kv = session.state.export().map_err(|e| StateFileError::Io(e.to_string()))?;
    let (n_kv_heads, head_dim) = session.state.shape();
    let header = Header {
        model: model.clone(),
        budget: session.state.max_tokens(),
        n_layers: session.state.n_layers(),
        n_kv_heads,
        head_dim,
        session: session.snapshot(),
    };
    let json = serde_json::to_vec(&header).map_err(|e| StateFileError::Io(e.to_string()))?;
    let part = path.with_extension("part");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&part).map_err(io)?);
    f.write_all(MAGIC).map_err(io)?;
    f.write_all(&FORMAT_VERSION.to_le_bytes()).map_err(io)?;
    f.write_all(&(json.len() as u32).to_le_bytes()).map_err(io)?;
    f.write_all(&json).map_err(io)?;
    for (k, v) in kv {
        for t in [k, v] {
            let data: Vec<half::f16> = t
                .to_dtype(DType::F16)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .map_err(|e| StateFileError::Io(e.to_string()))?;
            let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            f.write_all(&bytes).map_err(io)?;
        }
    }
    f.into_inner().map_err(|e| StateFileError::Io(e.to_string()))?.sync_all().map_err(io)?;
    std::fs::rename(&part, path).map_err(io)?;
    Ok(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
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

fn read_into(session: &mut Session, model: &ModelIdentity, path: &Path) -> Result<(), StateFileError> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StateFileError::Missing(path.to_path_buf()),
        _ => StateFileError::Io(e.to_string()),
    })?;
    let mut r = bytes.as_slice();
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| StateFileError::NotAStateFile)?;
    if &magic != MAGIC {
        return Err(StateFileError::NotAStateFile);
    }
    let version = read_u32(&mut r)?;
    if version > FORMAT_VERSION {
        return Err(StateFileError::NewerFormat(version));
    }
    let header_len = read_u32(&mut r)? as usize;
    if r.len() < header_len {
        return Err(StateFileError::Damaged("the header is cut short".into()));
    }
    let header: Header =
        serde_json::from_slice(&r[..header_len]).map_err(|e| StateFileError::Damaged(e.to_string()))?;
    r = &r[header_len..];
    if header.model != *model {
        return Err(StateFileError::OtherModel(format!("sha256 {}…", &header.model.sha256.get(..12).unwrap_or(""))));
    }
    let (n_kv, hd) = session.state.shape();
    if (header.n_layers, header.n_kv_heads, header.head_dim) != (session.state.n_layers(), n_kv, hd) {
        return Err(StateFileError::OtherModel("different layer shapes".into()));
    }
    let len = header.session.tokens.len();
    if len > session.state.max_tokens() {
        return Err(StateFileError::Damaged(format!(
            "{len} tokens do not fit the budget of {}",
            session.state.max_tokens()
        )));
    }
    let per_tensor = n_kv * len * hd * 2;
    let expected = 2 * header.n_layers * per_tensor;
    if r.len() != expected {
        return Err(StateFileError::Damaged(format!("{} bytes of cache data, expected {expected}", r.len())));
    }
    let device = session.state.device().clone();
    let mut kv = Vec::with_capacity(header.n_layers);
    let tensor = |chunk: &[u8]| -> Result<Tensor, StateFileError> {
        let data: Vec<half::f16> = chunk.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]])).collect();
        Tensor::from_vec(data, (n_kv, len, hd), &Device::Cpu)
            .and_then(|t| t.to_device(&device))
            .map_err(|e| StateFileError::Damaged(e.to_string()))
    };
    if len > 0 {
        for layer in r.chunks_exact(2 * per_tensor) {
            kv.push((tensor(&layer[..per_tensor])?, tensor(&layer[per_tensor..])?));
        }
    }
    session.restore(header.session, kv).map_err(|e| StateFileError::Damaged(e.to_string()))
}

fn read_u32(r: &mut &[u8]) -> Result<u32, StateFileError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(|_| StateFileError::Damaged("the file is cut short".into()))?;
    Ok(u32::from_le_bytes(b))
}
