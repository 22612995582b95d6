//! What dead processes leave in the chats folder, removed when the store is opened:
//! temporary files of saves that never finished (`.ID.pcstate.PID.N.tmp`, `.ID.json.PID.N.tmp`,
//! from a process that is gone) and caches without a record (`ID.pcstate` whose `ID.json`
//! is gone, unless someone holds the chat). Until swept, all of them count in the cap.

use std::io::{self, Read};
use std::path::Path;

use super::lock::process_alive;
use super::{valid_id, ChatStore};

impl ChatStore {
    /// Removes stale temporary files and orphan caches; returns how many files went.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Some(pid) = temp_file_pid(&name) {
                if pid != std::process::id() && !process_alive(pid) && std::fs::remove_file(entry.path()).is_ok() {
                    tracing::info!("removed {name}, left by process {pid} that is gone");
                    removed += 1;
                }
            } else if let Some(id) = cache_owner(&name) {
                removed += self.sweep_orphan(id);
            }
        }
        removed
    }

    /// The caches of `id` when it has no record and no process holds it.
    fn sweep_orphan(&self, id: &str) -> usize {
        if self.record_path(id).exists() || self.holds(id) {
            return 0;
        }
        let Ok(lock) = self.acquire(id) else { return 0 };
        // Checked again under the lock: a record is saved before any cache.
        if self.record_path(id).exists() {
            return 0;
        }
        let removed = self.cache_files(id).iter().filter(|p| std::fs::remove_file(p).is_ok()).count();
        lock.remove();
        if removed > 0 {
            tracing::info!("removed the cache of {id}, whose chat record is gone");
        }
        removed
    }
}

/// The process id in a temporary file's name: `.TARGET.PID.UNIQUE.tmp`.
fn temp_file_pid(name: &str) -> Option<u32> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let mut parts = inner.rsplitn(3, '.');
    let (_unique, pid, target) = (parts.next()?, parts.next()?, parts.next()?);
    (target.ends_with(".pcstate") || target.ends_with(".json")).then_some(())?;
    pid.parse().ok()
}

/// The chat id of a cache file: `ID.pcstate` or `ID.before-eviction.pcstate`.
fn cache_owner(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".pcstate")?;
    let id = stem.strip_suffix(".before-eviction").unwrap_or(stem);
    valid_id(id).then_some(id)
}

/// Whether a file counts in the caches' cap: a cache (also one without a record) or a
/// temporary file of a save.
pub(super) fn counts_as_cache(name: &str) -> bool {
    name.ends_with(".pcstate") || (name.starts_with('.') && name.ends_with(".tmp"))
}

/// Whether the file holds any of `needles`, read in pieces (it may be of any size).
pub(super) fn file_contains_any(path: &Path, needles: &[Vec<u8>]) -> io::Result<bool> {
    let longest = needles.iter().map(Vec::len).max().unwrap_or(0);
    let mut file = crate::files::open_regular(path)?;
    let mut window: Vec<u8> = Vec::new();
    let mut piece = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut piece)?;
        if n == 0 {
            return Ok(false);
        }
        window.extend_from_slice(&piece[..n]);
        if needles.iter().any(|needle| !needle.is_empty() && window.windows(needle.len()).any(|w| w == &needle[..])) {
            return Ok(true);
        }
        // Keep what a needle may still span.
        let keep = longest.saturating_sub(1).min(window.len());
        window.drain(..window.len() - keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_and_cache_names_are_told_apart() {
        assert_eq!(temp_file_pid(".18c-1.pcstate.4242.1f3a0.tmp"), Some(4242));
        assert_eq!(temp_file_pid(".18c-1.json.77.ab1.tmp"), Some(77));
        assert_eq!(temp_file_pid(".notes.txt.77.ab1.tmp"), None);
        assert_eq!(temp_file_pid("18c-1.pcstate"), None);
        assert_eq!(cache_owner("18c-1.pcstate"), Some("18c-1"));
        assert_eq!(cache_owner("18c-1.before-eviction.pcstate"), Some("18c-1"));
        assert_eq!(cache_owner(".18c-1.pcstate.lock"), None);
        assert_eq!(cache_owner("a.b.pcstate"), None);
    }

    #[test]
    fn a_needle_across_two_pieces_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        let mut bytes = vec![b'a'; (1 << 20) - 3];
        bytes.extend_from_slice(b"\"needle\"");
        std::fs::write(&path, &bytes).unwrap();
        assert!(file_contains_any(&path, &[b"\"needle\"".to_vec()]).unwrap());
        assert!(!file_contains_any(&path, &[b"\"other\"".to_vec()]).unwrap());
    }
}
