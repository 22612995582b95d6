//! Measures what issue 6's features save on the real default model:
//!
//! 1. time to first token of the turn after a budget trim, shifting the cache vs
//!    resetting and re-prefilling the kept tokens;
//! 2. restoring a saved full-budget conversation vs re-prefilling it.
//!
//! `cargo bench --no-default-features --bench context_bench -- [BUDGET]`

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device};
use pocketchat::engine::model::{argmax, read_gguf};
use pocketchat::engine::persist::{self, ModelIdentity};
use pocketchat::engine::template::ChatTemplate;
use pocketchat::engine::tokenizer::TextTokenizer;
use pocketchat::engine::{Kernels, Model, Session, TrimMode};

const REPLY: &str = "Here is a short answer with a few words in it, enough to fill the context \
a little with every turn so the budget is reached after several turns.";

fn main() -> Result<()> {
    let budget: usize =
        std::env::args().skip(1).find(|a| a != "--bench").map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let path = pocketchat::catalog::default_model_path();
    let model = Model::load(&path, &Device::Cpu, Kernels::Fast, |_| {})?;
    let (content, _) = read_gguf(&path)?;
    let tok = TextTokenizer::from_gguf(&content)?;
    let src = content.metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
    let new_session = || -> Result<Session> {
        let template = ChatTemplate::new(src.as_deref(), tok.bos_token(), tok.eos_token());
        Ok(Session::new(model.make_state(budget, DType::F32), template)?)
    };
    let reply_ids = tok.encode(REPLY)?;
    let reserve = budget / 4;

    // Fill a conversation until the next turn has to trim; time that turn both ways.
    for mode in [TrimMode::Shift, TrimMode::Reprefill] {
        let mut s = new_session()?;
        s.trim_mode = mode;
        let mut turn = 0;
        loop {
            turn += 1;
            let t = Instant::now();
            let p =
                s.prepare_turn(&model, &tok, &format!("Question number {turn}: tell me something new."), reserve)?;
            argmax(&p.logits)?;
            let ttft = t.elapsed().as_secs_f64() * 1e3;
            if p.dropped_tokens > 0 {
                println!(
                    "{mode:?}: turn {turn} trimmed {} tokens, fed {} (context now {}), time to first token {ttft:.1} ms",
                    p.dropped_tokens,
                    if mode == TrimMode::Shift { p.fed_tokens } else { s.state.len() },
                    s.state.len()
                );
                break;
            }
            s.finish_reply(REPLY);
            model.forward(&reply_ids, &mut s.state)?;
        }
    }

    // A conversation at about three quarters of the budget: save, restore, re-prefill.
    let mut s = new_session()?;
    let mut turn = 0;
    while s.state.len() + 2 * reply_ids.len() < budget * 3 / 4 {
        turn += 1;
        s.prepare_turn(&model, &tok, &format!("Question {turn}."), reserve)?;
        s.finish_reply(REPLY);
        model.forward(&reply_ids, &mut s.state)?;
    }
    let file = std::env::temp_dir().join("context_bench.pcstate");
    let id = ModelIdentity { sha256: pocketchat::catalog::sha256_file(&path)?, bytes: std::fs::metadata(&path)?.len() };
    let t = Instant::now();
    let bytes = persist::save(&s, &id, &file)?;
    let save_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut restored = new_session()?;
    let t = Instant::now();
    persist::restore(&mut restored, &id, &file)?;
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut fresh = model.make_state(budget, DType::F32);
    let t = Instant::now();
    model.forward(s.state.tokens(), &mut fresh)?;
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{} tokens: save {save_ms:.0} ms ({:.1} MB), restore {restore_ms:.0} ms, re-prefill {prefill_ms:.0} ms ({:.0}x)",
        s.state.len(),
        bytes as f64 / 1e6,
        prefill_ms / restore_ms
    );
    let _ = std::fs::remove_file(file);
    Ok(())
}
