#!/usr/bin/env python3
"""A test double for the window's CPU load: processes that wake up, spin a short burst and sleep.

While a reply streams, the web view, WebKit's IPC threads, our UI thread and the X server
wake up ~2,400 times a second for short bursts (`bench/thread-census.py`), ~0.35 of a
core in all. Each burst preempts a compute thread. This script makes the same kind of load
without a window, so the engine's behaviour beside it can be measured with `pocketchat bench`:

    bench/cpu-bursts.py & b=$!
    target/release/pocketchat bench --threads 2 --gen 128; kill $b

usage: cpu-bursts.py [PROCESSES=3] [MEAN_SLEEP_MS=3] [MEAN_BURST_MS=0.4]
Sleeps and bursts vary uniformly from 0.3x to 1.7x their means; each process takes
about burst / (sleep + burst) of a core (3 processes: ~0.35 of a core).
"""
import os
import random
import sys
import time


def main():
    procs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sleep_s = float(sys.argv[2]) / 1e3 if len(sys.argv) > 2 else 3e-3
    burst_s = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 0.4e-3
    for _ in range(procs - 1):
        if os.fork() == 0:
            break
    rng = random.Random(os.getpid())
    while True:
        time.sleep(sleep_s * rng.uniform(0.3, 1.7))
        end = time.perf_counter() + burst_s * rng.uniform(0.3, 1.7)
        while time.perf_counter() < end:
            pass


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
