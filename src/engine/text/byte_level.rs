//! GPT-2's byte-level alphabet: every byte spelled as one printable character, so a BPE
//! vocabulary can hold any byte sequence as text. The printable bytes (`!`..`~`, `¡`..`¬`,
//! `®`..`ÿ`) stand for themselves; the other 68 bytes, in byte order, for U+0100, U+0101, …
//! (space is `Ġ`, newline `Ċ`).

/// Whether byte `b` is spelled by the character of the same code.
fn is_printable(b: u32) -> bool {
    (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
}

/// The character that spells byte `b`.
pub fn char_of_byte(b: u8) -> char {
    if is_printable(b as u32) {
        return b as char;
    }
    let rank = (0..b as u32).filter(|&x| !is_printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("U+0100..U+0143 are characters")
}

/// The byte that `c` spells; `None` for a character outside the alphabet.
pub fn byte_of_char(c: char) -> Option<u8> {
    let code = c as u32;
    if is_printable(code) {
        return Some(code as u8);
    }
    let rank = code.checked_sub(256)?;
    (0..=255u32).filter(|&b| !is_printable(b)).nth(rank as usize).map(|b| b as u8)
}

/// `text`'s bytes, each spelled as its character.
pub fn encode(text: &str, out: &mut String) {
    out.clear();
    out.extend(text.bytes().map(|b| BYTE_CHARS[b as usize]));
}

/// [`char_of_byte`] for every byte, computed once.
static BYTE_CHARS: std::sync::LazyLock<[char; 256]> = std::sync::LazyLock::new(|| {
    let mut table = ['\0'; 256];
    for (b, c) in table.iter_mut().enumerate() {
        *c = char_of_byte(b as u8);
    }
    table
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_and_space_and_newline_have_their_gpt2_spelling() {
        for b in 0..=255u8 {
            assert_eq!(byte_of_char(char_of_byte(b)), Some(b));
        }
        assert_eq!(char_of_byte(b' '), 'Ġ');
        assert_eq!(char_of_byte(b'\n'), 'Ċ');
        assert_eq!(byte_of_char('▁'), None);
        let mut out = String::new();
        encode("a é", &mut out);
        assert_eq!(out, "aĠÃ©");
    }
}
