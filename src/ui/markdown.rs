//! Markdown for replies, as chat apps render it.
//!
//! [`to_html`] turns a (possibly half-streamed) reply into HTML with pulldown-cmark:
//! paragraphs, lists, emphasis, tables, inline code and fenced code blocks
//! (`<pre><code>`, shown in monospace by the stylesheet). Model output is untrusted, so
//! raw HTML in it is escaped and shown as text, links become plain text followed by
//! their address (a click must never navigate the app's webview away), images show
//! their alt text, and single newlines are kept as line breaks. Each code block comes in
//! a box with its own Copy button ([`with_code_copy_buttons`]), which copies the block's
//! text (the page script's `pcCopyCode`, assets/page.js).
//!
//! A streaming reply is rendered with [`MarkdownBlocks`]: the text's top-level blocks
//! that are finished (a later block has begun) are rendered once and kept; only the open
//! last block is parsed again as tokens arrive, so the cost of a token does not grow with
//! the reply. The open block is itself cut before its last line ([`OpenHtml`]): the web
//! view repaints the whole box whose content changes, so a token should change only a
//! box the size of one line.

use std::rc::Rc;

use pulldown_cmark::{html, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

use super::copy;

fn options() -> Options {
    Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS
}

/// A reply's Markdown as HTML blocks, kept up to date as its text grows.
///
/// ```text
/// "Intro.\n\n- a\n- b\n\nMore text.\nAnd mo"   (text so far)
///  └──── finished ─────┘└───── open ─────┘   blocks before the last block whose
///                                             first line is complete are finished
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
    open: OpenHtml,
    /// The text the blocks were made from (to tell appends from rewrites).
    text: String,
    /// The text defines link references: it is rendered as one block.
    whole: bool,
}

/// The open block's HTML for a reply that is still streaming, in two parts shown one
/// after the other: `settled`, its lines before the last, changes once per line; `live`,
/// the last line (a paragraph's line after its last break, a list's last item), at every
/// token. Together they look exactly like the block rendered whole: the cut is a line
/// break (or the start of an item) in both, and the stylesheet drops the margins at the
/// seam (`.continued`, `.rest`). Without a line to cut at, `settled` holds the blocks
/// before the last one, if any, and `live` the last block.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OpenHtml {
    pub settled: Rc<str>,
    pub live: Rc<str>,
}

/// Where the finished blocks of a text end.
enum Split {
    At(usize),
    None,
    Never,
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
        if !self.whole {
            let tail = &text[self.finished_len..];
            match finished_prefix(tail) {
                Split::At(cut) => {
                    self.finished.push(Rc::from(to_html(&tail[..cut])));
                    self.finished_len += cut;
                }
                Split::None => {}
                // A definition applies to links anywhere in the text, finished blocks
                // included: this text is rendered whole from now on.
                Split::Never => {
                    self.whole = true;
                    self.finished.clear();
                    self.finished_len = 0;
                }
            }
        }
        let (settled, live) = to_html_cut_at_last_line(&text[self.finished_len..]);
        // An unchanged part keeps its `Rc`: a component showing it is not re-rendered.
        if *self.open.settled != *settled {
            self.open.settled = Rc::from(settled);
        }
        self.open.live = Rc::from(live);
    }

    /// HTML of the finished blocks, oldest first.
    pub fn finished(&self) -> &[Rc<str>] {
        &self.finished
    }

    /// HTML of the open last block, cut before its last line (both parts are empty when
    /// there is no text after the finished blocks).
    pub fn open(&self) -> &OpenHtml {
        &self.open
    }

    /// HTML of the open last block in one piece, for a reply that has ended.
    pub fn open_whole(&self) -> String {
        to_html(&self.text[self.finished_len..])
    }
}

/// How many bytes at the start of `markdown` hold blocks that no text appended later can
/// change (`Never` when links anywhere may depend on its definitions): everything before the line on which the last top-level block starts, when
/// that line is complete. (An incomplete line can still turn out to continue the block
/// before it: `2` becomes the list item `2. b`, `|` a table row.)
fn finished_prefix(markdown: &str) -> Split {
    let (starts, defines_references) = top_level_block_starts(markdown);
    if defines_references {
        return Split::Never;
    }
    let Some(start) = starts.into_iter().rev().find(|&s| markdown[s..].contains('\n')) else { return Split::None };
    // Back to the start of the line: an indented code block starts after its indent.
    match markdown[..start].rfind('\n') {
        Some(i) => Split::At(i + 1),
        None => Split::None,
    }
}

/// Byte offsets in `markdown` where its top-level blocks start, and whether it defines
/// link references (`[name]: url`).
fn top_level_block_starts(markdown: &str) -> (Vec<usize>, bool) {
    let mut starts = Vec::new();
    let mut depth = 0usize;
    let mut events = Parser::new_ext(markdown, options()).into_offset_iter();
    for (event, range) in events.by_ref() {
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
    let defines_references = events.reference_definitions().iter().next().is_some();
    (starts, defines_references)
}

/// Renders `markdown` to safe HTML.
pub fn to_html(markdown: &str) -> String {
    render(safe_events(markdown))
}

fn render<'a>(events: impl IntoIterator<Item = Event<'a>>) -> String {
    let mut html_out = String::new();
    html::push_html(&mut html_out, events.into_iter());
    with_code_copy_buttons(html_out)
}

/// Puts each code block of rendered HTML in a box with a Copy button; the page script
/// copies the text of the box's `<code>` when it is clicked, the code alone, without
/// its fences or language tag. The tags are found as text: the model's raw HTML is
/// escaped ([`safe_events`]), so `<pre><code` and `</code></pre>` are only ours.
fn with_code_copy_buttons(html: String) -> String {
    if !html.contains("<pre><code") {
        return html;
    }
    let open = format!(
        "<div class=\"code-block\"><button class=\"code-copy\" type=\"button\" title=\"{}\" data-copied=\"{}\">{}</button><pre><code",
        copy::COPY_CODE_TITLE,
        copy::COPIED,
        copy::COPY
    );
    html.replace("<pre><code", &open).replace("</code></pre>", "</code></pre></div>")
}

/// [`to_html`] in two parts, cut before the last line of the last block; see [`OpenHtml`].
fn to_html_cut_at_last_line(markdown: &str) -> (String, String) {
    let events = safe_events(markdown);
    // The last top-level block: where it starts, and its tag.
    let mut depth = 0usize;
    let mut last_block = None;
    for (i, event) in events.iter().enumerate() {
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    last_block = Some((i, tag.clone()));
                }
                depth += 1;
            }
            Event::End(_) => depth = depth.saturating_sub(1),
            _ if depth == 0 => last_block = None,
            _ => {}
        }
    }
    let Some((start, tag)) = last_block else { return (String::new(), render(events)) };
    // Inside the block (it ends with the last event): the cut, the last line break of a
    // paragraph outside any emphasis or link, or the last item of a list.
    let inside = start + 1..events.len() - 1;
    let mut depth = 0usize;
    let mut cut = None;
    for i in inside.clone() {
        match (&events[i], &tag) {
            (Event::Start(Tag::Item), Tag::List(_)) if depth == 0 && i > inside.start => cut = Some(i),
            (Event::HardBreak, Tag::Paragraph) if depth == 0 && i + 1 < inside.end => cut = Some(i),
            _ => {}
        }
        match &events[i] {
            Event::Start(_) => depth += 1,
            Event::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    let before = || events[..start].iter().cloned();
    let Some(cut) = cut else { return (render(before()), render(events[start..].iter().cloned())) };
    let (open, close, rest) = match tag {
        Tag::Paragraph => ("<p class=\"continued\">".to_string(), "</p>\n", "<p class=\"rest\">".to_string()),
        Tag::List(None) => ("<ul class=\"continued\">\n".to_string(), "</ul>\n", "<ul class=\"rest\">\n".to_string()),
        Tag::List(Some(first)) => {
            let items_before =
                events[inside.start..cut].iter().filter(|e| matches!(e, Event::Start(Tag::Item))).count();
            let next = first.saturating_add(items_before as u64);
            (
                format!("<ol class=\"continued\" start=\"{first}\">\n"),
                "</ol>\n",
                format!("<ol class=\"rest\" start=\"{next}\">\n"),
            )
        }
        _ => unreachable!("cuts are made only in paragraphs and lists"),
    };
    // Our own tags, not the model's text (whose raw HTML `safe_events` turned into text).
    let ours = |html: &str| Event::Html(CowStr::from(html.to_string()));
    let settled_inside = events[inside.start..cut].iter().cloned();
    let settled = render(before().chain([ours(&open)]).chain(settled_inside).chain([ours(close)]));
    // A paragraph's cut is its break, which the seam replaces; a list's is an item.
    let live_from = if matches!(events[cut], Event::HardBreak) { cut + 1 } else { cut };
    let live =
        render([ours(&rest)].into_iter().chain(events[live_from..inside.end].iter().cloned()).chain([ours(close)]));
    (settled, live)
}

/// The parser's events for `markdown`, made safe to show: raw HTML becomes text, links
/// become their text and address, images their alt text, single newlines line breaks.
fn safe_events(markdown: &str) -> Vec<Event<'_>> {
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
    out
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
        assert!(html.contains("<pre><code class=\"language-rust\">fn main() {}\n</code></pre></div>"), "{html}");
    }

    /// What a code block's Copy button copies: the text of the `<code>` in its box, as
    /// the page script reads it (`textContent`, the last line break dropped).
    fn copied_code(html: &str) -> Vec<String> {
        html.split("<div class=\"code-block\">")
            .skip(1)
            .map(|block| {
                assert!(block.starts_with("<button class=\"code-copy\""), "{block}");
                let code = &block[block.find("<code").unwrap()..];
                let code = &code[code.find('>').unwrap() + 1..code.find("</code></pre></div>").unwrap()];
                let text = code.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&");
                text.strip_suffix('\n').unwrap_or(&text).to_string()
            })
            .collect()
    }

    #[test]
    fn each_code_block_has_a_copy_button_that_copies_the_code_alone() {
        let reply = "Two ways:\n\n```rust\nfn main() {\n    println!(\"<b>&amp;</b>\");\n}\n```\n\n\
            - in a list:\n\n  ~~~~\n  ```not a fence end\n  ~~~~\n\nAfter.\n\n    indented code\n\nNot code: `inline` \
            and <pre><code>raw</code></pre>";
        let html = to_html(reply);
        assert_eq!(
            copied_code(&html),
            ["fn main() {\n    println!(\"<b>&amp;</b>\");\n}", "```not a fence end", "indented code"],
            "{html}"
        );
        assert_eq!(html.matches("class=\"code-copy\"").count(), 3, "{html}");
        assert!(html.contains(">Copy</button><pre><code class=\"language-rust\">"), "{html}");
        assert!(html.contains("&lt;pre&gt;&lt;code&gt;raw"), "raw HTML stays text: {html}");
        // A streamed reply's blocks carry the same buttons.
        let mut blocks = MarkdownBlocks::default();
        blocks.update(reply);
        let streamed: String =
            blocks.finished().iter().map(|b| b.to_string()).collect::<String>() + &blocks.open_whole();
        assert_eq!(copied_code(&streamed), copied_code(&html));
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

    /// The finished blocks and the open one, its two parts joined back at the seam into
    /// the HTML of the block rendered whole (which is also checked against `open_whole`).
    fn joined(blocks: &MarkdownBlocks) -> String {
        let mut html: String = blocks.finished().iter().map(|b| b.to_string()).collect();
        let open = unsplit(blocks.open());
        assert_eq!(open, blocks.open_whole());
        html.push_str(&open);
        html
    }

    fn unsplit(open: &OpenHtml) -> String {
        let (settled, live) = (&*open.settled, &*open.live);
        if let Some(rest) = live.strip_prefix("<p class=\"rest\">") {
            let head = settled.strip_suffix("</p>\n").expect(settled).replacen("<p class=\"continued\">", "<p>", 1);
            return format!("{head}<br />\n{rest}");
        }
        if let Some(rest) = live.strip_prefix("<ul class=\"rest\">\n") {
            let head = settled.strip_suffix("</ul>\n").expect(settled).replacen("<ul class=\"continued\">", "<ul>", 1);
            return format!("{head}{rest}");
        }
        if let Some(rest) = live.strip_prefix("<ol class=\"rest\" start=\"") {
            let rest = &rest[rest.find("\">\n").expect(live) + 3..];
            let head = settled.strip_suffix("</ol>\n").expect(settled);
            let head = head.replacen("<ol class=\"continued\" start=\"1\">", "<ol>", 1).replacen(
                "<ol class=\"continued\" ",
                "<ol ",
                1,
            );
            return format!("{head}{rest}");
        }
        format!("{settled}{live}")
    }

    const REPLY: &str = "# Tips\n\nSleep **well**:\n\n1. Keep a schedule.\n2. Avoid screens.\n\n3. Loose item.\n\n\
        ```sh\necho one\n\necho two\n```\n\n---\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n\
        > quoted\n> lines\n\n    indented code\n\n    more code\n\nLast *words* — ünïcödé 😀.";

    /// Texts whose later lines change how earlier ones parse.
    const TRICKY: &[&str] = &[
        "Title\n=====\n\nSub\n---\ntext",
        "- a\n  - nested\n\n  continued\n- b\n\n10. ten\n11. eleven\n\n12\n",
        "<!-- a comment\n\nstill the comment -->\n\n<div>\nraw\n</div>\n\nafter",
        "para\n| h |\n|---|\n| r |\n\n> q\nlazy\n\n~~~\nfence\n~~~~\n\n***\n* item",
        "[ref]: https://x.org\n\nsee [ref] and [the site](https://y.org)\n\n1) one\n\n2) two",
    ];

    #[test]
    fn streamed_blocks_render_what_the_whole_text_renders() {
        let whole = to_html(REPLY);
        for step in [1, 2, 3, 7, 16, 1000] {
            let blocks = streamed(REPLY, step);
            assert_eq!(joined(&blocks), whole, "step {step}");
            for text in TRICKY {
                assert_eq!(joined(&streamed(text, step)), to_html(text), "step {step}: {text:?}");
            }
        }
        let blocks = streamed(REPLY, 3);
        assert!(blocks.finished().len() >= 5, "finished blocks are kept: {}", blocks.finished().len());
        assert!(blocks.open().live.contains("Last <em>words</em>"), "{:?}", blocks.open());
    }

    #[test]
    fn a_token_changes_only_the_line_it_is_written_on() {
        let mut blocks = MarkdownBlocks::default();
        blocks.update("Once upon a time\nthere was a *keeper*\nwho wa");
        let settled = blocks.open().settled.clone();
        assert_eq!(&*settled, "<p class=\"continued\">Once upon a time<br />\nthere was a <em>keeper</em></p>\n");
        assert_eq!(&*blocks.open().live, "<p class=\"rest\">who wa</p>\n");
        blocks.update("Once upon a time\nthere was a *keeper*\nwho watched");
        assert!(Rc::ptr_eq(&settled, &blocks.open().settled), "the lines before are not rendered again");
        assert_eq!(&*blocks.open().live, "<p class=\"rest\">who watched</p>\n");

        blocks.update("Tips:\n\n3. Keep a schedule.\n4. Avoid screens.\n5. Dar");
        assert_eq!(&*blocks.open().live, "<ol class=\"rest\" start=\"5\">\n<li>Dar</li>\n</ol>\n");
        assert!(blocks.open().settled.starts_with("<ol class=\"continued\" start=\"3\">"), "{:?}", blocks.open());
        // Emphasis across the last break: the cut moves to a break outside it.
        blocks.update("a\nb **c\nd** e");
        assert_eq!(&*blocks.open().live, "<p class=\"rest\">b <strong>c<br />\nd</strong> e</p>\n");
        // One line, nothing to cut.
        blocks.update("a line");
        assert_eq!((&*blocks.open().settled, &*blocks.open().live), ("", "<p>a line</p>\n"));
    }

    #[test]
    fn finished_blocks_are_kept_as_they_are() {
        let mut blocks = MarkdownBlocks::default();
        blocks.update("First paragraph.\n\nSecond");
        assert!(blocks.finished().is_empty(), "the new block's first line may still change");
        blocks.update("First paragraph.\n\nSecond paragraph,\nlonger");
        assert_eq!(blocks.finished().len(), 1);
        let first = blocks.finished()[0].clone();
        blocks.update("First paragraph.\n\nSecond paragraph,\nlonger still.");
        assert!(Rc::ptr_eq(&first, &blocks.finished()[0]), "not rendered again");
        assert_eq!(blocks.open_whole(), "<p>Second paragraph,<br />\nlonger still.</p>\n");
        // A fence left open holds everything after it in the open block.
        blocks.update("First paragraph.\n\nSecond paragraph,\nlonger still.\n\n```\ncode\n\nstill code");
        assert!(blocks.open().live.contains("<pre><code>code\n\nstill code"), "{:?}", blocks.open());
    }

    #[test]
    fn a_rewritten_text_starts_over() {
        let mut blocks = MarkdownBlocks::default();
        blocks.update("One.\n\nTwo.\n\nThree");
        blocks.update("Other.\n\nText");
        assert_eq!(joined(&blocks), to_html("Other.\n\nText"));
        blocks.update("");
        assert!(blocks.finished().is_empty() && *blocks.open() == OpenHtml::default());
    }

    #[test]
    fn single_newlines_are_line_breaks_and_half_streamed_fences_render() {
        let br = to_html("a\nb");
        assert!(br.contains("a<br />\nb"), "{br}");
        let html = to_html("code:\n```\nlet x = 1;");
        assert!(html.contains("<pre><code>let x = 1;"), "{html}");
    }
}
