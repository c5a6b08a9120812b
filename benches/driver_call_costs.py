#!/usr/bin/env python3
"""Host cost of the CUDA driver calls a collective's launch makes, on the GPU host (ctypes
only, no Rust there). The small-message path is host-bound on one GPU: this says which calls
the microseconds go to. Python's own call overhead is the cuCtxGetCurrent row; subtract it.
Usage: python3 benches/driver_call_costs.py"""
import ctypes as C
import time

cu = C.CDLL("libcuda.so.1")


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUresult {r}")


ok(cu.cuInit(0), "cuInit")
dev = C.c_int()
ok(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ctx = C.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
buf = C.c_uint64()
ok(cu.cuMemAlloc_v2(C.byref(buf), 1 << 20), "cuMemAlloc")
stream = C.c_void_p()
ok(cu.cuStreamCreate(C.byref(stream), 1), "cuStreamCreate")
timed, untimed = C.c_void_p(), C.c_void_p()
ok(cu.cuEventCreate(C.byref(timed), 0), "cuEventCreate")
ok(cu.cuEventCreate(C.byref(untimed), 2), "cuEventCreate(DISABLE_TIMING)")

PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry empty(.param .u64 p) { ret; }
"""
mod = C.c_void_p()
ok(cu.cuModuleLoadData(C.byref(mod), C.c_char_p(PTX)), "cuModuleLoadData")
fn = C.c_void_p()
ok(cu.cuModuleGetFunction(C.byref(fn), mod, b"empty"), "cuModuleGetFunction")
arg = C.c_uint64(0)
params = (C.c_void_p * 1)(C.cast(C.byref(arg), C.c_void_p))

ordinal = C.c_int()
status = C.c_int()
cur = C.c_void_p()
calls = {
    "cuCtxGetCurrent (python overhead)": lambda: cu.cuCtxGetCurrent(C.byref(cur)),
    "cuCtxSetCurrent": lambda: cu.cuCtxSetCurrent(ctx),
    "cuPointerGetAttribute(DEVICE_ORDINAL)": lambda: cu.cuPointerGetAttribute(
        C.byref(ordinal), 9, buf
    ),
    "cuStreamIsCapturing": lambda: cu.cuStreamIsCapturing(stream, C.byref(status)),
    "cuEventRecord (timing event)": lambda: cu.cuEventRecord(timed, stream),
    "cuEventRecord (DISABLE_TIMING event)": lambda: cu.cuEventRecord(untimed, stream),
    "cuStreamWaitEvent": lambda: cu.cuStreamWaitEvent(stream, untimed, 0),
    "cuLaunchKernel (1 CTA x 512)": lambda: cu.cuLaunchKernel(
        fn, 1, 1, 1, 512, 1, 1, 0, stream, params, None
    ),
}
for name, f in calls.items():
    for _round in range(2):  # the first round warms up
        n, t = 0, 0.0
        for _batch in range(20):
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            t += time.perf_counter() - t0
            n += 200
            ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    print(f"{name:42s} {t / n * 1e6:7.2f} us per call")
