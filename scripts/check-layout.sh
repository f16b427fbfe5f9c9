#!/usr/bin/env bash
# Layout rules for src/ (run by scripts/test.sh; exits non-zero on a violation):
# 1. no file under src/ over MAX_LINES (800) lines: split it by responsibility;
# 2. no import cycle between modules. Each file is a module (src/a/b.rs is a::b,
#    src/a/mod.rs is a). A module depends on another when it names it: in a `use` tree
#    (`use crate::…`, `use super::{a, b::{c, d}}`, `use self::…`, `pub(super) use …`, groups
#    and nesting expanded) or in a path in code (`crate::a::f()`, `super::b::T`,
#    `super::super::c::K`, `self::d::X`). A path inside an inline `mod tests { … }` resolves
#    from that inline module, as rustc does; `use child::x` from the module it is in;
#    `as` renames are kept. A path through a `pub use` re-export (a mod.rs index) names
#    the module that defines the item, not the index. Comments, strings and `$crate` are
#    skipped. Edges between a module and its own ancestors or descendants are not
#    counted: a module and its parts are one unit (mod.rs and helpers). Any other cycle, e.g.
#    fs::decide -> fs::ops -> fs::decide, fails, and every cycle is printed with its edges.
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
    """`a::{b, c::{d as e}}` -> ["a::b", "a::c::d@e"] (`@alias` when renamed)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
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
            out.append(part)
    return out

def inline_mods(code):
    """[(start, end, names)]: the spans of `mod name { … }` blocks inside a file, innermost
    last, so a path inside `mod tests { … }` resolves from `file::tests` (`super::` there is
    the file's own module)."""
    spans, stack, depth = [], [], 0
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{|[{}]", code):
        if m.group(1):
            depth += 1
            stack.append((m.group(1), depth, m.start()))
        elif m.group(0) == "{":
            depth += 1
        else:
            if stack and stack[-1][1] == depth:
                name, _, start = stack.pop()
                spans.append((start, m.end(), tuple(s[0] for s in stack) + (name,)))
            depth -= 1
    return spans

def scope_at(mod, spans, pos):
    """The module a path at offset `pos` is written in: the file's module plus inline mods."""
    best = ()
    for start, end, names in spans:
        if start <= pos < end and len(names) > len(best):
            best = names
    return mod + best

def absolute(scope, path):
    """`path` written in `scope` as segments from the crate root; None for another crate,
    std, or a name in scope."""
    segs = [s for s in path.split("::") if s and s != "*"]
    if segs and scope is not None and scope + (segs[0],) in modules:
        segs = ["self"] + segs  # `use child::x` in a module (2018 paths)
    if not segs or segs[0] not in ("crate", "super", "self"):
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    else:
        base = scope
        while segs and segs[0] in ("super", "self"):
            base = base[:-1] if segs[0] == "super" else base
            segs = segs[1:]
    return base + tuple(s for s in segs if s != "self")

# Re-exports: `pub use a::b::X;` in module M makes `M::X` name a::b's X (mod.rs indexes do
# this), so a path through M is an edge to a::b, not to M (which could hide a cycle).
reexports = {}  # (module, name) -> absolute path of what it names

def resolve(scope, path, seen=0):
    """The deepest module (a file) that `path`, written in `scope`, names, following
    re-exports; None for another crate, std, or a name in scope."""
    full = absolute(scope, path) if isinstance(path, str) else path
    if full is None:
        return None
    for k in range(len(full), -1, -1):
        if full[:k] in modules:
            if k < len(full) and (full[:k], full[k]) in reexports and seen < 16:
                return resolve(None, reexports[(full[:k], full[k])] + full[k + 1 :], seen + 1)
            return full[:k]
    return None

PATH_HEAD = r"(?:crate|super|self)"
codes = {}
for p, mod in files.items():
    with open(p, encoding="utf-8") as f:
        codes[p] = strip(f.read())
    spans = inline_mods(codes[p])
    for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", codes[p]):
        scope = scope_at(mod, spans, m.start())
        for leaf in expand(m.group(1)):
            path, _, alias = leaf.partition("@")
            full = absolute(scope, path)
            if full:
                reexports[(scope, alias or full[-1])] = full

edges = {}
for p, mod in files.items():
    code = codes[p]
    spans = inline_mods(code)
    targets = set()
    # `use` trees, groups and nesting included: `use super::{a, b::{c, d}};`,
    # `use {crate::x, super::y};`, `pub(super) use self::z::*;`.
    for m in re.finditer(r"\buse\s+([^;]*);", code):
        scope = scope_at(mod, spans, m.start())
        tree = re.sub(r"\s+", "", m.group(1))
        if tree.startswith("{"):
            tree = tree[1 : tree.rfind("}")]
        for leaf in expand(tree):
            targets.add(resolve(scope, leaf.partition("@")[0]))
    # Inline paths in code: `crate::a::f()`, `super::b::T`, `self::c::K`, `super::super::d`.
    # `$crate` (a macro's own crate, resolved where the macro is used) is not an edge.
    for m in re.finditer(r"(?<![:\w$])" + PATH_HEAD + r"(?:\s*::\s*\w+)+", code):
        scope = scope_at(mod, spans, m.start())
        targets.add(resolve(scope, re.sub(r"\s+", "", m.group(0))))
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

if comps:
    print(f"check-layout: {len(comps)} import cycle(s)")
if failed:
    sys.exit(1)
print(f"check-layout: {len(files)} files, none over {MAX_LINES} lines, no import cycle")
PY
