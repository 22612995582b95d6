#!/usr/bin/env python3
"""Does the second turn keep the facts? Asks `pocketchat chat` "What is the capital of
Germany?" then "And of Italy?" once per seed and counts the second replies that name Rome.

    python3 bench/rome_check.py target/release/pocketchat [chat flags, e.g. --temperature 0]

Set SEEDS (default "1 2 3 4 5") to choose the seeds; with --temperature 0 one run is enough.
"""
import os
import subprocess
import sys

binary, extra = sys.argv[1], sys.argv[2:]
seeds = os.environ.get("SEEDS", "1 2 3 4 5").split()
named = 0
for seed in seeds:
    # With --stats the chat writes "[turn N] …" to stderr after each reply: merged with the
    # replies on stdout, those lines separate the turns.
    out = subprocess.run([binary, "chat", "--stats", "--max-tokens", "80", "--seed", seed, *extra],
                         input="What is the capital of Germany?\nAnd of Italy?\n",
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600).stdout
    lines = out.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("[turn ")]
    second = ""
    if len(marks) >= 2:
        body = lines[marks[0] + 1:marks[1]]
        second = " ".join(line for line in body if not line.startswith("[")).strip()
    rome = "Rome" in second
    named += rome
    print(f"seed {seed}: {'Rome' if rome else 'no Rome'}: {second[:160]!r}")
print(f"named Rome: {named} of {len(seeds)}")
