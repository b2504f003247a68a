#!/usr/bin/python3
"""Plot a gradcomm-bench --json sweep against message size, one line per
algorithm (and baseline) x dtype/op: bus bandwidth on a log axis, and time
on a log-log panel, where the latency range of small messages shows
(out-of-place runs by default).

    python3 bench/plot_sweep.py sweep.json -o sweep.png [--in-place] [--title T]

Needs matplotlib: Debian's /usr/bin/python3 with python3-matplotlib (what
`make sweep` uses), or `python3 -m pip install matplotlib` for another
Python.
"""
import argparse
import json
import sys
from collections import defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402
except ImportError as e:
    sys.exit(f"plot_sweep: {sys.executable} cannot import matplotlib ({e}); install it "
             "(Debian: apt-get install python3-matplotlib and run /usr/bin/python3; "
             f"other Pythons: {sys.executable} -m pip install matplotlib)")


def human(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def label_of(row, several_types):
    label = row["algorithm"]
    if row.get("executed") and row["algorithm"] == "default":
        label += f" ({row['executed']})" if "," not in row["executed"] else ""
    if row.get("compression", "none") != "none":
        label += f" [{row['compression']}]"
    if several_types:
        label += f" {row['dtype']} {row['op']}"
    return label


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
    several_types = len({(r["dtype"], r["op"]) for r in rows}) > 1
    # "default" runs different algorithms at different sizes: one line, the
    # label says so only when one algorithm ran throughout.
    executed = defaultdict(set)
    for r in rows:
        executed[(r["algorithm"], r.get("compression"), r["dtype"], r["op"])].add(r.get("executed", ""))
    series = defaultdict(list)
    for r in rows:
        row = dict(r)
        row["executed"] = ",".join(sorted(executed[(r["algorithm"], r.get("compression"), r["dtype"], r["op"])]))
        # Log axes: a zero-byte call has no bandwidth to show.
        if r["bytes"] > 0:
            series[label_of(row, several_types)].append((r["bytes"], r["busbw_GBps"], r["time_us"]))

    fig, (bw, tm) = plt.subplots(1, 2, figsize=(15, 6))
    for label in sorted(series, key=lambda s: (s.startswith("baseline:"), s)):
        pts = sorted(series[label])
        style = "--" if label.startswith("baseline:") else "-"
        x = [p[0] for p in pts]
        bw.plot(x, [p[1] if p[1] > 0 else float("nan") for p in pts], style, marker="o", markersize=3, label=label)
        tm.plot(x, [p[2] if p[2] > 0 else float("nan") for p in pts], style, marker="o", markersize=3, label=label)
    ticks = sorted({p[0] for pts in series.values() for p in pts})
    if len(ticks) > 12:
        ticks = ticks[:: max(1, len(ticks) // 12)]
    for ax in (bw, tm):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(t) for t in ticks], rotation=45, ha="right")
        ax.grid(True, which="both", alpha=0.3)
    bw.set_ylabel("bus bandwidth (GB/s, log)")
    bw.set_title("bandwidth")
    tm.set_ylabel("time per call (us, log)")
    tm.set_title("time (latency range on the left)")
    tm.legend(fontsize=8)
    coll = rows[0].get("collective", "allreduce")
    types = "" if several_types else f", {rows[0]['dtype']} {rows[0]['op']}"
    fig.suptitle(args.title or (f"gradcomm {coll}: {doc.get('ranks')} ranks on {doc.get('hosts')} host(s)"
                                f"{types}{' in place' if args.in_place else ''}"))
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_sweep: wrote {args.output}")


if __name__ == "__main__":
    main()
