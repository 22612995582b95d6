//! The root of the app.
//!
//! [`launch`] opens the window (desktop) or the app's webview (iOS). The root component
//! [`App`] provides the state and starts the engine's bridge coroutine
//! ([`super::engine_link`]) and the model screen's; [`Shell`] lays out the top bar, the
//! chat and the settings panel. Components read narrow memos of the state, so a batch of
//! tokens re-renders the streaming reply and nothing else; the settings panel's live
//! figures ([`LiveFigures`]) change a few times a second.

use dioxus::prelude::*;

use crate::catalog;
use crate::engine::{Command, EngineConfig};

use super::chat::ChatView;
use super::chat_list::ChatList;
use super::chat_transfer::ChatFolder;
use super::config::UiConfig;
use super::copy;
use super::engine_link::{bridge, send_command};
use super::meter::LiveFigures;
use super::models::{models_bridge, ModelAction, ModelsPanel, ModelsView};
use super::qa::QaHook;
use super::settings::SettingsPanel;
use super::state::{ChatState, Phase};

/// The stylesheet, compiled in so the app needs no asset pipeline (`cargo run` works).
pub const STYLE: &str = include_str!("../../assets/style.css");

/// The page script: keeps the message list pinned to the bottom while the reader is at
/// the bottom (a MutationObserver, so streaming tokens scroll too) and provides
/// `pcCopy(text)` for the copy buttons.
pub const PAGE_SCRIPT: &str = include_str!("../../assets/page.js");

/// Window title.
pub const TITLE: &str = copy::APP_NAME;

/// Whether the settings panel starts open: yes on desktops, no on phones.
pub const SETTINGS_OPEN_AT_START: bool = cfg!(not(any(target_os = "ios", target_os = "android")));

/// Compute threads for the app when none is configured (`--threads`,
/// `POCKETCHAT_THREADS`; the settings panel changes it while the app runs). `None` is
/// every available core (the performance cores on Apple devices).
///
/// Chosen by measuring how fast replies reach the screen with the window open
/// (docs/performance.md, "How fast the window streams"): on the 2-core Linux machine, both
/// cores (median 0.67 of the terminal's decode rate, first token 1.27x) beat one (0.63,
/// 2.1x), because the pool backs off a worker by itself while the web view holds a core. On macOS and iOS
/// this is not measured yet; all performance cores is the same choice.
pub fn threads_beside_the_window() -> Option<usize> {
    None
}

/// The engine configuration handed to the root component.
#[derive(Clone)]
struct LaunchConfig(EngineConfig);

/// The page the webview loads: viewport with safe-area support, the stylesheet and the
/// page script inlined.
pub fn index_html() -> String {
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{TITLE}</title>
<meta name="viewport" content="width=device-width, initial-scale=1, maximum-scale=1, user-scalable=no, viewport-fit=cover">
<meta name="color-scheme" content="light dark">
<style>
{STYLE}
</style>
<script>
{PAGE_SCRIPT}
</script>
</head>
<body>
<div id="main"></div>
</body>
</html>
"#
    )
}

/// Starts the app with the given engine configuration; returns when the window closes.
///
/// The renderer comes from the crate's features: `desktop` opens a native window
/// (macOS, Linux/X11, Windows), `mobile` runs inside the iOS app shell that `dx` builds.
/// With `ui` alone (no renderer) it logs an error and returns.
pub fn launch(mut config: EngineConfig) {
    // Files copied to an iPhone with Finder arrive in Documents; models live elsewhere.
    catalog::import_documents_on_ios();
    config.model_path = resolve_model_path(config.model_path);
    let ui = UiConfig::from_env();
    #[cfg(all(feature = "desktop", target_os = "linux"))]
    paint_on_the_cpu_without_a_gpu(&ui);
    #[cfg(feature = "desktop")]
    let builder = dioxus::LaunchBuilder::desktop().with_cfg(desktop_config());
    #[cfg(all(feature = "mobile", not(feature = "desktop")))]
    let builder = dioxus::LaunchBuilder::mobile().with_cfg(mobile_config());
    #[cfg(any(feature = "desktop", feature = "mobile"))]
    builder.with_context(LaunchConfig(config)).with_context(ui).launch(App);
    #[cfg(not(any(feature = "desktop", feature = "mobile")))]
    {
        let _ = (LaunchConfig(config), ui);
        tracing::error!("this build has no renderer: enable the `desktop` or `mobile` feature");
    }
}

/// WebKitGTK composites the page with OpenGL. Without a GPU (no `/dev/dri` render node:
/// a VM, a remote desktop, Xvfb) that OpenGL is Mesa's llvmpipe on the CPU, which
/// re-composites the whole window at every change: while a reply streamed it took more
/// than one of two cores and halved the engine's speed. WebKit's own CPU painting
/// repaints only what changed. A value the user set is kept.
#[cfg(all(feature = "desktop", target_os = "linux"))]
fn paint_on_the_cpu_without_a_gpu(ui: &UiConfig) {
    const VAR: &str = "WEBKIT_DISABLE_COMPOSITING_MODE";
    let has_render_node = std::fs::read_dir("/dev/dri")
        .map(|dir| dir.flatten().any(|e| e.file_name().to_string_lossy().starts_with("renderD")))
        .unwrap_or(false);
    if !ui.compositing_chosen && !has_render_node {
        tracing::info!("no GPU render node: the web view paints on the CPU ({VAR}=1)");
        // Called before the web view and any other thread start.
        std::env::set_var(VAR, "1");
    }
}

/// On iOS a relative model path names a file in the models folder (files the user copied
/// into Documents are moved there first, see `catalog::import_documents`); elsewhere
/// paths are kept as given.
pub fn resolve_model_path(path: std::path::PathBuf) -> std::path::PathBuf {
    if cfg!(target_os = "ios") && path.is_relative() && !path.exists() {
        if let Some(name) = path.file_name() {
            return crate::catalog::models_dir().join(name);
        }
    }
    path
}

#[cfg(feature = "desktop")]
pub fn desktop_config() -> dioxus::desktop::Config {
    use dioxus::desktop::{Config, LogicalSize, WindowBuilder};
    let window = WindowBuilder::new()
        .with_title(TITLE)
        .with_inner_size(LogicalSize::new(1120.0, 760.0))
        .with_min_inner_size(LogicalSize::new(360.0, 520.0))
        .with_always_on_top(false);
    #[allow(unused_mut)]
    let mut config = Config::new().with_window(window).with_custom_index(index_html());
    // The default menu bar is a macOS convention (it also gives Cmd+C/V); on Linux and
    // Windows it would only push the page down.
    #[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "android")))]
    {
        config = config.with_menu(Option::<dioxus::desktop::muda::Menu>::None);
    }
    config
}

#[cfg(all(feature = "mobile", not(feature = "desktop")))]
fn mobile_config() -> dioxus::mobile::Config {
    dioxus::mobile::Config::new().with_custom_index(index_html())
}

/// The root component: state, bridge, layout.
#[component]
pub fn App() -> Element {
    let config = use_hook(|| consume_context::<LaunchConfig>().0);
    let state = use_signal(ChatState::new);
    let live = use_context_provider(|| Signal::new(None::<LiveFigures>));
    let ui = use_hook(|| try_consume_context::<UiConfig>().unwrap_or_default());
    let qa: Option<QaHook> = use_hook(|| ui.qa_status.clone().and_then(QaHook::open));
    let models = use_context_provider(|| Signal::new(ModelsView::default()));
    use_context_provider(|| ChatFolder(config.chats.clone()));
    let engine = {
        let (config, qa) = (config.clone(), qa.clone());
        use_coroutine(move |commands: UnboundedReceiver<Command>| {
            bridge(config.clone(), ui.frame, commands, state, live, qa.clone())
        })
    };
    use_coroutine(move |actions: UnboundedReceiver<ModelAction>| {
        models_bridge(actions, catalog::models_dir(), models, state, engine, qa.clone())
    });
    rsx! {
        Shell { state, settings_open: SETTINGS_OPEN_AT_START }
    }
}

/// The app's layout: top bar, chat, settings panel. Rendered by [`App`] with the live
/// state, and by tests with a fixed one.
#[component]
pub fn Shell(state: ReadSignal<ChatState>, settings_open: bool) -> Element {
    let mut open = use_signal(|| settings_open);
    // The model screen replaces the settings panel while it is open.
    let mut models_open = use_signal(|| false);
    let fallback_models = use_signal(ModelsView::default);
    let models = try_use_context::<Signal<ModelsView>>().unwrap_or(fallback_models);
    // The chat list's drawer on narrow windows (wide ones always show the column).
    let mut chats_open = use_signal(|| false);
    let has_chats = use_memo(move || state.read().active_chat.is_some());
    let ready = use_memo(move || state.read().is_ready());
    let status = use_memo(move || {
        let s = state.read();
        match &s.phase {
            Phase::Starting => ("status-loading", copy::STATUS_STARTING.to_string()),
            Phase::Loading { progress, .. } => ("status-loading", copy::status_loading(*progress)),
            Phase::Ready if s.generating() => ("status-busy", copy::STATUS_WRITING.to_string()),
            Phase::Ready => {
                ("status-ready", s.model.as_ref().map(|m| m.name.clone()).unwrap_or_else(|| copy::STATUS_READY.into()))
            }
            Phase::Failed(f) => ("status-failed", f.title.clone()),
        }
    });
    let (status_class, status_text) = status();
    let ready = ready();
    rsx! {
        div { class: format!(
                "app{}{}",
                if open() || models_open() { " settings-open" } else { "" },
                if chats_open() { " chats-open" } else { "" }
            ),
            header { class: "topbar",
                div { class: "brand",
                    span { class: "brand-mark", aria_hidden: "true" }
                    h1 { {copy::APP_NAME} }
                }
                span { class: "status-chip {status_class}", title: "{status_text}", "{status_text}" }
                div { class: "topbar-actions",
                    if has_chats() {
                        button { class: "btn ghost chats-toggle", r#type: "button", id: "chats-toggle",
                            aria_pressed: "{chats_open()}",
                            onclick: move |_| chats_open.toggle(),
                            {copy::CHATS}
                        }
                    }
                    button { class: "btn ghost", r#type: "button", id: "new-chat",
                        disabled: !ready,
                        onclick: move |_| send_command(Command::NewConversation),
                        "data-qa": "new_chat",
                        {copy::NEW_CHAT}
                    }
                    button { class: "btn ghost", r#type: "button", id: "models-toggle",
                        aria_pressed: "{models_open()}",
                        onclick: move |_| {
                            models_open.toggle();
                            open.set(false);
                        },
                        "data-qa": "models_toggle",
                        {copy::MODELS}
                    }
                    button { class: "btn ghost", r#type: "button", id: "settings-toggle",
                        aria_pressed: "{open()}",
                        onclick: move |_| {
                            open.toggle();
                            models_open.set(false);
                        },
                        "data-qa": "settings_toggle",
                        {copy::SETTINGS}
                    }
                }
            }
            div { class: "layout",
                if has_chats() {
                    if chats_open() {
                        div { class: "drawer-backdrop", onclick: move |_| chats_open.set(false) }
                    }
                    ChatList { state, on_pick: move |_| chats_open.set(false) }
                }
                ChatView { state }
                if models_open() {
                    ModelsPanel { state, models, on_close: move |_| models_open.set(false) }
                } else if open() {
                    SettingsPanel { state, on_close: move |_| open.set(false) }
                }
            }
        }
    }
}
