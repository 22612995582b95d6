//! `pocketchat template`: the exact prompt text the engine feeds for a conversation, the
//! way llama-server's `/apply-template` shows it. Part of the binary only.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args};
use minijinja::Value;
use pocketchat::engine::template::{ChatTemplate, Instant};

/// Prints the prompt the engine would feed for a conversation, exactly (no newline added)
#[derive(Args)]
#[command(group(ArgGroup::new("source").required(true).args(["model", "template"])))]
pub struct TemplateArgs {
    /// A GGUF model file: its chat template, BOS and EOS tokens, as the engine uses them
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// A Jinja chat template file (Hugging Face's `chat_template`, llama.cpp's `.jinja`)
    #[arg(long, value_name = "FILE")]
    template: Option<PathBuf>,
    /// The conversation: a JSON array of messages, `[{"role": "user", "content": "Hi"}, ...]`
    /// (other keys, e.g. `tool_calls`, go to the template as they are); `-` reads standard
    /// input [default: a user turn, an assistant reply and a second user turn]
    #[arg(long, value_name = "FILE.json")]
    messages: Option<PathBuf>,
    /// The `bos_token` the template sees [default: the model's with --model, else empty]
    #[arg(long, value_name = "S")]
    bos: Option<String>,
    /// The `eos_token` the template sees [default: the model's with --model, else empty]
    #[arg(long, value_name = "S")]
    eos: Option<String>,
    /// End with the last message instead of opening the assistant's turn
    #[arg(long)]
    no_generation_prompt: bool,
    /// What the template's `strftime_now` reads, `YYYY-MM-DD[THH:MM[:SS]]` [default: now,
    /// local time]
    #[arg(long, value_name = "DATE")]
    now: Option<String>,
}

const DEFAULT_CONVERSATION: &str = r#"[
  {"role": "user", "content": "Hello!"},
  {"role": "assistant", "content": "Hi! How can I help you today?"},
  {"role": "user", "content": "What is the capital of France?"}
]"#;

pub fn run(args: &TemplateArgs) -> Result<()> {
    let template = match (&args.model, &args.template) {
        (Some(model), _) => {
            let (content, _) = pocketchat::engine::model::read_gguf(model)?;
            let tokenizer = pocketchat::engine::tokenizer::TextTokenizer::from_gguf(&content)?;
            let template = ChatTemplate::for_model(&content, &tokenizer);
            let bos = args.bos.as_deref().unwrap_or(tokenizer.bos_token());
            template.with_tokens(bos, args.eos.as_deref().unwrap_or(tokenizer.eos_token()))
        }
        (None, Some(file)) => {
            let source = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            ChatTemplate::parse(&source, args.bos.as_deref().unwrap_or(""), args.eos.as_deref().unwrap_or(""))
                .with_context(|| format!("{} is not a template", file.display()))?
        }
        (None, None) => unreachable!("clap requires --model or --template"),
    };
    let template = match &args.now {
        Some(now) => template.at(Instant::from_iso(now).context("--now takes YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]")?),
        None => template,
    };
    let messages = read_messages(args.messages.as_ref())?;
    let prompt = template.render_any(&messages, !args.no_generation_prompt)?;
    out!("{prompt}");
    Ok(())
}

/// The conversation as JSON values in the file's key order (templates that print a
/// message or `tojson` it see the keys as written).
fn read_messages(path: Option<&PathBuf>) -> Result<Vec<Value>> {
    let (text, from) = match path {
        None => (DEFAULT_CONVERSATION.to_string(), "the default conversation".to_string()),
        Some(p) if p.as_os_str() == "-" => {
            (std::io::read_to_string(std::io::stdin()).context("reading standard input")?, "standard input".into())
        }
        Some(p) => {
            (std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?, p.display().to_string())
        }
    };
    let messages: Vec<Value> = serde_json::from_str(&text)
        .with_context(|| format!("{from}: expected a JSON array of messages, [{{\"role\": ..., \"content\": ...}}]"))?;
    for (i, m) in messages.iter().enumerate() {
        if m.get_attr("role").ok().and_then(|r| r.as_str().map(str::to_owned)).is_none() {
            bail!("{from}: message {i} has no \"role\" string");
        }
    }
    Ok(messages)
}
