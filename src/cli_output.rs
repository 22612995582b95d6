//! What the `pocketchat` command prints, and how: output that ends quietly when its
//! reader goes away (`… | head`), diagnostics that never panic, text from files made
//! safe for a terminal, and errors with each cause once. Part of the binary only.

use std::io::Write;

use anyhow::Result;

/// `eprintln!` that never panics: a closed or full standard error loses the line, not
/// the command (std's panics on any write error).
macro_rules! eprintln {
    () => {{
        let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\n");
    }};
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("{}\n", format_args!($($arg)*)));
    }};
}

/// `eprint!` that never panics (see `eprintln!`).
macro_rules! eprint {
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!($($arg)*));
    }};
}

/// `println!` for the command's output: a reader that went away (`… | head`) ends the
/// command quietly with [`OutputClosed`] (returned with `?`) instead of a panic.
macro_rules! outln {
    () => {
        $crate::cli_output::write_out(format_args!("\n"))?
    };
    ($($arg:tt)*) => {
        $crate::cli_output::write_out(format_args!("{}\n", format_args!($($arg)*)))?
    };
}

/// `print!` for the command's output, flushed (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli_output::write_out(format_args!($($arg)*))?
    };
}

/// Standard output was closed by its reader: the command stops and exits with success,
/// as Unix filters do when `head` has what it wanted.
#[derive(Debug)]
pub struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for OutputClosed {}

/// Writes to standard output and flushes; a broken pipe is [`OutputClosed`].
pub fn write_out(args: std::fmt::Arguments) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(OutputClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// `text` safe to print on a terminal: control characters (escape sequences that clear
/// the screen or set the window title, carriage returns) and bidirectional overrides
/// are dropped; tabs and line breaks become spaces.
pub fn printable(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            '\t' | '\n' | '\r' => Some(' '),
            c if c.is_control() => None,
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => None,
            c => Some(c),
        })
        .collect()
}

/// An error and its causes on one line, each cause once: a message that already
/// contains its cause's text (`{path}: {source}`) is not followed by it again.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_bidi_overrides_are_dropped() {
        assert_eq!(printable("\u{1b}]0;title\u{7}\u{1b}[2Jhi\u{9b}1m\tthere\r\n\u{202e}x"), "]0;title[2Jhi1m there  x");
        assert_eq!(printable("Trip to Lisbon — ünïcode"), "Trip to Lisbon — ünïcode");
    }

    /// An error whose message ends in its cause, as `CatalogError::Io` is: test double.
    #[derive(Debug)]
    struct SaysItsCause(std::io::Error);

    impl std::fmt::Display for SaysItsCause {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot open x: {}", self.0)
        }
    }

    impl std::error::Error for SaysItsCause {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_its_message_is_not_repeated() {
        let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let twice = anyhow::Error::new(SaysItsCause(missing())).context("quantizing");
        assert_eq!(format!("{twice:#}"), "quantizing: cannot open x: no such file: no such file");
        assert_eq!(error_text(&twice), "quantizing: cannot open x: no such file");
        let chained = anyhow::Error::new(missing()).context("cannot open x");
        assert_eq!(error_text(&chained), "cannot open x: no such file");
    }
}
