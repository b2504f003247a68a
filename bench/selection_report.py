#!/usr/bin/env python3
"""Issue 10's goals 1 and 4 from gradcomm-bench JSON and `gradcomm-info --tuning` output.

selection_report.py LAYOUT MODEL.txt BENCH.json [BENCH.json ...]

Goal 1, per size: the default's time over the fastest forced algorithm's
time and over baseline:mpi's (out of place), and whether the default
executed the algorithm that measured fastest. Goal 4, at 1 KiB, 1 MiB and
64 MiB: the model's predicted time for the algorithm it chose against the
default's measured time.
"""
import json
import sys


def load_bench(paths):
    times, executed = {}, {}
    for path in paths:
        for r in json.load(open(path))['results']:
            if r['in_place']:
                continue
            forced = r['algorithm'] not in ('default', 'baseline:mpi')
            if forced and r['executed'] != r['algorithm']:
                continue  # cannot run on this layout: it fell back to the default
            times[(r['algorithm'], r['bytes'])] = r['time_us']
            if r['algorithm'] == 'default':
                executed[r['bytes']] = r['executed']
    return times, executed


def load_model(path):
    rows, names = {}, []
    for line in open(path):
        parts = line.split()
        if parts[:1] == ['bytes']:
            names = parts[1:parts.index('choice')]
            continue
        if names and parts and parts[0].isdigit() and len(parts) > len(names) + 1:
            preds = {n: (None if v == '-' else float(v)) for n, v in zip(names, parts[1:1 + len(names)])}
            rows[int(parts[0])] = (preds, parts[1 + len(names)])
    return rows


def main():
    layout, model_path, bench_paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    times, executed = load_bench(bench_paths)
    model = load_model(model_path)
    sizes = sorted(b for (a, b) in times if a == 'default')
    print(f'### {layout}: default against the fastest forced algorithm and MPI\n')
    print('| bytes | default ran | fastest forced | default / fastest | default / MPI |')
    print('|---:|---|---|---:|---:|')
    within = below_mpi = same = 0
    # A run of the default alone (goal 4 only) has no forced algorithm to compare.
    sizes = [b for b in sizes if any(bb == b and a not in ('default', 'baseline:mpi') for (a, bb) in times)]
    for b in sizes:
        forced = {a: t for (a, bb), t in times.items() if bb == b and a not in ('default', 'baseline:mpi')}
        best = min(forced, key=forced.get)
        d = times[('default', b)]
        m = times.get(('baseline:mpi', b))
        r1, r2 = d / forced[best], (d / m if m else float('nan'))
        within += r1 <= 1.05
        below_mpi += r2 <= 1.0
        same += executed[b] == best
        print(f'| {b} | {executed[b]} | {best} {forced[best]:.1f} us | {r1:.2f} | {r2:.2f} |')
    print(f'\n{layout}: default <= 1.05x the fastest forced at {within} of {len(sizes)} sizes; '
          f'<= MPI at {below_mpi} of {len(sizes)}; ran the measured-fastest algorithm at {same} of {len(sizes)}.\n')
    print(f'### {layout}: the model\'s prediction for its choice against the measured default\n')
    print('| bytes | chosen | predicted (us) | measured (us) | error |')
    print('|---:|---|---:|---:|---:|')
    for b in (1024, 1 << 20, 64 << 20):
        if b not in model or ('default', b) not in times:
            print(f'| {b} | - | - | - | not measured |')
            continue
        preds, choice = model[b]
        p, d = preds[choice], times[('default', b)]
        print(f'| {b} | {choice} | {p:.1f} | {d:.1f} | {100 * (p - d) / d:+.0f}% |')
    print()


if __name__ == '__main__':
    main()
