//! The app's components rendered to HTML with dioxus-ssr, for the states a user meets:
//! empty chat, model loading, a streaming reply, a finished Markdown reply, trimmed and
//! evicted notices, a missing model, a failed load, a failed turn, and the settings panel
//! with its figures. The state is built the way the app builds it: by applying engine
//! events to a `ChatState`.

#![cfg(feature = "ui")]

use dioxus::prelude::*;
use pocketchat::engine::template::{Message as TemplateMessage, Role as TemplateRole};
use pocketchat::engine::{Cause, DoneReason, EngineError, EngineEvent, ModelInfo, Stats};
use pocketchat::memory::{Policy, RamTier, TierReport, GIB, MIB};
use pocketchat::ui::copy::{EVICTED_TEXT, FETCH_COMMAND};
use pocketchat::ui::state::ChatState;
use pocketchat::ui::Shell;

#[derive(Props, Clone, PartialEq)]
struct Fixture {
    state: ChatState,
    settings_open: bool,
}

fn root(f: Fixture) -> Element {
    rsx! { Shell { state: f.state, settings_open: f.settings_open } }
}

/// Renders the whole window for `state`.
fn render(state: &ChatState, settings_open: bool) -> String {
    let mut dom = VirtualDom::new_with_props(root, Fixture { state: state.clone(), settings_open });
    dom.rebuild_in_place();
    dioxus_ssr::render(&dom)
}

/// The HTML with the common entities decoded, for assertions on visible text.
fn text(html: &str) -> String {
    html.replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
        .replace("&#38;", "&")
}

fn count(html: &str, needle: &str) -> usize {
    html.matches(needle).count()
}

fn model_info() -> ModelInfo {
    ModelInfo {
        path: "/home/me/pocketchat/models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        file_bytes: 98_037_696,
        architecture: "llama".into(),
        name: "SmolLM2 135M Instruct".into(),
        weights_quant: "Q4_1".into(),
        n_layers: 30,
        context_length: 8192,
        kv_dtype: "f16".into(),
        kv_bytes_per_token: 23_040,
        recurrent_bytes: 0,
        device: "cpu".into(),
        thinking: None,
    }
}

fn ready() -> ChatState {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.3, message: "reading weights".into() });
    s.apply(EngineEvent::Ready(model_info()));
    s
}

fn tok(s: &mut ChatState, t: &str) {
    s.apply(EngineEvent::Token { text: t.into() });
}

fn stats() -> Stats {
    Stats {
        context_tokens: 120,
        budget: 1024,
        kv_bytes: 120 * 23_040,
        predicted_footprint_bytes: 250 * MIB,
        ceiling_bytes: 3 * GIB,
        rss_bytes: 180 * MIB,
        prefill_tokens: 42,
        prefill_ms: 87.0,
        ttft_ms: 95.0,
        decode_tok_s: 31.46,
        generated_tokens: 17,
        ..Stats::default()
    }
}

/// A conversation whose first reply was interrupted by a memory warning.
fn evicted() -> ChatState {
    let mut s = ready();
    s.submit("Tell me a story", "12:00:00");
    s.apply_at(EngineEvent::ReplyStarted { prompt: "Tell me a story".into() }, "12:00:00");
    tok(&mut s, "Once upon a time");
    s.apply_at(
        EngineEvent::Evicted {
            reason: "simulated from settings".into(),
            before_tokens: 900,
            after_tokens: 450,
            freed_bytes: 20 * MIB,
        },
        "12:00:03",
    );
    s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
    s
}

#[test]
fn empty_chat_invites_a_message() {
    let html = render(&ready(), false);
    let t = text(&html);
    assert!(t.contains("What's on your mind?"), "{t}");
    assert!(t.contains("SmolLM2 135M Instruct runs on this device."), "{t}");
    assert!(html.contains("class=\"empty\""), "{html}");
    assert!(html.contains("status-ready"), "{html}");
    assert!(html.contains("id=\"composer-input\""), "{html}");
    assert!(html.contains("placeholder=\"Message pocketchat\""), "{html}");
    assert!(html.contains("id=\"send-button\""), "{html}");
    assert!(!html.contains("id=\"stop-button\""), "{html}");
    assert!(!html.contains("class=\"settings\""), "settings closed: {html}");
    assert_eq!(count(&html, "class=\"msg "), 0);
}

#[test]
fn loading_shows_progress() {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.42, message: "reading weights".into() });
    let html = render(&s, false);
    let t = text(&html);
    assert!(t.contains("Loading the model…"), "{t}");
    assert!(t.contains("reading weights"), "{t}");
    assert!(t.contains("42%"), "{t}");
    assert!(html.contains("width: 42%"), "{html}");
    assert!(html.contains("class=\"status-chip status-loading\""), "{html}");
    assert!(html.contains("placeholder=\"Loading the model…\""), "{html}");
    assert!(!html.contains("class=\"empty\""), "{html}");
}

#[test]
fn streaming_reply_has_stop_and_no_copy_yet() {
    let mut s = ready();
    s.submit("Hi <there>", "10:00:00");
    s.apply(EngineEvent::ReplyStarted { prompt: "Hi <there>".into() });
    tok(&mut s, "Hello");
    tok(&mut s, ", wor");
    let html = render(&s, false);
    assert!(html.contains("msg msg-user"), "{html}");
    assert!(!html.contains("<there>"), "user text is escaped: {html}");
    assert!(text(&html).contains("Hi <there>"), "{html}");
    assert!(html.contains("msg msg-assistant streaming"), "{html}");
    assert!(text(&html).contains("Hello, wor"), "{html}");
    assert!(html.contains("id=\"stop-button\""), "{html}");
    assert!(!html.contains("id=\"send-button\""), "{html}");
    assert!(!html.contains(">Copy<"), "no copy button while streaming: {html}");
    assert!(html.contains("status-busy"), "{html}");
}

#[test]
fn a_thinking_reply_shows_its_thinking_collapsed_and_the_switch() {
    let mut s = ready();
    assert!(!render(&s, false).contains("think-toggle"), "no switch for a model without one");
    s.apply(EngineEvent::Ready(ModelInfo { thinking: Some(true), ..model_info() }));
    let html = render(&s, false);
    assert!(html.contains("id=\"think-toggle\""), "{html}");
    assert!(html.contains("aria-pressed=\"true\""), "the model's default is on: {html}");
    s.submit("Is 91 prime?", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "Is 91 prime?".into() });
    s.apply(EngineEvent::Thinking { text: "Try <7>.".into() });
    let html = render(&s, false);
    assert!(html.contains("<details class=\"thinking live\""), "collapsed while it streams: {html}");
    assert!(!html.contains("<details class=\"thinking live\" open"), "{html}");
    assert!(text(&html).contains("Thinking…") && text(&html).contains("Try <7>."), "{html}");
    tok(&mut s, "No: 7 × 13.");
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    s.apply(EngineEvent::Stats(Stats { generated_tokens: 12, thinking_tokens: 5, decode_tok_s: 30.0, ..stats() }));
    let html = render(&s, false);
    assert!(text(&html).contains("Thought for 5 tokens"), "{html}");
    assert!(html.contains("<details class=\"thinking\""), "{html}");
    s.apply(EngineEvent::ThinkingSwitch { enabled: Some(false) });
    assert!(render(&s, false).contains("aria-pressed=\"false\""));
}

#[test]
fn waiting_for_the_first_token_shows_dots() {
    let mut s = ready();
    s.submit("Hi", "");
    let html = render(&s, false);
    assert!(html.contains("msg msg-assistant pending"), "{html}");
    assert!(html.contains("class=\"typing\""), "{html}");
}

#[test]
fn finished_reply_renders_markdown_with_copy_and_speed() {
    let mut s = ready();
    s.submit("Show me", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "Show me".into() });
    for piece in [
        "Here is **bold** text.\n\n",
        "- first\n- second\n\n",
        "```rust\nfn main() {}\n```\n\n",
        "<script>alert(1)</script>",
    ] {
        tok(&mut s, piece);
    }
    s.apply(EngineEvent::Stats(stats()));
    s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    let html = render(&s, false);
    assert!(html.contains("<strong>bold</strong>"), "{html}");
    assert!(html.contains("<li>first</li>"), "{html}");
    assert!(html.contains("<pre><code class=\"language-rust\">fn main() {}"), "{html}");
    assert!(!html.contains("<script>"), "raw HTML must be escaped: {html}");
    assert!(html.contains("&lt;script&gt;"), "{html}");
    assert!(html.contains(">Copy<"), "{html}");
    assert_eq!(count(&html, "<button class=\"code-copy\""), 1, "the code block has its own Copy: {html}");
    assert!(
        html.contains(">Copy</button><pre><code class=\"language-rust\">fn main() {}\n</code></pre></div>"),
        "{html}"
    );
    assert!(html.contains("class=\"toks\""), "{html}");
    assert!(html.contains("17 tokens · 31.5 tok/s"), "the engine's token count wins: {html}");
    assert!(!html.contains("streaming"), "{html}");
    assert!(html.contains("id=\"send-button\""), "{html}");
}

#[test]
fn trimmed_notice_is_inline() {
    let mut s = ready();
    s.submit("Next question", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "Next question".into() });
    s.apply_at(EngineEvent::Trimmed { dropped_tokens: 312, kept_tokens: 388 }, "12:05:00");
    tok(&mut s, "Sure.");
    let html = render(&s, false);
    let t = text(&html);
    assert!(html.contains("notice notice-trimmed"), "{html}");
    assert!(t.contains("Earlier messages were trimmed to fit the budget (312 tokens dropped)"), "{t}");
    assert!(t.contains("388 tokens kept"), "{t}");
    assert!(t.contains("12:05:00"), "{t}");
    // The notice sits between the prompt and the reply.
    let user = html.find("msg msg-user").unwrap();
    let notice = html.find("notice-trimmed").unwrap();
    let reply = html.find("msg msg-assistant").unwrap();
    assert!(user < notice && notice < reply, "{html}");
}

#[test]
fn evicted_notice_says_memory_limit_reached() {
    let html = render(&evicted(), false);
    let t = text(&html);
    assert!(html.contains("notice notice-evicted"), "{html}");
    assert!(html.contains("role=\"alert\""), "{html}");
    assert!(t.contains(EVICTED_TEXT), "{t}");
    assert!(t.contains("900 → 450 tokens, 20.0 MiB freed · simulated from settings"), "{t}");
    assert!(t.contains("Interrupted by a memory warning"), "{t}");
    assert!(t.contains("Once upon a time"), "{t}");
    assert!(html.contains("id=\"send-button\""), "the chat goes on: {html}");
}

#[test]
fn missing_model_tells_how_to_fetch_it() {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Failed {
        error: EngineError::ModelMissing { path: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into() },
    });
    let html = render(&s, false);
    let t = text(&html);
    assert!(html.contains("card error-card model-missing"), "{html}");
    assert!(t.contains("No model installed"), "{t}");
    assert!(html.contains(&format!("<code>{FETCH_COMMAND}</code>")), "{html}");
    assert!(t.contains("models/SmolLM2-135M-Instruct.Q4_1.gguf"), "{t}");
    assert!(html.contains("status-failed"), "{html}");
    assert!(html.contains("placeholder=\"No model loaded\""), "{html}");
    assert!(html.contains("disabled"), "{html}");
    assert!(!html.contains("class=\"empty\""), "{html}");
}

#[test]
fn load_failure_shows_the_engine_message() {
    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.1, message: "opening".into() });
    s.apply(EngineEvent::Failed {
        error: EngineError::BadModelFile { path: "broken.gguf".into(), message: "bad magic 0x0".into() },
    });
    let html = render(&s, false);
    let t = text(&html);
    assert!(html.contains("card error-card load-failed"), "{html}");
    assert!(t.contains("The model could not be loaded"), "{t}");
    assert!(t.contains("broken.gguf is not a usable GGUF model file: bad magic 0x0"), "{t}");
    assert!(!t.contains(FETCH_COMMAND), "{t}");
}

#[test]
fn failed_turn_is_an_inline_error() {
    let mut s = ready();
    s.submit("hi", "");
    s.apply(EngineEvent::ReplyStarted { prompt: "hi".into() });
    tok(&mut s, "Partial");
    s.apply(EngineEvent::Failed { error: EngineError::Inference(Cause::msg("shape mismatch")) });
    let html = render(&s, false);
    let t = text(&html);
    assert!(html.contains("notice notice-error"), "{html}");
    assert!(t.contains("This reply failed: inference failed: shape mismatch"), "{t}");
    assert!(html.contains("msg msg-assistant failed"), "{html}");
    assert!(html.contains("id=\"send-button\""), "{html}");
    assert!(html.contains("status-ready"), "{html}");
}

#[test]
fn settings_panel_shows_the_figures() {
    let mut s = evicted();
    s.apply(EngineEvent::Policy {
        report: TierReport {
            physical_bytes: 7 * GIB + GIB / 2,
            detected: RamTier::Phone8Gb,
            overridden: Some(RamTier::Phone6Gb),
            bf16: Some(true),
        },
        policy: Policy::for_tier(RamTier::Phone6Gb),
    });
    s.apply_at(EngineEvent::Trimmed { dropped_tokens: 64, kept_tokens: 200 }, "12:07:30");
    s.apply(EngineEvent::Stats(stats()));
    let html = render(&s, true);
    let t = text(&html);

    assert!(html.contains("class=\"settings\""), "{html}");
    assert!(html.contains("id=\"simulate-warning\""), "{html}");
    assert!(html.contains("btn danger big"), "{html}");
    assert!(t.contains("Simulate memory warning"), "{t}");
    assert!(html.contains("id=\"reset-context\""), "{html}");
    assert!(t.contains("Reset context"), "{t}");

    // Device and tier, detected and overridden kept apart.
    assert!(t.contains("7.5 GiB"), "{t}");
    assert!(t.contains("Auto (8 GB class)"), "{t}");
    assert!(t.contains("Overridden for QA — detected 8 GB class."), "{t}");
    assert!(html.contains("value=\"6gb\" selected"), "the override is selected: {html}");
    assert!(t.contains("4-bit weights · 1024 tokens · 3.0 GiB ceiling"), "{t}");
    assert!(t.contains("Budget set by") && t.contains("this device class's cache allowance"), "{t}");

    // Model.
    assert!(t.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{t}");
    assert!(t.contains("93.5 MiB"), "{t}");
    assert!(t.contains("Weights (loaded)"), "{t}");
    assert!(html.contains(">Q4_1<"), "{html}");
    assert!(t.contains("f16 · 22.5 KiB per token"), "{t}");

    // Context and memory.
    assert!(t.contains("120 / 1024"), "{t}");
    assert!(html.contains("width: 11.7%"), "token bar: {html}");
    assert!(t.contains("2.6 MiB"), "KV bytes: {t}");
    assert!(t.contains("250.0 MiB of 3.0 GiB"), "{t}");
    assert!(t.contains("180.0 MiB"), "RSS: {t}");
    assert!(t.contains("31.5 tok/s"), "{t}");
    assert!(t.contains("42 tokens in 87 ms"), "{t}");

    // The log, newest first, with times.
    let trim = t.find("Trimmed 64 tokens to fit the budget, kept 200").expect("trim logged");
    let evict =
        t.find("Memory warning (simulated from settings): 900 → 450 tokens, 20.0 MiB freed").expect("eviction logged");
    assert!(trim < evict, "newest first: {t}");
    assert!(html.contains("class=\"log-eviction\""), "{html}");
    assert!(t.contains("12:07:30") && t.contains("12:00:03"), "{t}");
}

#[test]
fn settings_before_the_model_is_ready() {
    let html = render(&ChatState::new(), true);
    let t = text(&html);
    assert!(t.contains("Detecting memory…"), "{t}");
    assert!(t.contains("No model loaded yet."), "{t}");
    assert!(t.contains("None yet."), "{t}");
    // The QA buttons wait for the engine.
    let button = html.find("id=\"simulate-warning\"").unwrap();
    let tag_start = html[..button].rfind('<').unwrap();
    let tag_end = button + html[button..].find('>').unwrap();
    assert!(html[tag_start..tag_end].contains("disabled"), "{}", &html[tag_start..tag_end]);
}

#[test]
fn new_chat_and_reset_empty_the_transcript() {
    let mut s = evicted();
    s.apply(EngineEvent::ConversationReset);
    let html = render(&s, false);
    assert!(html.contains("class=\"empty\""), "{html}");
    assert_eq!(count(&html, "class=\"notice "), 0, "{html}");
}

#[test]
fn eviction_offers_restore_when_the_engine_saved_first() {
    let mut s = ready();
    s.restore_available = true;
    s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
    tok(&mut s, "a");
    s.apply(EngineEvent::Evicted { reason: "simulated".into(), before_tokens: 40, after_tokens: 0, freed_bytes: MIB });
    s.apply(EngineEvent::Done { reason: DoneReason::MemoryWarning });
    let html = render(&s, false);
    assert!(html.contains("btn secondary restore"), "{html}");
    assert!(html.contains(">Restore<"), "{html}");
    // Without a saved copy there is nothing to offer.
    assert!(!render(&evicted(), false).contains(">Restore<"));
}

#[test]
fn restored_conversation_is_shown_with_a_notice_and_logged() {
    let mut s = ready();
    s.apply_at(
        EngineEvent::Restored {
            messages: vec![
                TemplateMessage::new(TemplateRole::System, "You are helpful."),
                TemplateMessage::new(TemplateRole::User, "What is **2+2**?"),
                TemplateMessage::new(TemplateRole::Assistant, "It is **4**."),
            ],
            tokens: 42,
        },
        "08:00:00",
    );
    s.apply_at(EngineEvent::Saved { path: "/data/conversation.pcstate".into(), bytes: 968_460, ms: 12.0 }, "08:01:00");
    let html = render(&s, true);
    let t = text(&html);
    assert!(!t.contains("You are helpful."), "the system prompt is not a bubble: {t}");
    assert!(t.contains("What is **2+2**?"), "user text stays literal: {t}");
    assert!(html.contains("It is <strong>4</strong>."), "replies render Markdown: {html}");
    assert!(t.contains("Conversation restored"), "{t}");
    assert!(t.contains("2 messages, 42 tokens, no re-prefill"), "{t}");
    assert!(html.contains("class=\"log-restore\""), "{html}");
    assert!(t.contains("945.8 KiB in 12 ms at 08:01:00"), "{t}");
}

#[test]
fn settings_explain_a_budget_below_the_tier() {
    let mut s = ready();
    s.apply(EngineEvent::Stats(Stats {
        budget: 512,
        tier_budget: 1024,
        budget_note: Some("only 300 MiB of headroom left".into()),
        ..stats()
    }));
    let html = render(&s, true);
    let t = text(&html);
    assert!(t.contains("120 / 512"), "the bar uses the budget in force: {t}");
    assert!(html.contains("data-figure=\"budget-note\""), "{html}");
    assert!(t.contains("512 of the tier's 1024 tokens"), "{t}");
    assert!(t.contains("only 300 MiB of headroom left"), "{t}");
    // No note when the budget is the tier's.
    let mut plain = ready();
    plain.apply(EngineEvent::Stats(Stats { tier_budget: 1024, ..stats() }));
    assert!(!render(&plain, true).contains("budget-note"));
}

fn report() -> TierReport {
    TierReport { physical_bytes: 16 * GIB, detected: RamTier::Desktop, overridden: None, bf16: None }
}

#[test]
fn settings_show_the_compute_threads_with_a_selector() {
    let mut s = ready();
    s.apply(EngineEvent::Policy { report: report(), policy: Policy::for_tier(RamTier::Desktop) });
    s.apply(EngineEvent::Stats(Stats { compute_threads: 1, available_cores: 2, ..stats() }));
    let html = render(&s, true);
    let t = text(&html);
    assert!(html.contains("data-figure=\"threads\""), "{html}");
    assert!(html.contains("id=\"threads-override\""), "{html}");
    assert!(t.contains("1 of 2 cores") && t.contains("2 of 2 cores"), "{t}");
    // Unknown before the engine has reported (older stats): no row.
    let mut before = ready();
    before.apply(EngineEvent::Policy { report: report(), policy: Policy::for_tier(RamTier::Desktop) });
    before.apply(EngineEvent::Stats(stats()));
    assert!(!render(&before, true).contains("threads-override"));
}

#[test]
fn a_reply_is_rendered_as_markdown_blocks() {
    let mut s = ready();
    s.apply(EngineEvent::ReplyStarted { prompt: "q".into() });
    tok(&mut s, "First **para**.\n\n- one\n- two\n\nStill writ");
    let html = render(&s, false);
    // The finished paragraph; then the open part, cut before the line being written:
    // the list (its lines are complete) and the live line, each a box of its own.
    assert_eq!(count(&html, "class=\"mdb\""), 3, "finished blocks, settled lines, the live line: {html}");
    assert!(html.contains("<strong>para</strong>"), "{html}");
    assert!(html.contains("<div class=\"mdb\"><p>Still writ</p>"), "{html}");
    tok(&mut s, "\nand a second line");
    let html = render(&s, false);
    assert!(html.contains("<p class=\"continued\">Still writ</p>"), "{html}");
    assert!(html.contains("<div class=\"mdb\"><p class=\"rest\">and a second line</p>"), "{html}");
}

#[test]
fn settings_show_the_sampling_with_the_models_defaults_and_a_reset() {
    use pocketchat::engine::sampler::{SamplingOverrides, SamplingParams};
    let mut s = ready();
    let defaults = SamplingParams::default();
    let overrides = SamplingOverrides { temperature: Some(0.3), ..Default::default() };
    s.apply(EngineEvent::Sampling { params: overrides.apply(defaults), defaults, overrides });
    let html = render(&s, true);
    let t = text(&html);
    assert!(t.contains("Generation"), "{t}");
    assert!(html.contains("data-figure=\"temperature\""), "{html}");
    assert!(html.contains("value=\"0.3\""), "the value in force: {html}");
    assert!(t.contains("model: 0.8"), "the model's default beside a changed value: {t}");
    // The token repetition penalty is off by default: 1.
    assert!(html.contains("data-figure=\"repeat-penalty\"") && html.contains("value=\"1\""), "{html}");
    // DRY is on by default, with llama.cpp's recommended values.
    assert!(html.contains("data-figure=\"dry-multiplier\"") && html.contains("value=\"0.8\""), "{html}");
    assert!(html.contains("data-figure=\"dry-base\"") && html.contains("value=\"1.75\""), "{html}");
    assert!(html.contains("data-figure=\"dry-allowed-length\"") && html.contains("value=\"2\""), "{html}");
    assert!(html.contains("id=\"reset-sampling\""), "{html}");
    assert!(t.contains("Reset to the model's defaults"), "{t}");
}

#[test]
fn the_chat_list_marks_the_open_chat_and_the_last_turn_offers_edit_and_regenerate() {
    use pocketchat::chats::ChatSummary;
    let mut s = ready();
    let summary = |id: &str, title: &str, cache_bytes| ChatSummary {
        id: id.into(),
        title: title.into(),
        created: 0,
        updated: 0,
        tokens: 130,
        messages: 4,
        cache_bytes,
        unreadable: None,
    };
    s.apply(EngineEvent::Chats {
        chats: vec![summary("b", "Lighthouse story", 3_000_000), summary("a", "Packing list", 0)],
        active: Some("b".into()),
        cache_bytes: 3_000_000,
        cache_cap_bytes: 256_000_000,
    });
    for (prompt, reply) in [("hello", "hi"), ("tell me a story", "Once upon a time")] {
        s.submit(prompt, "");
        s.apply(EngineEvent::ReplyStarted { prompt: prompt.into() });
        tok(&mut s, reply);
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    }
    s.apply(EngineEvent::Stats(stats()));
    let html = render(&s, true);
    let t = text(&html);
    assert!(t.contains("Lighthouse story") && t.contains("Packing list"), "{t}");
    assert_eq!(count(&html, "chat-item active"), 1);
    assert!(t.contains("re-read when opened"), "a chat without its cache says so");
    assert_eq!(count(&html, "id=\"regenerate\""), 1, "only the last reply");
    assert_eq!(count(&html, "id=\"edit-last\""), 1, "only the last message");
    assert!(t.contains("This chat") && t.contains("Saved chat caches"), "{t}");
    // Search, Share and Import (issue 32).
    assert!(html.contains("id=\"chat-search\"") && html.contains("placeholder=\"Search chats\""), "{html}");
    assert!(html.contains("id=\"share-all\"") && t.contains("Share all"), "{t}");
    assert!(html.contains("id=\"import-chats\"") && html.contains("type=\"file\""), "{html}");
    assert_eq!(count(&html, ">Share<"), 2, "each chat has Share: {html}");
}

#[test]
fn every_message_of_yours_offers_edit_and_a_message_with_versions_switches_among_them() {
    use pocketchat::chats::branches::BranchPoint;
    let mut s = ready();
    for (prompt, reply) in [("hello", "hi"), ("tell me a story", "Once upon a time")] {
        s.submit(prompt, "");
        s.apply(EngineEvent::ReplyStarted { prompt: prompt.into() });
        tok(&mut s, reply);
        s.apply(EngineEvent::Done { reason: DoneReason::EndOfTurn });
    }
    s.apply(EngineEvent::Branches { points: vec![BranchPoint { index: 2, shown: 1, count: 3 }] });
    s.apply(EngineEvent::Stats(stats()));
    let html = render(&s, true);
    let t = text(&html);
    assert_eq!(count(&html, ">Edit<"), 2, "both of the user's messages: {html}");
    assert_eq!(count(&html, "id=\"edit-last\""), 1);
    assert_eq!(count(&html, "class=\"versions\""), 1, "{html}");
    assert!(t.contains("2/3"), "{t}");
    assert!(html.contains("aria-label=\"Previous version\"") && html.contains("aria-label=\"Next version\""), "{html}");
}

#[derive(Props, Clone, PartialEq)]
struct ModelsFixture {
    state: ChatState,
    models: pocketchat::ui::models::ModelsView,
}

fn models_root(f: ModelsFixture) -> Element {
    rsx! { pocketchat::ui::models::ModelsPanel { state: f.state, models: f.models, on_close: |_| {} } }
}

/// The model screen: the catalog as read from an empty models folder plus one file the
/// user added, one download in flight with its bar, one failed, the loaded model marked.
#[test]
fn the_model_screen_shows_fit_downloads_and_the_model_in_use() {
    use pocketchat::catalog::Progress;
    use pocketchat::ui::models::{list::scan, ModelsView, Transfer};
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    // The real default model under the catalog's own name: listed as downloaded.
    std::os::unix::fs::symlink(common_model(), &mine).unwrap();
    let mut items = scan(pocketchat::catalog::catalog(), dir.path(), RamTier::Phone6Gb);
    assert!(items.iter().any(|i| i.downloaded), "the default model is found");
    items.truncate(8);
    let downloading = items.iter().find(|i| !i.downloaded && i.not_yet.is_none()).unwrap().key.clone();
    let failed = items.iter().rev().find(|i| !i.downloaded).unwrap().key.clone();
    let progress = Progress {
        bytes: 40 << 20,
        total: Some(160 << 20),
        bytes_per_sec: (4 << 20) as f64,
        eta: Some(std::time::Duration::from_secs(30)),
        verifying: false,
    };
    let mut transfers = std::collections::BTreeMap::new();
    transfers.insert(downloading.clone(), Transfer::Running(progress));
    transfers.insert(failed.clone(), Transfer::Failed("https://x/y.gguf: not found (HTTP 404)".into()));
    let models = ModelsView { items, transfers, notice: Some("Downloaded and verified X.".into()) };
    let mut state = ChatState::new();
    state.apply(EngineEvent::Ready(ModelInfo { path: mine.display().to_string(), ..model_info() }));
    let mut dom = VirtualDom::new_with_props(models_root, ModelsFixture { state, models });
    dom.rebuild_in_place();
    let html = dioxus_ssr::render(&dom);
    let t = text(&html);
    assert!(t.contains("Add by URL") && html.contains("id=\"model-url\""), "{t}");
    assert!(t.contains("Downloaded and verified X."), "{t}");
    assert!(t.contains("In use"), "the loaded model is marked: {t}");
    assert!(html.contains("role=\"progressbar\"") && html.contains("width: 25.0%"), "{html}");
    assert!(t.contains("40.0 MiB of 160.0 MiB · 4.0 MiB/s · 30 s left"), "{t}");
    assert!(t.contains("Cancel"), "{t}");
    assert!(t.contains("not found (HTTP 404)"), "{t}");
    assert!(t.contains("fits") && t.contains("tokens ·"), "fit and budget per row: {t}");
}

fn common_model() -> std::path::PathBuf {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.exists(), "run `cargo run --release -- fetch` first");
    model
}

/// Issue #31: a hybrid model's recurrent state, with its turn checkpoints, is a row of the
/// settings panel's Model section; a plain transformer (state 0) has no such row.
#[test]
fn settings_show_a_hybrids_recurrent_state_and_not_a_transformers() {
    let plain = render(&ready(), true);
    assert!(plain.contains("data-figure=\"kv-dtype\""), "the Model section is shown: {plain}");
    assert!(!plain.contains("data-figure=\"recurrent-state\""), "{plain}");

    let mut s = ChatState::new();
    s.apply(EngineEvent::Loading { progress: 0.3, message: "reading weights".into() });
    s.apply(EngineEvent::Ready(ModelInfo {
        architecture: "qwen35".into(),
        recurrent_bytes: 5 * 20 * MIB,
        ..model_info()
    }));
    let html = render(&s, true);
    let t = text(&html);
    assert!(html.contains("data-figure=\"recurrent-state\""), "{html}");
    assert!(t.contains("Recurrent state") && t.contains("100.0 MiB · with 4 turn checkpoints"), "{t}");
}
