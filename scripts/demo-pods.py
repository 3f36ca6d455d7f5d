#!/usr/bin/env python3
"""The Pods of a `make demo` run, per CSI driver, as a user sees them: a Pod's
volumes are attached when every one of them is listed in its Node's
`status.volumesAttached` (what the kubelet waits for; kube-controller-manager
writes it once the VolumeAttachment it created is attached).

Usage: scripts/demo-pods.py --kubectl PATH --kubeconfig FILE --selector L=V
         [--hub-status CMD...] [--watch | --until-attached] [--timeout S]

  --selector        label selector of the run's Pods, claims, PVs and Nodes
  --kind DRIVER=TEXT  what a driver is (shown in the table); repeatable
  --hub-status      with --watch: the command printing the hub's own table
                    (`attacher-hub status ...`), shown above the Pods
  --watch           redraw every --interval seconds until interrupted
  --until-attached  exit 0 once every Pod's volumes are attached (the final
                    table on stdout), 1 after --timeout seconds
Without --watch or --until-attached: print the table once.
"""

import argparse
import json
import subprocess
import sys
import time


def kubectl_json(args, *what):
    out = subprocess.run(
        [args.kubectl, "--kubeconfig", args.kubeconfig, "get", *what,
         "-l", args.selector, "-o", "json"],
        check=True, capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)["items"]


def snapshot(args):
    """Rows per driver: {driver: [(pod, node, attached)]}."""
    pods = kubectl_json(args, "pods", "-n", "default")
    claims = {c["metadata"]["name"]: c for c in kubectl_json(args, "pvc", "-n", "default")}
    pvs = {p["metadata"]["name"]: p for p in kubectl_json(args, "pv")}
    nodes = {n["metadata"]["name"]: n for n in kubectl_json(args, "nodes")}
    rows = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = pod["spec"].get("nodeName", "")
        listed = {v["name"] for v in
                  nodes.get(node, {}).get("status", {}).get("volumesAttached", []) or []}
        drivers, attached = set(), True
        for vol in pod["spec"].get("volumes", []):
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                continue
            pv = pvs.get(claims.get(claim, {}).get("spec", {}).get("volumeName", ""), {})
            csi = pv.get("spec", {}).get("csi")
            if not csi:
                attached = False  # not bound yet
                continue
            drivers.add(csi["driver"])
            if f"kubernetes.io/csi/{csi['driver']}^{csi['volumeHandle']}" not in listed:
                attached = False
        for d in drivers or {"?"}:
            rows.setdefault(d, []).append((pod["metadata"]["name"], node, attached))
    return rows


def render(rows, kinds):
    width = max([len("DRIVER")] + [len(d) for d in rows])
    kw = max([len("KIND")] + [len(kinds.get(d, "")) for d in rows])
    lines = [f"{'DRIVER':<{width}}  {'KIND':<{kw}}  {'PODS ATTACHED':<13}  WAITING"]
    done = total = 0
    for driver in sorted(rows):
        pods = rows[driver]
        ok = sum(1 for _, _, a in pods if a)
        waiting = ", ".join(p for p, _, a in pods if not a) or "-"
        lines.append(f"{driver:<{width}}  {kinds.get(driver, ''):<{kw}}  "
                     f"{f'{ok}/{len(pods)}':<13}  {waiting}")
        done += ok
        total += len(pods)
    lines.append("")
    lines.append(f"pods: {done}/{total} with every volume attached "
                 f"(listed in their Node's status.volumesAttached)")
    return "\n".join(lines) + "\n", done, total


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--selector", required=True)
    ap.add_argument("--kind", action="append", default=[])
    ap.add_argument("--hub-status", nargs=argparse.REMAINDER, default=None)
    ap.add_argument("--watch", action="store_true")
    ap.add_argument("--until-attached", action="store_true")
    ap.add_argument("--expect", type=int, default=0,
                    help="with --until-attached: the number of Pods to wait for")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    kinds = dict(k.split("=", 1) for k in args.kind)

    started = time.monotonic()
    last = ""
    while True:
        try:
            text, done, total = render(snapshot(args), kinds)
        except (subprocess.SubprocessError, json.JSONDecodeError, KeyError) as e:
            text, done, total = f"(reading the API failed: {e})\n", 0, -1
        if args.watch:
            top = ""
            if args.hub_status:
                hub = subprocess.run(args.hub_status, capture_output=True, text=True, timeout=30)
                top = hub.stdout + hub.stderr + "\n"
            sys.stdout.write("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n")
            sys.stdout.write(top + text + "\n(Ctrl-C ends the demo: the Pods are deleted and "
                             "kube-controller-manager has their volumes detached)\n")
            sys.stdout.flush()
        elif args.until_attached:
            complete = total > 0 and done == total and total >= args.expect
            summary = text.strip().splitlines()[-1]
            if summary != last:
                print(f"demo: {summary}", file=sys.stderr)
                last = summary
            if complete:
                sys.stdout.write(text)
                return 0
            if time.monotonic() - started > args.timeout:
                sys.stdout.write(text)
                print(f"demo: not every Pod's volumes were attached within {args.timeout:.0f}s",
                      file=sys.stderr)
                return 1
        else:
            sys.stdout.write(text)
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
