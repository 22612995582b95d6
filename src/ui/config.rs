//! The UI's tuning knobs, read from the environment once at launch
//! ([`UiConfig::from_env`]) and handed to the components as context. Nothing else under
//! `ui/` reads the environment.
//!
//! | variable | knob |
//! |---|---|
//! | `POCKETCHAT_FRAME_MS` | how often tokens reach the screen (1–1000 ms; default 33) |
//! | `POCKETCHAT_TYPE_AHEAD=0` | no reading ahead of the composer's text |
//! | `POCKETCHAT_QA_STATUS` | the QA status file ([`super::qa`], builds with the `qa` feature) |
//! | `WEBKIT_DISABLE_COMPOSITING_MODE` | the user's choice of WebKit's compositing (Linux) |

use std::path::PathBuf;
use std::time::Duration;

use super::pacer::FRAME;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct UiConfig {
    /// The engine's events reach the screen at most this often.
    pub frame: Duration,
    /// The composer hands the engine its text as it is typed, so the reply starts sooner.
    pub type_ahead: bool,
    /// Where the QA hook writes its status; `None`: no QA hook.
    pub qa_status: Option<PathBuf>,
    /// `WEBKIT_DISABLE_COMPOSITING_MODE` was set before launch (kept as the user set it).
    pub compositing_chosen: bool,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig { frame: FRAME, type_ahead: true, qa_status: None, compositing_chosen: false }
    }
}

impl UiConfig {
    pub fn from_env() -> UiConfig {
        let var = |name: &str| std::env::var(name).ok();
        UiConfig {
            frame: frame_from(var("POCKETCHAT_FRAME_MS").as_deref()),
            type_ahead: var("POCKETCHAT_TYPE_AHEAD").is_none_or(|v| v.trim() != "0"),
            qa_status: qa_status_file(),
            compositing_chosen: std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_some(),
        }
    }
}

/// `POCKETCHAT_QA_STATUS`, read by a build with the `qa` feature; another says it is
/// ignored rather than leave a tester waiting for a file that never comes.
fn qa_status_file() -> Option<PathBuf> {
    let path = std::env::var_os(super::qa::QA_STATUS_ENV).filter(|p| !p.is_empty()).map(PathBuf::from)?;
    if cfg!(feature = "qa") {
        return Some(path);
    }
    tracing::warn!("{} is ignored: this build has no QA hook (cargo feature `qa`)", super::qa::QA_STATUS_ENV);
    None
}

/// The frame for a `POCKETCHAT_FRAME_MS` value: 1–1000 ms, else [`FRAME`].
fn frame_from(value: Option<&str>) -> Duration {
    match value.and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(ms @ 1..=1000) => Duration::from_millis(ms),
        _ => FRAME,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_is_taken_in_range_only() {
        assert_eq!(frame_from(None), FRAME);
        assert_eq!(frame_from(Some(" 50 ")), Duration::from_millis(50));
        assert_eq!(frame_from(Some("0")), FRAME);
        assert_eq!(frame_from(Some("5000")), FRAME);
        assert_eq!(frame_from(Some("fast")), FRAME);
    }
}
