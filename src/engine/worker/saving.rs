//! The conversation's state file: locked for this process, restored at launch, saved
//! after each reply, and never replaced when it holds something that is not ours.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{Loaded, Worker};
use crate::engine::persist::{self, ModelIdentity, StateFileError};
use crate::engine::{Cause, EngineEvent};

impl Loaded {
    fn identity(&mut self) -> Result<ModelIdentity, StateFileError> {
        if self.identity.is_none() {
            let path = self.model.path();
            let sha256 = crate::files::sha256_file(path).map_err(|e| StateFileError::Unreadable(Cause::new(e)))?;
            self.identity = Some(ModelIdentity { sha256, bytes: self.info.file_bytes });
        }
        Ok(self.identity.clone().expect("set above"))
    }
}

impl Worker {
    /// Saves the conversation to the configured state file, if any, and the open chat's
    /// record when there is a chat store.
    pub(super) fn save(&mut self) {
        if let Some(path) = self.config.state_file.clone() {
            self.save_to(&path);
        }
        self.save_record();
    }

    pub(super) fn save_to(&mut self, path: &Path) {
        let Some(l) = self.loaded.as_mut() else { return };
        let started = Instant::now();
        let result = l.identity().and_then(|id| persist::save(&l.session, &id, path));
        match result {
            Ok(bytes) => self.emit(EngineEvent::Saved {
                path: path.display().to_string(),
                bytes,
                ms: started.elapsed().as_secs_f64() * 1e3,
            }),
            // A refusal names the file already; other errors get its name here.
            Err(e @ StateFileError::WontOverwrite { .. }) => {
                self.emit(EngineEvent::Notice { message: format!("The conversation could not be saved: {e}") })
            }
            Err(e) => self.emit(EngineEvent::Notice {
                message: format!("The conversation could not be saved to {}: {e}", path.display()),
            }),
        }
    }

    /// Loads a saved conversation (announced with `Restored`); on an error the
    /// conversation is a fresh one and the caller says why.
    pub(super) fn restore_from(&mut self, path: &Path) -> Result<(), StateFileError> {
        self.restore_session(path)?;
        let tokens = self.loaded.as_ref().map_or(0, |l| l.session.state.len());
        self.emit(EngineEvent::Restored { messages: self.transcript(), tokens });
        Ok(())
    }

    /// Loads a saved conversation's cache into the session, without telling anyone.
    pub(super) fn restore_session(&mut self, path: &Path) -> Result<(), StateFileError> {
        let Some(l) = self.loaded.as_mut() else { return Ok(()) };
        l.identity().and_then(|id| persist::restore(&mut l.session, &id, path))
    }

    /// Locks `path` for this process; when another pocketchat holds it, this conversation
    /// is saved under a free name beside it instead, and the user is told.
    pub(super) fn lock_state_file(&mut self, path: &Path) {
        // A FIFO, a device (`/dev/null`) or a path in a missing folder: nothing is opened
        // there and nothing is written beside it.
        if let Err(why) = persist::check_state_path(path) {
            self.config.state_file = None;
            self.emit(EngineEvent::Notice { message: format!("{why}: this conversation will not be saved.") });
            return;
        }
        let mut candidate = path.to_path_buf();
        for _ in 0..100 {
            if let Some(lock) = persist::StateLock::try_acquire(&candidate) {
                self.state_lock = Some(lock);
                if candidate != path {
                    self.emit(EngineEvent::Notice {
                        message: format!(
                            "{} is in use by another pocketchat; this conversation will be saved to {}.",
                            path.display(),
                            candidate.display()
                        ),
                    });
                    self.config.state_file = Some(candidate);
                }
                return;
            }
            candidate = persist::free_path_beside(&candidate);
        }
    }

    /// Restores the configured state file; when it holds something that must be kept
    /// (not a state file, another model's, a newer format's, a damaged one), it is left
    /// as it is and this conversation is saved under a free name beside it.
    pub(super) fn restore_or_save_beside(&mut self, path: &Path) {
        let Err(e) = self.restore_from(path) else { return };
        let message = if let StateFileError::NotRegular(why) = &e {
            self.config.state_file = None;
            self.state_lock = None;
            format!("{why}: this conversation will not be saved.")
        } else if e.keeps_the_file() {
            let beside = persist::free_path_beside(path);
            let message = format!(
                "{e}. {} was left as it is; this conversation will be saved to {}.",
                path.display(),
                beside.display()
            );
            self.config.state_file = Some(beside.clone());
            self.lock_state_file(&beside);
            message
        } else {
            format!("{e}. Starting a fresh conversation.")
        };
        self.emit(EngineEvent::Notice { message });
    }
}

/// Where the conversation is kept just before a memory-warning eviction.
pub(super) fn before_eviction_path(state_file: &Path) -> PathBuf {
    state_file.with_extension("before-eviction.pcstate")
}
