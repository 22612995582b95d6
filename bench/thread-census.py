#!/usr/bin/env python3
"""Per-thread CPU and wake-ups of the app, WebKit and Xvfb while a reply streams.

    bench/thread-census.py record FILE   # samples /proc every 0.25 s until killed
    bench/thread-census.py report FILE   # the busiest stretch of the app, per thread

`record` writes one JSON line per sample: for every thread of `pocketchat app`, the
WebKit processes and Xvfb, its CPU ticks and its voluntary and involuntary context
switches. `report` finds the longest stretch where the app used more than 0.9 of a
core (the reply streaming), drops its first and last samples, and prints per thread
name: cores used, voluntary switches a second (wake-ups: the thread slept and was woken)
and involuntary ones (it was preempted). Run `record` in the background around the
end-to-end test:

    bench/thread-census.py record /tmp/census.jsonl & rec=$!
    cargo test --release --features desktop --test app_e2e -- --nocapture the_window_streams
    kill $rec; bench/thread-census.py report /tmp/census.jsonl
"""
import collections
import json
import os
import sys
import time

PROCESSES = ('pocketchat', 'WebKit', 'Xvfb')


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def sample():
    threads = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        process = (read(f'/proc/{pid}/comm') or '').strip()
        if not process.startswith(PROCESSES):
            continue
        if process == 'pocketchat' and 'app' not in (read(f'/proc/{pid}/cmdline') or ''):
            continue
        for tid in os.listdir(f'/proc/{pid}/task') if os.path.isdir(f'/proc/{pid}/task') else []:
            stat, status = read(f'/proc/{pid}/task/{tid}/stat'), read(f'/proc/{pid}/task/{tid}/status')
            if not stat or not status:
                continue
            name = stat[stat.index('(') + 1:stat.rindex(')')]
            fields = stat[stat.rindex(')') + 2:].split()
            switches = {k: int(v) for k, v in (line.split(':') for line in status.splitlines() if 'ctxt_switches' in line)}
            threads[f'{process}/{name}/{tid}'] = (
                int(fields[11]) + int(fields[12]),
                switches['voluntary_ctxt_switches'],
                switches['nonvoluntary_ctxt_switches'],
            )
    return {'t': time.time(), 'threads': threads}


def record(path):
    with open(path, 'w') as out:
        while True:
            out.write(json.dumps(sample()) + '\n')
            out.flush()
            time.sleep(0.25)


def report(path):
    ticks = os.sysconf('SC_CLK_TCK')
    with open(path) as f:
        samples = [json.loads(line) for line in f if line.strip()]
    app = [sum(v[0] for k, v in s['threads'].items() if k.startswith('pocketchat/')) for s in samples]
    busy = [i for i in range(len(samples) - 1)
            if (app[i + 1] - app[i]) / ticks / (samples[i + 1]['t'] - samples[i]['t']) > 0.9]
    longest, run = [], []
    for i in busy:
        run = run + [i] if run and i == run[-1] + 1 else [i]
        longest = max(longest, run, key=len)
    if len(longest) < 3:
        sys.exit('no stretch where the app used more than 0.9 of a core: did a reply stream?')
    first, last = samples[longest[0] + 1], samples[longest[-1]]
    seconds = last['t'] - first['t']
    print(f'{seconds:.1f} s while the app used more than 0.9 of a core')
    totals = collections.defaultdict(lambda: [0, 0, 0])
    for key, now in last['threads'].items():
        before = first['threads'].get(key)
        if before:
            process, name, _ = key.split('/')
            for j in range(3):
                totals[f'{process}/{name}'][j] += now[j] - before[j]
    print(f'{"process/thread":44s} {"cores":>6s} {"wake-ups/s":>11s} {"preempted/s":>12s}')
    for key, (cpu, woken, preempted) in sorted(totals.items(), key=lambda kv: -kv[1][1] - kv[1][2]):
        if cpu or woken or preempted:
            print(f'{key:44s} {cpu / ticks / seconds:6.2f} {woken / seconds:11.1f} {preempted / seconds:12.1f}')


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] not in ('record', 'report'):
        sys.exit(__doc__)
    (record if sys.argv[1] == 'record' else report)(sys.argv[2])
