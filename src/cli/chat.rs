//! The app and `pocketchat chat`, the terminal chat.

use anyhow::{bail, Result};
use clap::Args;
use pocketchat::engine::{Command, DoneReason, Engine, EngineEvent, EngineEvents};
use pocketchat::memory;
use std::io::{BufRead, IsTerminal};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::args::EngineArgs;
use super::ctrl_c::{on_sigint, CTRL_C};
use crate::cli_output::printable;

#[derive(Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Print each turn's figures (tokens, memory, speed)
    #[arg(long)]
    pub(crate) stats: bool,
    /// Send a memory warning at the first token of every Nth reply
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) simulate_warning_every: Option<u32>,
    /// Kill the process when its footprint passes BYTES (a jetsam stand-in)
    #[arg(long, value_name = "BYTES")]
    pub(crate) jetsam_ceiling: Option<u64>,
    /// Continue the saved chat of this name, or start one (the app's chat list)
    #[arg(long, value_name = "NAME", conflicts_with = "session")]
    pub(crate) chat: Option<String>,
    /// Let a thinking model (Qwen3, Qwen3.5, SmolLM3) think before it answers: its
    /// template's `enable_thinking` (with --chat, saved with the chat) [default: the
    /// model's own]. The thinking goes to stderr, the answer to stdout
    #[arg(long, overrides_with = "no_think")]
    pub(crate) think: bool,
    /// Answer without thinking first (`enable_thinking` false)
    #[arg(long, overrides_with = "think")]
    pub(crate) no_think: bool,
}

impl ChatArgs {
    /// The thinking switch asked for on the command line (`None`: as it is).
    fn thinking(&self) -> Option<bool> {
        match (self.think, self.no_think) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[cfg(feature = "ui")]
pub(crate) fn app(args: &EngineArgs) -> Result<()> {
    let mut config = args.config(true)?;
    if config.threads.is_none() {
        config.threads = pocketchat::ui::app::threads_beside_the_window();
    }
    // The chats survive the app being closed or killed (`--session FILE` keeps one
    // conversation in FILE instead).
    if config.state_file.is_none() {
        config.chats = Some(args.chat_store()?);
    }
    pocketchat::ui::launch(config);
    Ok(())
}

#[cfg(not(feature = "ui"))]
pub(crate) fn app(_args: &EngineArgs) -> Result<()> {
    bail!("this build has no UI (built without the `desktop` or `mobile` feature); try `pocketchat chat`")
}

/// `pocketchat chat`: the engine thread is shut down and waited for on every way out
/// (the input's end, an error, a closed output), so its last save is finished and no
/// temporary file is left.
pub(crate) fn chat(args: &ChatArgs) -> Result<()> {
    let mut config = args.engine.config(false)?;
    if let Some(name) = &args.chat {
        let store = args.engine.chat_store()?;
        // Found by its whole name (else made), and locked for this process: a chat open in
        // another pocketchat is refused here, naming that process.
        let id = store.open_named(name)?.id;
        config.chats = Some(store);
        config.open_chat = Some(id);
    }
    let (handle, mut events, thread) = Engine::start(config);
    let result = converse(args, &handle, &mut events);
    thread.shutdown();
    result
}

/// The terminal chat itself, on a started engine.
pub(crate) fn converse(
    args: &ChatArgs,
    handle: &pocketchat::engine::EngineHandle,
    events: &mut EngineEvents,
) -> Result<()> {
    let show_stats = args.stats;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    {
        let handle = handle.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(50));
            if CTRL_C.swap(false, Ordering::SeqCst) && handle.send(Command::Stop).is_err() {
                break;
            }
        });
    }
    let warn_handle = handle.clone();
    let _monitor = memory::MemoryMonitor::start(move |reason| {
        let _ = warn_handle.send(Command::MemoryWarning { reason });
    });

    // Wait for the model (and a restored conversation, which comes before the first Stats).
    let mut has_switch = false;
    loop {
        match events.recv_blocking() {
            Some(EngineEvent::Ready(info)) => {
                eprintln!("[{} · {} · {}]", info.name, info.weights_quant, info.device);
                has_switch = info.thinking.is_some();
            }
            Some(EngineEvent::Policy { report, policy }) => {
                eprintln!(
                    "[{}: {} weights · {} tokens, {} · {:.1} GiB ceiling]",
                    report.effective().label(),
                    policy.quant.label(),
                    policy.token_budget,
                    policy.why(),
                    policy.ceiling_bytes as f64 / memory::GIB as f64
                );
            }
            Some(EngineEvent::Restored { messages, tokens }) => {
                eprintln!(
                    "[restored a conversation of {} messages, {tokens} tokens, without re-prefill]",
                    messages.len()
                );
            }
            Some(EngineEvent::ChatOpened { title, messages, tokens, resumed, .. }) if !messages.is_empty() => {
                let how =
                    if resumed { "its cache restored without re-prefill" } else { "re-read at the first message" };
                eprintln!("[chat “{}”: {} messages, {tokens} tokens, {how}]", printable(&title), messages.len());
            }
            Some(EngineEvent::Notice { message }) => eprintln!("[{}]", printable(&message)),
            Some(EngineEvent::Stats(_)) => break,
            Some(EngineEvent::Failed { error }) => bail!("{error}"),
            Some(_) => {}
            None => bail!("the engine stopped"),
        }
    }
    if let Some(enabled) = args.thinking() {
        if !has_switch {
            eprintln!("[this model's template has no thinking switch: --think/--no-think change nothing]");
        }
        handle.send(Command::SetThinking { enabled: Some(enabled) })?;
    }
    if let Some(ceiling) = args.jetsam_ceiling {
        start_jetsam_watchdog(ceiling);
    }
    let warn_every = args.simulate_warning_every.map(|n| n as usize);
    let mut turn = 0usize;
    let interactive = std::io::stdin().is_terminal();
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    loop {
        if interactive {
            eprint!("> ");
        }
        bytes.clear();
        if stdin.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        let line = match String::from_utf8(bytes.clone()) {
            Ok(line) => line,
            Err(_) => {
                eprintln!("[that line was not valid UTF-8: the bad bytes were replaced with \u{FFFD}]");
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let line = line.strip_suffix('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).unwrap_or(&line).to_string();
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/warn" {
            handle.send(Command::MemoryWarning { reason: "simulated from the terminal".into() })?;
        } else {
            handle.send(Command::Send { text: line })?;
        }
        // Print events until this command has been answered: a reply ends with Done (or
        // Failed), an eviction with Evicted; the Stats that follow close the turn.
        let mut answered = false;
        let mut first_token = true;
        let mut thinking = false;
        loop {
            let Some(event) = events.recv_blocking() else { bail!("the engine stopped") };
            match event {
                EngineEvent::Thinking { text } => {
                    if !thinking {
                        eprint!("[thinking: ");
                        thinking = true;
                    }
                    eprint!("{}", printable(&text));
                }
                EngineEvent::Token { text } => {
                    if std::mem::take(&mut thinking) {
                        eprintln!("]");
                    }
                    if first_token && warn_every.is_some_and(|n| (turn + 1).is_multiple_of(n)) {
                        handle.send(Command::MemoryWarning {
                            reason: "simulated mid-reply (--simulate-warning-every)".into(),
                        })?;
                    }
                    first_token = false;
                    out!("{text}");
                }
                EngineEvent::Done { reason } => {
                    if std::mem::take(&mut thinking) {
                        eprintln!("]");
                    }
                    outln!();
                    if reason != DoneReason::EndOfTurn {
                        eprintln!("[reply ended: {reason:?}]");
                    }
                    answered = true;
                }
                EngineEvent::Trimmed { dropped_tokens, kept_tokens } => {
                    eprintln!("[context trimmed: {dropped_tokens} tokens dropped, {kept_tokens} kept]")
                }
                EngineEvent::Evicted { reason, before_tokens, after_tokens, freed_bytes } => {
                    eprintln!(
                        "[memory warning ({reason}): context {before_tokens} → {after_tokens} tokens, {:.1} MB freed]",
                        freed_bytes as f64 / 1e6
                    );
                    answered = true;
                }
                EngineEvent::Notice { message } => eprintln!("[{}]", printable(&message)),
                EngineEvent::Saved { bytes, ms, .. } if show_stats => {
                    eprintln!("[saved {bytes} B in {ms:.0} ms]")
                }
                EngineEvent::Failed { error } => {
                    eprintln!("[error: {error}]");
                    answered = true;
                }
                EngineEvent::Stats(s) if answered => {
                    turn += 1;
                    if show_stats {
                        eprintln!(
                            "[turn {turn}] generated {} · thinking {} · context {}/{} tokens · kv {} B · rss {} B · footprint {} B · peak_rss {} B · predicted {} B · mapped {} B · ttft {:.0} ms · prefill {} tok in {:.0} ms · decode {:.1} tok/s",
                            s.generated_tokens,
                            s.thinking_tokens,
                            s.context_tokens,
                            s.budget,
                            s.kv_bytes,
                            s.rss_bytes,
                            memory::process::footprint_bytes().unwrap_or(0),
                            memory::process::peak_rss_bytes().unwrap_or(0),
                            s.predicted_footprint_bytes,
                            s.mapped_weights_bytes,
                            s.ttft_ms,
                            s.prefill_tokens,
                            s.prefill_ms,
                            s.decode_tok_s
                        );
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A stand-in for iOS jetsam on machines without it: kills the process the moment its
/// footprint (anonymous resident memory, what jetsam counts) passes `ceiling` bytes.
pub(crate) fn start_jetsam_watchdog(ceiling: u64) {
    std::thread::spawn(move || loop {
        if let Some(f) = memory::process::footprint_bytes() {
            if f > ceiling {
                eprintln!("[jetsam] footprint {f} B passed the ceiling of {ceiling} B: killed");
                // SAFETY: raising a signal on our own process.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    });
}
