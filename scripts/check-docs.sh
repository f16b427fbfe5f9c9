#!/usr/bin/env bash
# The documentation book (docs/, mdBook): builds it into target/book/ and checks every
# relative link in docs/src/*.md and README.md: the target file exists, and a #anchor
# names a heading of the target page (ids as mdBook makes them). Run by scripts/test.sh.
#
# mdbook: used from PATH or target/tools/bin; otherwise the distribution's package when
# it has one, else `cargo install --locked mdbook` into target/tools (later runs reuse it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MDBOOK_VERSION=0.5.4
tools="$PWD/target/tools"
export PATH="$tools/bin:$PATH"
if ! command -v mdbook >/dev/null 2>&1; then
    if [[ $(id -u) -eq 0 ]] && apt-cache policy mdbook 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        echo "check-docs: installing mdbook (Debian package)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mdbook >/dev/null
    else
        echo "check-docs: installing mdbook $MDBOOK_VERSION with cargo into $tools (once)"
        cargo install --quiet --locked mdbook --version "$MDBOOK_VERSION" \
            --no-default-features --features search --root "$tools"
    fi
fi

mdbook build docs

python3 - <<'PY'
import os, re, sys, unicodedata

def slug(title):
    """A heading's id as mdBook makes it: markup dropped, lowercase, alphanumerics, `-`
    and `_` kept, spaces as `-`, everything else removed."""
    t = re.sub(r"<[^>]+>", "", title)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = t.replace("`", "").replace("*", "")
    out = []
    for c in t.strip().lower():
        if c.isalnum() or c in "-_":
            out.append(c)
        elif c.isspace():
            out.append("-")
    return "".join(out)

def headings(path):
    ids, seen, fence = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                ids.add(base if n == 0 else f"{base}-{n}")
    return ids

def links(path):
    """(line, target) of every inline link outside code."""
    fence = False
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if line.startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            line = re.sub(r"`[^`]*`", "``", line)
            for m in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
                yield no, m.group(1)

files = ["README.md"] + sorted(
    os.path.join(d, n) for d, _, ns in os.walk("docs/src") for n in ns if n.endswith(".md")
)
bad, count = [], 0
for src in files:
    for no, target in links(src):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            if not target.startswith(("https://", "http://", "mailto:")):
                bad.append(f"{src}:{no}: {target}: only public URLs may leave the repository")
            continue
        count += 1
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
        if not os.path.abspath(dest).startswith(os.getcwd() + os.sep):
            bad.append(f"{src}:{no}: {target}: leaves the repository")
        elif not os.path.exists(dest):
            bad.append(f"{src}:{no}: {target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in headings(dest):
            bad.append(f"{src}:{no}: {target}: no heading #{anchor} in {dest}")
for b in bad:
    print("check-docs:", b)
if bad:
    sys.exit(1)
print(f"check-docs: book built into target/book; {count} relative links in {len(files)} files resolve")
PY
