//! `pocketchat chats`: the saved chats.

use anyhow::Result;
use clap::Args;
use pocketchat::chats::ChatStore;

use super::args::chats_dir;
use crate::cli_output::printable;

#[derive(Args)]
pub(crate) struct ChatsArgs {
    /// One JSON array instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn list_chats(args: &ChatsArgs) -> Result<()> {
    let dir = chats_dir();
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
