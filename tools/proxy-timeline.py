#!/usr/bin/env python3
"""Reads the files NCCL_RS_PROXY_TIMELINE=PREFIX wrote (PREFIX.<pid>, one per rank process) and
says where a small collective across nodes spends its time, in microseconds (median, p10, p90):

  issue    one launch call to the next on the host (the host runs ahead of the GPU)
  call     the GPU's time per call: windows of 50 calls (first posted send to first posted send)
  hop      a send posted by one process's proxy -> the same step landed at its peer's proxy
  turn     a step landed -> the next send this process posted, within one call
  restart  the last step of a call landed -> the first send of the next call
  wait     the kernel's word that it waits for a step -> that step landed (>0: the kernel waited)

Usage: proxy-timeline.py PREFIX [--skip N]   (N: leading launches per process to ignore, warm-up)
Steps per call are inferred per process as receive steps / launches.
"""
import glob
import statistics
import sys


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 4:
                ev.append((int(p[0]), p[1], int(p[2]), int(p[3])))
    ev.sort()
    return ev


def stats(xs):
    if not xs:
        return "n/a"
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
    return f"{statistics.median(xs) / 1e3:8.1f} ({q(0.1) / 1e3:.1f}-{q(0.9) / 1e3:.1f}) n={len(xs)}"


def main():
    prefix = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 20
    files = sorted(glob.glob(prefix + ".*"))
    procs = {f.rsplit(".", 1)[1]: load(f) for f in files}
    # Which process is which rank: a process's sends to peer p land in the process that
    # receives from... ranks are not recorded, so match by (peer, step) pairs below.
    sent = {}  # (pid, peer, step) -> ns
    for pid, ev in procs.items():
        for ns, m, peer, step in ev:
            if m == "SendPosted":
                sent[(pid, peer, step)] = ns
    for pid, ev in procs.items():
        launches = [ns for ns, m, _, _ in ev if m == "Launch"]
        if len(launches) <= skip + 1:
            print(f"{pid}: {len(launches)} launches, too few")
            continue
        t0 = launches[skip]
        ev = [e for e in ev if e[0] >= t0]
        landed = [(ns, peer, step) for ns, m, peer, step in ev if m == "RecvLanded"]
        sends = [(ns, peer, step) for ns, m, peer, step in ev if m == "SendPosted"]
        awaited = {(peer, step): ns for ns, m, peer, step in ev if m == "Awaited"}
        nl = len([x for x in launches if x >= t0])
        per_call = max(1, round(len(landed) / max(1, nl)))
        per_send = max(1, round(len(sends) / max(1, nl)))
        issue = [b - a for a, b in zip(launches[skip:], launches[skip + 1 :])]
        # Steady state: the mean over windows of 50 calls, each window's mean (a window that
        # holds a pause, such as the switch from out-of-place to in-place, falls in the tail).
        st = [ns for ns, _, _ in sends][::per_send]
        w = 50
        call = [(st[k + w] - st[k]) / w for k in range(0, len(st) - w, w // 2)]
        hops, turns, restarts, waits = [], [], [], []
        # Hops: this process's landed step s from peer q was sent by the process whose send to
        # us has the same step number; the files do not name ranks, so take the other process
        # whose send of that step is latest before the landing.
        for ns, peer, step in landed:
            cands = [t for (p, _, s), t in sent.items() if p != pid and s == step and t <= ns]
            if cands:
                hops.append(ns - max(cands))
            if (peer, step) in awaited:
                waits.append(ns - awaited[(peer, step)])
        si = 0
        for ns, peer, step in landed:
            while si < len(sends) and sends[si][0] < ns:
                si += 1
            if si == len(sends):
                break
            dt = sends[si][0] - ns
            (restarts if step % per_call == per_call - 1 else turns).append(dt)
        print(f"process {pid}: {nl} launches, {per_call} receive steps per call")
        print(f"  issue   {stats(issue)}")
        print(f"  call    {stats(call)}")
        print(f"  hop     {stats(hops)}")
        print(f"  turn    {stats(turns)}")
        print(f"  restart {stats(restarts)}")
        print(f"  wait    {stats(waits)}")


if __name__ == "__main__":
    main()
