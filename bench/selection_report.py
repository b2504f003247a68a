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

Several runs of the same sweep may be given (one JSON file per run and
size range). Every ratio is taken within one run, whose configurations
were measured side by side, and the table shows the median of the runs'
ratios (the count is shown): the machine's speed drifts between runs, and
a ratio of medians taken from different runs mixes its states (2x2, 4 B,
stop 34: 1.27 against MPI from the medians of the times, 0.95 as the
median of the runs' own ratios). The times shown are medians over the
runs. The prediction is the one each run's own communicator made for
what its default ran (gradcomm-bench's predicted_us); goal 4's error is
the median of the runs' errors. MODEL.txt (or '-' for none) is read only
for runs that do not record a prediction.
"""
import json
import statistics
import sys
from collections import Counter, defaultdict


def load_bench(paths):
    """times[(algorithm, bytes)]: {run: us}; executed[bytes], predicted[bytes]: {run: value}."""
    times, executed, predicted = defaultdict(dict), defaultdict(dict), defaultdict(dict)
    for run, path in enumerate(paths):
        for r in json.load(open(path))['results']:
            # Goal rows: float32 sums, uncompressed, out of place.
            if r['in_place'] or r.get('compression', 'none') != 'none' or (r['dtype'], r['op']) != ('float32', 'sum'):
                continue
            forced = r['algorithm'] not in ('default', 'baseline:mpi')
            if forced and r['executed'] != r['algorithm']:
                continue  # cannot run on this layout: it fell back to the default
            times[(r['algorithm'], r['bytes'])][run] = r['time_us']
            if r['algorithm'] == 'default':
                executed[r['bytes']][run] = r['executed']
                if r.get('predicted_us') is not None:
                    predicted[r['bytes']][run] = r['predicted_us']
    return times, executed, predicted


def median_ratio(pairs):
    """The median over runs of a / b, from [(a, b), ...] of the same runs; nan for none."""
    ratios = [a / b for a, b in pairs if b]
    return statistics.median(ratios) if ratios else float('nan')


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
    med = {k: statistics.median(v.values()) for k, v in times.items()}
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
        per_run = {a: v for (a, bb), v in times.items() if bb == b and a not in ('default', 'baseline:mpi')}
        d = times[('default', b)]
        m = times.get(('baseline:mpi', b), {})

        def fastest(run):
            ts = [v[run] for v in per_run.values() if run in v]
            return min(ts) if ts else 0
        r1 = median_ratio([(t, fastest(run)) for run, t in d.items()])
        r2 = median_ratio([(t, m[run]) for run, t in d.items() if run in m])
        # The forced time, in the same run, of what the default ran there; a
        # choice that cannot be forced here has none.
        r3 = median_ratio([(per_run[executed[b][run]][run], fastest(run)) for run in d
                           if executed[b][run] in per_run and run in per_run[executed[b][run]]])
        within += r1 <= 1.05
        below_mpi += r2 <= 1.0
        same += all(e == best for e in executed[b].values())
        choice_within += r3 <= 1.05
        print(f'| {b} | {ran(executed[b].values())} | {best} {forced[best]:.1f} us | {r1:.2f} | {r3:.2f} | {r2:.2f} |')
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
        d = times[('default', b)]
        if b in predicted:
            choice, p = ran(executed[b].values()), statistics.median(predicted[b].values())
            err = median_ratio([(predicted[b][run] - t, t) for run, t in d.items() if run in predicted[b]])
        else:
            preds, choice = model[b]
            p = preds[choice]
            err = median_ratio([(p - t, t) for t in d.values()])
        print(f'| {b} | {choice} | {p:.1f} | {med[("default", b)]:.1f} | {100 * err:+.0f}% |')
    print()


if __name__ == '__main__':
    main()
