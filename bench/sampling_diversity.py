#!/usr/bin/env python3
"""Distinct word 4-gram ratio of `pocketchat chat` replies to three everyday prompts
(300 tokens each, a fresh conversation per prompt): 1.0 means no 4-gram repeats, low
values mean the reply loops.

    python3 bench/sampling_diversity.py target/release/pocketchat [chat flags, e.g. --temperature 0]
"""
import re
import subprocess
import sys

PROMPTS = [
    "Write a story about a dragon who is afraid of the dark.",
    "Explain how rain forms to a ten-year-old.",
    "Describe a busy market in the morning.",
]

binary, extra = sys.argv[1], sys.argv[2:]
ratios = []
for prompt in PROMPTS:
    out = subprocess.run([binary, "chat", "--max-tokens", "300", *extra], input=prompt + "\n",
                         capture_output=True, text=True, timeout=600).stdout
    words = re.findall(r"\w+", out.lower())
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    ratio = len(set(grams)) / max(1, len(grams))
    ratios.append(ratio)
    print(f"{ratio:.2f} ({len(words)} words): {out.strip()[:120]!r}")
print("ratios", " ".join(f"{r:.2f}" for r in ratios))
