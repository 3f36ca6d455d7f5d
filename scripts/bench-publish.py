#!/usr/bin/env python3
"""Makes the latest benchmark report the one source of the figures the documents quote.

    scripts/bench-publish.py [REPORT]   copy REPORT (default target/bench-report.md, as
                                        `make bench` writes it) into docs/benchmarks.md, then
                                        write the README's headline table from it
    scripts/bench-publish.py --check    exit 1 unless the README's headline table is exactly
                                        what docs/benchmarks.md's report gives (`make test`)

The report goes between the `bench-report` markers of docs/benchmarks.md, its headings moved
two levels down; the README's table goes between its `bench-figures` markers. Every figure of
the table is read from the report's own tables (by their column names), so a figure in the
README always has the report's date and commit beside it; a report without a section (a run
with fewer configurations) gives fewer rows, never an old number.
"""

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
REPORT_MARKERS = ("<!-- bench-report:begin -->", "<!-- bench-report:end -->")
FIGURE_MARKERS = (
    "<!-- bench-figures:begin: written by scripts/bench-publish.py from docs/benchmarks.md -->",
    "<!-- bench-figures:end -->",
)


class ReportError(Exception):
    """The report lacks what a figure needs, or says it in a shape this script does not know."""


def between(text, markers, name):
    begin, end = markers
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ReportError(f"{name}: the markers {begin!r} ... {end!r} are missing")
    return text[:i + len(begin)], text[i + len(begin):j], text[j:]


def cells(line):
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def tables(md):
    """Every Markdown table: (header cells, rows of cells)."""
    lines = md.splitlines()
    out = []
    i = 0
    while i + 1 < len(lines):
        if lines[i].startswith("|") and re.match(r"^\|[-| :]+\|$", lines[i + 1].strip()):
            header = cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def number(cell):
    """The first number of a cell (`10 (10)` → 10.0, `0.14 / 0.15` → 0.14); None for `—`."""
    m = re.search(r"-?\d+(?:\.\d+)?", cell.replace(",", ""))
    return float(m.group()) if m else None


def fmt(v, unit):
    if v is None:
        return "—"
    digits = 0 if v >= 100 or v == int(v) else 1 if v >= 10 or unit in ("VAs/s", "MiB") else 2
    text = f"{v:,.{digits}f}"
    return f"{text} {unit}".strip()


def ratio(h, g):
    if h is None or not g:
        return "—"
    r = h / g
    return f"**{r:.3f}×**" if r < 0.1 else f"**{r:.2f}×**"


def figures(report):
    """The headline rows: (what, hub, Go, hub / Go)."""
    rows = []
    all_tables = tables(report)

    # The configurations a-f: one row per contender and configuration.
    results = next((t for t in all_tables if "VAs/s" in t[0] and "contender" in t[0]), None)
    titles = {}
    for header, body in all_tables:
        if header[:2] == ["", "flags (both contenders)"]:
            for r in body:
                titles[r[0].split(" ")[0]] = r[0]
    if results:
        header, body = results
        col = {name: k for k, name in enumerate(header)}

        def value(cid, side, column):
            for r in body:
                if r[0] != cid:
                    continue
                if ((side == "hub" and r[1].startswith("attacher-hub"))
                        or (side == "go" and "external-attacher" in r[1])
                        or (side == "ratio" and r[1] == "hub / fleet")):
                    return r[col[column]] if side == "ratio" else number(r[col[column]])
            return None

        def row(cid, column, what, unit):
            h, g = value(cid, "hub", column), value(cid, "go", column)
            # The report's own ratio (from unrounded medians) where it gives one.
            r = value(cid, "ratio", column)
            shown = f"**{r}×**" if number(r or "") is not None else ratio(h, g)
            if h is not None and g is not None:
                rows.append((f"{what} ({cid})", fmt(h, unit), fmt(g, unit), shown))

        for key in ("VAs/s", "p99 (s)", "CPU (s)", "peak RSS (MiB)", "idle RSS (MiB)", "watches",
                    "API conns", "ControllerPublish (dup.)"):
            if key not in col:
                raise ReportError(f"the results table has no column {key!r}: {header}")
        row("a", "VAs/s", "attach throughput at the default QPS 5 / burst 10", "VAs/s")
        row("a", "p99 (s)", "attach p99 at the default QPS 5 / burst 10", "s")
        row("b", "VAs/s", "attach throughput at QPS 100 / burst 200", "VAs/s")
        row("c", "VAs/s", "attach throughput without a client-side limit", "VAs/s")
        row("c", "CPU (s)", "CPU seconds to attach and detach them", "s")
        row("a", "peak RSS (MiB)", "peak memory", "MiB")
        extra = re.search(r"(\d+) extra VAs", titles.get("f", ""))
        if extra:
            row("f", "idle RSS (MiB)", f"idle memory with {int(extra.group(1)):,} other VAs and PVs in the cluster", "MiB")
        row("a", "watches", "watches held on the API server", "")
        row("a", "API conns", "connections to the API server", "")
        row("d", "p99 (s)", "a quiet driver's attach p99 next to a noisy one", "s")
        dup = {s: [] for s in ("hub", "go")}
        for cid in ("a", "b", "c"):
            for r in body:
                if r[0] == cid and (r[1].startswith("attacher-hub") or "external-attacher" in r[1]):
                    m = re.search(r"\((\d+)\)", r[col["ControllerPublish (dup.)"]])
                    if m:
                        dup["hub" if r[1].startswith("attacher-hub") else "go"].append(m.group(1))
        if dup["hub"] and dup["go"]:
            rows.append(("duplicate ControllerPublish calls (a, b, c)", " / ".join(dup["hub"]),
                         " / ".join(dup["go"]), ""))
        # Reports from before 2026-12-06 have no unpublish column: no row then.
        if "ControllerUnpublish (dup.)" in col:
            dup = {s: [] for s in ("hub", "go")}
            for cid in ("a", "b", "c"):
                for r in body:
                    if r[0] == cid and (r[1].startswith("attacher-hub") or "external-attacher" in r[1]):
                        m = re.search(r"\((\d+)\)", r[col["ControllerUnpublish (dup.)"]])
                        if m:
                            dup["hub" if r[1].startswith("attacher-hub") else "go"].append(m.group(1))
            if dup["hub"] and dup["go"]:
                rows.append(("duplicate ControllerUnpublish calls (a, b, c)", " / ".join(dup["hub"]),
                             " / ".join(dup["go"]), ""))

    # The thresholds table: the writes per detached VA.
    for header, body in all_tables:
        if header[:2] == ["check", "measured"]:
            for r in body:
                m = re.match(r"b: API writes per detached VA, hub \(fleet: ([\d.]+)\)", r[0])
                if m:
                    rows.append(("API writes per detached VA (b)", fmt(number(r[1]), ""),
                                 fmt(float(m.group(1)), ""), ratio(number(r[1]), float(m.group(1)))))

    # API Priority and Fairness squeeze: medians over its runs.
    runs = {"hub": [], "go": []}
    for header, body in all_tables:
        if header[0] == "contender" and "requests rejected with 429" in header:
            col = {name: k for k, name in enumerate(header)}
            attached = next(n for n in header if n.endswith(" attached"))
            gone = next(n for n in header if n.endswith(" gone"))
            for r in body:
                side = "hub" if r[0].startswith("attacher-hub") else "go"
                runs[side].append([number(r[col[c]]) for c in
                                   ("requests rejected with 429", attached, gone)])
    if runs["hub"] and runs["go"]:
        med = {s: [statistics.median(v[i] for v in runs[s]) for i in range(3)] for s in runs}
        what = f"squeezed by API Priority and Fairness ({len(runs['hub'])} runs):"
        rows.append((f"{what} requests rejected with 429", fmt(med["hub"][0], ""),
                     fmt(med["go"][0], ""), ratio(med["hub"][0], med["go"][0])))
        rows.append((f"{what} {attached}", fmt(med["hub"][1], "s"), fmt(med["go"][1], "s"),
                     ratio(med["hub"][1], med["go"][1])))

    # End to end: Pods through kube-controller-manager.
    e2e = next((t for t in all_tables if t[0][:3] == ["contender", "attach p50", "attach p99"]), None)
    if e2e:
        header, body = e2e
        col = {name: k for k, name in enumerate(header)}
        by = {("hub" if r[0] == "attacher-hub" else "go"): r for r in body}
        if "hub" in by and "go" in by:
            for key, what in (("attach p99", "Pods through kube-controller-manager: attach p99"),
                              ("detach p99", "Pods through kube-controller-manager: detach p99")):
                h, g = number(by["hub"][col[key]]), number(by["go"][col[key]])
                rows.append((what, fmt(h, "s"), fmt(g, "s"), ratio(h, g)))

    # Rolling updates through the pod runner.
    for header, body in all_tables:
        if header[:2] == ["workload", "runs"] and "leaderless s (median / worst)" in header:
            col = {name: k for k, name in enumerate(header)}
            hub = next((r for r in body if r[0].startswith("hub overlay")), None)
            go = next((r for r in body if "Go external-attacher" in r[0]), None)
            if hub and go:
                for key, what in (("leaderless s (median / worst)",
                                   "rolling update of two replicas: longest time without a leader"),
                                  ("attach p99 s (median / worst)",
                                   "rolling update of two replicas: attach p99 of the VAs made meanwhile")):
                    h, g = number(hub[col[key]]), number(go[col[key]])
                    rows.append((what, fmt(h, "s"), fmt(g, "s"), ratio(h, g)))
    return rows


def stamp(report):
    """Date, commit and versions from the report's first lines."""
    m = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d UTC) · (.*)$", report, re.M)
    if not m:
        raise ReportError("the report has no `YYYY-MM-DD HH:MM UTC · ...` line under its title")
    date, rest = m.group(1), m.group(2)
    commit = re.search(r"attacher-hub `([^`]+)`", rest)
    go = re.search(r"external-attacher (v[\w.-]+)", rest)
    api = re.search(r"kube-apiserver (v[\w.-]+)", rest)
    runs = re.search(r"medians of (\d+) runs", rest)
    if not (commit and go and api):
        raise ReportError(f"the report's first line lacks the commit or versions: {rest}")
    return date, commit.group(1), go.group(1), api.group(1), runs.group(1) if runs else "?"


def headline(report):
    date, commit, go, api, runs = stamp(report)
    rows = figures(report)
    if not rows:
        raise ReportError("the report has none of the tables the headline is made from")
    out = [
        "",
        f"From `make bench` on {date} (attacher-hub `{commit}`):",
        f"one attacher-hub against the Go external-attacher {go}, one per driver, with the same flags,",
        f"on kube-apiserver {api} and 2 cores; medians of {runs} runs of each. The whole report, and",
        "how to read it: [docs/benchmarks.md](docs/benchmarks.md).",
        "",
        "| | attacher-hub | Go external-attacher | hub / Go |",
        "|---|---|---|---|",
    ]
    out += [f"| {w} | {h} | {g} | {r} |" for w, h, g, r in rows]
    out.append("")
    return "\n".join(out) + "\n"


def docs_report():
    _, body, _ = between(DOCS.read_text(), REPORT_MARKERS, "docs/benchmarks.md")
    # The headings were moved two levels down when published; the figures do not need them.
    return body


def publish(path):
    report = path.read_text()
    stamp(report)
    moved = "\n".join("##" + l if l.startswith("#") else l for l in report.strip().splitlines())
    head, _, tail = between(DOCS.read_text(), REPORT_MARKERS, "docs/benchmarks.md")
    DOCS.write_text(head + "\n" + moved + "\n" + tail)
    head, _, tail = between(README.read_text(), FIGURE_MARKERS, "README.md")
    README.write_text(head + headline(docs_report()) + tail)
    print(f"bench-publish: {path} → docs/benchmarks.md and the README's headline table")


def check():
    want = headline(docs_report())
    _, have, _ = between(README.read_text(), FIGURE_MARKERS, "README.md")
    if have != want:
        print("bench-publish: the README's headline table is not what docs/benchmarks.md's report "
              "gives; run scripts/bench-publish.py on the report, or restore the table:", file=sys.stderr)
        for line in sorted(set(have.splitlines()) ^ set(want.splitlines())):
            side = "README" if line in have.splitlines() else "report"
            print(f"  {side}: {line}", file=sys.stderr)
        return 1
    print("bench-publish: the README's figures are the report's")
    return 0


def main(argv):
    try:
        if argv[1:] == ["--check"]:
            return check()
        if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
            print(__doc__, file=sys.stderr)
            return 2
        publish(Path(argv[1]) if len(argv) == 2 else ROOT / "target" / "bench-report.md")
        return 0
    except (ReportError, OSError) as e:
        print(f"bench-publish: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
