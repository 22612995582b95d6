//! The model screen: the catalog and the files in the models folder, each with its fit
//! on this device (fits / tight / too large, and the token budget it would get), whether
//! it is downloaded, and its actions — *Download* with a progress bar and *Cancel*
//! (resumed later from its `.part`), *Delete*, and *Use*, which switches the engine to it
//! while the app runs. A field at the top downloads any GGUF by its URL.
//!
//! - [`list`]: the screen's state as plain data, read from the disk;
//! - [`bridge`]: the coroutine that changes it (downloads, deletes, switches).

pub mod bridge;
pub mod list;

use dioxus::prelude::*;

pub use bridge::{models_bridge, send_model_action, ModelAction};
pub use list::{ModelItem, ModelsView, Origin, Transfer};

use super::copy;
use super::state::ChatState;

#[component]
pub fn ModelsPanel(
    state: ReadSignal<ChatState>,
    models: ReadSignal<ModelsView>,
    on_close: EventHandler<()>,
) -> Element {
    let loaded_path = use_memo(move || state.read().model.as_ref().map(|m| m.path.clone()));
    let busy = use_memo(move || !state.read().is_ready() || state.read().generating());
    let mut url = use_signal(String::new);
    use_hook(|| send_model_action(ModelAction::Refresh));
    let view = models.read();
    let loaded = loaded_path();
    rsx! {
        div { class: "sheet-backdrop", onclick: move |_| on_close.call(()) }
        aside { class: "settings models-panel", aria_label: copy::MODELS,
            div { class: "sheet-handle", aria_hidden: "true" }
            header { class: "settings-head",
                h2 { {copy::MODELS} }
                button { class: "btn ghost close", r#type: "button", onclick: move |_| on_close.call(()), {copy::DONE} }
            }
            div { class: "settings-scroll",
                section { class: "panel-section",
                    h3 { {copy::ADD_BY_URL} }
                    div { class: "add-url",
                        input { class: "url-field", id: "model-url", r#type: "url",
                            placeholder: copy::MODEL_URL_PLACEHOLDER,
                            // Not bound to `url`: writing the value back at each keystroke
                            // lost fast typing.
                            oninput: move |e: FormEvent| url.set(e.value()),
                            onkeydown: move |e: KeyboardEvent| {
                                if e.key() == Key::Enter {
                                    add_url(url);
                                }
                            },
                            "data-qa": "model_url",
                        }
                        button { class: "btn secondary", r#type: "button", id: "model-add",
                            disabled: url.read().trim().is_empty(),
                            onclick: move |_| add_url(url),
                            "data-qa": "model_add",
                            {copy::DOWNLOAD}
                        }
                    }
                    if let Some(notice) = &view.notice {
                        p { class: "hint models-notice", role: "status", "{notice}" }
                    }
                }
                ul { class: "model-items",
                    for item in view.items.iter().cloned() {
                        ModelRowView {
                            key: "{item.key}",
                            in_use: loaded.as_deref().is_some_and(|p| bridge::same_file(std::path::Path::new(p), &item.path)),
                            transfer: view.transfers.get(&item.key).cloned(),
                            busy: busy(),
                            item,
                        }
                    }
                }
            }
        }
    }
}

/// Starts downloading the URL in the field, and empties it.
fn add_url(mut url: Signal<String>) {
    let text = url.peek().trim().to_string();
    if !text.is_empty() {
        send_model_action(ModelAction::AddUrl { url: text });
        url.set(String::new());
        document::eval("document.getElementById('model-url').value = ''");
    }
}

#[component]
fn ModelRowView(item: ModelItem, in_use: bool, transfer: Option<Transfer>, busy: bool) -> Element {
    let mut confirm_delete = use_signal(|| false);
    let key = item.key.clone();
    let fit_class = item.fit.replace(' ', "-");
    let budget = if item.fits { copy::model_budget(item.budget, item.budget_why) } else { item.budget_why.to_string() };
    let runs = item.not_yet.is_none();
    let running = matches!(transfer, Some(Transfer::Running(_)));
    rsx! {
        li { class: if in_use { "panel-section model-item in-use" } else { "panel-section model-item" }, "data-model": "{key}",
            div { class: "model-head",
                span { class: "model-name", "{item.name}" }
                if item.fit != "unknown" {
                    span { class: "fit-chip fit-{fit_class}", title: "{budget}", "{item.fit}" }
                }
            }
            p { class: "hint model-detail", "{item.detail}" }
            if item.tier_pick {
                p { class: "hint tier-pick", {copy::TIER_PICK} }
            }
            if runs && item.fit != "unknown" {
                p { class: "hint", "{budget}" }
            }
            if let Some(why) = &item.not_yet {
                p { class: "hint not-yet", {copy::not_supported_yet(why)} }
            }
            match &transfer {
                Some(Transfer::Running(p)) => rsx! {
                    div { class: "meter download", "data-figure": "download",
                        div { class: "meter-top",
                            span { class: "figure-label", if p.verifying { {copy::VERIFYING} } else { {copy::DOWNLOADING} } }
                            span { class: "figure-value", "{list::progress_words(p)}" }
                        }
                        div { class: "bar", role: "progressbar",
                            aria_valuenow: "{p.fraction().unwrap_or(0.0) * 100.0:.0}", aria_valuemin: "0", aria_valuemax: "100",
                            div { class: "bar-fill", style: "width: {p.fraction().unwrap_or(0.0) * 100.0:.1}%" }
                        }
                    }
                },
                Some(Transfer::Failed(e)) => rsx! { p { class: "last-error", role: "alert", "{e}" } },
                None => rsx! {},
            }
            div { class: "model-actions",
                if in_use {
                    span { class: "in-use-label", {copy::IN_USE} }
                } else if item.downloaded && runs {
                    button { class: "btn primary small", r#type: "button",
                        disabled: busy,
                        onclick: {
                            let key = key.clone();
                            let force = !item.fits;
                            move |_| send_model_action(ModelAction::Use { key: key.clone(), allow_too_large: force })
                        },
                        "data-qa": "model_use:{key}",
                        if item.fits { {copy::USE} } else { {copy::USE_ANYWAY} }
                    }
                }
                if running {
                    button { class: "btn secondary small", r#type: "button",
                        onclick: {
                            let key = key.clone();
                            move |_| send_model_action(ModelAction::Cancel { key: key.clone() })
                        },
                        {copy::CANCEL}
                    }
                } else if !item.downloaded && runs {
                    if let Origin::Url(_) = item.origin {
                        button { class: "btn secondary small", r#type: "button",
                            onclick: {
                                let key = key.clone();
                                move |_| send_model_action(ModelAction::Download { key: key.clone() })
                            },
                            if item.partial { {copy::RESUME} } else { {copy::DOWNLOAD} }
                        }
                    }
                    if let Origin::Elsewhere(how) = &item.origin {
                        span { class: "hint", "{how}" }
                    }
                }
                if (item.downloaded || item.partial) && !in_use && !running {
                    button { class: "btn ghost small danger-text", r#type: "button",
                        onclick: {
                            let key = key.clone();
                            move |_| {
                                if confirm_delete() {
                                    send_model_action(ModelAction::Delete { key: key.clone() });
                                    confirm_delete.set(false);
                                } else {
                                    confirm_delete.set(true);
                                }
                            }
                        },
                        if confirm_delete() { {copy::DELETE_FOR_GOOD_ASK} } else { {copy::DELETE} }
                    }
                }
            }
        }
    }
}
