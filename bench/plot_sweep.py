#!/usr/bin/python3
"""Plot a gradcomm-bench --json sweep: bus bandwidth against message size,
one line per algorithm and baseline (out-of-place runs by default).

    python3 bench/plot_sweep.py sweep.json -o sweep.png [--in-place] [--title T]
"""
import argparse
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def human(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="file written by gradcomm-bench --json")
    ap.add_argument("-o", "--output", default="sweep.png", help="PNG to write")
    ap.add_argument("--in-place", action="store_true", help="plot the in-place runs instead")
    ap.add_argument("--title", help="plot title")
    args = ap.parse_args()

    with open(args.json) as f:
        doc = json.load(f)
    rows = [r for r in doc["results"] if bool(r["in_place"]) == args.in_place]
    if not rows:
        sys.exit(f"plot_sweep: no {'in-place' if args.in_place else 'out-of-place'} rows in {args.json}")
    series = defaultdict(list)
    for r in rows:
        label = r["algorithm"]
        if r.get("compression", "none") != "none":
            label += f" [{r['compression']}]"
        series[label].append((r["bytes"], r["busbw_GBps"]))

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label in sorted(series, key=lambda s: (s.startswith("baseline:"), s)):
        pts = sorted(series[label])
        style = "--" if label.startswith("baseline:") else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    coll = rows[0].get("collective", "allreduce")
    title = args.title or (f"gradcomm {coll}: {doc.get('ranks')} ranks on {doc.get('hosts')} host(s), "
                           f"{rows[0]['dtype']} {rows[0]['op']}{' in place' if args.in_place else ''}")
    ax.set_title(title)
    ticks = sorted({r["bytes"] for r in rows})
    if len(ticks) > 12:
        ticks = ticks[:: max(1, len(ticks) // 12)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human(t) for t in ticks], rotation=45, ha="right")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_sweep: wrote {args.output}")


if __name__ == "__main__":
    main()
