#!/usr/bin/env bash
# Layout rules for src/ (run by scripts/test.sh; exits non-zero on a violation):
# 1. no file under src/ over MAX_LINES (800) lines: split it by responsibility;
# 2. no import cycle between modules. Each file is a module (src/a/b.rs is a::b,
#    src/a/mod.rs is a). A module depends on another when it names it: `use crate::…`,
#    `use super::…`, `use self::…` (braces included) or a `crate::…` path in code
#    (comments and strings are skipped). Edges between a module and its own ancestors or
#    descendants are not counted: a module and its parts are one unit (mod.rs re-exports
#    and helpers). Any other cycle, e.g. fs::decide -> fs::ops -> fs::decide, fails.
# Usage: scripts/check-layout.sh [SRC_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python3 - "${1:-src}" <<'PY'
import os, re, sys

MAX_LINES = 800
root = sys.argv[1]
failed = False

def module_of(path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)

files = {}
for d, _, names in os.walk(root):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(d, n)
            files[p] = module_of(p)
modules = set(files.values())

for p in sorted(files):
    with open(p, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if lines > MAX_LINES:
        print(f"check-layout: {p}: {lines} lines (more than {MAX_LINES}): split it by responsibility")
        failed = True

def strip(text):
    """Source without comments, string and char literals (a rough lexer, enough here)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            j = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if j < 0 else j + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            j = text.find("'", i + 2)
            i = n if j < 0 else j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)

def expand(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    depth, start, parts = 0, 0, []
    for i, c in enumerate(tree + ","):
        if c in "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(tree[start:i])
            start = i + 1
    out = []
    for part in filter(None, parts):
        if "{" in part:
            head, rest = part.split("{", 1)
            out += [head + x for x in expand(rest[: rest.rfind("}")])]
        else:
            out.append(part.split(" as ")[0])
    return out

def resolve(mod, path):
    segs = [s for s in path.split("::") if s and s != "*"]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = mod
        while segs and segs[0] in ("super", "self"):
            base = base[:-1] if segs[0] == "super" else base
            segs = segs[1:]
    else:
        return None  # another crate, std, or a name in scope
    best = base if base in modules else None
    for k in range(1, len(segs) + 1):
        if base + tuple(segs[:k]) in modules:
            best = base + tuple(segs[:k])
    return best

edges = {}
for p, mod in files.items():
    with open(p, encoding="utf-8") as f:
        code = strip(f.read())
    targets = set()
    for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", code):
        for path in expand(m.group(1)):
            targets.add(resolve(mod, path))
    for m in re.finditer(r"(?<![:\w])crate(?:::\w+)+", code):
        targets.add(resolve(mod, m.group(0)))
    for t in targets:
        if t is None or t == mod:
            continue
        if t[: len(mod)] == mod or mod[: len(t)] == t:
            continue  # a module and its own parts
        edges.setdefault(mod, set()).add(t)

# Tarjan's strongly connected components: every component of more than one module is a cycle.
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges.get(v, ())):
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
            comps.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in sorted(modules):
    if v not in index:
        visit(v)

name = lambda m: "::".join(m) or "crate"
for comp in comps:
    inside = set(comp)
    links = [f"{name(a)} -> {name(b)}" for a in comp for b in sorted(edges.get(a, ())) if b in inside]
    print(f"check-layout: import cycle between {', '.join(map(name, comp))}: {'; '.join(links)}")
    failed = True

if failed:
    sys.exit(1)
print(f"check-layout: {len(files)} files, none over {MAX_LINES} lines, no import cycle")
PY
