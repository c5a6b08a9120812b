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

With --offsets (for more than two processes, e.g. a tree over 4 nodes, where a hop's sender is
not obvious): which process is which rank is worked out from the files (a process's sends to
rank p land in rank p's process with its own rank as the peer, step for step), and for runs of
one network step per connection per call (tiny messages) each step number is one call. For each
call, time 0 is the first send posted anywhere; the tool prints, rank by rank, the median (p10,
p90) offset of each kind of event with each peer, in order: the critical path reads off it
(a leaf's send, its parent's landing and send, ..., the root's turn, the way down).

With --kernels STAMPS (the files NCCL_RS_KERNEL_STAMPS=STAMPS wrote, STAMPS.<pid>-<k>.<rank>): per
rank, the kernel's own time (CTA 0's entry to exit, the GPU's timer), the gap from one launch's
exit to the next one's entry, and the period (entry to entry), median (p10-p90), after --skip N
launches.
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


def ranks_of(procs):
    """pid -> rank: the assignment under which the most posted sends (peer, step) are matched by
    a landing (our rank, step) in the peer's process."""
    import itertools

    pids = sorted(procs)
    if len(pids) > 8:
        sys.exit(f"--offsets tries every assignment of ranks: {len(pids)} processes are too many")
    sends = {pid: {(peer, step) for _, m, peer, step in procs[pid] if m == "SendPosted"} for pid in pids}
    lands = {pid: {(peer, step) for _, m, peer, step in procs[pid] if m == "RecvLanded"} for pid in pids}
    best, best_score = None, -1
    for perm in itertools.permutations(range(len(pids))):
        rank = dict(zip(pids, perm))
        by_rank = {r: pid for pid, r in rank.items()}
        score = 0
        for pid in pids:
            for peer, step in sends[pid]:
                q = by_rank.get(peer)
                if q is not None and (rank[pid], step) in lands[q]:
                    score += 1
        if score > best_score:
            best, best_score = rank, score
    return best


def offsets(procs, skip):
    rank = ranks_of(procs)
    # Step numbers common to every connection's record, after the warm-up.
    steps = sorted({step for ev in procs.values() for _, m, _, step in ev if m == "SendPosted"})
    steps = steps[skip:]
    t0 = {}
    for ev in procs.values():
        for ns, m, _, step in ev:
            if m == "SendPosted" and step in steps:
                t0[step] = min(t0.get(step, ns), ns)
    print(f"ranks by pid: {dict(sorted(rank.items(), key=lambda kv: kv[1]))}; calls: {len(t0)}")
    print("offset from the call's first posted send, us: median (p10-p90) n")
    for pid in sorted(procs, key=lambda p: rank[p]):
        rows = {}
        for ns, m, peer, step in procs[pid]:
            if m in ("SendPosted", "RecvLanded", "Awaited", "SendDone") and step in t0:
                rows.setdefault((m, peer), []).append(ns - t0[step])
        order = sorted(rows, key=lambda k: statistics.median(rows[k]))
        print(f"rank {rank[pid]} (pid {pid}):")
        for m, peer in order:
            arrow = "->" if m.startswith("Send") else "<-"
            print(f"  {m:10s} {arrow} rank {peer}: {stats(rows[(m, peer)])}")


def kernels(prefix, skip):
    for f in sorted(glob.glob(prefix + ".*"), key=lambda p: int(p.rsplit(".", 1)[1])):
        rows = [tuple(int(x) for x in l.split()) for l in open(f) if l.strip()]
        rows = sorted(rows)[skip:]
        own = [x - e for _, e, x in rows]
        gap = [b[1] - a[2] for a, b in zip(rows, rows[1:]) if b[0] == a[0] + 1]
        period = [b[1] - a[1] for a, b in zip(rows, rows[1:]) if b[0] == a[0] + 1]
        print(f"rank {f.rsplit('.', 1)[1]} ({len(rows)} launches):")
        print(f"  kernel  {stats(own)}")
        print(f"  gap     {stats(gap)}")
        print(f"  period  {stats(period)}")


if __name__ == "__main__":
    if "--kernels" in sys.argv:
        sk = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 20
        kernels(sys.argv[sys.argv.index("--kernels") + 1], sk)
    elif "--offsets" in sys.argv:
        pre = sys.argv[1]
        sk = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 20
        offsets({f.rsplit(".", 1)[1]: load(f) for f in sorted(glob.glob(pre + ".*"))}, sk)
    else:
        main()
