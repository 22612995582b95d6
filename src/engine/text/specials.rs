//! Cutting text at the special tokens it contains before the rest is tokenized as text,
//! as llama.cpp's `tokenizer_st_partition` does for every tokenizer type.

/// A part of the text being tokenized: raw text, or a special token already recognised.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// `text` cut at every occurrence of `specials` (token id and text, in the order given:
/// longest first), each found left to right in what earlier ones left as text.
pub(crate) fn cut_at_specials<'a, 'p>(
    text: &'a str,
    specials: impl IntoIterator<Item = (u32, &'p str)>,
) -> Vec<Fragment<'a>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(text)];
    for (id, piece) in specials {
        if !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(piece))) {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(t) = fragment else {
                next.push(fragment);
                continue;
            };
            let mut at = 0;
            for (start, _) in t.match_indices(piece) {
                if start > at {
                    next.push(Fragment::Text(&t[at..start]));
                }
                next.push(Fragment::Token(id));
                at = start + piece.len();
            }
            if at < t.len() {
                next.push(Fragment::Text(&t[at..]));
            }
        }
        fragments = next;
    }
    fragments
}
