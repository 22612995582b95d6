//! Reading the message ahead while it is typed: the composer's drafts are fed while the
//! engine has nothing else to do, their whole words at once and, when typing pauses, all
//! of the message with the reply's header ([`Session::draft`](crate::engine::Session::draft)).

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::Worker;
use crate::engine::budget::reply_reserve;
use crate::engine::{Command, DraftExtent};

/// No new draft for this long means typing has paused: the whole message is fed, so a
/// Send of it right after has nothing left to prefill.
pub const TYPING_PAUSE: Duration = Duration::from_millis(300);

impl Worker {
    /// The next command to handle; `None` when the handles are gone. While a message is
    /// being typed, a pause in its drafts first feeds the whole of it.
    pub(super) fn next_command(&mut self) -> Option<Command> {
        if let Some(command) = self.deferred.pop_front() {
            return Some(command);
        }
        loop {
            let Some(typed) = self.typing.as_ref() else { return self.commands.recv().ok() };
            match self.commands.recv_timeout(TYPING_PAUSE) {
                Ok(command) => return Some(command),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    let typed = typed.clone();
                    self.typing = None;
                    self.feed_draft(&typed, DraftExtent::Whole);
                }
            }
        }
    }

    /// Feeds the message being typed ahead of its Send. Skipped when newer commands
    /// wait: a newer draft replaces it, anything else goes first.
    pub(super) fn draft(&mut self, mut text: String) {
        while let Ok(command) = self.commands.try_recv() {
            self.deferred.push_back(command);
        }
        while let Some(Command::Draft { .. }) = self.deferred.front() {
            if let Some(Command::Draft { text: newer }) = self.deferred.pop_front() {
                text = newer;
            }
        }
        if self.deferred.is_empty() && self.feed_draft(&text, DraftExtent::Words) {
            self.typing = Some(text);
        }
    }

    /// Feeds `typed` as far as `extent` says; returns whether there is a draft now.
    fn feed_draft(&mut self, typed: &str, extent: DraftExtent) -> bool {
        let budget = self.budget();
        let reserve = reply_reserve(budget, self.config.max_tokens);
        let Some(l) = self.loaded.as_mut() else { return false };
        l.session.set_budget(budget);
        match l.session.draft(&l.model, &l.tokenizer, typed, extent, reserve) {
            Ok(_) => !typed.trim().is_empty(),
            Err(e) => {
                // Send feeds the message again and reports what is wrong with it.
                tracing::debug!("the draft was not fed: {e}");
                l.session.discard_draft();
                false
            }
        }
    }
}
