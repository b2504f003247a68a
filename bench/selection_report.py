#!/usr/bin/env python3
"""Issue 10's goals 1 and 4 from gradcomm-bench JSON and `gradcomm-info --tuning` output.

selection_report.py LAYOUT MODEL.txt|- BENCH.json [BENCH.json ...]

Goal 1, per size: the default's time over the fastest forced algorithm's
time and over baseline:mpi's (out of place), and whether the default
executed the algorithm that measured fastest. Where the default runs the
same code as a forced algorithm, their ratio is the machine's noise; the
choice's own cost is the forced time of the algorithm the default chose
over the fastest forced time ("choice / fastest"). Goal 4, at 1 KiB, 1 MiB and
64 MiB: the model's predicted time for the algorithm it chose against the
default's measured time.

Several runs of the same sweep may be given: each configuration's time at
a size is then the median over the runs that measured it (the count is
shown), so one slow or fast run does not decide a ratio. The prediction
is the one each run's own communicator made for what its default ran
(gradcomm-bench's predicted_us, median over runs); MODEL.txt (or '-' for
none) is read only for runs that do not record one.
"""
import json
import statistics
import sys
from collections import Counter, defaultdict


def load_bench(paths):
    times, executed, predicted = defaultdict(list), defaultdict(list), defaultdict(list)
    for path in paths:
        for r in json.load(open(path))['results']:
            # Goal rows: float32 sums, uncompressed, out of place.
            if r['in_place'] or r.get('compression', 'none') != 'none' or (r['dtype'], r['op']) != ('float32', 'sum'):
                continue
            forced = r['algorithm'] not in ('default', 'baseline:mpi')
            if forced and r['executed'] != r['algorithm']:
                continue  # cannot run on this layout: it fell back to the default
            times[(r['algorithm'], r['bytes'])].append(r['time_us'])
            if r['algorithm'] == 'default':
                executed[r['bytes']].append(r['executed'])
                if r.get('predicted_us') is not None:
                    predicted[r['bytes']].append(r['predicted_us'])
    return times, executed, predicted


def load_model(path):
    rows, names = {}, []
    if path == '-':
        return rows
    for line in open(path):
        parts = line.split()
        if parts[:1] == ['bytes']:
            names = parts[1:parts.index('choice')]
            continue
        if names and parts and parts[0].isdigit() and len(parts) > len(names) + 1:
            preds = {n: (None if v == '-' else float(v)) for n, v in zip(names, parts[1:1 + len(names)])}
            rows[int(parts[0])] = (preds, parts[1 + len(names)])
    return rows


def ran(names):
    """What the default ran over the runs: 'shm', or 'rd 2/hd 1' when runs differ."""
    counts = Counter(names).most_common()
    return counts[0][0] if len(counts) == 1 else '/'.join(f'{n} {c}' for n, c in counts)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    layout, model_path, bench_paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    times, executed, predicted = load_bench(bench_paths)
    model = load_model(model_path)
    med = {k: statistics.median(v) for k, v in times.items()}
    runs = max((len(v) for v in times.values()), default=0)
    sizes = sorted(b for (a, b) in med if a == 'default')
    note = f' (median of {runs} runs)' if runs > 1 else ''
    print(f'### {layout}: default against the fastest forced algorithm and MPI{note}\n')
    print('| bytes | default ran | fastest forced | default / fastest | choice / fastest | default / MPI |')
    print('|---:|---|---|---:|---:|---:|')
    within = below_mpi = same = choice_within = 0
    # A run of the default alone (goal 4 only) has no forced algorithm to compare.
    sizes = [b for b in sizes if any(bb == b and a not in ('default', 'baseline:mpi') for (a, bb) in med)]
    for b in sizes:
        forced = {a: t for (a, bb), t in med.items() if bb == b and a not in ('default', 'baseline:mpi')}
        best = min(forced, key=forced.get)
        d = med[('default', b)]
        m = med.get(('baseline:mpi', b))
        r1, r2 = d / forced[best], (d / m if m else float('nan'))
        # The forced time of what the default ran (the most common choice
        # over the runs); a choice that cannot be forced here has none.
        chosen = Counter(executed[b]).most_common(1)[0][0]
        r3 = forced[chosen] / forced[best] if chosen in forced else float('nan')
        within += r1 <= 1.05
        below_mpi += r2 <= 1.0
        same += all(e == best for e in executed[b])
        choice_within += r3 <= 1.05
        print(f'| {b} | {ran(executed[b])} | {best} {forced[best]:.1f} us | {r1:.2f} | {r3:.2f} | {r2:.2f} |')
    print(f'\n{layout}: default <= 1.05x the fastest forced at {within} of {len(sizes)} sizes; '
          f'its choice forced <= 1.05x the fastest at {choice_within} of {len(sizes)}; '
          f'<= MPI at {below_mpi} of {len(sizes)}; ran the measured-fastest algorithm at {same} of {len(sizes)}.\n')
    print(f'### {layout}: the model\'s prediction for its choice against the measured default{note}\n')
    print('| bytes | chosen | predicted (us) | measured (us) | error |')
    print('|---:|---|---:|---:|---:|')
    for b in (1024, 1 << 20, 64 << 20):
        if ('default', b) not in med or (b not in predicted and b not in model):
            print(f'| {b} | - | - | - | not measured |')
            continue
        if b in predicted:
            choice, p = ran(executed[b]), statistics.median(predicted[b])
        else:
            preds, choice = model[b]
            p = preds[choice]
        d = med[('default', b)]
        print(f'| {b} | {choice} | {p:.1f} | {d:.1f} | {100 * (p - d) / d:+.0f}% |')
    print()


if __name__ == '__main__':
    main()
