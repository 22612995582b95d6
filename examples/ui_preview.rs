//! Opens the desktop app on a fixed, synthetic state (no model needed), to look at the
//! UI's states: `cargo run --example ui_preview -- [empty|loading|streaming|done|evicted|missing|failed]`.
//! `live [MODEL]` starts the real app instead.

#[cfg(feature = "desktop")]
fn main() {
    use dioxus::prelude::*;
    use pocketchat::engine::{Cause, DoneReason, EngineConfig, EngineError, EngineEvent, ModelInfo, Stats};
    use pocketchat::memory::{Policy, RamTier, TierReport, GIB, MIB};
    use pocketchat::ui::state::ChatState;

    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| "evicted".into());
    if scenario == "live" {
        let model = args.next().unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
        pocketchat::ui::launch(EngineConfig::new(model));
        return;
    }

    let info = ModelInfo {
        path: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        file_bytes: 98_037_696,
        architecture: "llama".into(),
        name: "SmolLM2 135M Instruct".into(),
        weights_quant: "Q4_1".into(),
        n_layers: 30,
        context_length: 8192,
        kv_dtype: "f32".into(),
        kv_bytes_per_token: 46_080,
        recurrent_bytes: 0,
        device: "cpu".into(),
        thinking: None,
    };
    let mut s = ChatState::new();
    let apply = |s: &mut ChatState, e: EngineEvent, t: &str| s.apply_at(e, t);
    if scenario == "missing" {
        apply(
            &mut s,
            EngineEvent::Failed {
                error: EngineError::ModelMissing { path: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into() },
            },
            "",
        );
    } else if scenario == "loading" {
        apply(&mut s, EngineEvent::Loading { progress: 0.42, message: "reading weights".into() }, "");
    } else {
        apply(&mut s, EngineEvent::Ready(info), "");
        apply(
            &mut s,
            EngineEvent::Policy {
                report: TierReport {
                    physical_bytes: 15 * GIB + GIB / 2,
                    detected: RamTier::Desktop,
                    overridden: Some(RamTier::Phone6Gb),
                    bf16: None,
                },
                policy: Policy::for_tier(RamTier::Phone6Gb),
            },
            "",
        );
    }
    if matches!(scenario.as_str(), "streaming" | "done" | "evicted" | "failed") {
        s.submit("How do I reverse a list in Python?", "14:02:10");
        apply(&mut s, EngineEvent::ReplyStarted { prompt: "How do I reverse a list in Python?".into() }, "14:02:10");
        for piece in [
            "You can use **slicing** or the built-in method:\n\n",
            "1. `items[::-1]` returns a new list\n",
            "2. `items.reverse()` reverses in place\n\n",
            "```python\nitems = [1, 2, 3]\nprint(items[::-1])\n```\n\n",
            "Both are O(n).",
        ] {
            apply(&mut s, EngineEvent::Token { text: piece.into() }, "");
        }
        if scenario != "streaming" {
            apply(
                &mut s,
                EngineEvent::Stats(Stats {
                    context_tokens: 180,
                    budget: 1024,
                    kv_bytes: 180 * 46_080,
                    predicted_footprint_bytes: 190 * MIB,
                    ceiling_bytes: 3 * GIB,
                    rss_bytes: 160 * MIB,
                    prefill_tokens: 40,
                    prefill_ms: 75.0,
                    ttft_ms: 90.0,
                    decode_tok_s: 48.2,
                    generated_tokens: 52,
                    ..Stats::default()
                }),
                "",
            );
            apply(&mut s, EngineEvent::Done { reason: DoneReason::EndOfTurn }, "");
        }
    }
    if scenario == "evicted" || scenario == "failed" {
        s.submit("And for a tuple?", "14:03:00");
        apply(&mut s, EngineEvent::ReplyStarted { prompt: "And for a tuple?".into() }, "14:03:00");
        apply(&mut s, EngineEvent::Trimmed { dropped_tokens: 96, kept_tokens: 240 }, "14:03:00");
        apply(&mut s, EngineEvent::Token { text: "Tuples are immutable, so".into() }, "");
        if scenario == "evicted" {
            apply(
                &mut s,
                EngineEvent::Evicted {
                    reason: "simulated from settings".into(),
                    before_tokens: 262,
                    after_tokens: 131,
                    freed_bytes: 131 * 46_080,
                },
                "14:03:02",
            );
            apply(&mut s, EngineEvent::Done { reason: DoneReason::MemoryWarning }, "");
        } else {
            apply(
                &mut s,
                EngineEvent::Failed { error: EngineError::Inference(Cause::msg("shape mismatch in layer 3")) },
                "14:03:02",
            );
        }
    }

    #[derive(Clone)]
    struct Preview(ChatState);
    #[derive(Clone)]
    struct Open(bool);
    fn root() -> Element {
        let state = use_hook(|| consume_context::<Preview>().0);
        let open = use_hook(|| consume_context::<Open>().0);
        rsx! { pocketchat::ui::Shell { state, settings_open: open } }
    }
    // PREVIEW_SIZE=375x812 shows the phone layout; PREVIEW_SETTINGS=0 starts with it closed.
    let mut config = pocketchat::ui::app::desktop_config();
    if let Some((w, h)) = std::env::var("PREVIEW_SIZE").ok().and_then(|v| {
        let (w, h) = v.split_once('x')?;
        Some((w.parse::<f64>().ok()?, h.parse::<f64>().ok()?))
    }) {
        use dioxus::desktop::{LogicalSize, WindowBuilder};
        config = config.with_window(
            WindowBuilder::new()
                .with_title("pocketchat")
                .with_inner_size(LogicalSize::new(w, h))
                .with_always_on_top(false),
        );
    }
    let open = std::env::var("PREVIEW_SETTINGS").map(|v| v != "0").unwrap_or(true);
    dioxus::LaunchBuilder::desktop().with_cfg(config).with_context(Open(open)).with_context(Preview(s)).launch(root);
}

#[cfg(not(feature = "desktop"))]
fn main() {
    eprintln!("ui_preview needs the `desktop` feature");
}
