//! One writer per chat: an exclusive `flock` on a hidden `.ID.pcstate.lock` beside the
//! chat's cache (the same file older versions lock), held for as long as a process has the
//! chat open. The holder writes its process id into the file so another process can say
//! who holds it.
//!
//! A lock file is removed only by its holder, while it still holds it ([`ChatLock::remove`]).
//! A process that opened the file just before it went finds, once it holds the lock, that
//! the name no longer leads to the file it locked, and tries again: two holders of one
//! chat are never possible, also across a removal.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// A held chat lock; released when dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub struct ChatLock {
    file: File,
    path: PathBuf,
}

/// Why a lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it; its process id when it wrote one.
    Held {
        pid: Option<u32>,
    },
    Io(io::Error),
}

impl ChatLock {
    /// Takes the lock at `path` without waiting.
    pub fn try_acquire(path: &Path) -> Result<ChatLock, LockError> {
        // Each retry follows a removal by the holder; a handful is plenty.
        for _ in 0..16 {
            let file = open_lock_file(path, true).map_err(LockError::Io)?;
            if !flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(LockError::Io)? {
                return Err(LockError::Held { pid: read_pid(path) });
            }
            if !still_named(&file, path) {
                continue;
            }
            let mut lock = ChatLock { file, path: path.to_path_buf() };
            lock.write_pid();
            return Ok(lock);
        }
        Err(LockError::Io(io::Error::other(format!("{} kept being replaced", path.display()))))
    }

    fn write_pid(&mut self) {
        // Best effort: the lock holds without it, the message is only less precise.
        let _ = self.file.set_len(0);
        let _ = self.file.write_all(std::process::id().to_string().as_bytes());
        let _ = self.file.flush();
    }

    /// Removes the lock file, while still holding it (a chat being deleted, an orphan
    /// cache swept).
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The folder's lock (`.chats.lock`, never removed), waited for: held only for as long
/// as it takes to find a chat by name or make it.
pub fn lock_folder(path: &Path) -> io::Result<File> {
    let file = open_lock_file(path, false)?;
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own; released when the file is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::new(e.kind(), format!("the lock {} could not be taken: {e}", path.display())));
        }
    }
}

/// `flock` without waiting: Ok(false) when another open file holds it.
fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether `path` still names the file that was locked (not removed or replaced since).
fn still_named(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Opens (or makes) a lock file without blocking on a FIFO put in its place, and only if
/// it is a regular file.
fn open_lock_file(path: &Path, read: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Said with the path before the open (which a FIFO without a reader fails with
    // ENXIO); the check after it covers a swap in between.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.is_file() {
            return Err(crate::files::not_regular(path, &meta));
        }
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(read)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(crate::files::not_regular(path, &meta));
    }
    Ok(file)
}

/// The process id a holder wrote into the lock file.
fn read_pid(path: &Path) -> Option<u32> {
    let mut text = String::new();
    crate::files::open_regular(path).ok()?.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Whether process `pid` is running (on this machine, in this PID namespace).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    unsafe { libc::kill(pid, 0) == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_is_told_the_holder_and_a_removed_lock_is_taken_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".x.pcstate.lock");
        let first = ChatLock::try_acquire(&path).unwrap();
        match ChatLock::try_acquire(&path) {
            Err(LockError::Held { pid }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("taken twice: {other:?}"),
        }
        first.remove();
        assert!(!path.exists());
        let again = ChatLock::try_acquire(&path).unwrap();
        assert!(matches!(ChatLock::try_acquire(&path), Err(LockError::Held { .. })));
        drop(again);
        assert!(path.exists(), "only the holder's remove takes the file away");
        ChatLock::try_acquire(&path).unwrap();
    }

    #[test]
    fn this_process_is_alive_and_pid_zero_is_not_a_process() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
    }
}
