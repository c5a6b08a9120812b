#!/usr/bin/env python3
"""PyTorch's torch.distributed on our libnccl.so.2 in place of NVIDIA's: the drop-in test.

    python3 tests/python/torch_dropin.py --lib PATH/libnccl.so.2 --nranks N [--timeout S]

Starts N processes, each with LD_PRELOAD=PATH. torch itself also loads NVIDIA's libnccl.so.2
(by path, from its wheel), but the preloaded library comes first in symbol lookup, so torch's
NCCL calls bind to ours. The test checks that: in each process the process-wide
ncclGetVersion must be ours, and with NCCL_DEBUG=VERSION only our version line may appear
(NVIDIA's prints its own when one of its communicators starts). Then each process runs the collectives, point-to-point patterns, subgroups and CUDA Graphs a training
program uses, on random data (each rank's input comes from a seed every rank knows, so every
rank computes the expected result itself), and compares. Rank r uses GPU r % visible GPUs: on a
host of fewer GPUs than ranks, set NCCL_RS_SHARED_GPUS=1 (our kernel lab; NVIDIA's NCCL refuses
shared GPUs). `--lib nvidia` runs the same checks on NVIDIA's NCCL, to check the checks.
`--scenario dead-peer` instead kills the last rank mid-job: the others must get an error from
torch's watchdog abort, not hang.

Exit status 0 only if every rank passed every check and exited in time.
"""
import argparse
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_of(pid):
    """Each thread of a stuck process: name, state and where it sleeps in the kernel."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        def rd(f):
            try:
                return open(f"/proc/{pid}/task/{tid}/{f}").read().strip()
            except OSError as e:
                return f"({e.strerror})"
        state = next((l for l in rd("status").splitlines() if l.startswith("State")), "")
        stack = " <- ".join(l.split()[-1] for l in rd("stack").splitlines()[:4])
        out.append(f"  {tid} {rd('comm'):16} {state[6:].strip():14} wchan {rd('wchan')} {stack}")
    return "\n".join(out)


def launch(args):
    import tempfile
    port = free_port()
    procs, logs = [], []
    for r in range(args.nranks):
        env = dict(os.environ)
        env.update(RANK=str(r), WORLD_SIZE=str(args.nranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0", NCCL_DEBUG="VERSION")
        if args.lib != "nvidia":
            env["LD_PRELOAD"] = os.path.abspath(args.lib)
        if args.scenario == "dead-peer":
            # CleanUpOnly: on a timeout torch's watchdog aborts the communicator
            # (ncclCommAbort) and keeps the process, which then sees the error.
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
            env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")  # no debug dump first
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--lib", args.lib,
               "--scenario", args.scenario]
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.time() + args.timeout
    rcs = [None] * len(procs)
    while None in rcs and time.time() < deadline:
        for i, p in enumerate(procs):
            rcs[i] = p.poll()
        time.sleep(0.2)
    for i, p in enumerate(procs):
        if rcs[i] is None:
            print(f"rank {i}: still running after {args.timeout} s: killed; its threads:",
                  flush=True)
            print(threads_of(p.pid), flush=True)
            p.kill()
            rcs[i] = "timeout"
    for r, log in enumerate(logs):
        log.seek(0)
        out = log.read()
        print(out, end="", flush=True)
        versions = {line.strip() for line in out.splitlines()
                    if line.strip().startswith("NCCL version")}
        mine = "(nccl-rs)" if args.lib != "nvidia" else "+cuda"
        # NVIDIA's NCCL prints its line on rank 0 only, ours in every process.
        if (r == 0 and not versions) or any(mine not in v for v in versions):
            print(f"rank {r}: NCCL_DEBUG=VERSION printed {sorted(versions)}: "
                  f"not only the library asked for", flush=True)
            rcs[r] = rcs[r] or "wrong library"
    ok = all(rc == 0 for rc in rcs)
    print(f"torch drop-in on {args.nranks} rank(s), lib {args.lib}: "
          f"{'PASSED' if ok else 'FAILED'} (exit codes {rcs})", flush=True)
    return 0 if ok else 1


def library_of(address):
    """The file of the shared object holding `address` (dladdr)."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    info = DlInfo()
    if ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) == 0:
        return "?"
    return os.path.realpath(info.dli_fname.decode())


# ---------------------------------------------------------------------------------------------
# Worker side.

def worker(args):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    failures = []
    passed = []

    def say(msg):
        print(f"[rank {rank}] {msg}", flush=True)

    def check(name, fn):
        try:
            fn()
            torch.cuda.synchronize()
            passed.append(name)
        except Exception as e:  # a failed comparison or an error from NCCL: report, go on
            failures.append(name)
            say(f"FAIL {name}: {type(e).__name__}: {e}")

    # Which libnccl files this process mapped, and whose ncclGetVersion the process-wide
    # lookup finds first (the one torch's calls bind to).
    import ctypes
    maps = open("/proc/self/maps").read()
    mapped = sorted({line.split()[-1] for line in maps.splitlines() if "libnccl" in line})
    v = ctypes.c_int(0)
    owner = "-"
    if args.lib != "nvidia":  # NVIDIA's alone is loaded RTLD_LOCAL: not found this way
        get_version = ctypes.CDLL(None).ncclGetVersion
        get_version(ctypes.byref(v))
        owner = library_of(ctypes.cast(get_version, ctypes.c_void_p).value)
    say(f"torch {torch.__version__} (built with NCCL {torch.cuda.nccl.version()}), libnccl "
        f"mapped: {mapped}, process-wide ncclGetVersion: {v.value} from {owner}")
    # Both libraries may report the same version (nccl-rs reports the newest NCCL release whose
    # host API it implements): the file the symbol lives in tells which one answers.
    if args.lib != "nvidia" and "site-packages/nvidia" in owner:
        say(f"FAIL: ncclGetVersion resolves to NVIDIA's library ({owner}), not nccl-rs's")
        return 1

    if args.scenario == "dead-peer":
        return dead_peer(rank, world, dev, say)

    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)

    def inputs(shape, dtype, seed_base=0, lo=-8, hi=8):
        """Every rank's input for one check, made alike on every rank (CPU generator)."""
        if dtype == torch.uint8:
            lo = max(lo, 0)
        out = []
        for r in range(world):
            g = torch.Generator().manual_seed(1000 * seed_base + r)
            if dtype.is_floating_point:
                t = torch.randint(lo, hi, shape, generator=g).to(torch.float64)
                t = t + torch.randint(0, 4, shape, generator=g) / 4.0
            else:
                t = torch.randint(lo, hi, shape, generator=g)
            out.append(t.to(dtype))
        return out

    def poison(shape, dtype):
        if dtype.is_floating_point:
            return torch.full(shape, float("nan"), dtype=dtype, device=dev)
        return torch.full(shape, -77, dtype=dtype, device=dev)

    def same(got, want, what, tol=0.0):
        got = got.detach().to("cpu", torch.float64)
        want = want.to(torch.float64)
        if got.shape != want.shape:
            raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
        bad = ~torch.isclose(got, want, rtol=tol, atol=tol, equal_nan=False)
        n = int(bad.sum())
        if n:
            i = int(bad.flatten().nonzero()[0])
            raise AssertionError(f"{what}: {n} of {got.numel()} wrong, first [{i}] got "
                                 f"{got.flatten()[i].item()} want {want.flatten()[i].item()}")

    Op = dist.ReduceOp
    # Inputs are small integers or quarters, so the float64 reference is exact.
    reductions = {
        Op.SUM: lambda ts: sum(t.to(torch.float64) for t in ts),
        Op.MAX: lambda ts: torch.stack([t.to(torch.float64) for t in ts]).max(0).values,
        Op.MIN: lambda ts: torch.stack([t.to(torch.float64) for t in ts]).min(0).values,
        Op.PRODUCT: lambda ts: torch.stack([t.to(torch.float64) for t in ts]).prod(0),
        Op.AVG: lambda ts: sum(t.to(torch.float64) for t in ts) / world,
    }

    def all_reduce(dtype, op, count, seed):
        def run():
            lo, hi = (-2, 3) if op == Op.PRODUCT else (-8, 8)
            ins = inputs((count,), dtype, seed, lo, hi)
            t = ins[rank].to(dev)
            dist.all_reduce(t, op=op)
            # Integers are exact; floats differ from the float64 result by their rounding.
            tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
            tol = tol if dtype.is_floating_point else 0.0
            same(t, reductions[op](ins), f"all_reduce {dtype} {op} count {count}", tol)
        return run

    seed = 1
    for dtype, op, count in [
        (torch.float32, Op.SUM, 1_000_003), (torch.float32, Op.SUM, 1),
        (torch.float32, Op.SUM, 17 << 20), (torch.bfloat16, Op.SUM, 65_537),
        (torch.float16, Op.SUM, 4099), (torch.float64, Op.AVG, 12_345),
        (torch.float32, Op.AVG, 777), (torch.int32, Op.MAX, 100_001),
        (torch.int64, Op.MIN, 3333), (torch.float32, Op.PRODUCT, 5000),
        (torch.uint8, Op.SUM, 2049), (torch.int8, Op.MAX, 513),
    ]:
        seed += 1
        check(f"all_reduce {str(dtype)[6:]} {op} x{count}", all_reduce(dtype, op, count, seed))

    def premul_sum(factor_on_device):
        def run():
            ins = inputs((10_001,), torch.float32, 50)
            t = ins[rank].to(dev)
            factor = torch.tensor(0.5, device=dev) if factor_on_device else 0.5
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            same(t, sum(x.to(torch.float64) * 0.5 for x in ins), "premul_sum", 1e-6)
        return run

    check("all_reduce premul_sum (host scalar)", premul_sum(False))
    check("all_reduce premul_sum (device scalar)", premul_sum(True))

    def broadcast(src, count, dtype):
        def run():
            ins = inputs((count,), dtype, 60 + src)
            t = ins[rank].to(dev) if rank == src else poison((count,), dtype)
            dist.broadcast(t, src=src)
            same(t, ins[src], f"broadcast from {src}")
        return run

    for src in sorted({0, world - 1}):
        check(f"broadcast src {src}", broadcast(src, 300_007, torch.float32))
    check("broadcast bf16 8 MiB", broadcast(world - 1, 4 << 20, torch.bfloat16))

    def reduce(dst):
        def run():
            ins = inputs((70_001,), torch.float32, 70 + dst)
            t = ins[rank].to(dev)
            dist.reduce(t, dst=dst, op=Op.SUM)
            if rank == dst:
                same(t, sum(x.to(torch.float64) for x in ins), f"reduce to {dst}")
        return run

    for dst in sorted({0, world - 1}):
        check(f"reduce dst {dst}", reduce(dst))

    def all_gather_into_tensor(count, dtype):
        def run():
            ins = inputs((count,), dtype, 80)
            out = poison((world * count,), dtype)
            dist.all_gather_into_tensor(out, ins[rank].to(dev))
            same(out, torch.cat(ins), "all_gather_into_tensor")
        return run

    check("all_gather_into_tensor odd", all_gather_into_tensor(100_003, torch.float32))
    check("all_gather_into_tensor int8", all_gather_into_tensor(4097, torch.int8))

    def all_gather_list():
        ins = inputs((5003,), torch.float16, 90)
        outs = [poison((5003,), torch.float16) for _ in range(world)]
        dist.all_gather(outs, ins[rank].to(dev))
        for r in range(world):
            same(outs[r], ins[r], f"all_gather list [{r}]")

    check("all_gather list", all_gather_list)

    def reduce_scatter_tensor(count, op):
        def run():
            ins = inputs((world * count,), torch.float32, 100)
            out = poison((count,), torch.float32)
            dist.reduce_scatter_tensor(out, ins[rank].to(dev), op=op)
            want = reductions[op](ins)[rank * count:(rank + 1) * count]
            same(out, want, f"reduce_scatter_tensor {op}", 1e-6)
        return run

    check("reduce_scatter_tensor sum", reduce_scatter_tensor(65_539, Op.SUM))
    check("reduce_scatter_tensor max", reduce_scatter_tensor(1001, Op.MAX))
    check("reduce_scatter_tensor avg", reduce_scatter_tensor(1001, Op.AVG))

    def all_to_all_single_uneven():
        # Rank s sends (s + 1) * (d + 1) + d elements to rank d: every pair its own size.
        size = lambda s, d: (s + 1) * (d + 1) + d
        datas = {}
        for s in range(world):
            g = torch.Generator().manual_seed(110 + s)
            datas[s] = torch.randint(-100, 100, (sum(size(s, d) for d in range(world)),),
                                     generator=g).to(torch.float32)
        send_splits = [size(rank, d) for d in range(world)]
        recv_splits = [size(s, rank) for s in range(world)]
        out = poison((sum(recv_splits),), torch.float32)
        dist.all_to_all_single(out, datas[rank].to(dev), recv_splits, send_splits)
        want = []
        for s in range(world):
            start = sum(size(s, d) for d in range(rank))
            want.append(datas[s][start:start + size(s, rank)])
        same(out, torch.cat(want), "all_to_all_single uneven")

    check("all_to_all_single uneven", all_to_all_single_uneven)

    def all_to_all_single_even():
        n = 4096
        ins = inputs((world * n,), torch.bfloat16, 120)
        out = poison((world * n,), torch.bfloat16)
        dist.all_to_all_single(out, ins[rank].to(dev))
        want = torch.cat([ins[s][rank * n:(rank + 1) * n] for s in range(world)])
        same(out, want, "all_to_all_single even")

    check("all_to_all_single even", all_to_all_single_even)

    def ring_send_recv():
        if world == 1:
            return
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        ins = inputs((123_457,), torch.float32, 130)
        out = poison((123_457,), torch.float32)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, ins[rank].to(dev), nxt),
                                       dist.P2POp(dist.irecv, out, prv)])
        for q in reqs:
            q.wait()
        same(out, ins[prv], "ring send/recv")

    check("batch_isend_irecv ring", ring_send_recv)

    def blocking_send_recv():
        # Rank 0 sends different sizes to every other rank, one blocking call each.
        if world == 1:
            return
        if rank == 0:
            for d in range(1, world):
                dist.send(inputs((1000 * d + 1,), torch.int64, 140 + d)[0].to(dev), dst=d)
        else:
            out = poison((1000 * rank + 1,), torch.int64)
            dist.recv(out, src=0)
            same(out, inputs((1000 * rank + 1,), torch.int64, 140 + rank)[0], "send/recv")

    check("send/recv from rank 0", blocking_send_recv)

    check("barrier", lambda: dist.barrier())

    def subgroup():
        # ncclCommSplit under new_group: ranks 0 and the last form a group, the rest another.
        members = sorted({0, world - 1})
        others = [r for r in range(world) if r not in members]
        g1 = dist.new_group(members)
        g2 = dist.new_group(others) if others else None
        mine, group = (members, g1) if rank in members else (others, g2)
        ins = inputs((20_001,), torch.float32, 150)
        t = ins[rank].to(dev)
        dist.all_reduce(t, group=group)
        same(t, sum(ins[r].to(torch.float64) for r in mine), f"subgroup {mine} all_reduce")

    check("new_group all_reduce", subgroup)

    def graph_replays():
        ins = inputs((262_147,), torch.float32, 160)
        static = torch.zeros(262_147, device=dev)
        gathered = poison((world * 1024,), torch.float32)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up outside the capture, as torch asks
            dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(static)
            static.mul_(0.5)
            dist.all_gather_into_tensor(gathered, static[:1024].contiguous())
        for i in range(10):
            static.copy_(ins[rank].to(dev) * (i + 1))
            g.replay()
            torch.cuda.synchronize()
            want = sum(x.to(torch.float64) for x in ins) * (i + 1) * 0.5
            same(static, want, f"graph replay {i}", 1e-6)
            same(gathered, torch.cat([want[:1024]] * world), f"graph replay {i} gather", 1e-6)

    check("cuda graph replays", graph_replays)

    def async_then_wait():
        ins = inputs((1 << 20,), torch.float32, 170)
        t = ins[rank].to(dev)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        same(t, sum(x.to(torch.float64) for x in ins), "async all_reduce")

    check("async_op all_reduce", async_then_wait)

    dist.destroy_process_group()
    say(f"{len(passed)} checks passed, {len(failures)} failed"
        + (f": {failures}" if failures else ""))
    return 0 if not failures else 1


def dead_peer(rank, world, dev, say):
    """The last rank leaves without a word after one AllReduce; the others start another,
    which can never finish. torch's watchdog must see the timeout and abort the communicator
    (ncclCommAbort), the stuck kernel must then end, later calls must fail, and the process
    group must be destroyed: an error and a working abort, not a hang."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    limit = 20
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=timedelta(seconds=limit))
    t = torch.ones(1 << 20, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if t[0].item() != world:
        say(f"FAIL: the first all_reduce gave {t[0].item()}, want {world}")
        return 1
    if rank == world - 1:
        say("leaving without a word")
        os._exit(0)
    t0 = time.time()
    dist.all_reduce(t, async_op=True)
    torch.cuda.synchronize()  # returns only once the abort ended the kernel
    stuck = time.time() - t0
    say(f"the stuck all_reduce ended after {stuck:.1f} s (watchdog timeout {limit} s)")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        say("FAIL: an all_reduce on the aborted group succeeded")
        return 1
    except Exception as e:
        say(f"the next all_reduce failed as it must: {type(e).__name__}: {str(e)[:200]}")
    t1 = time.time()
    dist.destroy_process_group()
    say(f"destroy_process_group returned after {time.time() - t1:.1f} s")
    if stuck < limit * 0.9:
        say(f"FAIL: the all_reduce ended before the timeout: it cannot have completed")
        return 1
    say("dead peer: error seen, abort worked; exiting")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="our libnccl.so.2, or 'nvidia'")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--scenario", choices=["checks", "dead-peer"], default="checks",
                    help="checks: the collectives; dead-peer: a rank dies, the rest abort")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.exit(worker(args) if args.worker else launch(args))


if __name__ == "__main__":
    main()
