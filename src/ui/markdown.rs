//! Markdown for replies, as chat apps render it.
//!
//! [`to_html`] turns a (possibly half-streamed) reply into HTML with pulldown-cmark:
//! paragraphs, lists, emphasis, tables, inline code and fenced code blocks
//! (`<pre><code>`, shown in monospace by the stylesheet). Model output is untrusted, so
//! raw HTML in it is escaped and shown as text, links become plain text followed by
//! their address (a click must never navigate the app's webview away), images show
//! their alt text, and single newlines are kept as line breaks.

use pulldown_cmark::{html, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Renders `markdown` to safe HTML.
pub fn to_html(markdown: &str) -> String {
    let options = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS;
    let mut out = Vec::new();
    // Link destinations and the text seen inside each open link.
    let mut links: Vec<(LinkType, String, String)> = Vec::new();
    for event in Parser::new_ext(markdown, options) {
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

    #[test]
    fn single_newlines_are_line_breaks_and_half_streamed_fences_render() {
        let br = to_html("a\nb");
        assert!(br.contains("a<br />\nb"), "{br}");
        let html = to_html("code:\n```\nlet x = 1;");
        assert!(html.contains("<pre><code>let x = 1;"), "{html}");
    }
}
