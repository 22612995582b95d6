//! The UI's link to the engine: [`send_command`] for the components, and the bridge
//! coroutine ([`bridge`]) that owns the [`EngineHandle`], forwards the UI's [`Command`]s
//! and folds the engine's event stream into the one `Signal<ChatState>` — the only place
//! that state changes. The engine thread never touches a signal: events cross threads
//! over the engine's `futures` channel, are batched to the frame rate by
//! [`super::pacer`], and each batch is applied here, on the UI executor, in one write.
//! Components send commands with [`send_command`], which finds the coroutine in the
//! context; rendered without one (server-side rendering in tests) it does nothing.

use std::time::{Duration, Instant};

use dioxus::prelude::*;
use futures::stream::Fuse;
use futures::{FutureExt, StreamExt};

use crate::engine::{Command, Engine, EngineConfig, EngineError, EngineEvent, EngineHandle};

use super::clock::now_label;
use super::meter::{LiveFigures, ReplyMeter};
use super::pacer;
use super::qa::QaHook;
use super::state::{ChatState, Phase};
use super::{lifecycle, monitor};

/// Sends a command to the engine through the bridge coroutine (no-op without one).
pub fn send_command(command: Command) {
    if let Some(bridge) = try_consume_context::<Coroutine<Command>>() {
        bridge.send(command);
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
pub(super) async fn bridge(
    config: EngineConfig,
    frame: Duration,
    mut commands: UnboundedReceiver<Command>,
    mut state: Signal<ChatState>,
    mut live: Signal<Option<LiveFigures>>,
    qa: Option<QaHook>,
) {
    // The engine keeps a copy from before each eviction next to the state file (each
    // chat's, with a chat store).
    state.write().restore_available = config.state_file.is_some() || config.chats.is_some();
    let (engine, events) = Engine::spawn(config);
    let mut link = EngineLink { handle: engine.clone(), events: Some(pacer::pace(events, frame).fuse()) };
    let mut meter = ReplyMeter::default();
    let mut live_at = Instant::now();
    let Some(events) = link.events.as_mut() else { return };
    let mut monitor = monitor::start(engine.clone(), None);
    let _lifecycle = lifecycle::save_when_backgrounded(engine.clone());
    if let Some(qa) = &qa {
        qa.watch_controls();
        qa.report_state(&state.peek());
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
                if matches!(command, Command::Send { .. } | Command::Regenerate | Command::EditLast { .. } | Command::EditMessage { .. }) {
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
                    qa.report_state(&state.peek());
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
