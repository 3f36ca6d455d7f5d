#!/usr/bin/env bash
# Lists the production functions longer than a limit (default 80 lines), and fails if any is
# not on the allow list of declarative tables below.
#
# A production function is one in src/ or crates/*/src/ outside test code: files declared under
# `#[cfg(test)]` (`mod tests;` and the like) and items marked `#[cfg(test)]` are left out, as are
# build scripts. A function's length is counted from its `fn` line to its closing brace,
# doc comments and attributes above it not included.
#
# Usage: scripts/check-functions.sh [--list] [LIMIT]
#   --list   print every production function over the limit with its length, longest first,
#            and exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

sys.path.insert(0, "scripts")
from rust_source import strip_code

# Functions that are tables, not control flow: one line per entry, nothing to decide. Each
# entry: "path::function".
DECLARATIVE = {
}

args = [a for a in sys.argv[1:]]
listing = "--list" in args
args = [a for a in args if a != "--list"]
limit = int(args[0]) if args else 80

def test_files():
    """Files that are test modules: declared under #[cfg(test)] in their parent."""
    skip = set()
    for root, _, files in os.walk("."):
        if "/target" in root or "/.git" in root or "/.work" in root:
            continue
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            lines = open(path, encoding="utf-8").read().split("\n")
            for k, line in enumerate(lines):
                m = re.match(r"\s*(?:pub(?:\([a-z]+\))? )?mod (\w+);", line)
                if m and k > 0 and "#[cfg(test)]" in lines[k - 1]:
                    base = os.path.dirname(path)
                    if f not in ("lib.rs", "main.rs", "mod.rs"):
                        base = os.path.join(base, f[:-3])
                    name = m.group(1)
                    skip.add(os.path.normpath(os.path.join(base, name + ".rs")))
                    skip.add(os.path.normpath(os.path.join(base, name)))
    return skip

def production_files():
    skip = test_files()
    roots = ["src"] + [os.path.join("crates", c, "src") for c in sorted(os.listdir("crates"))] if os.path.isdir("crates") else ["src"]
    for r in roots:
        for root, _, files in os.walk(r):
            norm = os.path.normpath(root)
            if any(norm == s or norm.startswith(s + os.sep) for s in skip):
                continue
            for f in sorted(files):
                p = os.path.normpath(os.path.join(root, f))
                if f.endswith(".rs") and p not in skip:
                    yield p

def functions(path):
    raw = open(path, encoding="utf-8").read()
    code = strip_code(raw)
    lines = code.split("\n")
    # Spans of #[cfg(test)] items: the item after the attribute, to its closing brace or `;`.
    excluded = []
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        j, depth = m.end(), 0
        while j < len(code):
            ch = code[j]
            if ch == "{": depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0: break
            elif ch == ";" and depth == 0: break
            j += 1
        excluded.append((m.start(), j))
    for m in re.finditer(r"\bfn\s+(\w+)", code):
        if any(a <= m.start() <= b for a, b in excluded):
            continue
        # The body: the first `{` at depth 0 of parentheses/angles after the signature, unless
        # a `;` comes first (a declaration without body).
        j, paren = m.end(), 0
        while j < len(code):
            ch = code[j]
            if ch in "([": paren += 1
            elif ch in ")]": paren -= 1
            elif ch == ";" and paren == 0: j = -1; break
            elif ch == "{" and paren == 0: break
            j += 1
        if j < 0 or j >= len(code):
            continue
        depth, k = 0, j
        while k < len(code):
            if code[k] == "{": depth += 1
            elif code[k] == "}":
                depth -= 1
                if depth == 0: break
            k += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, k) + 1
        yield m.group(1), first, last - first + 1

found = []
for path in production_files():
    for name, line, length in functions(path):
        if length > limit:
            found.append((length, path, line, name))
found.sort(key=lambda t: (-t[0], t[1]))
bad = []
for length, path, line, name in found:
    key = f"{path}::{name}"
    tag = "  (declarative table)" if key in DECLARATIVE else ""
    if listing or not tag:
        print(f"{length:4} lines  {path}:{line}  {name}{tag}")
    if not tag:
        bad.append(key)
if listing:
    sys.exit(0)
if bad:
    print(f"check-functions: {len(bad)} production function(s) over {limit} lines; split the "
          "decisions out of the control flow, or list a declarative table in "
          "scripts/check-functions.sh", file=sys.stderr)
    sys.exit(1)
print(f"check-functions: no production function over {limit} lines "
      f"({len(found)} declarative table(s) allowed)")
PY
