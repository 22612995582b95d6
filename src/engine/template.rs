//! The chat template from the GGUF (`tokenizer.chat_template`, a Jinja template) rendered
//! with minijinja; ChatML when the file has none.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use super::EngineError;

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into() }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Builds from the file's template source, falling back to ChatML when absent or broken.
    pub fn new(source: Option<&str>, bos_token: &str, eos_token: &str) -> ChatTemplate {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        let source = source.unwrap_or(CHATML).to_string();
        if let Err(e) = env.add_template_owned("chat", source) {
            tracing::warn!("chat template in the model file does not parse ({e}); using ChatML");
            env.add_template("chat", CHATML).expect("ChatML template parses");
        }
        ChatTemplate { env, bos_token: bos_token.into(), eos_token: eos_token.into() }
    }

    /// Renders the conversation; with `add_generation_prompt` it ends where the assistant speaks.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, EngineError> {
        let tmpl = self.env.get_template("chat").map_err(|e| EngineError::Inference(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| EngineError::Inference(format!("chat template: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_and_finds_the_user_header() {
        let t = ChatTemplate::new(None, "", "");
        let text = t
            .render(&[Message::new(Role::System, "sys"), Message::new(Role::User, "hi")], true)
            .unwrap();
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
    fn broken_template_falls_back_to_chatml() {
        let t = ChatTemplate::new(Some("{% for %}"), "", "");
        assert!(t.render(&[Message::new(Role::User, "x")], true).unwrap().contains("<|im_start|>user"));
    }
}
