//! The settings panel: a side panel on wide windows, a bottom sheet on phones (the
//! stylesheet decides by width). It shows what the memory policy is doing — detected
//! RAM and tier with the QA override selector, the loaded weights' real quantization,
//! the model file, the live token count against the budget, KV cache bytes, predicted
//! footprint against the tier's ceiling, resident memory, decode speed and a log of
//! trims and evictions — and offers *Simulate memory warning* and *Reset context*.

use dioxus::prelude::*;

use crate::engine::state::MAX_CHECKPOINTS;
use crate::engine::{Command, Stats};
use crate::memory::RamTier;

use super::copy;
use super::engine_link::send_command;
use super::fmt::{format_bytes, format_ms, format_rate, percent};
use super::meter::LiveFigures;
use super::state::{ChatState, LogKind, SamplingView};
use crate::engine::sampler::SamplingOverrides;

#[component]
pub fn SettingsPanel(state: ReadSignal<ChatState>, on_close: EventHandler<()>) -> Element {
    let ready = use_memo(move || state.read().is_ready());
    let ready = ready();
    let last_error = use_memo(move || state.read().last_error.clone());
    rsx! {
        div { class: "sheet-backdrop", onclick: move |_| on_close.call(()) }
        aside { class: "settings", aria_label: copy::SETTINGS,
            div { class: "sheet-handle", aria_hidden: "true" }
            header { class: "settings-head",
                h2 { {copy::SETTINGS_HEADING} }
                button { class: "btn ghost close", r#type: "button", onclick: move |_| on_close.call(()), {copy::DONE} }
            }
            div { class: "settings-scroll",
                section { class: "panel-section actions-section",
                    button {
                        id: "simulate-warning",
                        class: "btn danger big",
                        r#type: "button",
                        disabled: !ready,
                        onclick: move |_| send_command(Command::MemoryWarning { reason: copy::SIMULATED_REASON.into() }),
                        "data-qa": "simulate_warning",
                        {copy::SETTINGS_SIMULATE_WARNING}
                    }
                    p { class: "hint", {copy::SETTINGS_SIMULATE_WARNING_HINT} }
                    button {
                        id: "reset-context",
                        class: "btn secondary",
                        r#type: "button",
                        disabled: !ready,
                        onclick: move |_| send_command(Command::NewConversation),
                        {copy::SETTINGS_RESET_CONTEXT}
                    }
                }
                ContextSection { state }
                ChatSection { state, ready }
                GenerationSection { state, ready }
                DeviceSection { state }
                ModelSection { state }
                LogSection { state }
                if let Some(error) = last_error() {
                    section { class: "panel-section",
                        h3 { {copy::SETTINGS_LAST_ERROR} }
                        p { class: "last-error", "{error}" }
                    }
                }
            }
        }
    }
}

/// A label and its value.
#[component]
fn Figure(name: String, label: String, value: String) -> Element {
    rsx! {
        div { class: "figure", "data-figure": "{name}",
            span { class: "figure-label", "{label}" }
            span { class: "figure-value", "{value}" }
        }
    }
}

/// A labelled bar: `used` of `total`.
#[component]
fn Meter(name: String, label: String, used: f64, total: f64, text: String) -> Element {
    let pct = percent(used, total);
    let level = if pct >= 90.0 {
        "high"
    } else if pct >= 70.0 {
        "mid"
    } else {
        "low"
    };
    rsx! {
        div { class: "meter meter-{level}", "data-figure": "{name}",
            div { class: "meter-top",
                span { class: "figure-label", "{label}" }
                span { class: "figure-value", "{text}" }
            }
            div { class: "bar", role: "meter", aria_valuenow: "{used}", aria_valuemin: "0", aria_valuemax: "{total}",
                div { class: "bar-fill", style: "width: {pct:.1}%" }
            }
        }
    }
}

#[component]
fn ContextSection(state: ReadSignal<ChatState>) -> Element {
    let figures = use_memo(move || {
        let s = state.read();
        (s.stats.clone(), s.budget().unwrap_or(0), s.ceiling_bytes().unwrap_or(0))
    });
    // Refreshed a few times a second while a reply streams (see `engine_link::bridge`).
    let live = try_consume_context::<Signal<Option<LiveFigures>>>().and_then(|l| l());
    let (stats, budget, ceiling) = figures();
    let Some(stats) = stats else {
        let budget = if budget > 0 { budget.to_string() } else { copy::NO_FIGURE.into() };
        return rsx! {
            section { class: "panel-section",
                h3 { {copy::CONTEXT} }
                Figure { name: "budget", label: copy::TOKEN_BUDGET, value: "{budget}" }
                p { class: "hint", {copy::FIGURES_AFTER_FIRST_REPLY} }
            }
        };
    };
    let context_tokens = live.map_or(stats.context_tokens, |l| l.context_tokens);
    let (decode_label, decode_rate) = match live {
        Some(l) => (copy::SPEED_SHOWN_NOW, l.reply_tok_s),
        None => (copy::SPEED_DECODE, stats.decode_tok_s),
    };
    rsx! {
        section { class: "panel-section",
            h3 { {copy::CONTEXT} }
            Meter {
                name: "tokens",
                label: copy::TOKENS_IN_CONTEXT,
                used: context_tokens as f64,
                total: budget as f64,
                text: "{context_tokens} / {budget}",
            }
            Meter {
                name: "footprint",
                label: copy::PREDICTED_FOOTPRINT,
                used: stats.predicted_footprint_bytes as f64,
                total: ceiling as f64,
                text: copy::used_of(&format_bytes(stats.predicted_footprint_bytes), &format_bytes(ceiling)),
            }
            if stats.tier_budget > 0 && stats.tier_budget != budget {
                div { class: "budget-note", "data-figure": "budget-note",
                    div { class: "figure-value", {copy::budget_of_tier(budget, stats.tier_budget)} }
                    if let Some(note) = &stats.budget_note {
                        div { class: "hint", "{note}" }
                    }
                }
            }
            Figure { name: "kv-bytes", label: copy::KV_CACHE, value: format_bytes(stats.kv_bytes) }
            Figure {
                name: "dirty",
                label: copy::DIRTY_MEMORY,
                value: if stats.footprint_bytes > 0 { format_bytes(stats.footprint_bytes) } else { copy::NO_FIGURE.to_string() },
            }
            Figure {
                name: "mapped",
                label: copy::MAPPED_WEIGHTS,
                value: format_bytes(stats.mapped_weights_bytes),
            }
            Figure {
                name: "rss",
                label: copy::RESIDENT_MEMORY,
                value: if stats.rss_bytes > 0 { format_bytes(stats.rss_bytes) } else { copy::NO_FIGURE.to_string() },
            }
            Figure { name: "decode", label: decode_label.to_string(), value: format_rate(decode_rate) }
            Figure { name: "ttft", label: copy::FIRST_TOKEN, value: format_ms(stats.ttft_ms) }
            Figure {
                name: "prefill",
                label: copy::LAST_PREFILL,
                value: prefill_figure(&stats),
            }
        }
    }
}

/// "12 tokens in 20 ms", and how many more were read ahead while the message was typed.
fn prefill_figure(stats: &Stats) -> String {
    match (stats.prefill_tokens, stats.drafted_tokens) {
        (0, 0) => copy::NO_FIGURE.to_string(),
        (fed, 0) => copy::prefill_fed(fed, &format_ms(stats.prefill_ms)),
        (0, ahead) => copy::prefill_all_ahead(ahead),
        (fed, ahead) => copy::prefill_fed_and_ahead(fed, &format_ms(stats.prefill_ms), ahead),
    }
}

/// The open chat: its own system prompt (saved with the chat; the conversation is re-read
/// with it at the next message) and the chats' caches on disk against their cap.
#[component]
fn ChatSection(state: ReadSignal<ChatState>, ready: bool) -> Element {
    let chat = use_memo(move || {
        let s = state.read();
        (s.active_chat.clone(), s.system_prompt.clone().unwrap_or_default(), s.chat_caches)
    });
    // `id` only feeds the component key below, which rsx! reads under debug assertions
    // only: without them (release, and the test profile) the variable looks unused.
    #[allow(unused_variables)]
    let (Some(id), prompt, caches) = chat() else {
        return rsx! {};
    };
    rsx! {
        section { class: "panel-section", "data-section": "chat",
            h3 { {copy::THIS_CHAT} }
            SystemPromptField { key: "{id}", prompt, ready }
            if let Some((bytes, cap)) = caches {
                Meter {
                    name: "chat-caches",
                    label: copy::SAVED_CHAT_CACHES,
                    used: bytes as f64,
                    total: cap as f64,
                    text: copy::used_of(&format_bytes(bytes), &format_bytes(cap)),
                }
                p { class: "hint", {copy::CHAT_CACHES_HINT} }
            }
        }
    }
}

/// The system prompt's field; *Save* sends it (keyed by chat, so switching chats starts
/// from the other chat's prompt).
#[component]
fn SystemPromptField(prompt: String, ready: bool) -> Element {
    let mut draft = use_signal(|| prompt.clone());
    let changed = draft.read().trim() != prompt.trim();
    rsx! {
        label { class: "field", "data-figure": "system-prompt",
            span { class: "figure-label", {copy::SYSTEM_PROMPT} }
            textarea { class: "system-prompt", rows: "3", value: "{draft}",
                placeholder: copy::SYSTEM_PROMPT_PLACEHOLDER,
                disabled: !ready,
                oninput: move |e: FormEvent| draft.set(e.value()),
            }
        }
        button { class: "btn secondary", r#type: "button", id: "save-system-prompt",
            disabled: !ready || !changed,
            onclick: move |_| send_command(Command::SetSystemPrompt { text: draft.peek().clone() }),
            {copy::SAVE_SYSTEM_PROMPT}
        }
    }
}

/// The sampling settings, each editable, with the model's default beside a changed one
/// and a reset to the model's defaults. Changes apply from the next reply.
#[component]
fn GenerationSection(state: ReadSignal<ChatState>, ready: bool) -> Element {
    let sampling = use_memo(move || state.read().sampling);
    let Some(SamplingView { params: p, defaults: d, overrides }) = sampling() else {
        return rsx! {
            section { class: "panel-section",
                h3 { {copy::GENERATION} }
                p { class: "hint", {copy::GENERATION_BEFORE_LOAD} }
            }
        };
    };
    // Sends the overrides with one field changed; text that is not a number is ignored
    // (the engine clamps numbers to their range).
    let set = move |change: fn(&mut SamplingOverrides, f32), text: String| {
        if let Ok(x) = text.trim().parse::<f32>() {
            if x.is_finite() {
                let mut o = overrides;
                change(&mut o, x);
                send_command(Command::SetSampling { overrides: o });
            }
        }
    };
    rsx! {
        section { class: "panel-section", "data-section": "generation",
            h3 { {copy::GENERATION} }
            SamplingRow {
                name: "temperature", label: copy::TEMPERATURE, value: p.temperature, default: d.temperature,
                step: 0.05, max: 5.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.temperature = Some(x), t),
            }
            SamplingRow {
                name: "top-k", label: copy::TOP_K, value: p.top_k as f32, default: d.top_k as f32,
                step: 1.0, max: 1000.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.top_k = Some(x.max(0.0) as usize), t),
            }
            SamplingRow {
                name: "top-p", label: copy::TOP_P, value: p.top_p, default: d.top_p,
                step: 0.01, max: 1.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.top_p = Some(x), t),
            }
            SamplingRow {
                name: "min-p", label: copy::MIN_P, value: p.min_p, default: d.min_p,
                step: 0.01, max: 1.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.min_p = Some(x), t),
            }
            SamplingRow {
                name: "repeat-penalty", label: copy::REPEAT_PENALTY, value: p.repeat_penalty, default: d.repeat_penalty,
                step: 0.05, max: 10.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.repeat_penalty = Some(x), t),
            }
            SamplingRow {
                name: "dry-multiplier", label: copy::DRY_MULTIPLIER, value: p.dry_multiplier, default: d.dry_multiplier,
                step: 0.05, max: 10.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.dry_multiplier = Some(x), t),
            }
            SamplingRow {
                name: "dry-base", label: copy::DRY_BASE, value: p.dry_base, default: d.dry_base,
                step: 0.05, max: 10.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.dry_base = Some(x), t),
            }
            SamplingRow {
                name: "dry-allowed-length", label: copy::DRY_ALLOWED_LENGTH, value: p.dry_allowed_length as f32,
                default: d.dry_allowed_length as f32, step: 1.0, max: 1000.0, disabled: !ready,
                on_set: move |t| set(|o, x| o.dry_allowed_length = Some(x.max(0.0) as usize), t),
            }
            button {
                id: "reset-sampling",
                class: "btn secondary",
                r#type: "button",
                disabled: !ready || overrides == SamplingOverrides::default(),
                onclick: move |_| send_command(Command::SetSampling { overrides: SamplingOverrides::default() }),
                {copy::RESET_SAMPLING}
            }
            p { class: "hint",
                if p.temperature <= 0.0 { {copy::GREEDY_HINT} } else { {copy::seed_hint(p.seed)} }
            }
        }
    }
}

/// One sampling setting: a number field, and the model's default when it differs.
#[component]
fn SamplingRow(
    name: &'static str,
    label: &'static str,
    value: f32,
    default: f32,
    step: f32,
    max: f32,
    disabled: bool,
    on_set: EventHandler<String>,
) -> Element {
    rsx! {
        label { class: "figure select-row", "data-figure": name,
            span { class: "figure-label", "{label}" }
            span { class: "figure-value",
                input {
                    class: "number-input",
                    r#type: "number",
                    value: "{value}",
                    step: "{step}",
                    min: "0",
                    max: "{max}",
                    disabled,
                    onchange: move |e: FormEvent| on_set.call(e.value()),
                }
                if value != default {
                    span { class: "hint default-note", {copy::model_default(default)} }
                }
            }
        }
    }
}

#[component]
fn DeviceSection(state: ReadSignal<ChatState>) -> Element {
    let figures = use_memo(move || {
        let s = state.read();
        let threads = s.stats.as_ref().map(|s| (s.compute_threads, s.available_cores));
        (s.tier.clone(), s.policy, threads)
    });
    let (tier, policy, threads) = figures();
    let Some(report) = tier else {
        return rsx! {
            section { class: "panel-section",
                h3 { {copy::DEVICE} }
                p { class: "hint", {copy::DETECTING_MEMORY} }
            }
        };
    };
    let selected = report.overridden.map(|t| t.id()).unwrap_or("auto");
    rsx! {
        section { class: "panel-section",
            h3 { {copy::DEVICE} }
            Figure { name: "ram", label: copy::PHYSICAL_MEMORY, value: format_bytes(report.physical_bytes) }
            Figure { name: "detected-tier", label: copy::DETECTED_TIER, value: report.detected.label() }
            if let Some(bf16) = report.bf16 {
                Figure { name: "bf16", label: copy::BF16, value: if bf16 { copy::YES } else { copy::NO } }
            }
            label { class: "figure select-row", r#for: "tier-override",
                span { class: "figure-label", {copy::TIER} }
                select {
                    id: "tier-override",
                    class: "tier-select",
                    value: "{selected}",
                    onchange: move |e: FormEvent| {
                        let tier = RamTier::parse(&e.value());
                        send_command(Command::SetPolicy { tier });
                    },
                    option { value: "auto", selected: selected == "auto", {copy::tier_auto(report.detected.label())} }
                    for tier in RamTier::ALL {
                        option { key: "{tier.id()}", value: tier.id(), selected: selected == tier.id(), "{tier.label()}" }
                    }
                }
            }
            if report.overridden.is_some() {
                p { class: "hint override-note", {copy::tier_overridden(report.detected.label())} }
            }
            if let Some((threads, cores)) = threads.filter(|(t, _)| *t > 0) {
                ThreadsRow { threads, cores }
            }
            if let Some(p) = policy {
                Figure { name: "policy", label: copy::POLICY, value: copy::policy(p.quant.label(), p.token_budget, &format_bytes(p.ceiling_bytes)) }
                Figure { name: "budget-why", label: copy::BUDGET_SET_BY, value: p.why().to_string() }
            }
        }
    }
}

#[component]
fn ModelSection(state: ReadSignal<ChatState>) -> Element {
    let model = use_memo(move || state.read().model.clone());
    let Some(m) = model() else {
        return rsx! {
            section { class: "panel-section",
                h3 { {copy::MODEL} }
                p { class: "hint", {copy::NO_MODEL_YET} }
            }
        };
    };
    let file = std::path::Path::new(&m.path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| m.path.clone());
    rsx! {
        section { class: "panel-section",
            h3 { {copy::MODEL} }
            Figure { name: "model-name", label: copy::MODEL, value: "{m.name}" }
            div { class: "figure", "data-figure": "model-file", title: "{m.path}",
                span { class: "figure-label", {copy::FILE} }
                span { class: "figure-value mono", "{file}" }
            }
            Figure { name: "model-size", label: copy::FILE_SIZE, value: format_bytes(m.file_bytes) }
            Figure { name: "weights", label: copy::WEIGHTS_LOADED, value: "{m.weights_quant}" }
            Figure { name: "arch", label: copy::ARCHITECTURE, value: copy::architecture(&m.architecture, m.n_layers) }
            Figure { name: "kv-dtype", label: copy::KV_CACHE, value: copy::kv_per_token(&m.kv_dtype, &format_bytes(m.kv_bytes_per_token)) }
            if m.recurrent_bytes > 0 {
                Figure {
                    name: "recurrent-state",
                    label: copy::RECURRENT_STATE_LABEL,
                    value: copy::recurrent_state(&format_bytes(m.recurrent_bytes), MAX_CHECKPOINTS),
                }
            }
            Figure { name: "device", label: copy::RUNS_ON, value: "{m.device}" }
        }
    }
}

#[component]
fn LogSection(state: ReadSignal<ChatState>) -> Element {
    let figures = use_memo(move || {
        let s = state.read();
        (s.log.clone(), s.last_save.clone())
    });
    let (log, last_save) = figures();
    rsx! {
        section { class: "panel-section",
            h3 { {copy::TRIMS_AND_EVICTIONS} }
            if let Some(save) = &last_save {
                div { class: "figure", "data-figure": "last-save", title: "{save.path}",
                    span { class: "figure-label", {copy::SAVED} }
                    span { class: "figure-value", {copy::saved_at(&format_bytes(save.bytes), &format_ms(save.ms), &save.time)} }
                }
            }
            if log.is_empty() {
                p { class: "hint", {copy::NONE_YET} }
            } else {
                ol { class: "event-log",
                    for (i, entry) in log.iter().enumerate().rev() {
                        li {
                            key: "{i}",
                            class: match entry.kind {
                                LogKind::Trim => "log-trim",
                                LogKind::Eviction => "log-eviction",
                                LogKind::Restore => "log-restore",
                            },
                            time { "{entry.time}" }
                            span { "{entry.text}" }
                        }
                    }
                }
            }
        }
    }
}

/// The compute threads in use, with a selector to change them (the engine applies it
/// from its next step; a reply in progress finishes on the old count).
#[component]
fn ThreadsRow(threads: usize, cores: usize) -> Element {
    rsx! {
        label { class: "figure select-row", r#for: "threads-override", "data-figure": "threads",
            span { class: "figure-label", {copy::COMPUTE_THREADS} }
            select {
                id: "threads-override",
                class: "tier-select",
                value: "{threads}",
                onchange: move |e: FormEvent| {
                    if let Ok(n) = e.value().parse::<usize>() {
                        send_command(Command::SetThreads { threads: Some(n) });
                    }
                },
                for n in 1..=cores.max(threads) {
                    option { key: "{n}", value: "{n}", selected: n == threads, {copy::threads_of_cores(n, cores)} }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_prefill_says_what_was_read_while_typing() {
        let figure = |prefill_tokens, drafted_tokens| {
            prefill_figure(&Stats { prefill_tokens, drafted_tokens, prefill_ms: 21.0, ..Default::default() })
        };
        assert_eq!(figure(0, 0), "—");
        assert!(figure(42, 0).starts_with("42 tokens in "), "{}", figure(42, 0));
        assert!(figure(8, 34).ends_with("(+34 read as you typed)"), "{}", figure(8, 34));
        assert_eq!(figure(0, 42), "none: all 42 tokens were read as you typed");
    }
}
