//! The `pocketchat` command: the app (default), a headless terminal chat, the benchmark,
//! the tokenizer, and model fetching/quantizing. This file sets up logging and candle's
//! thread pool and hands the command line to [`cli`], one module per command group.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

#[macro_use]
mod cli_output;
mod cli;

use cli_output::{error_text, OutputClosed};

/// Exit codes: 0 success, 1 a runtime error (printed once, plain), 2 a usage error
/// (clap's message, with a suggestion for a misspelled flag).
fn main() -> ExitCode {
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POCKETCHAT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    tame_candle_pool();
    let result = cli::run(cli::Cli::parse());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<OutputClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// candle's own thread pool (its larger element-wise ops during a prefill, and its
/// kernels for quant types ours do not cover) sits beside the engine's pool
/// (`engine::cpu::pool`). Its size comes from `RAYON_NUM_THREADS`: a value above the cores
/// available is lowered to them, as more threads than cores stall it whenever a core is
/// busy. Its idle workers spin 25,000 times before they park, taking a core from the
/// engine's pool between candle's ops; unless `CANDLE_BARRIER_POOL_SPIN_LIMIT` says
/// otherwise they spin a few microseconds. Runs first in `main`, before any other thread
/// exists.
fn tame_candle_pool() {
    let cores = pocketchat::engine::cpu::pool::available_cores();
    for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        if std::env::var(var).ok().and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| n > cores) {
            std::env::set_var(var, cores.to_string());
        }
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "2000");
    }
}
