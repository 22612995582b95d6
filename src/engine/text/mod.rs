//! Text in and out of the model: the tokenizers that ship in the GGUF ([`tokenizer`]:
//! BPE in [`bpe`] with llama.cpp's pre-tokenizer per `tokenizer.ggml.pre` in
//! [`pretokenize`], SentencePiece in [`spm`]), incremental detokenizing that only emits
//! whole characters ([`detokenizer`]), a reply's thinking told from its answer
//! ([`thinking`]), and the chat template ([`template`]). Nothing here
//! knows the weights or the cache.

pub(crate) mod bpe;
pub(crate) mod byte_level;
pub(crate) mod detokenizer;
mod merge;
pub mod pretokenize;
mod specials;
pub mod spm;
pub mod template;
pub mod thinking;
pub mod tokenizer;
