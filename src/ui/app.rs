//! The root of the app and the bridge to the engine.
//!
//! [`launch`] opens the window (desktop) or the app's webview (iOS). The root component
//! [`App`] spawns the engine inside a `use_coroutine`: the coroutine owns the
//! [`EngineHandle`], forwards the UI's [`Command`]s from its channel, and folds the
//! engine's event stream into the one `Signal<ChatState>` — the only place that state
//! changes. The engine thread never touches a signal: events cross threads over the
//! engine's `futures` channel, are batched to the frame rate by [`super::pacer`], and
//! each batch is applied here, on the UI executor, in one write. Components read narrow
//! memos of the state, so a batch of tokens re-renders the streaming reply and nothing
//! else; the settings panel's live figures ([`LiveFigures`]) change a few times a second.
//!
//! Components send commands with [`send_command`], which finds the coroutine in the
//! context; rendered without one (server-side rendering in tests) it does nothing.

use std::time::{Duration, Instant};

use dioxus::prelude::*;
use futures::stream::Fuse;
use futures::{FutureExt, StreamExt};

use crate::catalog;
use crate::engine::{Command, Engine, EngineConfig, EngineError, EngineEvent, EngineHandle};

use super::chat::ChatView;
use super::chat_list::ChatList;
use super::chat_transfer::ChatFolder;
use super::clock::now_label;
use super::meter::{LiveFigures, ReplyMeter};
use super::models::{models_bridge, ModelAction, ModelsPanel, ModelsView};
use super::pacer;
use super::qa::QaHook;
use super::settings::SettingsPanel;
use super::state::{ChatState, Phase};
use super::{lifecycle, monitor};

/// The stylesheet, compiled in so the app needs no asset pipeline (`cargo run` works).
pub const STYLE: &str = include_str!("../../assets/style.css");

/// The page script: keeps the message list pinned to the bottom while the reader is at
/// the bottom (a MutationObserver, so streaming tokens scroll too) and provides
/// `pcCopy(text)` for the copy buttons.
pub const PAGE_SCRIPT: &str = include_str!("../../assets/page.js");

/// Window title.
pub const TITLE: &str = "pocketchat";

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
    #[cfg(all(feature = "desktop", target_os = "linux"))]
    paint_on_the_cpu_without_a_gpu();
    #[cfg(feature = "desktop")]
    let builder = dioxus::LaunchBuilder::desktop().with_cfg(desktop_config());
    #[cfg(all(feature = "mobile", not(feature = "desktop")))]
    let builder = dioxus::LaunchBuilder::mobile().with_cfg(mobile_config());
    #[cfg(any(feature = "desktop", feature = "mobile"))]
    builder.with_context(LaunchConfig(config)).launch(App);
    #[cfg(not(any(feature = "desktop", feature = "mobile")))]
    {
        let _ = LaunchConfig(config);
        tracing::error!("this build has no renderer: enable the `desktop` or `mobile` feature");
    }
}

/// WebKitGTK composites the page with OpenGL. Without a GPU (no `/dev/dri` render node:
/// a VM, a remote desktop, Xvfb) that OpenGL is Mesa's llvmpipe on the CPU, which
/// re-composites the whole window at every change: while a reply streamed it took more
/// than one of two cores and halved the engine's speed. WebKit's own CPU painting
/// repaints only what changed. A value the user set is kept.
#[cfg(all(feature = "desktop", target_os = "linux"))]
fn paint_on_the_cpu_without_a_gpu() {
    const VAR: &str = "WEBKIT_DISABLE_COMPOSITING_MODE";
    let has_render_node = std::fs::read_dir("/dev/dri")
        .map(|dir| dir.flatten().any(|e| e.file_name().to_string_lossy().starts_with("renderD")))
        .unwrap_or(false);
    if std::env::var_os(VAR).is_none() && !has_render_node {
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

/// Sends a command to the engine through the bridge coroutine (no-op without one).
pub fn send_command(command: Command) {
    if let Some(bridge) = try_consume_context::<Coroutine<Command>>() {
        bridge.send(command);
    }
}

/// The root component: state, bridge, layout.
#[component]
pub fn App() -> Element {
    let config = use_hook(|| consume_context::<LaunchConfig>().0);
    let state = use_signal(ChatState::new);
    let live = use_context_provider(|| Signal::new(None::<LiveFigures>));
    let qa: Option<QaHook> = use_context_provider(QaHook::from_env);
    let models = use_context_provider(|| Signal::new(ModelsView::default()));
    use_context_provider(|| ChatFolder(config.chats.clone()));
    let engine = {
        let (config, qa) = (config.clone(), qa.clone());
        use_coroutine(move |commands: UnboundedReceiver<Command>| {
            bridge(config.clone(), commands, state, live, qa.clone())
        })
    };
    use_coroutine(move |actions: UnboundedReceiver<ModelAction>| {
        models_bridge(actions, catalog::models_dir(), models, state, engine, qa.clone())
    });
    rsx! {
        Shell { state, settings_open: SETTINGS_OPEN_AT_START }
    }
}

/// How long closing the window waits for the engine to save and stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// The bridge's end of the engine: its handle and its event stream. Dropping it (the
/// window closed, the virtual DOM went away) sends `Shutdown` — the engine saves the
/// conversation first when a state file is configured — and waits up to
/// [`SHUTDOWN_WAIT`] for the engine to finish, so the save is not cut off by the exit.
struct EngineLink {
    handle: EngineHandle,
    events: Option<Fuse<Batches>>,
}

/// The engine's events, in frame-paced batches (see [`pacer::pace`]).
type Batches = futures::channel::mpsc::UnboundedReceiver<Vec<EngineEvent>>;

/// How often the settings panel's live figures change during a reply.
const LIVE_FIGURES_EVERY: Duration = Duration::from_millis(250);

impl Drop for EngineLink {
    fn drop(&mut self) {
        if self.handle.send(Command::Shutdown).is_err() {
            return; // already gone
        }
        let Some(mut events) = self.events.take() else { return };
        let (done, finished) = std::sync::mpsc::channel();
        let drained = std::thread::Builder::new().name("engine-shutdown".into()).spawn(move || {
            while futures::executor::block_on(events.next()).is_some() {}
            let _ = done.send(());
        });
        if drained.is_ok() && finished.recv_timeout(SHUTDOWN_WAIT).is_err() {
            tracing::warn!("the engine did not stop within {SHUTDOWN_WAIT:?}; closing anyway");
        }
    }
}

/// The bridge: spawns the engine, forwards commands, folds events into `state`.
async fn bridge(
    config: EngineConfig,
    mut commands: UnboundedReceiver<Command>,
    mut state: Signal<ChatState>,
    mut live: Signal<Option<LiveFigures>>,
    qa: Option<QaHook>,
) {
    // The engine keeps a copy from before each eviction next to the state file (each
    // chat's, with a chat store).
    state.write().restore_available = config.state_file.is_some() || config.chats.is_some();
    let (engine, events) = Engine::spawn(config);
    let mut link = EngineLink { handle: engine.clone(), events: Some(pacer::pace(events, pacer::frame()).fuse()) };
    let mut meter = ReplyMeter::default();
    let mut live_at = Instant::now();
    let Some(events) = link.events.as_mut() else { return };
    let mut monitor = monitor::start(engine.clone(), None);
    let _lifecycle = lifecycle::save_when_backgrounded(engine.clone());
    if let Some(qa) = &qa {
        qa.report_status(state.peek().qa_status());
    }
    loop {
        futures::select! {
            command = commands.next() => {
                let Some(command) = command else { break };
                if let Command::Send { text } = &command {
                    if !state.write().submit(text, &now_label()) {
                        continue;
                    }
                }
                if matches!(command, Command::Send { .. } | Command::Regenerate | Command::EditLast { .. }) {
                    meter.sent(Instant::now());
                    if let Some(qa) = &qa {
                        qa.watch_first_paint();
                    }
                }
                if let Err(error) = engine.send(command) {
                    state.write().apply_at(EngineEvent::Failed { error }, &now_label());
                }
            }
            batch = events.next() => {
                let gone = batch.is_none();
                // Fold every batch already waiting in one write: one re-render at most per
                // frame, fewer when the UI falls behind.
                let mut batch = batch.unwrap_or_default();
                while let Some(Some(more)) = events.next().now_or_never() {
                    batch.extend(more);
                }
                let relayout = batch.iter().any(|e| {
                    matches!(
                        e,
                        EngineEvent::Ready(_)
                            | EngineEvent::Done { .. }
                            | EngineEvent::ConversationReset
                            | EngineEvent::Chats { .. }
                            | EngineEvent::ChatOpened { .. }
                    )
                });
                // Watch against the ceiling of the policy in force.
                let ceiling = batch.iter().rev().find_map(|e| match e {
                    EngineEvent::Policy { policy, .. } => Some(policy.ceiling_bytes),
                    _ => None,
                });
                if let Some(ceiling) = ceiling.filter(|c| Some(*c) != monitor.ceiling_bytes()) {
                    drop(monitor);
                    monitor = monitor::start(engine.clone(), Some(ceiling));
                }
                let shown_at = Instant::now();
                let finished = meter.shown(&batch, shown_at);
                {
                    let now = now_label();
                    let mut s = state.write();
                    for event in batch {
                        s.apply_at(event, &now);
                    }
                    if gone && !matches!(s.phase, Phase::Failed(_)) {
                        s.apply_at(EngineEvent::Failed { error: EngineError::EngineGone }, &now);
                    }
                }
                refresh_live_figures(&mut live, &mut live_at, shown_at, &state.peek(), &meter);
                if let Some(qa) = &qa {
                    if let Some(timing) = finished {
                        qa.report_reply(timing);
                        qa.watch_last_paint();
                    }
                    qa.report_status(state.peek().qa_status());
                    if relayout {
                        qa.remeasure();
                    }
                }
                if gone {
                    break;
                }
            }
        }
    }
}

/// Updates the settings panel's live figures at most every [`LIVE_FIGURES_EVERY`] while a
/// reply streams, and clears them when it ends.
fn refresh_live_figures(
    live: &mut Signal<Option<LiveFigures>>,
    last: &mut Instant,
    now: Instant,
    state: &ChatState,
    meter: &ReplyMeter,
) {
    let streaming = state.current_reply().is_some();
    let shown = live.peek().is_some();
    if !streaming {
        if shown {
            live.set(None);
        }
    } else if !shown || now - *last >= LIVE_FIGURES_EVERY {
        *last = now;
        let context_tokens = state.live_context_tokens();
        live.set(Some(LiveFigures { context_tokens, reply_tok_s: meter.rate() }));
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
            Phase::Starting => ("status-loading", "Starting…".to_string()),
            Phase::Loading { progress, .. } => ("status-loading", format!("Loading {:.0}%", progress * 100.0)),
            Phase::Ready if s.generating() => ("status-busy", "Writing…".to_string()),
            Phase::Ready => {
                ("status-ready", s.model.as_ref().map(|m| m.name.clone()).unwrap_or_else(|| "Ready".into()))
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
                    h1 { "pocketchat" }
                }
                span { class: "status-chip {status_class}", title: "{status_text}", "{status_text}" }
                div { class: "topbar-actions",
                    if has_chats() {
                        button { class: "btn ghost chats-toggle", r#type: "button", id: "chats-toggle",
                            aria_pressed: "{chats_open()}",
                            onclick: move |_| chats_open.toggle(),
                            "Chats"
                        }
                    }
                    button { class: "btn ghost", r#type: "button", id: "new-chat",
                        disabled: !ready,
                        onclick: move |_| send_command(Command::NewConversation),
                        onmounted: move |e: MountedEvent| super::qa::track("new_chat", e.data()),
                        "New chat"
                    }
                    button { class: "btn ghost", r#type: "button", id: "models-toggle",
                        aria_pressed: "{models_open()}",
                        onclick: move |_| {
                            models_open.toggle();
                            open.set(false);
                        },
                        onmounted: move |e: MountedEvent| super::qa::track("models_toggle", e.data()),
                        "Models"
                    }
                    button { class: "btn ghost", r#type: "button", id: "settings-toggle",
                        aria_pressed: "{open()}",
                        onclick: move |_| {
                            open.toggle();
                            models_open.set(false);
                        },
                        onmounted: move |e: MountedEvent| super::qa::track("settings_toggle", e.data()),
                        "Settings"
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
