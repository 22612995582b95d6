#!/usr/bin/env python3
"""llama.cpp's token ids for texts its own tokenizer suite does not cover, on the BPE
vocabularies of that suite, for tests/tokenizer_suite.rs:

  python3 scripts/llamacpp_tokenizer_cases.py     # tests/fixtures/llamacpp_tokenizer_cases.json

test-tokenizer-0 reads special-token strings as text only. This records, for every BPE
vocabulary (`tokenizer.ggml.model` gpt2 or gemma4) in models/llamacpp-suite/ (or
$POCKETCHAT_LLAMACPP_SUITE; scripts/fetch-llamacpp-suite.sh fetches it), the ids of a few
hard texts and of one text spelling the vocabulary's first control and user-defined
tokens, with special tokens read as text and parsed (llama-cpp-python 0.3.36,
`tokenize(add_bos=False, special=...)`).
"""
import glob, json, os

import gguf
from llama_cpp import Llama

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.environ.get("POCKETCHAT_LLAMACPP_SUITE", os.path.join(REPO, "models", "llamacpp-suite"))
OUT = os.path.join(REPO, "tests", "fixtures", "llamacpp_tokenizer_cases.json")
TEXTS = [
    "Ünïcödé naïve café — “quotes” ‘x’ … 𝔘𝔫𝔦 😀👍🏽 \u00a0nbsp\u2003em\u3000ideo 中文字符 日本語のテキスト 한국어 텍스트 عربي हिन्दी ไทย",
    "def f(x):\n\tif x >= 10_000:\n\t\treturn x**2 # comment\n    \n\n\n\r\n  1. item\n  2. 3.14159 1,234,567 $99.99 100% #tag @user http://a.b/c?d=e&f=g",
    "   leading and trailing   \n\n\n",
    "'s 'S 'RE 'Ll don't I'M",
    "\u0000\u0001\u007f\u0085\u200b\u200d\ufeff",
]


def strings(reader, key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode() for i in field.data]


def main():
    out = {}
    for inp in sorted(glob.glob(os.path.join(SUITE, "ggml-vocab-*.gguf.inp"))):
        path = inp[: -len(".inp")]
        reader = gguf.GGUFReader(path)
        if strings(reader, "tokenizer.ggml.model")[0] not in ("gpt2", "gemma4"):
            continue
        tokens = strings(reader, "tokenizer.ggml.tokens")
        field = reader.fields["tokenizer.ggml.token_type"]
        types = [int(field.parts[i][0]) for i in field.data]
        control = [tokens[i] for i, t in enumerate(types) if t == 3][:4]
        user = [tokens[i] for i, t in enumerate(types) if t == 4][:3]
        specials = "".join(c + " Hello\n" for c in control) + "x".join(user) + " end" + (control[0] if control else "")
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        out[os.path.basename(path)] = [
            {
                "text": text,
                "text_ids": llm.tokenize(text.encode(), add_bos=False, special=False),
                "special_ids": llm.tokenize(text.encode(), add_bos=False, special=True),
            }
            for text in TEXTS + [specials]
        ]
    with open(OUT, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{OUT}: {len(out)} vocabularies")


if __name__ == "__main__":
    main()
