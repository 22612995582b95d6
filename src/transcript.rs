//! A conversation's messages as the user sees them and the chat template reads them: who
//! spoke, and what. Shared by the engine (which renders and feeds them), the chat store
//! (which saves them) and the UI, so it sits below all three.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// The text (of a reply: its answer, without the thinking).
    pub content: String,
    /// What a thinking model wrote in `<think>…</think>` before the answer (replies
    /// only; records from before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into(), thinking: None }
    }

    /// The same message with `thinking` (see [`Message::thinking`]).
    pub fn with_thinking(mut self, thinking: Option<String>) -> Message {
        self.thinking = thinking;
        self
    }
}
