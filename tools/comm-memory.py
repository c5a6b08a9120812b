#!/usr/bin/env python3
"""Device memory a communicator takes, for a libnccl.so.2 (nccl-rs's or NVIDIA's).

    comm-memory.py LIB --ranks N --comms K1,K2,...

Creates communicators of N ranks on GPU 0 with ncclCommInitAll (N > 1 needs ranks sharing a
GPU: nccl-rs with NCCL_RS_SHARED_GPUS=1; NVIDIA's NCCL refuses it), K at a time, runs one float
AllReduce of 1 MiB on each (a library may connect and allocate on first use), and prints the
GPU's used memory per communicator (cudaMemGetInfo's drop over all of them / K) and, where the
library has it, ncclCommMemStats's total for one rank. One line per K:

    lib=<name> ranks=N comms=K mib_per_comm=<x> memstats_mib=<y|->

Stops early when less than 4 GiB would be left. Needs PyTorch for the CUDA context, buffers
and streams.
"""
import argparse
import ctypes
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--comms", default="1,8,64")
    ap.add_argument("--name", default="lib")
    args = ap.parse_args()
    nccl = ctypes.CDLL(args.lib)
    torch.cuda.init()
    # A stream per rank: ranks sharing a GPU on one stream would wait on each other's kernels
    # queued behind their own.
    streams = [torch.cuda.Stream(device=0) for _ in range(args.ranks)]
    count = 1 << 18  # 1 MiB of floats per rank
    bufs = [torch.ones(count, device="cuda:0") for _ in range(args.ranks)]
    has_stats = hasattr(nccl, "ncclCommMemStats")
    for k in [int(x) for x in args.comms.split(",")]:
        torch.cuda.synchronize()
        free0, _ = torch.cuda.mem_get_info(0)
        comms = []
        for _ in range(k):
            arr = (ctypes.c_void_p * args.ranks)()
            devs = (ctypes.c_int * args.ranks)(*([0] * args.ranks))
            rc = nccl.ncclCommInitAll(arr, args.ranks, devs)
            if rc != 0:
                print(f"lib={args.name} ranks={args.ranks} comms={k} init failed rc={rc}")
                return 1
            comms.append(list(arr))
            assert nccl.ncclGroupStart() == 0
            for r, c in enumerate(comms[-1]):
                p = ctypes.c_void_p(bufs[r].data_ptr())
                rc = nccl.ncclAllReduce(p, p, ctypes.c_size_t(count), 7, 0, ctypes.c_void_p(c),
                                        ctypes.c_void_p(streams[r].cuda_stream))
                assert rc == 0, rc
            assert nccl.ncclGroupEnd() == 0
            torch.cuda.synchronize()
            free, _ = torch.cuda.mem_get_info(0)
            if free < (4 << 30):
                print(f"# stopped at {len(comms)} communicators: {free >> 20} MiB left")
                break
        torch.cuda.synchronize()
        free1, _ = torch.cuda.mem_get_info(0)
        made = len(comms)
        per = (free0 - free1) / made / (1 << 20)
        stats = "-"
        if has_stats:
            v = ctypes.c_uint64(0)
            if nccl.ncclCommMemStats(ctypes.c_void_p(comms[0][0]), 3, ctypes.byref(v)) == 0:
                stats = f"{v.value / (1 << 20):.1f}"
        print(f"lib={args.name} ranks={args.ranks} comms={made} mib_per_comm={per:.1f} "
              f"memstats_mib={stats}", flush=True)
        for cs in comms:
            for c in cs:
                nccl.ncclCommDestroy(ctypes.c_void_p(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
