//! End to end: the real desktop app on the default model, under Xvfb, driven the way a
//! person drives it — xdotool clicks into the composer, types a prompt and presses Enter,
//! clicks **Simulate memory warning** while the reply streams, then sends a second
//! prompt; then starts a second chat, chats there, clicks the first chat in the chat list
//! and goes on with it. It passes only when every reply finished, the eviction notice was
//! shown and the first chat came back from its cache with its messages, as the app itself
//! reports in its QA status file (`POCKETCHAT_QA_STATUS`). Screenshots of the screen go
//! to `target/e2e/`.
//!
//! Needs `xvfb-run`, `xdotool`, `xwd` and ImageMagick's `convert`. Without `xvfb-run`
//! the test prints a loud SKIPPED banner and returns (under `CI=true` it fails); anything
//! else missing fails it.
//! The model is `models/SmolLM2-135M-Instruct.Q4_1.gguf` (or `POCKETCHAT_MODEL`).

#![cfg(feature = "desktop")]

/// The app writes its QA status only when built with the `qa` feature: without it this
/// test could not see what the window showed, so it says how to run it instead of passing.
#[cfg(not(feature = "qa"))]
#[test]
fn the_end_to_end_test_needs_the_qa_feature() {
    panic!("run the end-to-end test with `--features desktop,qa` (scripts/e2e.sh does)");
}

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "common/http_server.rs"]
#[allow(dead_code)]
mod http_server;

/// Every eviction notice starts so ("… earlier messages were forgotten", or "… the reply
/// was stopped; there was nothing older to forget" when the context had nothing to drop).
const EVICTED_PREFIX: &str = "Memory limit reached";
const FIRST_PROMPT: &str = "Write a long story about a lighthouse keeper and a storm.";
const SECOND_PROMPT: &str = "Say hello in one short sentence.";
const OTHER_CHAT_PROMPT: &str = "Name a color.";
const THIRD_PROMPT: &str = "Thank you. Say goodbye in one short sentence.";

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Prints a loud SKIPPED banner; under `CI=true` (where .ci/run installs xvfb) it fails
/// instead, so that a green CI means the window was tested.
fn skip_loudly(why: &str) {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "app_e2e cannot run under CI=true: {why}");
    let bar = "!".repeat(78);
    eprintln!("\n{bar}\n!! SKIPPED app_e2e: {why}\n!! The end-to-end app test did NOT run. Install xvfb (xvfb-run) to run it.\n{bar}\n");
}

/// `target/e2e/`, next to the binary under test (`target/<profile>/pocketchat`).
fn out_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_pocketchat"));
    let target = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("e2e");
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Kills what it holds when the test ends, passing or not.
struct Cleanup {
    children: Vec<(&'static str, Child)>,
    keep_file: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // The app first; then Xvfb, by letting xvfb-run's command end (removing the keep
        // file), so xvfb-run stops its X server itself. Killing xvfb-run instead would
        // leave the server running.
        for (name, child) in self.children.iter_mut().rev() {
            if *name == "xvfb-run" {
                if let Some(keep) = self.keep_file.take() {
                    let _ = fs::remove_file(keep);
                }
                let start = Instant::now();
                while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
            }
            let _ = child.wait();
            eprintln!("e2e: stopped {name}");
        }
    }
}

struct Screen {
    display: String,
    xauthority: String,
}

impl Screen {
    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .env("DISPLAY", &self.display)
            .env("XAUTHORITY", &self.xauthority)
            .output()
            .unwrap_or_else(|e| panic!("could not run {program}: {e}"));
        assert!(out.status.success(), "{program} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Saves the window (`geometry`: x, y, width, height) as a PNG.
    fn screenshot(&self, path: &Path, geometry: (i64, i64, i64, i64)) {
        let (x, y, w, h) = geometry;
        let crop = format!("{w}x{h}+{x}+{y}");
        let xwd = Command::new("xwd")
            .args(["-root", "-silent"])
            .env("DISPLAY", &self.display)
            .env("XAUTHORITY", &self.xauthority)
            .output()
            .expect("xwd");
        assert!(xwd.status.success(), "xwd failed");
        let mut convert = Command::new("convert")
            .args(["xwd:-", "-crop", &crop, "+repage", &path.to_string_lossy()])
            .stdin(Stdio::piped())
            .spawn()
            .expect("convert (ImageMagick)");
        use std::io::Write;
        convert.stdin.take().unwrap().write_all(&xwd.stdout).unwrap();
        assert!(convert.wait().unwrap().success(), "convert failed");
        eprintln!("e2e: screenshot {}", path.display());
    }

    /// Clicks the middle of a control whose box the app reported (CSS px in the webview).
    fn click(&self, origin: (i64, i64), rect: &Value) {
        let x = origin.0 + (rect["x"].as_f64().unwrap() + rect["width"].as_f64().unwrap() / 2.0).round() as i64;
        let y = origin.1 + (rect["y"].as_f64().unwrap() + rect["height"].as_f64().unwrap() / 2.0).round() as i64;
        self.run("xdotool", &["mousemove", "--sync", &x.to_string(), &y.to_string()]);
        self.run("xdotool", &["click", "1"]);
    }

    fn type_and_enter(&self, text: &str) {
        self.type_pause_and_enter(text, Duration::ZERO);
    }

    /// Types `text`, waits `pause` (someone reading it over) and presses Enter.
    fn type_pause_and_enter(&self, text: &str, pause: Duration) {
        self.run("xdotool", &["type", "--delay", "15", text]);
        std::thread::sleep(pause);
        self.run("xdotool", &["key", "Return"]);
    }
}

fn read_status(path: &Path) -> Option<Value> {
    let bytes = fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Polls the status file until `done` holds; panics with the last status on timeout.
fn wait_for(path: &Path, what: &str, timeout: Duration, app: &mut Child, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < timeout {
        if let Some(status) = read_status(path) {
            if done(&status) {
                eprintln!("e2e: {what} after {:.1} s", start.elapsed().as_secs_f64());
                return status;
            }
            last = status;
        }
        if let Ok(Some(code)) = app.try_wait() {
            panic!("the app exited ({code}) while waiting for {what}; last status: {last:#}");
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    panic!("timed out after {timeout:?} waiting for {what}; last status: {last:#}");
}

/// The app window's position and size on the screen.
fn window_geometry(screen: &Screen) -> (i64, i64, i64, i64) {
    let ids = screen.run("xdotool", &["search", "--sync", "--onlyvisible", "--name", "^pocketchat$"]);
    let id = ids.lines().next().expect("the pocketchat window").trim().to_string();
    let geometry = screen.run("xdotool", &["getwindowgeometry", "--shell", &id]);
    let field = |name: &str| -> i64 {
        geometry
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    eprintln!("e2e: window {id}: {}", geometry.replace('\n', " "));
    (field("X"), field("Y"), field("WIDTH"), field("HEIGHT"))
}

/// The real app in a fresh Xvfb, with its QA status file; stopped when dropped.
struct RunningApp {
    cleanup: Cleanup,
    screen: Screen,
    status_path: PathBuf,
    out: PathBuf,
    _work: tempfile::TempDir,
}

impl RunningApp {
    /// Starts Xvfb and `pocketchat app --model MODEL EXTRA_ARGS...`; `None` (after a loud
    /// SKIPPED banner) when `xvfb-run` is not installed.
    fn start(model: &Path, extra_args: &[&str], log_name: &str) -> Option<RunningApp> {
        RunningApp::start_with_env(model, extra_args, &[], log_name)
    }

    /// [`RunningApp::start`] with extra environment variables for the app.
    fn start_with_env(model: &Path, extra_args: &[&str], env: &[(&str, &Path)], log_name: &str) -> Option<RunningApp> {
        if !have("xvfb-run") {
            skip_loudly("xvfb-run is not installed");
            return None;
        }
        for tool in ["xdotool", "xwd", "convert"] {
            assert!(have(tool), "{tool} is needed for the end-to-end test (apt install xdotool x11-apps imagemagick)");
        }
        let out = out_dir();
        let work = tempfile::tempdir().unwrap();
        let status_path = work.path().join("qa-status.json");
        let display_file = work.path().join("display");
        let keep_file = work.path().join("keep-xvfb");
        fs::write(&keep_file, b"").unwrap();
        let mut cleanup = Cleanup { children: Vec::new(), keep_file: Some(keep_file.clone()) };

        // An X server that lives until `keep_file` disappears; it tells us its display.
        let xvfb = Command::new("xvfb-run")
            .args(["-a", "-s", "-screen 0 1280x800x24 -nolisten tcp", "sh", "-c"])
            .arg(format!(
                "echo \"$XAUTHORITY\" > '{0}.tmp'; echo \"$DISPLAY\" >> '{0}.tmp'; mv '{0}.tmp' '{0}'; while [ -e '{1}' ]; do sleep 0.2; done",
                display_file.display(),
                keep_file.display()
            ))
            .stdout(Stdio::null())
            .stderr(fs::File::create(out.join("xvfb.log")).unwrap())
            .spawn()
            .expect("xvfb-run");
        cleanup.children.push(("xvfb-run", xvfb));
        let start = Instant::now();
        // xvfb-run's child learns the display and the X authority file; we pass both on.
        let (xauthority, display) = loop {
            if let Ok(d) = fs::read_to_string(&display_file) {
                let mut lines = d.lines();
                if let (Some(auth), Some(display)) = (lines.next(), lines.next()) {
                    break (auth.trim().to_string(), display.trim().to_string());
                }
            }
            assert!(start.elapsed() < Duration::from_secs(30), "Xvfb did not start (see {}/xvfb.log)", out.display());
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!("e2e: Xvfb on {display} (auth {xauthority})");
        let screen = Screen { display: display.clone(), xauthority: xauthority.clone() };

        let log = fs::File::create(out.join(log_name)).unwrap();
        let app = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
            .arg("app")
            .arg("--model")
            .arg(model)
            .args(extra_args)
            .env("DISPLAY", &display)
            .env("XAUTHORITY", &xauthority)
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("POCKETCHAT_THREADS")
            .env("POCKETCHAT_QA_STATUS", &status_path)
            // A fresh chat list: nothing restored from an earlier run.
            .env("POCKETCHAT_CHATS_DIR", work.path().join("chats"))
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("the pocketchat binary");
        cleanup.children.push(("pocketchat app", app));
        Some(RunningApp { cleanup, screen, status_path, out, _work: work })
    }

    fn app(&mut self) -> &mut Child {
        &mut self.cleanup.children.last_mut().unwrap().1
    }

    fn wait_for(&mut self, what: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let path = self.status_path.clone();
        wait_for(&path, what, timeout, self.app(), done)
    }

    /// Waits for the model and the controls; returns the status and the window geometry.
    fn wait_until_ready(&mut self) -> (Value, (i64, i64, i64, i64)) {
        let status = self.wait_for("the model to be ready", Duration::from_secs(240), |s| {
            s["phase"] == "ready" && s["rects"]["composer"].is_object() && s["rects"]["simulate_warning"].is_object()
        });
        assert_eq!(status["last_error"], Value::Null, "{status:#}");
        let window = window_geometry(&self.screen);
        (status, window)
    }
}

/// The default model, or `POCKETCHAT_MODEL`.
fn model_path() -> PathBuf {
    let model = std::env::var_os("POCKETCHAT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        model.exists(),
        "the default model is missing at {} — run `cargo run --release -- fetch` (or set POCKETCHAT_MODEL)",
        model.display()
    );
    model
}

/// The tests here each start a window and measure speed: one at a time.
static ONE_WINDOW_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn chat_evict_and_chat_again_in_the_real_window() {
    let _one = ONE_WINDOW_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = model_path();
    let Some(mut run) = RunningApp::start(&model, &[], "app.log") else { return };
    let out = run.out.clone();
    let status_path = run.status_path.clone();

    // 1. The model loads and the controls are on screen.
    let (status, window) = run.wait_until_ready();
    let origin = (window.0, window.1);
    std::thread::sleep(Duration::from_millis(300));
    run.screen.screenshot(&out.join("01-ready.png"), window);

    // 2. First prompt, typed into the composer and sent with Enter.
    run.screen.click(origin, &status["rects"]["composer"]);
    run.screen.type_and_enter(FIRST_PROMPT);
    run.wait_for("the first reply to stream", Duration::from_secs(120), |s| {
        s["generating"] == true && s["last_reply"].as_str().is_some_and(|r| r.trim().len() >= 12)
    });

    // 3. Simulate memory warning, mid-reply (measured again in case the layout moved).
    let rect = read_status(&status_path).unwrap()["rects"]["simulate_warning"].clone();
    run.screen.click(origin, &rect);
    let status = run.wait_for("the eviction", Duration::from_secs(60), |s| {
        s["evictions"].as_u64() >= Some(1) && s["generating"] == false
    });
    std::thread::sleep(Duration::from_millis(300));
    run.screen.screenshot(&out.join("02-evicted.png"), window);
    assert_eq!(status["done_reasons"][0], "MemoryWarning", "the warning should interrupt the first reply: {status:#}");

    // 4. Second prompt: the chat goes on after the eviction.
    let rect = status["rects"]["composer"].clone();
    run.screen.click(origin, &rect);
    run.screen.type_and_enter(SECOND_PROMPT);
    let status = run.wait_for("the second reply", Duration::from_secs(240), |s| {
        s["replies_done"].as_u64() >= Some(2) && s["generating"] == false
    });
    std::thread::sleep(Duration::from_millis(500));
    run.screen.screenshot(&out.join("03-second-reply.png"), window);
    assert!(status["replies_done"].as_u64().unwrap() >= 2, "{status:#}");
    assert!(status["evictions"].as_u64().unwrap() >= 1, "{status:#}");
    let notices: Vec<&str> = status["notices"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(notices.iter().any(|n| n.starts_with(EVICTED_PREFIX)), "the eviction notice was shown: {notices:?}");
    let prompts: Vec<&str> = status["prompts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(prompts, [FIRST_PROMPT, SECOND_PROMPT], "what was typed arrived whole");
    assert_eq!(status["last_error"], Value::Null, "{status:#}");
    let second = status["last_reply"].as_str().unwrap_or_default();
    assert!(!second.trim().is_empty(), "the second reply has text: {status:#}");
    let reasons = status["done_reasons"].as_array().unwrap();
    assert!(
        matches!(reasons[1].as_str(), Some("EndOfTurn" | "MaxTokens" | "BudgetExhausted")),
        "the second reply finished normally: {status:#}"
    );
    assert!(out.join("03-second-reply.png").exists());
    let first_chat = status["active_chat"].as_str().expect("the app opened a chat").to_string();

    // 5. A second chat: New chat, a prompt, its reply.
    run.screen.click(origin, &status["rects"]["new_chat"]);
    let status = run.wait_for("the second chat", Duration::from_secs(30), |s| {
        s["active_chat"].as_str().is_some_and(|id| id != first_chat) && s["messages"] == 0
    });
    run.screen.click(origin, &status["rects"]["composer"]);
    run.screen.type_and_enter(OTHER_CHAT_PROMPT);
    let status = run.wait_for("the second chat's reply", Duration::from_secs(240), |s| {
        s["replies_done"].as_u64() >= Some(3)
            && s["generating"] == false
            && s["chats"].as_array().is_some_and(|c| c.len() == 2)
    });
    std::thread::sleep(Duration::from_millis(300));
    run.screen.screenshot(&out.join("04-second-chat.png"), window);
    assert_eq!(status["prompts"], serde_json::json!([OTHER_CHAT_PROMPT]), "{status:#}");

    // 6. Back to the first chat from the list: its messages are back (no re-prefill), and
    // it goes on.
    let item = format!("chat:{first_chat}");
    let status = run.wait_for("the first chat in the list", Duration::from_secs(10), |s| s["rects"][&item].is_object());
    run.screen.click(origin, &status["rects"][&item]);
    let status = run.wait_for("the first chat again", Duration::from_secs(30), |s| {
        s["active_chat"].as_str() == Some(first_chat.as_str()) && s["messages"].as_u64() >= Some(4)
    });
    let prompts: Vec<&str> = status["prompts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(prompts, [FIRST_PROMPT, SECOND_PROMPT], "the first chat's messages came back");
    let notices: Vec<&str> = status["notices"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(notices.iter().any(|n| n.contains("resumed from its cache")), "resumed without re-prefill: {notices:?}");
    run.screen.click(origin, &status["rects"]["composer"]);
    run.screen.type_and_enter(THIRD_PROMPT);
    // The list is saved and sent just after the reply ends: wait for it too.
    let status = run.wait_for("the first chat's third reply", Duration::from_secs(240), |s| {
        s["replies_done"].as_u64() >= Some(4) && s["generating"] == false && s["chats"][0]["id"] == first_chat.as_str()
    });
    std::thread::sleep(Duration::from_millis(300));
    run.screen.screenshot(&out.join("05-first-chat-again.png"), window);
    fs::copy(&status_path, out.join("qa-status.json")).unwrap();

    eprintln!("e2e: final status {status:#}");
    let prompts: Vec<&str> = status["prompts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(prompts, [FIRST_PROMPT, SECOND_PROMPT, THIRD_PROMPT], "the first chat went on");
    assert_eq!(status["chats"].as_array().unwrap().len(), 2, "{status:#}");
    assert_eq!(status["chats"][0]["id"].as_str(), Some(first_chat.as_str()), "the chat just used comes first");
    assert_eq!(status["last_error"], Value::Null, "{status:#}");
    assert!(out.join("05-first-chat-again.png").exists());
}

const STREAM_PROMPT: &str = "Write a long story about a lighthouse keeper and a storm.";
const STREAM_MAX_TOKENS: &str = "300";

/// What `pocketchat chat --stats` printed for one prompt.
struct CliReply {
    text: String,
    decode_tok_s: f64,
    ttft_ms: f64,
}

/// Runs the terminal chat on `prompt` (its default threads, greedy, `max_tokens`), on the
/// file the app loads (`--model`, loaded as named by both).
fn cli_reply(model: &Path, prompt: &str, max_tokens: &str) -> CliReply {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocketchat"))
        .args(["chat", "--stats", "--max-tokens", max_tokens, "--model"])
        .arg(model)
        .env_remove("POCKETCHAT_THREADS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pocketchat chat");
    writeln!(child.stdin.take().unwrap(), "{prompt}").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pocketchat chat failed: {stderr}");
    let stats = stderr.lines().find(|l| l.starts_with("[turn 1]")).unwrap_or_else(|| panic!("no stats line: {stderr}"));
    // "... · ttft 61 ms · prefill ... · decode 118.3 tok/s"
    let figure = |before: &str, after: &str| -> f64 {
        let start = stats.find(before).unwrap_or_else(|| panic!("{before:?} in {stats}")) + before.len();
        let end = start + stats[start..].find(after).unwrap();
        stats[start..end].trim().parse().unwrap()
    };
    let mut text = String::from_utf8(out.stdout).unwrap();
    if text.ends_with('\n') {
        text.pop();
    }
    CliReply { text, decode_tok_s: figure("decode ", " tok/s"), ttft_ms: figure("ttft ", " ms") }
}

/// CPU seconds used so far by the processes whose name starts with `comm` (or by `pid`).
fn cpu_seconds(select: impl Fn(u32, &str) -> bool) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut total = 0.0;
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else { continue };
        // "pid (comm) state ppid ..." — comm may hold spaces; fields resume after ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        if !select(pid, &stat[open + 1..close]) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let (utime, stime): (f64, f64) = (fields[11].parse().unwrap_or(0.0), fields[12].parse().unwrap_or(0.0));
        total += (utime + stime) / ticks;
    }
    total
}

/// The app's speed as a person sees it, beside the engine's in the terminal: one long
/// reply on the same model and prompt, in the real window under Xvfb. Prints the streaming
/// rate (tokens shown per second between the first token on screen and the last one, from
/// the app's QA status file) against `pocketchat chat`'s decode rate, the first token
/// against the CLI's, and the CPU the web process and the app used while the reply
/// streamed. Speed is reported, not asserted; the test fails only when what was shown is
/// not exactly what the engine wrote (greedy decoding gives both the same text).
///
/// `POCKETCHAT_E2E_APP_THREADS=N` runs the app with `--threads N` (to compare counts).
#[test]
fn the_window_streams_what_the_engine_writes_and_reports_its_speed() {
    let _one = ONE_WINDOW_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = model_path();
    if !have("xvfb-run") {
        skip_loudly("xvfb-run is not installed");
        return;
    }
    let cli = cli_reply(&model, STREAM_PROMPT, STREAM_MAX_TOKENS);
    let threads = std::env::var("POCKETCHAT_E2E_APP_THREADS").ok();
    let mut args = vec!["--max-tokens", STREAM_MAX_TOKENS];
    if let Some(t) = &threads {
        args.extend(["--threads", t.as_str()]);
    }
    let Some(mut run) = RunningApp::start(&model, &args, "app-stream.log") else { return };
    let app_pid = run.app().id();
    let (status, window) = run.wait_until_ready();
    run.screen.click((window.0, window.1), &status["rects"]["composer"]);
    // Enter right after the last key, or after POCKETCHAT_E2E_PAUSE_MS (typing paused:
    // the whole prompt is read ahead).
    let pause = std::env::var("POCKETCHAT_E2E_PAUSE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    run.screen.type_pause_and_enter(STREAM_PROMPT, Duration::from_millis(pause));
    run.wait_for("the reply to start", Duration::from_secs(60), |s| {
        s["last_reply"].as_str().is_some_and(|r| !r.is_empty())
    });
    let web = |_: u32, comm: &str| comm.starts_with("WebKitWebProces");
    let app = |pid: u32, _: &str| pid == app_pid;
    let (web0, app0, t0) = (cpu_seconds(web), cpu_seconds(app), Instant::now());
    run.wait_for("the reply to finish", Duration::from_secs(240), |s| {
        // The engine's figures for the reply come just after it ends.
        s["replies_done"].as_u64() >= Some(1) && s["generating"] == false && s["decode_tok_s"].as_f64() > Some(0.0)
    });
    let wall = t0.elapsed().as_secs_f64();
    let (web_cores, app_cores) = ((cpu_seconds(web) - web0) / wall, (cpu_seconds(app) - app0) / wall);
    // The page times the frames it painted just after they are on screen.
    let status = run.wait_for("the page to report its painted frames", Duration::from_secs(30), |s| {
        s["reply_timings"][0]["painted_tok_s"].as_f64().is_some()
    });
    run.screen.screenshot(&run.out.join("04-streamed.png"), window);
    fs::copy(&run.status_path, run.out.join("qa-status-stream.json")).unwrap();

    let timing = &status["reply_timings"][0];
    let shown_tok_s = timing["shown_tok_s"].as_f64().unwrap();
    let first_ms = timing["first_token_ms"].as_f64().unwrap();
    let painted_tok_s = timing["painted_tok_s"].as_f64().unwrap();
    let painted_first_ms = timing["painted_first_token_ms"].as_f64().unwrap();
    let engine_tok_s = status["decode_tok_s"].as_f64().unwrap();
    drop(run);
    // This machine's speed can drift within minutes: the CLI runs before and after the
    // app, on a machine without the window either time, and the ratios use the mean.
    let after = cli_reply(&model, STREAM_PROMPT, STREAM_MAX_TOKENS);
    let (cli_tok_s, cli_ttft_ms) = ((cli.decode_tok_s + after.decode_tok_s) / 2.0, (cli.ttft_ms + after.ttft_ms) / 2.0);
    eprintln!(
        "\n==== app streaming vs CLI ({} tokens, app on {} compute threads) ====",
        timing["tokens"], status["compute_threads"]
    );
    eprintln!(
        "CLI decode              {cli_tok_s:8.1} tok/s   first token {cli_ttft_ms:7.1} ms (runs before / after the app: {:.1} / {:.1} tok/s)",
        cli.decode_tok_s, after.decode_tok_s
    );
    eprintln!(
        "app engine decode       {:8.1} tok/s   first token {:7.1} ms (engine)",
        engine_tok_s,
        status["ttft_ms"].as_f64().unwrap()
    );
    eprintln!("app UI state            {:8.1} tok/s   first token {:7.1} ms (from Enter)", shown_tok_s, first_ms);
    eprintln!(
        "app painted on screen   {:8.1} tok/s   first token {:7.1} ms (from Enter)",
        painted_tok_s, painted_first_ms
    );
    eprintln!(
        "ratio painted / CLI     {:8.2}         first token {:7.2}x the CLI's",
        painted_tok_s / cli_tok_s,
        painted_first_ms / cli_ttft_ms
    );
    eprintln!("CPU while streaming     web process {:.2} cores, app {:.2} cores ({wall:.1} s)", web_cores, app_cores);
    eprintln!(
        "the prompt              {} tokens fed after Enter, {} while it was typed (POCKETCHAT_TYPE_AHEAD=0: none)",
        status["prefill_tokens"], status["drafted_tokens"]
    );

    let shown = status["last_reply"].as_str().unwrap_or_default();
    assert_eq!(shown, cli.text, "the window shows every token the engine wrote, in order");
    assert!(timing["tokens"].as_u64().unwrap() > 1, "{status:#}");
    assert!(shown_tok_s > 0.0 && first_ms > 0.0, "{status:#}");
    assert!(painted_tok_s > 0.0 && painted_first_ms >= first_ms - 20.0, "painted after the state had it: {status:#}");
    if std::env::var("POCKETCHAT_TYPE_AHEAD").as_deref() != Ok("0") {
        // The prompt was typed into the window word by word: its words were read ahead.
        assert!(status["drafted_tokens"].as_u64() > Some(0), "nothing was read ahead while typing: {status:#}");
    }
}

/// The model screen end to end: in the real window, the user opens *Models*, pastes the
/// URL of a second model (the default model's Q8_0 copy, served by a local HTTP server
/// on a slowed link with Hugging Face's checksum header), watches the progress bar (a
/// screenshot shows it), and once the file is downloaded and verified clicks *Use*: the
/// app switches to it while it runs and answers on it.
#[test]
fn the_app_downloads_verifies_and_switches_to_a_second_model() {
    let _one = ONE_WINDOW_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = model_path();
    if !have("xvfb-run") {
        skip_loudly("xvfb-run is not installed");
        return;
    }
    // The default model's Q8_0 copy, made here on request as `pocketchat quantize` does.
    let second = pocketchat::catalog::quant_sibling_path(&model, "Q8_0");
    if !second.is_file() {
        pocketchat::catalog::quantize_q8_0(&model, &second).expect("the Q8_0 copy of the default model");
    }
    let bytes = std::sync::Arc::new(fs::read(&second).unwrap());
    let sha = pocketchat::catalog::sha256_file(&second).unwrap();
    const NAME: &str = "SmolLM2-135M-second.Q8_0.gguf";
    let server = http_server::TestServer::start(http_server::Content {
        name: NAME.into(),
        bytes: bytes.clone(),
        linked_sha256: sha,
    });
    // ~145 MB at 64 KiB per 2 ms: a few seconds, long enough to see the bar move.
    server.faults.lock().unwrap().delay_per_chunk = Some(Duration::from_millis(2));
    let models_dir = tempfile::tempdir().unwrap();
    let env = [("POCKETCHAT_MODELS_DIR", models_dir.path())];
    let Some(mut run) = RunningApp::start_with_env(&model, &[], &env, "app-models.log") else { return };
    let (status, window) = run.wait_until_ready();
    let origin = (window.0, window.1);
    let first_model = status["model_path"].as_str().unwrap().to_string();

    run.screen.click(origin, &status["rects"]["models_toggle"]);
    let status = run.wait_for("the model screen", Duration::from_secs(20), |s| s["rects"]["model_url"].is_object());
    run.screen.click(origin, &status["rects"]["model_url"]);
    run.screen.type_and_enter(&server.url(&format!("/org/repo/resolve/main/{NAME}")));
    let key = format!("file:{NAME}");
    let status = run.wait_for("the download to be under way", Duration::from_secs(60), |s| {
        s["models"]["downloads"][&key]["fraction"].as_f64().is_some_and(|f| f > 0.05 && f < 0.9)
    });
    // Let the page paint the bar's latest width before the picture.
    std::thread::sleep(Duration::from_millis(300));
    run.screen.screenshot(&run.out.join("06-model-downloading.png"), window);
    eprintln!("e2e: downloading, {:#}", status["models"]["downloads"][&key]);

    let status = run.wait_for("the download to finish and verify", Duration::from_secs(180), |s| {
        s["models"]["downloaded"].as_array().is_some_and(|d| d.iter().any(|k| k == key.as_str()))
            && s["rects"][format!("model_use:{key}")].is_object()
    });
    assert!(
        status["models"]["notice"].as_str().unwrap_or("").starts_with("Downloaded and verified"),
        "{:#}",
        status["models"]
    );
    let downloaded = models_dir.path().join(NAME);
    assert_eq!(fs::read(&downloaded).unwrap().len(), bytes.len(), "the whole file arrived");
    assert!(!pocketchat::catalog::download::part_path(&downloaded).exists());

    run.screen.click(origin, &status["rects"][format!("model_use:{key}")]);
    let status = run.wait_for("the second model to load", Duration::from_secs(120), |s| {
        s["phase"] == "ready" && s["model_path"].as_str().is_some_and(|p| p.ends_with(NAME))
    });
    assert_ne!(status["model_path"].as_str().unwrap(), first_model);
    std::thread::sleep(Duration::from_millis(500));
    run.screen.screenshot(&run.out.join("07-second-model.png"), window);

    // The chat beside the model screen: the second model answers.
    run.screen.click(origin, &status["rects"]["composer"]);
    run.screen.type_and_enter(SECOND_PROMPT);
    let status = run.wait_for("the reply on the second model", Duration::from_secs(240), |s| {
        s["replies_done"].as_u64() >= Some(1) && s["generating"] == false
    });
    assert_eq!(status["last_error"], Value::Null, "{status:#}");
    assert!(!status["last_reply"].as_str().unwrap_or("").trim().is_empty(), "{status:#}");
    fs::copy(&run.status_path, run.out.join("qa-status-models.json")).unwrap();
}
