//! `pocketchat models`, `fetch` and `quantize`: the catalog and model files.

use anyhow::{Context, Result};
use clap::Args;
use pocketchat::{catalog, memory};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::args::{tier, ModelArg};
use super::ctrl_c::{on_sigint, CTRL_C};

#[derive(Args)]
pub(crate) struct FetchArgs {
    /// A catalog id (`pocketchat models` lists them) or an http(s) URL of a GGUF file
    #[arg(value_name = "ID|URL")]
    pub(crate) target: Option<String>,
}

#[derive(Args)]
pub(crate) struct ModelsArgs {
    /// Memory tier instead of the detected one
    #[arg(long, value_parser = tier)]
    pub(crate) tier: Option<memory::RamTier>,
    /// One JSON array instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct QuantizeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArg,
    /// Where to write [default: beside the source, `…Q8_0-from-Q4_1.gguf`]
    #[arg(long, value_name = "PATH")]
    pub(crate) out: Option<PathBuf>,
    /// The type to write: Q8_0 (the 8-bit variant: only 4/5-bit matrices change), or any of
    /// F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K for every 2-D tensor
    /// (to test each kernel on one model)
    #[arg(long = "type", value_name = "TYPE", default_value = "Q8_0", value_parser = quant_type)]
    pub(crate) quant: String,
    /// Replace an existing --out that is not a GGUF pocketchat wrote (never the source
    /// itself, nor anything but a regular file)
    #[arg(long)]
    pub(crate) force: bool,
}

/// A `--type` of `pocketchat quantize`, in llama.cpp's spelling (any case).
pub(crate) fn quant_type(s: &str) -> Result<String, String> {
    let upper = s.trim().to_ascii_uppercase();
    if catalog::QUANT_TYPES.iter().any(|(name, _)| *name == upper) {
        Ok(upper)
    } else {
        let known: Vec<&str> = catalog::QUANT_TYPES.iter().map(|(n, _)| *n).collect();
        Err(format!("unknown type `{s}` (one of {})", known.join(", ")))
    }
}

pub(crate) fn quantize(args: &QuantizeArgs) -> Result<()> {
    let src = args.model.path()?;
    let dst = args.out.clone().unwrap_or_else(|| catalog::quant_sibling_path(&src, &args.quant));
    let (_, dtype) = catalog::QUANT_TYPES
        .iter()
        .find(|(name, _)| *name == args.quant)
        .with_context(|| format!("unknown type {}", args.quant))?;
    let replace = if args.force { catalog::Replace::AnyFile } else { catalog::Replace::OursOnly };
    catalog::quantize(&src, &dst, *dtype, replace)?;
    outln!("{}", dst.display());
    Ok(())
}

pub(crate) fn list_models(args: &ModelsArgs) -> Result<()> {
    let tier = args.tier.or_else(memory::tier_from_env).unwrap_or_else(|| memory::TierReport::probe().effective());
    let rows = catalog::listing::rows(catalog::catalog(), tier, &catalog::models_dir());
    if args.json {
        outln!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    outln!(
        "Models for the {} (ceiling {:.1} GB; * the file of a model this tier gets):",
        tier.label(),
        memory::fit::ceiling_bytes(tier) as f64 / 1e9
    );
    for r in &rows {
        let size = format!("{}{:.2} GB", if r.bytes_known { "" } else { "~" }, r.bytes as f64 / 1e9);
        let fit =
            if r.fits { format!("{} · {} tokens ({})", r.fit, r.budget, r.budget_limit) } else { r.fit.to_string() };
        let state = match (&r.not_yet, r.downloaded) {
            (Some(why), _) => format!("not yet: {why}"),
            (None, true) => "downloaded".to_string(),
            (None, false) => String::new(),
        };
        // Of a model's several published files, the one this tier gets.
        let pick = r.for_this_tier && rows.iter().filter(|o| o.name == r.name).count() > 1;
        let pick = if pick { "*" } else { " " };
        outln!("{:<30} {:>6}{pick} {:>10}  {fit:<58} {state}", r.id, r.quant, size);
    }
    Ok(())
}

/// `pocketchat fetch [ID|URL]`: downloads with a progress bar on stderr; prints the path.
pub(crate) fn fetch(args: &FetchArgs) -> Result<()> {
    let dir = catalog::models_dir();
    let options = catalog::DownloadOptions::default();
    // Ctrl-C stops the download and keeps its .part for the next run to resume.
    cancel_on_ctrl_c(options.cancel.clone());
    let mut bar = ProgressBar::default();
    let path = match args.target.as_deref() {
        None => {
            let tier = memory::tier_from_env().unwrap_or_else(|| memory::TierReport::probe().effective());
            catalog::ensure_entry(catalog::default_for_tier(tier), &dir)?
        }
        Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
            let name = catalog::file_name_of_url(url).map_err(anyhow::Error::msg)?;
            let request =
                catalog::DownloadRequest { url: url.to_string(), dest: dir.join(name), bytes: None, sha256: None };
            catalog::download(&request, &options, &mut |p| bar.show(p))?
        }
        Some(id) => {
            let entry = catalog::entry(id)?;
            match entry.source() {
                Ok(catalog::Source::Url(_)) => catalog::download_entry(entry, &dir, &options, &mut |p| bar.show(p))?,
                _ => catalog::ensure_entry(entry, &dir)?,
            }
        }
    };
    bar.finish();
    outln!("{}", path.display());
    Ok(())
}

/// Sets `cancel` on Ctrl-C (SIGINT) instead of letting it kill the process.
pub(crate) fn cancel_on_ctrl_c(cancel: std::sync::Arc<AtomicBool>) {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        if CTRL_C.load(Ordering::SeqCst) {
            cancel.store(true, Ordering::Relaxed);
        }
    });
}

/// A one-line progress bar on stderr; on a pipe, a line every 10 %.
#[derive(Default)]
pub(crate) struct ProgressBar {
    pub(crate) last_tenth: Option<u64>,
    pub(crate) drawn: bool,
}

impl ProgressBar {
    pub(crate) fn show(&mut self, p: &catalog::Progress) {
        use std::io::IsTerminal;
        let mb = |b: u64| b as f64 / 1e6;
        let text = if p.verifying {
            format!("verifying {:.1} MB (sha256, GGUF) …", mb(p.bytes))
        } else {
            let eta = p.eta.map(|e| format!(" · {}s left", e.as_secs())).unwrap_or_default();
            match (p.fraction(), p.total) {
                (Some(f), Some(t)) => {
                    let filled = (f * 30.0) as usize;
                    format!(
                        "[{}{}] {:>3.0}% {:.1}/{:.1} MB · {:.1} MB/s{eta}",
                        "#".repeat(filled),
                        "-".repeat(30 - filled),
                        f * 100.0,
                        mb(p.bytes),
                        mb(t),
                        p.bytes_per_sec / 1e6
                    )
                }
                _ => format!("{:.1} MB · {:.1} MB/s", mb(p.bytes), p.bytes_per_sec / 1e6),
            }
        };
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K{text}");
            self.drawn = true;
        } else {
            let tenth = p.fraction().map(|f| (f * 10.0) as u64);
            if p.verifying || tenth != self.last_tenth {
                self.last_tenth = tenth;
                eprintln!("{text}");
            }
        }
    }

    pub(crate) fn finish(&self) {
        if self.drawn {
            eprintln!();
        }
    }
}
