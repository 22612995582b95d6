//! The few things the UI asks of the webview directly: run a snippet of JavaScript
//! (copy to the clipboard). Without a webview (server-side rendering in tests) these
//! do nothing.

/// Runs `js` in the app's webview, if there is one.
pub fn run_js(js: &str) {
    #[cfg(feature = "desktop")]
    use dioxus::desktop as webview;
    #[cfg(all(feature = "mobile", not(feature = "desktop")))]
    use dioxus::mobile as webview;

    #[cfg(any(feature = "desktop", feature = "mobile"))]
    if let Some(ctx) = dioxus::prelude::try_consume_context::<webview::DesktopContext>() {
        if let Err(e) = ctx.webview.evaluate_script(js) {
            tracing::warn!("could not run script in the webview: {e}");
        }
    }
    #[cfg(not(any(feature = "desktop", feature = "mobile")))]
    let _ = js;
}

/// Copies `text` to the clipboard (the page's `pcCopy` helper, see `app::INDEX_HTML`).
pub fn copy_to_clipboard(text: &str) {
    let quoted = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
    run_js(&format!("window.pcCopy && window.pcCopy({quoted});"));
}
