//! The model screen's coroutine: the only place [`ModelsView`] changes. It runs each
//! download on a thread of its own (`catalog::download` is blocking HTTP), folds their
//! progress into the view (at most every 100 ms per download, as the downloader reports
//! it), deletes files, and asks the engine to switch models.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dioxus::prelude::*;
use futures::channel::mpsc as fmpsc;
use futures::StreamExt;

use super::list::{self, scan, ModelItem, ModelsView, Origin, Transfer, FILE_KEY_PREFIX};
use crate::catalog::{self, DownloadError, DownloadOptions, DownloadRequest, Progress};
use crate::engine::Command;
use crate::memory::{RamTier, TierReport};
use crate::ui::copy;
use crate::ui::qa::QaHook;
use crate::ui::state::ChatState;

/// What the model screen asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelAction {
    /// Read the models folder again (the screen opened, the tier changed).
    Refresh,
    /// Download (or resume) a catalog entry.
    Download {
        key: String,
    },
    /// Download any GGUF by its URL into the models folder.
    AddUrl {
        url: String,
    },
    Cancel {
        key: String,
    },
    /// Delete the file (and any `.part`); never the model in use.
    Delete {
        key: String,
    },
    /// Switch the engine to this file; `allow_too_large` is the explicit override.
    Use {
        key: String,
        allow_too_large: bool,
    },
}

/// A download thread's news.
enum Report {
    Progress(Progress),
    Done(Result<PathBuf, DownloadError>),
}

/// Sends an action to the model bridge (no-op without one, as in server-side rendering).
pub fn send_model_action(action: ModelAction) {
    if let Some(bridge) = try_consume_context::<Coroutine<ModelAction>>() {
        bridge.send(action);
    }
}

/// The coroutine: `dir` is the models folder, `engine` the engine bridge.
pub async fn models_bridge(
    mut actions: UnboundedReceiver<ModelAction>,
    dir: PathBuf,
    mut view: Signal<ModelsView>,
    state: Signal<ChatState>,
    engine: Coroutine<Command>,
    qa: Option<QaHook>,
) {
    let (report_tx, mut reports) = fmpsc::unbounded::<(String, Report)>();
    let mut cancels: HashMap<String, Arc<AtomicBool>> = HashMap::new();
    // Files being added by URL: listed (with their bar) before they exist on disk.
    let mut pending: Vec<ModelItem> = Vec::new();
    let tier = move || state.peek().tier.as_ref().map(TierReport::effective).unwrap_or_else(detected_tier);
    let rescan = |pending: &[ModelItem]| {
        let mut items = scan(catalog::catalog(), &dir, tier());
        let missing: Vec<ModelItem> = pending
            .iter()
            .filter(|p| !items.iter().any(|i| i.key == p.key))
            .map(|p| ModelItem { partial: catalog::download::part_path(&p.path).is_file(), ..p.clone() })
            .collect();
        items.splice(0..0, missing);
        items
    };
    view.write().items = rescan(&pending);
    loop {
        futures::select! {
            action = actions.next() => {
                let Some(action) = action else { break };
                match action {
                    ModelAction::Refresh => view.write().items = rescan(&pending),
                    ModelAction::Download { key } => {
                        let Some(item) = view.peek().item(&key).cloned() else { continue };
                        let Origin::Url(url) = item.origin else { continue };
                        let entry = catalog::catalog().get(&key);
                        let request = DownloadRequest {
                            url,
                            dest: item.path.clone(),
                            bytes: entry.and_then(|e| e.bytes),
                            sha256: entry.and_then(|e| e.sha256.clone()),
                        };
                        start(&mut view, &mut cancels, &report_tx, key, request);
                    }
                    ModelAction::AddUrl { url } => {
                        let url = url.trim().to_string();
                        match catalog::file_name_of_url(&url) {
                            Ok(name) if dir.join(&name).exists() => {
                                view.write().notice = Some(copy::already_in_folder(&name));
                            }
                            Ok(name) => {
                                let item = list::pending_item(&name, &url, &dir);
                                let request = DownloadRequest { url, dest: item.path.clone(), bytes: None, sha256: None };
                                start(&mut view, &mut cancels, &report_tx, item.key.clone(), request);
                                pending.retain(|p| p.key != item.key);
                                pending.push(item);
                                view.write().items = rescan(&pending);
                            }
                            Err(why) => view.write().notice = Some(why),
                        }
                    }
                    ModelAction::Cancel { key } => {
                        if let Some(cancel) = cancels.get(&key) {
                            cancel.store(true, Ordering::Relaxed);
                        }
                    }
                    ModelAction::Delete { key } => {
                        let notice = match delete(&view.peek(), &state.peek(), &key) {
                            Ok(done) => {
                                pending.retain(|p| p.key != key);
                                done
                            }
                            Err(refused) => refused,
                        };
                        let mut v = view.write();
                        v.notice = Some(notice);
                        v.items = rescan(&pending);
                    }
                    ModelAction::Use { key, allow_too_large } => {
                        let Some(item) = view.peek().item(&key).cloned() else { continue };
                        view.write().notice = Some(copy::loading_named(&item.name));
                        engine.send(Command::SwitchModel {
                            path: item.path,
                            display_name: item.display_name,
                            recommended_sampling: item.recommended_sampling,
                            allow_too_large,
                        });
                    }
                }
            }
            report = reports.next() => {
                let Some((key, report)) = report else { continue };
                let mut v = view.write();
                match report {
                    Report::Progress(p) => {
                        v.transfers.insert(key, Transfer::Running(p));
                    }
                    Report::Done(result) => {
                        cancels.remove(&key);
                        // A cancelled or failed one stays listed: Download resumes it.
                        if result.is_ok() {
                            pending.retain(|p| p.key != key);
                        }
                        let name = v.item(&key).map(|i| i.name.clone()).unwrap_or_else(|| key.trim_start_matches(FILE_KEY_PREFIX).to_string());
                        match result {
                            Ok(_) => {
                                v.transfers.remove(&key);
                                v.notice = Some(copy::downloaded_and_verified(&name));
                            }
                            Err(DownloadError::Cancelled { .. }) => {
                                v.transfers.remove(&key);
                                v.notice = Some(copy::download_cancelled(&name));
                            }
                            Err(e) => {
                                v.transfers.insert(key, Transfer::Failed(e.to_string()));
                            }
                        }
                        v.items = rescan(&pending);
                    }
                }
            }
        }
        if let Some(qa) = &qa {
            qa.report_models(qa_models(&view.peek()));
        }
    }
}

fn detected_tier() -> RamTier {
    TierReport::probe().effective()
}

/// Starts a download thread for `key` unless one runs already.
fn start(
    view: &mut Signal<ModelsView>,
    cancels: &mut HashMap<String, Arc<AtomicBool>>,
    reports: &fmpsc::UnboundedSender<(String, Report)>,
    key: String,
    request: DownloadRequest,
) {
    if cancels.contains_key(&key) {
        return;
    }
    let options = DownloadOptions::default();
    cancels.insert(key.clone(), options.cancel.clone());
    let first = Progress { bytes: 0, total: request.bytes, bytes_per_sec: 0.0, eta: None, verifying: false };
    {
        let mut v = view.write();
        v.transfers.insert(key.clone(), Transfer::Running(first));
        v.notice = None;
    }
    let tx = reports.clone();
    let spawned = std::thread::Builder::new().name("model-download".into()).spawn(move || {
        let _span = tracing::info_span!("download", key = %key).entered();
        if let Some(dir) = request.dest.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let result = catalog::download(&request, &options, &mut |p| {
            let _ = tx.unbounded_send((key.clone(), Report::Progress(*p)));
        });
        let _ = tx.unbounded_send((key, Report::Done(result)));
    });
    if let Err(e) = spawned {
        view.write().notice = Some(copy::download_not_started(&e.to_string()));
    }
}

/// Deletes an item's file and any `.part`. `Ok` says it was deleted; `Err` why it was
/// not (downloading, in use, a file that would not go), in words.
fn delete(view: &ModelsView, state: &ChatState, key: &str) -> Result<String, String> {
    let Some(item) = view.item(key) else { return Err(copy::MODEL_NO_LONGER_LISTED.into()) };
    if view.downloading(key) {
        return Err(copy::model_downloading(&item.name));
    }
    if state.model.as_ref().is_some_and(|m| same_file(Path::new(&m.path), &item.path)) {
        return Err(copy::model_in_use(&item.name));
    }
    let part = catalog::download::part_path(&item.path);
    let mut errors = Vec::new();
    for path in [&item.path, &part] {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    if errors.is_empty() {
        Ok(copy::model_deleted(&item.name))
    } else {
        Err(copy::model_not_deleted(&item.name, &errors.join("; ")))
    }
}

/// Whether two paths name the same file (the engine's may be relative).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The model screen in the QA status file: each item's key, whether it is on the device,
/// and each download's fraction or error.
fn qa_models(view: &ModelsView) -> serde_json::Value {
    let downloads: serde_json::Map<String, serde_json::Value> = view
        .transfers
        .iter()
        .map(|(key, t)| {
            let value = match t {
                Transfer::Running(p) => {
                    serde_json::json!({ "fraction": p.fraction(), "bytes": p.bytes, "verifying": p.verifying })
                }
                Transfer::Failed(e) => serde_json::json!({ "error": e }),
            };
            (key.clone(), value)
        })
        .collect();
    let downloaded: Vec<&str> = view.items.iter().filter(|i| i.downloaded).map(|i| i.key.as_str()).collect();
    serde_json::json!({ "downloaded": downloaded, "downloads": downloads, "notice": view.notice })
}
