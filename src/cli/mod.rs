//! The command line: [`Cli`] parses it, [`run`] dispatches to one module per command
//! group (the flags they share are in [`args`]).

use anyhow::Result;
use clap::{Parser, Subcommand};

mod args;
mod chat;
mod chats;
mod ctrl_c;
mod models;
mod template;
mod tools;

use args::EngineArgs;
use chat::ChatArgs;
use chats::ChatsArgs;
use models::{FetchArgs, ModelsArgs, QuantizeArgs};
use tools::{BenchArgs, LogitsArgs, PerplexityArgs, TokenizeArgs};

/// On-device chat with a persistent KV cache. Without a command: the chat app.
#[derive(Parser)]
#[command(name = "pocketchat", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Sub>,
    #[command(flatten)]
    pub app: EngineArgs,
}

#[derive(Subcommand)]
pub enum Sub {
    /// The chat app (desktop builds; the default)
    App(EngineArgs),
    /// Terminal chat: one prompt per line from the terminal or a pipe; `/warn` simulates a
    /// memory warning between replies; Ctrl-C stops the reply
    Chat(ChatArgs),
    /// Prefill and decode tok/s and the time to first token per turn on a synthetic prompt
    Bench(BenchArgs),
    /// Token ids of TEXT as a JSON array (special tokens parsed)
    Tokenize(TokenizeArgs),
    /// The exact prompt text the engine feeds for a conversation (chat template applied)
    Template(template::TemplateArgs),
    /// The saved chats, most recent first
    Chats(ChatsArgs),
    /// Download a catalog model by id, or any GGUF by URL (default: the default model)
    Fetch(FetchArgs),
    /// The model catalog with each model's fit for this device (or --tier)
    Models(ModelsArgs),
    /// Write a copy of a model file in another type (default Q8_0), on request only
    Quantize(QuantizeArgs),
    /// Perplexity of the model on a text file, computed as llama.cpp's llama-perplexity
    Perplexity(PerplexityArgs),
    /// The logits at every position of a prompt of token ids, and a greedy continuation
    Logits(LogitsArgs),
}

/// Runs the command the line names (the app without one).
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => chat::app(&cli.app),
        Some(Sub::App(args)) => chat::app(&args),
        Some(Sub::Chat(args)) => chat::chat(&args),
        Some(Sub::Bench(args)) => tools::bench(&args),
        Some(Sub::Tokenize(args)) => tools::tokenize(&args),
        Some(Sub::Template(args)) => template::run(&args),
        Some(Sub::Perplexity(args)) => tools::perplexity(&args),
        Some(Sub::Logits(args)) => tools::logits(&args),
        Some(Sub::Chats(args)) => chats::list_chats(&args),
        Some(Sub::Fetch(args)) => models::fetch(&args),
        Some(Sub::Models(args)) => models::list_models(&args),
        Some(Sub::Quantize(args)) => models::quantize(&args),
    }
}
