#!/usr/bin/env bash
# Checks the uses between the crate's top modules against the list in src/lib.rs.
#
# src/lib.rs holds, in its crate docs, a fenced block after the line "Uses between top modules"
# with one line per module: `module: used module, ...` (`module: -` for none). This script
# collects every `crate::<top module>` path in each top module's files (src/<m>.rs and
# src/<m>/**), test code left out: files declared under `#[cfg(test)]` (like `mod tests;`) and
# items marked `#[cfg(test)]` (a `mod tests { ... }` block, a `use`, a function). It fails,
# naming each one, on a use the list does not allow, on a listed use no code makes, and on a
# cycle of uses (the layers of src/lib.rs are a DAG).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

sys.path.insert(0, "scripts")
from rust_source import strip_code

SRC = "src"
MARKER = "Uses between top modules"

def top_modules():
    mods = set()
    for line in open(os.path.join(SRC, "lib.rs")):
        m = re.match(r"\s*(?:#\[cfg\(test\)\]\s*)?pub(?:\([a-z]+\))? mod (\w+);", line)
        if m:
            mods.add(m.group(1))
    return mods

def allowed_edges():
    lines = [l.rstrip("\n") for l in open(os.path.join(SRC, "lib.rs"))]
    doc = [re.sub(r"^//! ?", "", l) for l in lines if l.startswith("//!")]
    try:
        at = next(i for i, l in enumerate(doc) if MARKER in l)
        start = next(i for i in range(at, len(doc)) if doc[i].startswith("```"))
        end = next(i for i in range(start + 1, len(doc)) if doc[i].startswith("```"))
    except StopIteration:
        sys.exit(f"src/lib.rs: no fenced block after a line saying {MARKER!r}")
    edges, listed = set(), set()
    for l in doc[start + 1 : end]:
        if not l.strip():
            continue
        m = re.match(r"\s*(\w+)\s*:\s*(.*)$", l)
        if not m:
            sys.exit(f"src/lib.rs: cannot read the line {l!r} of the list of uses")
        listed.add(m.group(1))
        for used in re.split(r"[,\s]+", m.group(2).strip()):
            if used and used != "-":
                edges.add((m.group(1), used))
    return edges, listed

def test_only_files():
    """Files of modules declared under #[cfg(test)]."""
    skip = set()
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            text = open(path).read()
            base = root if f in ("mod.rs", "lib.rs", "main.rs") else os.path.join(root, f[:-3])
            for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod (\w+);", text):
                skip.add(os.path.normpath(os.path.join(base, m.group(1) + ".rs")))
                skip.add(os.path.normpath(os.path.join(base, m.group(1))))
    return skip

def drop_test_items(code):
    """Removes each item marked #[cfg(test)]: up to its `;` or its closing brace."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        if m.start() < i:
            continue
        out.append(code[i : m.start()])
        j, depth = m.end(), 0
        while j < len(code):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif code[j] == ";" and depth == 0:
                j += 1
                break
            j += 1
        i = j
    out.append(code[i:])
    return "".join(out)

def uses(code, mods):
    """The top modules named by `crate::` paths, grouped imports included."""
    found = set()
    for m in re.finditer(r"\bcrate::", code):
        rest = code[m.end():]
        if rest.startswith("{"):
            depth, j = 0, 0
            for j, c in enumerate(rest):
                depth += c == "{"
                depth -= c == "}"
                if depth == 0:
                    break
            inner = rest[1:j]
            # Top-level names of the group: split on commas outside nested braces.
            depth, part, parts = 0, "", []
            for c in inner:
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                if c == "," and depth == 0:
                    parts.append(part)
                    part = ""
                else:
                    part += c
            parts.append(part)
            for p in parts:
                name = re.match(r"\s*(\w+)", p)
                if name and name.group(1) in mods:
                    found.add(name.group(1))
        else:
            name = re.match(r"(\w+)", rest)
            if name and name.group(1) in mods:
                found.add(name.group(1))
    return found

def main():
    mods = top_modules()
    allowed, listed = allowed_edges()
    skip = test_only_files()
    actual = {}
    for mod in sorted(mods):
        files = []
        single = os.path.join(SRC, mod + ".rs")
        if os.path.exists(single):
            files.append(single)
        tree = os.path.join(SRC, mod)
        for root, _, names in os.walk(tree):
            files += [os.path.join(root, f) for f in names if f.endswith(".rs")]
        for path in sorted(files):
            p = os.path.normpath(path)
            if p in skip or any(p.startswith(s + os.sep) for s in skip) or os.path.basename(p) == "tests.rs":
                continue
            code = drop_test_items(strip_code(open(path).read()))
            for used in uses(code, mods) - {mod}:
                actual.setdefault((mod, used), []).append(p)
    bad = 0
    for mod in sorted(mods - listed):
        if not mod in skip_modules(skip):
            print(f"src/lib.rs: the list of uses has no line for `{mod}`")
            bad += 1
    for (a, b), where in sorted(actual.items()):
        if (a, b) not in allowed:
            print(f"{a} -> {b}: not allowed by src/lib.rs (used in {', '.join(where)})")
            bad += 1
    for a, b in sorted(allowed - set(actual)):
        print(f"{a} -> {b}: listed in src/lib.rs but no longer used; remove it from the list")
        bad += 1
    cycle = find_cycle(set(actual))
    if cycle:
        print("a cycle between top modules: " + " -> ".join(cycle))
        bad += 1
    if bad:
        sys.exit(1)
    print(f"layers: {len(actual)} uses between {len(listed)} top modules, all as src/lib.rs lists them")

def find_cycle(edges):
    """A cycle of uses (a list of modules, first = last), or None: the layers must be a DAG."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state, path = {}, []
    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph.get(m, [])):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = "done"
        return None
    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None

def skip_modules(skip):
    return {os.path.basename(s)[:-3] for s in skip if s.endswith(".rs") and os.path.dirname(s) == SRC}

main()
PY
