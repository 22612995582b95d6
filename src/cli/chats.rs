//! `pocketchat chats`: the saved chats; `--export DIR [--chat NAME]`, `--import FILE` and
//! `--grep TEXT`, the command-line side of `pocketchat::chats::export` and
//! `pocketchat::chats::search`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use pocketchat::chats::export::{self, Exported};
use pocketchat::chats::{search, ChatStore, DEFAULT_CACHE_CAP_BYTES};

use super::args::chats_dir;
use crate::cli_output::printable;

#[derive(Args)]
pub(crate) struct ChatsArgs {
    /// JSON instead of a table (also what --export, --import and --grep print)
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    transfer: TransferArgs,
}

pub(crate) fn list_chats(args: &ChatsArgs) -> Result<()> {
    let dir = chats_dir();
    if args.transfer.any() {
        return transfer(&args.transfer, &dir, args.json);
    }
    let chats = if dir.is_dir() { ChatStore::open(&dir, 0)?.list() } else { Vec::new() };
    if args.json {
        outln!("{}", serde_json::to_string(&chats)?);
        return Ok(());
    }
    if chats.is_empty() {
        eprintln!("No saved chats in {}.", dir.display());
    }
    for c in &chats {
        if let Some(why) = &c.unreadable {
            outln!("{}  unreadable: {}", c.id, printable(why));
            continue;
        }
        let cache = if c.cache_bytes > 0 {
            format!("cache {:.1} MB", c.cache_bytes as f64 / 1e6)
        } else {
            "no cache".to_string()
        };
        let title = printable(&c.title);
        outln!("{}  {title:<48}  {:>3} messages  {:>5} tokens  {cache}", c.id, c.messages, c.tokens);
    }
    Ok(())
}

#[derive(Args)]
struct TransferArgs {
    /// Write the chats into DIR (made when missing) as Markdown, to read, and JSON, to
    /// import elsewhere: two new files, named by the date (never replacing a file)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["import", "grep"])]
    export: Option<PathBuf>,
    /// With --export: only the chat of this name (or id)
    #[arg(long, value_name = "NAME", requires = "export")]
    chat: Option<String>,
    /// Add the chats of an exported JSON file as new chats (all of them, or none when the
    /// file is damaged)
    #[arg(long, value_name = "FILE", conflicts_with = "grep")]
    import: Option<PathBuf>,
    /// The chats whose title, system prompt or messages hold TEXT (ignoring case), with
    /// where it first occurs
    #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    grep: Option<String>,
}

impl TransferArgs {
    /// Whether any of these was given (else `chats` lists the chats).
    fn any(&self) -> bool {
        self.export.is_some() || self.import.is_some() || self.grep.is_some()
    }
}

fn transfer(args: &TransferArgs, chats_dir: &Path, json: bool) -> Result<()> {
    if let Some(out) = &args.export {
        let store = existing_store(chats_dir)?;
        let exported = match &args.chat {
            Some(name) => export::chat_id_for(&store, name).and_then(|id| export::export_chat(&store, &id, out)),
            None => export::export_all(&store, out),
        }
        .with_context(|| format!("exporting from {}", chats_dir.display()))?;
        return print_exported(&exported, json);
    }
    if let Some(file) = &args.import {
        let store = ChatStore::open(chats_dir, DEFAULT_CACHE_CAP_BYTES)
            .with_context(|| format!("opening the chats folder {}", chats_dir.display()))?;
        let imported = export::import_file(&store, file)
            .with_context(|| format!("{} was not imported, nothing changed", file.display()))?;
        if json {
            let rows: Vec<_> = imported.iter().map(|r| serde_json::json!({ "id": r.id, "title": r.title })).collect();
            outln!("{}", serde_json::to_string(&rows)?);
            return Ok(());
        }
        let noun = if imported.len() == 1 { "chat" } else { "chats" };
        eprintln!("Imported {} {noun} into {}:", imported.len(), chats_dir.display());
        for r in &imported {
            outln!("{}  {}", r.id, printable(&r.title));
        }
        return Ok(());
    }
    if let Some(text) = &args.grep {
        let found = if chats_dir.is_dir() { search::search(&existing_store(chats_dir)?, text) } else { Vec::new() };
        if json {
            outln!("{}", serde_json::to_string(&found)?);
            return Ok(());
        }
        if found.is_empty() {
            eprintln!("No chat holds “{}”.", printable(text));
        }
        for m in &found {
            outln!("{}  {:<48}  {}: {}", m.id, printable(&m.title), m.place.label(), printable(&m.snippet));
        }
    }
    Ok(())
}

fn existing_store(dir: &Path) -> Result<ChatStore> {
    if !dir.is_dir() {
        bail!("there are no saved chats in {}", dir.display());
    }
    ChatStore::open(dir, DEFAULT_CACHE_CAP_BYTES).with_context(|| format!("opening the chats folder {}", dir.display()))
}

fn print_exported(exported: &Exported, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(exported)?);
        return Ok(());
    }
    let noun = if exported.chats == 1 { "chat" } else { "chats" };
    eprintln!("Exported {} {noun}:", exported.chats);
    outln!("{}", exported.markdown.display());
    outln!("{}", exported.json.display());
    if !exported.unreadable.is_empty() {
        eprintln!(
            "Left out {} chat(s) whose record could not be read: {}",
            exported.unreadable.len(),
            exported.unreadable.join(", ")
        );
    }
    Ok(())
}
