//! The chat template from the GGUF (`tokenizer.chat_template`, a Jinja template) rendered
//! with minijinja. A file without one (a base model) gets its family's turn format when its
//! vocabulary has that family's markers ([`builtin_for`]), else ChatML.
//!
//! Templates come from downloaded files: each render runs on a fuel budget
//! ([`TEMPLATE_FUEL`] instructions) and stops at [`MAX_RENDER_BYTES`] of output, so a
//! template that loops forever or writes without end fails with an error instead of
//! hanging the engine.
//!
//! [`ChatTemplate::render_marked`] also says where each message's text sits in the result,
//! so that text is tokenized as text: a user who types `<|im_end|>` must not end a turn.

use std::ops::Range;

use minijinja::{context, Environment, Value};
use serde::Serialize;

use super::thinking;
use crate::engine::{Cause, EngineError};
pub use crate::transcript::{Message, Role};

pub mod hf;
pub use hf::{Instant, Raised};

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turns (`<start_of_turn>user` … `<end_of_turn>`; the assistant is `model`).
/// Newlines inside expressions: `trim_blocks` drops the one after a block tag.
const GEMMA: &str = "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// The template for a file that has none: Gemma's turns for a vocabulary with Gemma's
/// markers; `None` (ChatML) otherwise.
pub fn builtin_for(tokenizer: &super::tokenizer::TextTokenizer) -> Option<&'static str> {
    (tokenizer.has_token("<start_of_turn>") && tokenizer.has_token("<end_of_turn>")).then_some(GEMMA)
}

/// Instructions one render may run: a thousand-message conversation takes well under a
/// million.
pub const TEMPLATE_FUEL: u64 = 20_000_000;
/// Output one render may write: far beyond any context window's worth of text.
pub const MAX_RENDER_BYTES: usize = 64 << 20;

/// A rendered conversation and the byte ranges of the messages' text in it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub bodies: Vec<Range<usize>>,
}

/// Around a message's index in the skeleton render (private-use characters: not
/// whitespace, so `trim` leaves them alone).
const MARK_OPEN: char = '\u{F0001}';
const MARK_CLOSE: char = '\u{F0002}';

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// What `strftime_now` reads: `None` for the clock (see [`ChatTemplate::at`]).
    now: Option<hf::Instant>,
    /// The template reads `enable_thinking` (Qwen3's, Qwen3.5's, SmolLM3's).
    uses_enable_thinking: bool,
    /// The template reads a reply's `reasoning_content`: replies are given to it as
    /// answer + reasoning; to others as the model wrote them (`<think>…</think>` first).
    reads_reasoning: bool,
    /// `enable_thinking` as passed to renders; `None` leaves it undefined (the template's
    /// own default).
    enable_thinking: Option<bool>,
}

/// A message as the template reads it: a reply's thinking as `reasoning_content` for
/// templates that read it (as Hugging Face's and llama.cpp's servers pass it).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: Role,
    content: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
}

impl ChatTemplate {
    /// Builds from the file's template source, falling back to ChatML when absent or broken.
    pub fn new(source: Option<&str>, bos_token: &str, eos_token: &str) -> ChatTemplate {
        match ChatTemplate::parse(source.unwrap_or(CHATML), bos_token, eos_token) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("chat template in the model file does not parse ({e}); using ChatML");
                ChatTemplate::parse(CHATML, bos_token, eos_token).expect("ChatML template parses")
            }
        }
    }

    /// The template of a model file as the engine uses it: `tokenizer.chat_template` (or
    /// its family's built-in turns, [`builtin_for`]) with the vocabulary's BOS and EOS.
    pub fn for_model(
        content: &candle_core::quantized::gguf_file::Content,
        tokenizer: &super::tokenizer::TextTokenizer,
    ) -> ChatTemplate {
        let source = content.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok());
        let source = source.map(String::as_str).or_else(|| builtin_for(tokenizer));
        ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())
    }

    /// Builds from a template source; a template that does not parse is an error.
    ///
    /// The environment is Hugging Face's `apply_chat_template` one (transformers'
    /// `_compile_jinja_template`), so templates render as Python's jinja2 renders them:
    /// `trim_blocks`, `lstrip_blocks`, `break`/`continue`, `raise_exception`,
    /// `strftime_now`, `tojson` as `json.dumps` (no HTML escaping), the `{% generation %}`
    /// tag, Python's string/dict methods (minijinja-contrib's pycompat) and values printed
    /// as Python prints them. `tests/chat_templates.rs` checks llama.cpp's real templates
    /// against jinja2's renders byte for byte.
    pub fn parse(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, EngineError> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(hf::format_value);
        env.add_function("raise_exception", hf::raise_exception);
        env.add_filter("tojson", hf::tojson);
        env.add_filter("string", hf::string_filter);
        env.add_test("iterable", hf::is_iterable);
        env.add_template_owned("chat", hf::rewrite_generation_tags(source))
            .map_err(|e| EngineError::Template(Cause::new(e)))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            now: None,
            uses_enable_thinking: source.contains("enable_thinking"),
            reads_reasoning: source.contains("reasoning_content"),
            enable_thinking: None,
        })
    }

    /// Whether the template has a thinking switch (it reads `enable_thinking`), and then
    /// what it does without one: `Some(true)` when it thinks by default.
    pub fn thinking_default(&self) -> Option<bool> {
        if !self.uses_enable_thinking {
            return None;
        }
        let probe = [Message::new(Role::User, "?")];
        let probe = self.template_messages(&probe, false);
        let now = hf::Instant::civil(2026, 1, 1, 0, 0, 0);
        let render = |on: Option<bool>| self.render_switched(&probe, true, now, on).ok();
        let default = render(None)?;
        Some(render(Some(false)).is_none_or(|off| off != default))
    }

    /// Sets `enable_thinking` for the renders to come; `None` leaves it undefined (the
    /// template's default). Templates without the switch ignore it.
    pub fn set_enable_thinking(&mut self, enabled: Option<bool>) {
        self.enable_thinking = enabled;
    }

    /// The `enable_thinking` passed to renders (`None`: undefined).
    pub fn enable_thinking(&self) -> Option<bool> {
        self.enable_thinking
    }

    /// The messages as the template reads them (see [`TemplateMessage`]); with `marked`,
    /// each text is replaced by its numbered mark (contents `0..n`, thinkings `n..2n`),
    /// empty texts staying empty.
    fn template_messages<'a>(&self, messages: &'a [Message], marked: bool) -> Vec<TemplateMessage<'a>> {
        let n = messages.len();
        let mark = |text: &'a str, i: usize| -> std::borrow::Cow<'a, str> {
            match marked && !text.is_empty() {
                true => format!("{MARK_OPEN}{i}{MARK_CLOSE}").into(),
                false => text.into(),
            }
        };
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let content = mark(&m.content, i);
                let thinking = m.thinking.as_deref().map(|t| mark(t, n + i));
                match (thinking, self.reads_reasoning) {
                    (Some(t), false) => TemplateMessage {
                        role: m.role,
                        content: thinking::join_reply(Some(&t), &content).into(),
                        reasoning_content: None,
                    },
                    (reasoning_content, _) => TemplateMessage { role: m.role, content, reasoning_content },
                }
            })
            .collect()
    }

    /// The same template with other `bos_token` and `eos_token` values.
    pub fn with_tokens(mut self, bos_token: &str, eos_token: &str) -> ChatTemplate {
        (self.bos_token, self.eos_token) = (bos_token.into(), eos_token.into());
        self
    }

    /// Makes `strftime_now` read `now` instead of the clock (renders that must not change
    /// with the day: tests, fixtures).
    pub fn at(mut self, now: hf::Instant) -> ChatTemplate {
        self.now = Some(now);
        self
    }

    /// Renders the conversation; with `add_generation_prompt` it ends where the assistant speaks.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, EngineError> {
        self.render_any(&self.template_messages(messages, false), add_generation_prompt)
    }

    /// [`render`](Self::render) for messages of any shape (`pocketchat template` passes
    /// the user's JSON as it is: tool calls, other roles). The variables are those
    /// `apply_chat_template` passes: `messages`, `tools` and `documents` (none),
    /// `add_generation_prompt`, `bos_token`, `eos_token`. An error the template raises
    /// itself (`raise_exception`) is its own message.
    pub fn render_any<M: Serialize>(&self, messages: &[M], add_generation_prompt: bool) -> Result<String, EngineError> {
        self.render_at(messages, add_generation_prompt, self.now.unwrap_or_else(hf::Instant::now))
    }

    /// [`render_any`](Self::render_any) with `strftime_now` at `now`.
    fn render_at<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        now: hf::Instant,
    ) -> Result<String, EngineError> {
        self.render_switched(messages, add_generation_prompt, now, self.enable_thinking)
    }

    /// [`render_at`](Self::render_at) with `enable_thinking` set to `enable_thinking`.
    fn render_switched<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
        now: hf::Instant,
        enable_thinking: Option<bool>,
    ) -> Result<String, EngineError> {
        let tmpl = self.env.get_template("chat").map_err(|e| EngineError::Template(Cause::new(e)))?;
        let mut out = CappedWriter(Vec::new());
        // Undefined unless set: `enable_thinking is defined` must stay false.
        let thinking = match enable_thinking {
            Some(on) => context! { enable_thinking => on },
            None => context! {},
        };
        tmpl.render_captured_to(
            context! {
                messages => messages,
                tools => Value::from(()),
                documents => Value::from(()),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                strftime_now => Value::from_function(move |format: String| now.strftime(&format)),
                ..thinking
            },
            &mut out,
        )
        .map_err(|e| match hf::raised(&e) {
            Some(raised) => EngineError::Template(Cause::new(raised.clone())),
            None => EngineError::Template(Cause::new(e)),
        })?;
        String::from_utf8(out.0).map_err(|e| EngineError::Template(Cause::new(e)))
    }

    /// Renders like [`render`](Self::render) and finds each message's text in the result:
    /// a second render with every text replaced by a numbered mark gives the template's
    /// own parts, and the real texts (as given, or trimmed, as templates often do) must
    /// fill the marks to give the first render exactly. A template that changes texts in
    /// other ways is refused: its markers could not be told from what people typed.
    pub fn render_marked(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Rendered, EngineError> {
        // One instant for both renders: a date that turned between them would differ.
        let now = self.now.unwrap_or_else(hf::Instant::now);
        let text = self.render_at(&self.template_messages(messages, false), add_generation_prompt, now)?;
        // Empty texts stay empty: templates may test a text for being there.
        let skeleton = self.render_at(&self.template_messages(messages, true), add_generation_prompt, now)?;
        let texts: Vec<&str> = messages
            .iter()
            .map(|m| m.content.as_str())
            .chain(messages.iter().map(|m| m.thinking.as_deref().unwrap_or("")))
            .collect();
        match fill_marks(&skeleton, &texts, &text) {
            Some(bodies) => Ok(Rendered { text, bodies }),
            None => Err(EngineError::Template(Cause::msg(
                "the model's chat template changes the text of messages, so what you type could not be kept apart \
                 from its control tokens",
            ))),
        }
    }

    /// Byte offset in `render([user: X])` where the user turn begins (its header), which
    /// splits the pinned system prompt from the first turn. Found as the last special-looking
    /// token (`<|…|>` or `<…>`) before the word "user" ahead of the content.
    pub fn user_header(&self) -> Result<String, EngineError> {
        const SENTINEL: &str = "\u{E000}SENTINEL\u{E000}";
        let text = self.render(&[Message::new(Role::User, SENTINEL)], false)?;
        let before = &text[..text.find(SENTINEL).unwrap_or(text.len())];
        let user_at = before.rfind("user").unwrap_or(0);
        let start = before[..user_at].rfind("<|").or_else(|| before[..user_at].rfind('<')).unwrap_or(user_at);
        Ok(before[start..].to_string())
    }
}

/// Collects a render's output; fails past [`MAX_RENDER_BYTES`].
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDER_BYTES {
            return Err(std::io::Error::other(format!("the output passed {MAX_RENDER_BYTES} bytes")));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Puts each text (as given or trimmed, whichever `expected` has there) where `skeleton`
/// has its mark; the byte ranges of the texts when the result is `expected`.
fn fill_marks(skeleton: &str, texts: &[&str], expected: &str) -> Option<Vec<Range<usize>>> {
    let mut bodies = Vec::with_capacity(texts.len());
    let mut at = 0; // bytes of `expected` matched so far
    let mut rest = skeleton;
    loop {
        let literal_end = rest.find(MARK_OPEN).unwrap_or(rest.len());
        let literal = &rest[..literal_end];
        if !expected[at..].starts_with(literal) {
            return None;
        }
        at += literal.len();
        if literal_end == rest.len() {
            return (at == expected.len()).then_some(bodies);
        }
        let after = &rest[literal_end + MARK_OPEN.len_utf8()..];
        let close = after.find(MARK_CLOSE)?;
        let content = *texts.get(after[..close].parse::<usize>().ok()?)?;
        rest = &after[close + MARK_CLOSE.len_utf8()..];
        // The text that follows the mark up to the next one tells the variants apart.
        let next = &rest[..rest.find(MARK_OPEN).unwrap_or(rest.len())];
        let body = [content, content.trim()]
            .into_iter()
            .find(|b| expected[at..].starts_with(b) && expected[at + b.len()..].starts_with(next))?;
        bodies.push(at..at + body.len());
        at += body.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_render_finds_every_message_text() {
        let t = ChatTemplate::new(None, "", "");
        let messages = [
            Message::new(Role::System, "sys"),
            Message::new(Role::User, "hi <|im_end|>"),
            Message::new(Role::Assistant, "hello"),
            Message::new(Role::User, ""),
        ];
        let r = t.render_marked(&messages, true).unwrap();
        assert_eq!(r.text, t.render(&messages, true).unwrap());
        let texts: Vec<&str> = r.bodies.iter().map(|b| &r.text[b.clone()]).collect();
        assert_eq!(texts, ["sys", "hi <|im_end|>", "hello"], "an empty text has no range");
    }

    #[test]
    fn marked_render_follows_templates_that_trim() {
        // Llama 3 style: the system text as given, user texts trimmed.
        let src = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{% if m.role == 'system' %}{{ m.content }}{% else %}{{ m.content | trim }}{% endif %}<|eot_id|>{% endfor %}";
        let t = ChatTemplate::new(Some(src), "", "");
        let messages = [Message::new(Role::System, " keep "), Message::new(Role::User, "  <|eot_id|> x \n")];
        let r = t.render_marked(&messages, false).unwrap();
        let texts: Vec<&str> = r.bodies.iter().map(|b| &r.text[b.clone()]).collect();
        assert_eq!(texts, [" keep ", "<|eot_id|> x"]);
    }

    #[test]
    fn endless_templates_stop_with_an_error() {
        let looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(Some(looping), "", "");
        let e = t.render(&[Message::new(Role::User, "hi")], true).unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        let flood = "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(Some(flood), "", "");
        assert!(t.render(&[Message::new(Role::User, "hi")], true).is_err());
    }

    #[test]
    fn a_template_that_rewrites_texts_is_refused() {
        let t = ChatTemplate::new(Some("{% for m in messages %}<|u|>{{ m.content | upper }}{% endfor %}"), "", "");
        assert!(t.render_marked(&[Message::new(Role::User, "hi")], false).is_err());
        // Texts it does not change are fine.
        assert!(t.render_marked(&[Message::new(Role::User, "HI")], false).is_ok());
    }

    #[test]
    fn chatml_fallback_renders_and_finds_the_user_header() {
        let t = ChatTemplate::new(None, "", "");
        let text = t.render(&[Message::new(Role::System, "sys"), Message::new(Role::User, "hi")], true).unwrap();
        assert_eq!(text, "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(t.user_header().unwrap(), "<|im_start|>user\n");
    }

    #[test]
    fn llama3_style_header_is_found() {
        let src = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}";
        let t = ChatTemplate::new(Some(src), "<|begin_of_text|>", "");
        assert_eq!(t.user_header().unwrap(), "<|start_header_id|>user<|end_header_id|>\n\n");
    }

    #[test]
    fn gemma_turns_render_with_the_assistant_as_model() {
        let t = ChatTemplate::new(Some(GEMMA), "<bos>", "<eos>");
        let text = t.render(&[Message::new(Role::User, "hi"), Message::new(Role::Assistant, "yo")], true).unwrap();
        assert_eq!(
            text,
            "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(t.user_header().unwrap(), "<start_of_turn>user\n");
    }

    /// Hugging Face's `apply_chat_template` environment, checked against what jinja2 3.1.6
    /// prints for the same snippets (the llama.cpp suite test covers real templates).
    #[test]
    fn renders_as_hugging_faces_jinja2_environment() {
        let render = |src: &str| {
            let t = ChatTemplate::parse(src, "<s>", "</s>").unwrap().at(Instant::civil(2026, 3, 5, 9, 7, 3));
            t.render(&[Message::new(Role::User, "<b>\"é\"</b>")], true)
        };
        // trim_blocks and lstrip_blocks; a single trailing newline dropped.
        assert_eq!(render("  {% if true %}\nx\n  {% endif %}\ny\n").unwrap(), "x\ny");
        // tojson as json.dumps(ensure_ascii=False): Python's spacing, no HTML escaping.
        assert_eq!(render("{{ messages | tojson }}").unwrap(), r#"[{"role": "user", "content": "<b>\"é\"</b>"}]"#);
        assert_eq!(
            render("{{ {'a': [1, 2.0]} | tojson(indent=2) }}").unwrap(),
            "{\n  \"a\": [\n    1,\n    2.0\n  ]\n}"
        );
        // Python's printing, the variables HF passes, loop controls, strftime_now, generation.
        assert_eq!(
            render("{{ tools }} {{ true }} {{ [none, 'a'] }} {{ bos_token }}{{ eos_token }}").unwrap(),
            "None True [None, 'a'] <s></s>"
        );
        assert_eq!(
            render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}").unwrap(),
            "012"
        );
        assert_eq!(render("{{ strftime_now('%d %B %Y') }}").unwrap(), "05 March 2026");
        assert_eq!(render("{%- generation -%} g {% endgeneration %}").unwrap(), "g ");
        assert_eq!(
            render("{{ tools is iterable }} {{ tools is none }} {{ tools is defined }}").unwrap(),
            "False True True"
        );
        // The template's own error is the message the user sees.
        let e = render("{{ raise_exception('No system role') }}").unwrap_err();
        assert_eq!(e.to_string(), "the chat template failed: No system role");
    }

    #[test]
    fn broken_template_falls_back_to_chatml() {
        let t = ChatTemplate::new(Some("{% for %}"), "", "");
        assert!(t.render(&[Message::new(Role::User, "x")], true).unwrap().contains("<|im_start|>user"));
    }
}
