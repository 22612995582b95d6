//! The pre-tokenizer of a BPE vocabulary: how text is cut into words before the merges,
//! chosen by the file's `tokenizer.ggml.pre` as llama.cpp chooses it (`llama-vocab.cpp`).
//!
//! Each style is a list of regexes applied in turn: every piece of text so far is cut
//! into the regex's matches *and* the stretches between them (those stay pieces too, as
//! in llama.cpp's `unicode_regex_split`), and each piece is matched on its own, so a
//! lookahead such as `\s+(?!\S)` sees a piece's end as the end of the text.
//!
//! The regexes are the Hugging Face tokenizers' as llama.cpp adapted them (case-insensitive
//! groups spelled out). llama.cpp runs some through hand-written splitters and the rest on
//! text with every non-ASCII character replaced by its Unicode category; both amount to
//! these regexes with Unicode's letter, number and white-space classes, which is what
//! `fancy_regex` gives. A `pre` value not listed here is refused: its split is unknown, and
//! a guess would give other ids than the model was trained on without any sign.

use fancy_regex::Regex;

/// The split styles we reproduce, by llama.cpp's name for them (`LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// llama.cpp's default, for BPE files without a `pre`.
    Default,
    /// Llama 3: letters with one leading non-letter, numbers in threes.
    Llama3,
    /// Llama 3's split for models (DBRX, Smaug) that keep every merge.
    Llama3Merged,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    /// GPT-2's split with every digit on its own (StarCoder, Refact, Command-R, SmolLM).
    Starcoder,
    /// GPT-2's own split (also MPT, OLMo, Phi-2).
    Gpt2,
    /// Llama 3's split with single digits (Qwen 2/2.5/3).
    Qwen2,
    /// Qwen 2's split with combining marks kept in words (Qwen 3.5).
    Qwen35,
    /// Gemma 4: no word split (only newline runs apart); spaces become `▁` and the merges
    /// run on the raw UTF-8 bytes, with `<0xXX>` byte tokens.
    Gemma4,
}

/// `tokenizer.ggml.pre` values and their style, as llama.cpp maps them; only the names
/// whose style is one of ours.
const PRE_NAMES: &[(&str, Style)] = &[
    ("default", Style::Default),
    ("llama3", Style::Llama3),
    ("llama-v3", Style::Llama3),
    ("llama-bpe", Style::Llama3),
    ("falcon3", Style::Llama3),
    ("falcon-h1", Style::Llama3),
    ("pixtral", Style::Llama3),
    ("midm-2.0", Style::Llama3),
    ("lfm2", Style::Llama3),
    ("jina-v5-nano", Style::Llama3),
    ("dbrx", Style::Llama3Merged),
    ("smaug-bpe", Style::Llama3Merged),
    ("deepseek-llm", Style::DeepseekLlm),
    ("deepseek-coder", Style::DeepseekCoder),
    ("falcon", Style::Falcon),
    ("starcoder", Style::Starcoder),
    ("refact", Style::Starcoder),
    ("command-r", Style::Starcoder),
    ("smollm", Style::Starcoder),
    ("codeshell", Style::Starcoder),
    ("exaone", Style::Starcoder),
    ("minerva-7b", Style::Starcoder),
    ("mellum2", Style::Starcoder),
    ("gpt-2", Style::Gpt2),
    ("phi-2", Style::Gpt2),
    ("jina-es", Style::Gpt2),
    ("jina-de", Style::Gpt2),
    ("gigachat", Style::Gpt2),
    ("jina-v2-es", Style::Gpt2),
    ("jina-v2-de", Style::Gpt2),
    ("a.x-4.0", Style::Gpt2),
    ("mellum", Style::Gpt2),
    ("modern-bert", Style::Gpt2),
    ("mpt", Style::Gpt2),
    ("olmo", Style::Gpt2),
    ("jais", Style::Gpt2),
    ("trillion", Style::Gpt2),
    ("granite-docling", Style::Gpt2),
    ("exaone4", Style::Gpt2),
    ("qwen2", Style::Qwen2),
    ("deepseek-r1-qwen", Style::Qwen2),
    ("kormo", Style::Qwen2),
    ("f2llmv2", Style::Qwen2),
    ("stablelm2", Style::Qwen2),
    ("hunyuan", Style::Qwen2),
    ("solar-open", Style::Qwen2),
    ("megrez", Style::Qwen2),
    ("qwen35", Style::Qwen35),
];

/// The `tokenizer.ggml.pre` values we reproduce (BPE files; `gemma4` files have none).
pub fn supported_names() -> impl Iterator<Item = &'static str> {
    PRE_NAMES.iter().map(|(name, _)| *name)
}

/// GPT-2's word split; llama.cpp's has no final `|\s+`, which changes nothing here since
/// the stretches between matches are pieces anyway.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian and other cased
/// scripts, as its tokenizer.json lists them (escaped: several are canonically equivalent
/// to other characters, and an editor's normalization would change the ranges).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
/// CJK ideographs, the scripts from Samaritan up to them, and Hangul syllables.
const DEEPSEEK_CJK: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";

impl Style {
    /// The regexes applied in turn.
    fn patterns(self) -> &'static [&'static str] {
        match self {
            Style::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            Style::Llama3 | Style::Llama3Merged => &[LLAMA3],
            Style::DeepseekLlm => &[
                r"[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
                r"\s+$",
                DEEPSEEK_CJK,
                r"\p{N}+",
            ],
            Style::DeepseekCoder => &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
            Style::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            Style::Starcoder => &[r"\p{N}", GPT2],
            Style::Gpt2 => &[GPT2],
            Style::Qwen2 => &[QWEN2],
            Style::Qwen35 => &[QWEN35],
            Style::Gemma4 => &[r"[^\n]+|[\n]+"],
        }
    }
}

/// A vocabulary's pre-tokenizer and the BPE settings that come with its style.
pub struct PreTokenizer {
    pub style: Style,
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    /// The pre-tokenizer of a BPE file: `model` is `tokenizer.ggml.model` (`gpt2` or
    /// `gemma4`), `pre` its `tokenizer.ggml.pre`. An error names both when we do not know
    /// the split.
    pub fn for_vocabulary(model: &str, pre: Option<&str>) -> Result<PreTokenizer, String> {
        let style = match (model, pre) {
            ("gemma4", _) => Style::Gemma4,
            // As llama.cpp: a BPE file without `pre` gets the default split.
            ("gpt2", None) => Style::Default,
            ("gpt2", Some(name)) => PRE_NAMES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).ok_or_else(|| {
                format!(
                    "tokenizer.ggml.model `gpt2` with tokenizer.ggml.pre `{name}`: this pre-tokenizer is not \
                     supported, so token ids would differ from the model's (supported: {})",
                    supported_names().collect::<Vec<_>>().join(", ")
                )
            })?,
            (other, _) => return Err(format!("tokenizer.ggml.model `{other}` is not a BPE vocabulary")),
        };
        let regexes = style
            .patterns()
            .iter()
            .map(|p| Regex::new(p).map_err(|e| format!("pre-tokenizer {style:?}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer { style, regexes })
    }

    /// Words are spelled in GPT-2's byte-level alphabet before the merges (all but Gemma 4).
    pub fn byte_encodes(&self) -> bool {
        self.style != Style::Gemma4
    }

    /// A word that is a whole vocabulary token is that token, whatever the merges would
    /// make of it (Hugging Face's `ignore_merges`, Llama 3's setting).
    pub fn ignores_merges(&self) -> bool {
        self.style == Style::Llama3
    }

    /// Spaces are written `▁` before the split (Gemma 4's normalizer).
    pub fn escapes_spaces(&self) -> bool {
        self.style == Style::Gemma4
    }

    /// Texts start with BOS unless the file says otherwise (Llama 3, as in llama.cpp).
    pub fn adds_bos_by_default(&self) -> bool {
        self.style == Style::Llama3
    }

    /// `text` cut into words, in order; together they are the whole text.
    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for regex in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut at = 0;
                for m in regex.find_iter(piece) {
                    // The patterns are simple enough that fancy_regex's backtracking limit
                    // is out of reach; a piece it gave up on stays whole.
                    let Ok(m) = m else { break };
                    if m.start() == m.end() {
                        continue;
                    }
                    if m.start() > at {
                        next.push(&piece[at..m.start()]);
                    }
                    next.push(m.as_str());
                    at = m.end();
                }
                if at < piece.len() {
                    next.push(&piece[at..]);
                }
            }
            pieces = next;
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        PreTokenizer::for_vocabulary("gpt2", Some(pre)).unwrap().split(text).into_iter().map(String::from).collect()
    }

    #[test]
    fn smollm_isolates_digits_before_gpt2s_split() {
        assert_eq!(split("smollm", "\n\n  0"), ["\n\n  ", "0"]);
        assert_eq!(split("gpt-2", "\n\n  0"), ["\n\n ", " 0"]);
        assert_eq!(split("smollm", "Hello 123world"), ["Hello", " ", "1", "2", "3", "world"]);
    }

    #[test]
    fn llama3_groups_digits_in_threes_and_qwen2_singly() {
        assert_eq!(split("llama-bpe", "x 12345"), ["x", " ", "123", "45"]);
        assert_eq!(split("qwen2", "12"), ["1", "2"]);
    }

    /// fancy_regex backtracks; a long run must still split as a short one does.
    #[test]
    fn long_runs_split_like_short_ones() {
        let spaces = " ".repeat(100_000);
        for pre in ["smollm", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm"] {
            let pieces = split(pre, &format!("{spaces}a{spaces}"));
            assert_eq!(pieces.concat().len(), 200_001, "{pre}");
            assert_eq!(pieces[0].len(), 99_999, "{pre}: {:?}", &pieces[1..]);
        }
        let letters = "ab".repeat(100_000);
        assert_eq!(split("qwen2", &format!(" {letters}!")), [format!(" {letters}"), "!".into()]);
    }

    #[test]
    fn unknown_pre_tokenizers_are_refused_naming_model_and_pre() {
        let err = PreTokenizer::for_vocabulary("gpt2", Some("no-such-split")).err().unwrap();
        assert!(err.contains("tokenizer.ggml.model `gpt2`") && err.contains("`no-such-split`"), "{err}");
    }
}
