#!/usr/bin/env python3
"""The module graph has no loops, and each top-level module uses only those below it.

    python3 scripts/check-layers.py          # exit 1 and a list of the offending imports

Reads every `crate::…` and `super::…` path in src/ (comments and strings skipped) and
checks two things:

1. Between top-level modules, imports go one way only, down the order of LAYERS (a
   module may use those before it in the list). docs/architecture.md draws the same map.
2. The FORBIDDEN imports below (the UI's strings import nothing; nothing under ui/
   imports its root component).
3. Among the sibling modules of one folder (src/ui/*.rs, src/engine/*.rs, ... with their
   own subfolders counted as one), there is no cycle. A folder's own `mod.rs` is its
   interface and is left out: it declares and re-exports its children.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# Imports a module may not make although the layers allow them: (module, forbidden prefix,
# why). The UI's words are plain strings, and the root component is used by nobody.
FORBIDDEN = [
    (["ui", "copy"], [], "ui/copy.rs holds plain strings: it imports nothing of the crate"),
    (["ui"], ["ui", "app"], "nothing under ui/ imports ui::app (the engine link is ui::engine_link)"),
]

# Bottom up: each module may use the ones before it.
LAYERS = ["calendar", "files", "gguf", "transcript", "memory", "chats", "engine", "catalog", "ui", "cli_output", "cli", "main"]

PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")
USE_GROUP = re.compile(r"\b(crate|super)((?:::\w+)*)::\{([^;]*?)\};", re.S)


def module_of(path):
    """src/engine/worker/run.rs -> ['engine', 'worker', 'run']; mod.rs and lib.rs name the folder."""
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel == ["lib"]:
        return []
    return rel


def strip_comments_and_strings(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def resolve(module, kind, segments):
    """The absolute module path a `crate::…`/`super::…` path names (its first segments)."""
    if kind == "crate":
        return segments
    # `super` is the parent of the module (a folder's mod.rs is the folder's module).
    base = list(module[:-1])
    while segments and segments[0] == "super":
        base = base[:-1]
        segments = segments[1:]
    return base + segments


def imports(path):
    module = module_of(path)
    text = strip_comments_and_strings(open(path, encoding="utf-8").read())
    found = []
    for m in PATH.finditer(text):
        segs = [s for s in m.group(2).split("::") if s]
        found.append(resolve(module, m.group(1), segs))
    for m in USE_GROUP.finditer(text):
        prefix = [s for s in m.group(2).split("::") if s]
        for item in re.findall(r"\b(\w+)", m.group(3)):
            found.append(resolve(module, m.group(1), prefix + [item]))
    return module, found


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    files = []
    for d, _, names in os.walk(ROOT):
        files += [os.path.join(d, n) for n in names if n.endswith(".rs")]
    problems = []
    siblings = defaultdict(lambda: defaultdict(set))  # folder -> node -> nodes
    where = {}
    for path in sorted(files):
        module, found = imports(path)
        rel = os.path.relpath(path, os.path.join(ROOT, ".."))
        top = module[0] if module else None
        for target in found:
            if not target:
                continue
            for owner, prefix, why in FORBIDDEN:
                inside = module[: len(owner)] == owner and module != ["ui"]
                if inside and target[: len(prefix)] == prefix and module[:2] != target[:2]:
                    problems.append(f"{rel}: uses {'::'.join(target)}: {why}")
            # 1. Top-level layering.
            if top in LAYERS and target[0] in LAYERS and target[0] != top:
                if LAYERS.index(target[0]) > LAYERS.index(top):
                    problems.append(f"{rel}: {top} uses {'::'.join(target)}, a layer above it")
            # 2. Siblings within one folder: the first segment where the paths part.
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common >= len(module) or common >= len(target) or common == 0:
                continue
            folder = tuple(module[:common])
            a, b = module[common], target[common]
            siblings[folder][a].add(b)
            where.setdefault((folder, a, b), rel)
    for folder, graph in sorted(siblings.items()):
        for comp in cycles(graph):
            edges = [
                f"{where[(folder, a, b)]} ({a} -> {b})" for a in comp for b in sorted(graph[a]) if b in comp
            ]
            problems.append(f"import loop in {'/'.join(folder)}: {' <-> '.join(comp)}: " + "; ".join(edges))
    for p in problems:
        print(p, flush=True)
    if problems:
        print(f"check-layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check-layers: no import loops; every top-level module uses only those below it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
