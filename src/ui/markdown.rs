//! Markdown for replies, as chat apps render it.
//!
//! [`to_html`] turns a (possibly half-streamed) reply into HTML with pulldown-cmark:
//! paragraphs, lists, emphasis, tables, inline code and fenced code blocks
//! (`<pre><code>`, shown in monospace by the stylesheet). Model output is untrusted, so
//! raw HTML in it is escaped and shown as text, links become plain text followed by
//! their address (a click must never navigate the app's webview away), images show
//! their alt text, and single newlines are kept as line breaks.
//!
//! A streaming reply is rendered with [`MarkdownBlocks`]: the text's top-level blocks
//! that are finished (a later block has begun) are rendered once and kept; only the open
//! last block is parsed again as tokens arrive, so the cost of a token does not grow with
//! the reply.

use std::rc::Rc;

use pulldown_cmark::{html, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

fn options() -> Options {
    Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS
}

/// A reply's Markdown as HTML blocks, kept up to date as its text grows.
///
/// ```text
/// "Intro.\n\n- a\n- b\n\nMore te"   (text so far)
///  └ finished ┘└ finished ┘└ open ┘    a block is finished once the next one starts
/// ```
///
/// Finished blocks are rendered once and never change (their `Rc` stays the same, so a
/// component showing one is not re-rendered); [`MarkdownBlocks::open`] is the HTML of
/// everything after them, rendered again at each update.
#[derive(Debug, Default)]
pub struct MarkdownBlocks {
    finished: Vec<Rc<str>>,
    /// Bytes of the text the finished blocks cover.
    finished_len: usize,
    open: Rc<str>,
    /// The text the blocks were made from (to tell appends from rewrites).
    text: String,
}

impl MarkdownBlocks {
    /// Brings the blocks up to `text`. Appended text re-parses only the open block; any
    /// other change starts over.
    pub fn update(&mut self, text: &str) {
        if text == self.text {
            return;
        }
        if !text.starts_with(&self.text[..self.finished_len]) {
            *self = MarkdownBlocks::default();
        }
        self.text.clear();
        self.text.push_str(text);
        let tail = &text[self.finished_len..];
        // A block is finished when the parser has started another one after it.
        if let Some(last_start) = top_level_block_starts(tail).last().copied().filter(|&s| s > 0) {
            self.finished.push(Rc::from(to_html(&tail[..last_start])));
            self.finished_len += last_start;
        }
        self.open = Rc::from(to_html(&text[self.finished_len..]));
    }

    /// HTML of the finished blocks, oldest first.
    pub fn finished(&self) -> &[Rc<str>] {
        &self.finished
    }

    /// HTML of the open last block (empty when there is no text after the finished ones).
    pub fn open(&self) -> &Rc<str> {
        &self.open
    }
}

/// Byte offsets in `markdown` where its top-level blocks start.
fn top_level_block_starts(markdown: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut depth = 0usize;
    for (event, range) in Parser::new_ext(markdown, options()).into_offset_iter() {
        match event {
            Event::Start(_) => {
                if depth == 0 {
                    starts.push(range.start);
                }
                depth += 1;
            }
            Event::End(_) => depth = depth.saturating_sub(1),
            // Blocks without a start and an end (a thematic break).
            _ if depth == 0 => starts.push(range.start),
            _ => {}
        }
    }
    starts
}

/// Renders `markdown` to safe HTML.
pub fn to_html(markdown: &str) -> String {
    let mut out = Vec::new();
    // Link destinations and the text seen inside each open link.
    let mut links: Vec<(LinkType, String, String)> = Vec::new();
    for event in Parser::new_ext(markdown, options()) {
        match event {
            Event::Html(raw) | Event::InlineHtml(raw) => out.push(Event::Text(raw)),
            Event::Start(Tag::HtmlBlock) => out.push(Event::Start(Tag::Paragraph)),
            Event::End(TagEnd::HtmlBlock) => out.push(Event::End(TagEnd::Paragraph)),
            Event::SoftBreak => out.push(Event::HardBreak),
            Event::Start(Tag::Link { link_type, dest_url, .. }) => {
                links.push((link_type, dest_url.to_string(), String::new()));
            }
            Event::End(TagEnd::Link) => {
                if let Some((kind, dest, text)) = links.pop() {
                    let shown = dest.trim_start_matches("mailto:");
                    let autolink = matches!(kind, LinkType::Autolink | LinkType::Email);
                    if !dest.is_empty() && !autolink && text.trim() != shown {
                        out.push(Event::Text(CowStr::from(format!(" ({dest})"))));
                    }
                }
            }
            // Images: keep the alt text (the events between start and end).
            Event::Start(Tag::Image { .. }) | Event::End(TagEnd::Image) => {}
            Event::Text(text) => {
                if let Some((_, _, seen)) = links.last_mut() {
                    seen.push_str(&text);
                }
                out.push(Event::Text(text));
            }
            Event::Code(code) => {
                if let Some((_, _, seen)) = links.last_mut() {
                    seen.push_str(&code);
                }
                out.push(Event::Code(code));
            }
            other => out.push(other),
        }
    }
    let mut html_out = String::with_capacity(markdown.len() * 3 / 2 + 16);
    html::push_html(&mut html_out, out.into_iter());
    html_out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_lists_and_code() {
        let html = to_html("Hello **world**.\n\n- one\n- two\n\n1. first\n\n```rust\nfn main() {}\n```\n");
        assert!(html.contains("<p>Hello <strong>world</strong>.</p>"), "{html}");
        assert!(html.contains("<ul>\n<li>one</li>\n<li>two</li>\n</ul>"), "{html}");
        assert!(html.contains("<ol>"), "{html}");
        assert!(html.contains("<pre><code class=\"language-rust\">fn main() {}\n</code></pre>"), "{html}");
    }

    #[test]
    fn raw_html_is_escaped() {
        let html = to_html("<script>alert(1)</script>\n\nhi <b onclick=\"x()\">there</b>");
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
        assert!(!html.contains("<b "), "{html}");
        assert!(html.contains("&lt;b onclick="), "{html}");
    }

    #[test]
    fn links_become_text_and_images_alt_text() {
        let html = to_html("see [the docs](https://example.com/d) or <https://x.org> ![a cat](cat.png)");
        assert!(!html.contains("<a "), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("the docs (https://example.com/d)"), "{html}");
        assert!(html.contains("https://x.org"), "{html}");
        assert!(!html.contains("(https://x.org)"), "{html}");
        assert!(html.contains("a cat"), "{html}");
        let js = to_html("[click](javascript:alert(1))");
        assert!(!js.contains("href"), "{js}");
    }

    /// Streams `text` a few bytes at a time (at char boundaries) into a `MarkdownBlocks`.
    fn streamed(text: &str, step: usize) -> MarkdownBlocks {
        let mut blocks = MarkdownBlocks::default();
        let mut end = 0;
        while end < text.len() {
            end = (end + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            blocks.update(&text[..end]);
        }
        blocks
    }

    fn joined(blocks: &MarkdownBlocks) -> String {
        let mut html: String = blocks.finished().iter().map(|b| b.to_string()).collect();
        html.push_str(blocks.open());
        html
    }

    const REPLY: &str = "# Tips\n\nSleep **well**:\n\n1. Keep a schedule.\n2. Avoid screens.\n\n\
        ```sh\necho one\n\necho two\n```\n\n---\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n\
        > quoted\n> lines\n\n    indented code\n\n    more code\n\nLast *words* — ünïcödé 😀.";

    #[test]
    fn streamed_blocks_render_what_the_whole_text_renders() {
        let whole = to_html(REPLY);
        for step in [1, 2, 3, 7, 16, 1000] {
            let blocks = streamed(REPLY, step);
            assert_eq!(joined(&blocks), whole, "step {step}");
        }
        let blocks = streamed(REPLY, 3);
        assert!(blocks.finished().len() >= 5, "finished blocks are kept: {}", blocks.finished().len());
        assert!(blocks.open().contains("Last <em>words</em>"), "{}", blocks.open());
    }

    #[test]
    fn finished_blocks_are_kept_as_they_are() {
        let mut blocks = MarkdownBlocks::default();
        blocks.update("First paragraph.\n\nSecond");
        assert_eq!(blocks.finished().len(), 1);
        let first = blocks.finished()[0].clone();
        blocks.update("First paragraph.\n\nSecond paragraph, longer.");
        assert!(Rc::ptr_eq(&first, &blocks.finished()[0]), "not rendered again");
        assert_eq!(&*blocks.open(), "<p>Second paragraph, longer.</p>\n");
        // A fence left open holds everything after it in the open block.
        blocks.update("First paragraph.\n\nSecond paragraph, longer.\n\n```\ncode\n\nstill code");
        assert!(blocks.open().starts_with("<pre><code>code\n\nstill code"), "{}", blocks.open());
    }

    #[test]
    fn a_rewritten_text_starts_over() {
        let mut blocks = MarkdownBlocks::default();
        blocks.update("One.\n\nTwo.\n\nThree");
        blocks.update("Other.\n\nText");
        assert_eq!(joined(&blocks), to_html("Other.\n\nText"));
        blocks.update("");
        assert!(blocks.finished().is_empty() && blocks.open().is_empty());
    }

    #[test]
    fn single_newlines_are_line_breaks_and_half_streamed_fences_render() {
        let br = to_html("a\nb");
        assert!(br.contains("a<br />\nb"), "{br}");
        let html = to_html("code:\n```\nlet x = 1;");
        assert!(html.contains("<pre><code>let x = 1;"), "{html}");
    }
}
