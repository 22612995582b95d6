//! Inline notices in the transcript (context trimmed, memory evicted, engine notes,
//! failed turns) and the full-width cards for loading and load failures.

use dioxus::prelude::*;

use crate::engine::Command;

use super::copy;
use super::engine_link::send_command;
use super::state::{LoadFailure, Notice, NoticeKind};

/// One inline notice between messages.
#[component]
pub fn NoticeView(notice: Notice) -> Element {
    let icon = match notice.kind {
        NoticeKind::Trimmed { .. } => "✂",
        NoticeKind::Evicted { .. } => "⚠",
        NoticeKind::Info => "ℹ",
        NoticeKind::Error => "✕",
    };
    let role = if matches!(notice.kind, NoticeKind::Error | NoticeKind::Evicted { .. }) { "alert" } else { "status" };
    rsx! {
        div { class: "notice {notice.class()}", role,
            span { class: "notice-icon", aria_hidden: "true", "{icon}" }
            div { class: "notice-body",
                div { class: "notice-text", "{notice.text}" }
                if let Some(detail) = &notice.detail {
                    div { class: "notice-detail", "{detail}" }
                }
                if notice.restorable {
                    button { class: "btn secondary restore", r#type: "button",
                        title: copy::RESTORE_TITLE,
                        onclick: move |_| send_command(Command::RestoreEvicted),
                        {copy::RESTORE}
                    }
                }
            }
            if !notice.time.is_empty() {
                time { class: "notice-time", "{notice.time}" }
            }
        }
    }
}

/// Model loading, with a progress bar.
#[component]
pub fn LoadingCard(progress: f32, message: String) -> Element {
    let pct = (progress.clamp(0.0, 1.0) * 100.0).round();
    rsx! {
        div { class: "card loading-card", role: "status",
            div { class: "card-title", {copy::LOADING_MODEL} }
            div { class: "progress", role: "progressbar", aria_valuenow: "{pct}", aria_valuemin: "0", aria_valuemax: "100",
                div { class: "progress-fill", style: "width: {pct}%" }
            }
            div { class: "card-detail",
                span { "{message}" }
                span { class: "progress-pct", "{pct}%" }
            }
        }
    }
}

/// The model could not be used: what happened and what to do.
#[component]
pub fn LoadFailureCard(failure: LoadFailure) -> Element {
    rsx! {
        div { class: if failure.missing { "card error-card model-missing" } else { "card error-card load-failed" },
            role: "alert",
            div { class: "card-title", "{failure.title}" }
            if failure.missing {
                p { {copy::MODEL_MISSING_WHY} }
            }
            if let Some(command) = &failure.command {
                pre { class: "command", code { "{command}" } }
                p { class: "card-detail",
                    {copy::MODEL_MISSING_THEN}
                }
            }
            p { class: "engine-message", "{failure.message}" }
        }
    }
}
