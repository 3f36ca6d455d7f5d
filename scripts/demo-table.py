#!/usr/bin/env python3
"""The live table of `make demo` (scripts/demo.sh runs it; not meant to be run alone).

Once a second it reads attacher-hub's /drivers and the demo's VolumeAttachments
(kubectl -o json, selected by the run's label) and shows one row per driver:
state, lease holder, queue depths and how many of its VolumeAttachments are
attached.

On a terminal the table is redrawn in place. Otherwise (CI) a progress line
goes to stderr whenever the attached count changes, and the table is printed
once at the end on stdout.

Exit codes: 0 when --until-attached sees every VolumeAttachment attached,
1 on --timeout, 130 on Ctrl-C.
"""

import argparse
import json
import subprocess
import sys
import time
import urllib.request


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--hub", required=True, help="attacher-hub HTTP base URL")
    p.add_argument("--kubectl", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--selector", required=True, help="label selector of the run's objects")
    p.add_argument("--drivers", required=True, help="JSON list of {name, mock}")
    p.add_argument("--per-driver", type=int, required=True, help="VolumeAttachments per driver")
    p.add_argument("--until-attached", action="store_true")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--title", default="attacher-hub demo")
    p.add_argument("--since", type=float, default=None,
                   help="epoch seconds attacher-hub was started at (times are shown from then)")
    return p.parse_args()


def hub_drivers(base):
    """name -> /drivers entry; {} while the hub does not answer."""
    try:
        with urllib.request.urlopen(base + "/drivers", timeout=2) as r:
            entries = json.load(r)
    except (OSError, ValueError):
        return None
    return {e.get("name"): e for e in entries if e.get("name")}


def attachments(args):
    """attacher -> (attached, total, errors); None if kubectl failed."""
    r = subprocess.run(
        [args.kubectl, "--kubeconfig", args.kubeconfig, "get", "volumeattachments",
         "-l", args.selector, "-o", "json"],
        capture_output=True, text=True, timeout=20, check=False)
    if r.returncode != 0:
        return None
    counts = {}
    for va in json.loads(r.stdout).get("items", []):
        attacher = va.get("spec", {}).get("attacher", "")
        status = va.get("status") or {}
        a, t, e = counts.get(attacher, (0, 0, 0))
        counts[attacher] = (a + bool(status.get("attached")), t + 1,
                            e + bool(status.get("attachError")))
    return counts


def render(args, drivers, hub, vas, elapsed):
    lines = []
    stamp = time.strftime("%H:%M:%S")
    lines.append(f"{args.title}   {stamp}   hub running for {elapsed:.0f}s")
    lines.append("")
    header = ("DRIVER", "MOCK", "STATE", "LEADER (LEASE HOLDER)", "QUEUE attach/detach/pv", "ATTACHED")
    rows = []
    notes = []
    for d in drivers:
        entry = (hub or {}).get(d["name"])
        if hub is None:
            state, holder, queues = "hub down?", "-", "-"
        elif entry is None:
            state, holder, queues = "starting", "-", "-"
        else:
            s = entry.get("state") or {}
            state = s.get("state", "?")
            if s.get("reason"):
                notes.append(f"{d['name']}: {state}: {s['reason']}")
            holder = entry.get("leaseHolder") or "-"
            q = entry.get("queues") or {}
            queues = "/".join(str((q.get(k) or {}).get("depth", "?")) for k in ("attach", "detach", "pv"))
            if entry.get("lastError"):
                notes.append(f"{d['name']}: last error: {entry['lastError']}")
        if vas is None:
            attached = "?"
        else:
            a, t, e = vas.get(d["name"], (0, 0, 0))
            attached = f"{a}/{args.per_driver}"
            if e:
                attached += f" ({e} with attachError)"
        rows.append((d["name"], d["mock"], state, holder, queues, attached))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines.append(fmt.format(*header).rstrip())
    lines.extend(fmt.format(*r).rstrip() for r in rows)
    lines.append("")
    total = len(drivers) * args.per_driver
    done = sum(v[0] for v in (vas or {}).values())
    lines.append(f"attached: {done}/{total} VolumeAttachments")
    lines.append(f"metrics:  {args.hub}/metrics")
    lines.append(f"drivers:  {args.hub}/drivers")
    for n in notes:
        lines.append(f"note: {n}")
    return lines, done, total


def main():
    args = parse_args()
    drivers = json.loads(args.drivers)
    tty = sys.stdout.isatty()
    start = time.monotonic()
    # Elapsed times count from the hub's start when known.
    offset = time.time() - args.since if args.since else 0.0
    last_done = -1
    lines = []
    try:
        while True:
            hub = hub_drivers(args.hub)
            vas = attachments(args)
            waited = time.monotonic() - start
            elapsed = waited + offset
            lines, done, total = render(args, drivers, hub, vas, elapsed)
            leading = hub is not None and all(
                ((hub.get(d["name"]) or {}).get("state") or {}).get("state") == "leading"
                for d in drivers)
            if tty:
                footer = ("waiting until every VolumeAttachment is attached ..."
                          if args.until_attached else "press Ctrl-C to detach everything and stop")
                sys.stdout.write("\033[H\033[J" + "\n".join(lines) + "\n\n" + footer + "\n")
                sys.stdout.flush()
            elif done != last_done and not (args.until_attached and done == total and leading):
                print(f"demo: {done}/{total} attached {elapsed:.1f}s after attacher-hub started", file=sys.stderr, flush=True)
            last_done = done
            if args.until_attached and done == total and leading:
                if not tty:
                    print("\n".join(lines), flush=True)
                print(f"demo: all {total} VolumeAttachments attached {elapsed:.1f}s after attacher-hub started",
                      file=sys.stderr, flush=True)
                return 0
            if args.until_attached and waited > args.timeout:
                if not tty:
                    print("\n".join(lines), flush=True)
                print(f"demo: timed out: {done}/{total} attached {elapsed:.0f}s after attacher-hub started",
                      file=sys.stderr, flush=True)
                return 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - start - waited)))
    except KeyboardInterrupt:
        if not tty and lines:
            print("\n".join(lines), flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
