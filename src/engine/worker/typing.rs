//! Reading the message ahead while it is typed: the composer's drafts are fed while the
//! engine has nothing else to do, their whole words at once and, when typing pauses, all
//! of the message with the reply's header ([`Session::draft`](crate::engine::Session::draft)).
//! A long draft goes in steps, and a command that arrives meanwhile goes first.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::Worker;
use crate::engine::budget::reply_reserve;
use crate::engine::{Command, DraftExtent, DraftFed};

/// No new draft for this long means typing has paused: the whole message is fed, so a
/// Send of it right after has nothing left to prefill.
pub const TYPING_PAUSE: Duration = Duration::from_millis(300);

/// The message being typed, while it is read ahead.
pub(super) struct Typing {
    text: String,
    /// Steps of this extent are left to feed (at once, unless a command comes first);
    /// `None`: its words are fed, and the whole message goes once typing pauses.
    stepping: Option<DraftExtent>,
}

impl Worker {
    /// The next command to handle; `None` when the handles are gone. While a message is
    /// being typed, the rest of its draft is fed first, and a pause feeds all of it.
    pub(super) fn next_command(&mut self) -> Option<Command> {
        if let Some(command) = self.deferred.pop_front() {
            return Some(command);
        }
        loop {
            let Some(typing) = &self.typing else { return self.commands.recv().ok() };
            let wait = if typing.stepping.is_some() { Duration::ZERO } else { TYPING_PAUSE };
            match self.commands.recv_timeout(wait) {
                Ok(command) => return Some(command),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    let Some(Typing { text, stepping }) = self.typing.take() else { continue };
                    self.read_ahead(text, stepping.unwrap_or(DraftExtent::Whole));
                }
            }
        }
    }

    /// A draft from the composer. Skipped when newer commands wait: a newer draft
    /// replaces it, anything else goes first.
    pub(super) fn draft(&mut self, mut text: String) {
        while let Ok(command) = self.commands.try_recv() {
            self.deferred.push_back(command);
        }
        while let Some(Command::Draft { .. }) = self.deferred.front() {
            if let Some(Command::Draft { text: newer }) = self.deferred.pop_front() {
                text = newer;
            }
        }
        if self.deferred.is_empty() {
            self.read_ahead(text, DraftExtent::Words);
        }
    }

    /// Feeds one step of `text`'s draft as far as `extent` says, and notes what is left.
    fn read_ahead(&mut self, text: String, extent: DraftExtent) {
        self.typing = match self.feed_draft(&text, extent) {
            Some(DraftFed { left, .. }) if left > 0 => Some(Typing { text, stepping: Some(extent) }),
            Some(_) if extent == DraftExtent::Words && !text.trim().is_empty() => Some(Typing { text, stepping: None }),
            _ => None,
        };
    }

    /// One step of the draft; `None` when there is none (no model, or it failed).
    fn feed_draft(&mut self, typed: &str, extent: DraftExtent) -> Option<DraftFed> {
        let budget = self.budget();
        let reserve = reply_reserve(budget, self.config.max_tokens);
        let l = self.loaded.as_mut()?;
        l.session.set_budget(budget);
        match l.session.draft(&l.model, &l.tokenizer, typed, extent, reserve) {
            Ok(fed) => Some(fed),
            Err(e) => {
                // Send feeds the message again and reports what is wrong with it.
                tracing::debug!("the draft was not fed: {e}");
                l.session.discard_draft();
                None
            }
        }
    }
}
