//! Files, read and written safely.
//!
//! Reading: a file may be hostile. A FIFO blocks an `open` for reading until a writer
//! comes (forever, at a start), a device such as `/dev/zero` never ends. Everything the
//! app reads back from disk (saved conversations, chat records) goes through
//! [`open_regular`], which never blocks and refuses anything that is not a regular file.
//!
//! Writing: a crash leaves the old file or the new one, never half of one. A file is
//! written to a uniquely named [`TempFile`] beside it, synced and renamed over it
//! ([`write_atomically`]); the temp file is removed if anything fails before the rename.
//! Downloads use their own resumable `.part` files (`catalog::PartFile`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Opens `path` for reading only once it is known to be a regular file: the open itself
/// does not block (`O_NONBLOCK`, so a FIFO without a writer opens at once), and the
/// descriptor is checked with `fstat` before it is used. Anything else is an
/// [`io::ErrorKind::InvalidInput`] error naming what it is.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = open_nonblocking(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    clear_nonblocking(&file)?;
    Ok(file)
}

/// The error for a path that is not a regular file: "PATH is a FIFO, not a regular file".
pub fn not_regular(path: &Path, meta: &std::fs::Metadata) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{} is {}, not a regular file", path.display(), kind_of(meta)))
}

/// What a file is, in words: "a folder", "a FIFO", "a device", …
pub fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        return "a regular file";
    }
    if t.is_dir() {
        return "a folder";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Reads on a regular file never block; the flag is cleared all the same so that the
/// descriptor behaves as an ordinary one wherever it is passed.
#[cfg(unix)]
fn clear_nonblocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(unix))]
fn clear_nonblocking(_: &File) -> io::Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.pcstate");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        let err = open_regular(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("x.pcstate is a FIFO"), "{err}");

        let err = open_regular(Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("/dev/null is a device"), "{err}");
        let err = open_regular(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is a folder"), "{err}");

        let file = dir.path().join("ok");
        std::fs::write(&file, b"abc").unwrap();
        let mut s = String::new();
        open_regular(&file).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "abc");
        assert_eq!(open_regular(&dir.path().join("missing")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one, never
/// half of one: a temp file beside it, synced, then renamed over it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = folder_of(path);
    let tmp = TempFile::new(&dir, path);
    let mut f = File::create_new(tmp.path())?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp.path(), path)?;
    tmp.keep();
    Ok(())
}

/// The folder a file is in (`.` for a bare name).
pub fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A uniquely named hidden temp file in `dir` for `target` (`.NAME.PID.UNIQUE.tmp`),
/// removed when dropped unless [`TempFile::keep`] was called (after it was renamed into
/// place).
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn new(dir: &Path, target: &Path) -> TempFile {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let unique = format!("{}.{nanos:x}{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        TempFile(dir.join(format!(".{name}.{unique}.tmp")))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The file was renamed into place: nothing to remove.
    pub fn keep(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// sha256 of a file as lowercase hex.
pub fn sha256_file(path: impl AsRef<Path>) -> io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The user's home folder (`HOME`, or `USERPROFILE` on Windows); `None` when neither is
/// set to something.
pub fn home_dir() -> Option<PathBuf> {
    ["HOME", "USERPROFILE"].iter().find_map(|v| std::env::var_os(v).filter(|h| !h.is_empty())).map(PathBuf::from)
}
