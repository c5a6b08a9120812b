//! CUDA graph capture and replay of a communicator's work, shared by the simulator and GPU
//! suites. Every rank captures, in one group on its own stream, an AllReduce, an AllGather and
//! a ring of sends and receives; the graphs then run `replays` times with new inputs written
//! between runs, and direct calls on other streams come in between. Only one thread drives
//! all ranks (graphs are captured and launched per rank, as a program would).

use super::Ranks;
use nccl::{DataType, DevBuffer, ReduceOp, StreamHandle};

const COUNT: usize = 1000;

/// Rank `r`'s input at replay `it`: small integers, so float sums are exact.
fn value(it: usize, r: usize, j: usize) -> f32 {
    ((it * 7 + r * 13 + j) % 251) as f32
}

fn write(b: &DevBuffer, v: &[f32]) -> Result<(), String> {
    b.write(0, super::to_bytes(v)).map_err(|e| e.to_string())
}

fn read(b: &DevBuffer, n: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![0u8; n * 4];
    b.read(0, &mut out).map_err(|e| e.to_string())?;
    Ok(super::from_bytes(&out))
}

struct Bufs {
    send: DevBuffer,
    sum: DevBuffer,
    gathered: DevBuffer,
    from_prev: DevBuffer,
}

/// One group per call of `issue` on every rank's stream `streams[i]`.
fn issue(ranks: &Ranks, bufs: &[Bufs], streams: &[StreamHandle]) -> Result<(), String> {
    let n = ranks.comms.len();
    let e = |e: nccl::Error| e.to_string();
    nccl::group_start();
    for (i, c) in ranks.comms.iter().enumerate() {
        let (b, s, r) = (&bufs[i], streams[i], c.rank());
        let f = DataType::Float32;
        unsafe { c.all_reduce_raw(b.send.ptr(), b.sum.ptr(), COUNT, f, ReduceOp::SUM, s) }
            .map_err(e)?;
        unsafe { c.all_gather_raw(b.send.ptr(), b.gathered.ptr(), COUNT, f, s) }.map_err(e)?;
        unsafe { c.send_raw(b.send.ptr(), COUNT, f, (r + 1) % n, s) }.map_err(e)?;
        unsafe { c.recv_raw(b.from_prev.ptr(), COUNT, f, (r + n - 1) % n, s) }.map_err(e)?;
    }
    nccl::group_end().map(|_| ()).map_err(e)
}

/// Writes replay `it`'s inputs (every stream idle).
fn set_inputs(ranks: &Ranks, bufs: &[Bufs], it: usize) -> Result<(), String> {
    for (c, b) in ranks.comms.iter().zip(bufs) {
        let v: Vec<f32> = (0..COUNT).map(|j| value(it, c.rank(), j)).collect();
        write(&b.send, &v)?;
        let poison = vec![f32::NAN; COUNT * ranks.comms.len()];
        write(&b.sum, &poison[..COUNT])?;
        write(&b.gathered, &poison)?;
        write(&b.from_prev, &poison[..COUNT])?;
    }
    Ok(())
}

fn check(ranks: &Ranks, bufs: &[Bufs], it: usize, what: &str) -> Result<(), String> {
    let n = ranks.comms.len();
    for (c, b) in ranks.comms.iter().zip(bufs) {
        let r = c.rank();
        let sum = read(&b.sum, COUNT)?;
        let gathered = read(&b.gathered, COUNT * n)?;
        let from_prev = read(&b.from_prev, COUNT)?;
        for j in 0..COUNT {
            let want: f32 = (0..n).map(|q| value(it, q, j)).sum();
            if sum[j] != want {
                return Err(format!(
                    "{what} {it}: rank {r} AllReduce[{j}] = {} not {want}",
                    sum[j]
                ));
            }
            let p = (r + n - 1) % n;
            if from_prev[j] != value(it, p, j) {
                return Err(format!(
                    "{what} {it}: rank {r} recv[{j}] = {}",
                    from_prev[j]
                ));
            }
            for q in 0..n {
                if gathered[q * COUNT + j] != value(it, q, j) {
                    return Err(format!("{what} {it}: rank {r} AllGather[{q}][{j}] wrong"));
                }
            }
        }
    }
    Ok(())
}

/// What the runtime does to set up a connection, on every rank while its capture is open:
/// allocate (zeroed memory), write and read back. None of it may join the capture.
fn memory_inside_capture(ranks: &Ranks, keep: &mut Vec<DevBuffer>) -> Result<(), String> {
    for c in &ranks.comms {
        let b = c.device().alloc(4096).map_err(|e| e.to_string())?;
        let mut got = vec![0xffu8; 4096];
        b.read(0, &mut got).map_err(|e| e.to_string())?;
        if got.iter().any(|&x| x != 0) {
            return Err(format!("rank {}: a new allocation is not zeroed", c.rank()));
        }
        let want: Vec<u8> = (0..4096).map(|i| (i * 7 + c.rank()) as u8).collect();
        b.write(0, &want).map_err(|e| e.to_string())?;
        b.read(0, &mut got).map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!(
                "rank {}: read back differs from the write",
                c.rank()
            ));
        }
        keep.push(b);
    }
    Ok(())
}

/// When the communicators are first used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstUse {
    /// By direct calls before the capture: kernels loaded, connections made.
    BeforeCapture,
    /// Inside the capture: kernel modules load and send/recv connections are made (memory
    /// allocated, zeroed and written) while it is open, as when a program captures its first
    /// step.
    InsideCapture,
}

/// Captures every rank's work into a graph on `ranks.streams`, and replays it `replays` times
/// with direct calls on other streams in between; then finalizes.
pub fn capture_and_replay(ranks: &Ranks, replays: usize, first: FirstUse) -> Result<(), String> {
    capture_and_replay_with(ranks, replays, first, &|_, _| Ok(()))
}

/// What a test does to the communicators after replay `it` was checked (every stream idle).
pub type Between<'a> = &'a dyn Fn(&Ranks, usize) -> Result<(), String>;

/// [`capture_and_replay`], with `between` run after each replay.
pub fn capture_and_replay_with(
    ranks: &Ranks,
    replays: usize,
    first: FirstUse,
    between: Between<'_>,
) -> Result<(), String> {
    let e = |e: nccl::Error| e.to_string();
    let n = ranks.comms.len();
    let mut bufs = Vec::new();
    let mut others = Vec::new();
    for c in &ranks.comms {
        let d = c.device();
        let alloc = |elems: usize| d.alloc(elems * 4).map_err(e);
        bufs.push(Bufs {
            send: alloc(COUNT)?,
            sum: alloc(COUNT)?,
            gathered: alloc(COUNT * n)?,
            from_prev: alloc(COUNT)?,
        });
        others.push(d.stream_create().map_err(e)?);
    }
    let sync = |streams: &[StreamHandle]| -> Result<(), String> {
        for (c, s) in ranks.comms.iter().zip(streams) {
            c.device().stream_sync(*s).map_err(e)?;
        }
        Ok(())
    };
    if first == FirstUse::BeforeCapture {
        // Direct calls first, on other streams: the communicator's last launch is elsewhere.
        set_inputs(ranks, &bufs, 1000)?;
        issue(ranks, &bufs, &others)?;
        sync(&others)?;
        check(ranks, &bufs, 1000, "direct call before the capture")?;
    }
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        c.device().capture_begin(*s).map_err(e)?;
    }
    // Freed once the captures are over.
    let mut scratch = Vec::new();
    let captured = match first {
        FirstUse::BeforeCapture => Ok(()),
        FirstUse::InsideCapture => memory_inside_capture(ranks, &mut scratch),
    }
    .and_then(|_| issue(ranks, &bufs, &ranks.streams));
    let mut graphs = Vec::new();
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        graphs.push(c.device().capture_end(*s).map_err(e)?);
    }
    captured.map_err(|m| format!("issuing into the capture: {m}"))?;
    drop(scratch);
    for it in 0..replays {
        set_inputs(ranks, &bufs, it)?;
        for (g, s) in graphs.iter().zip(&ranks.streams) {
            g.launch(*s).map_err(e)?;
        }
        sync(&ranks.streams)?;
        check(ranks, &bufs, it, "replay")?;
        between(ranks, it)?;
        if it % 10 == 9 {
            // A direct call between replays, on the other streams.
            set_inputs(ranks, &bufs, it + 5000)?;
            issue(ranks, &bufs, &others)?;
            sync(&others)?;
            check(ranks, &bufs, it + 5000, "direct call between replays")?;
        }
    }
    drop(graphs);
    // Finalize is collective: every rank at once.
    std::thread::scope(|sc| {
        let done: Vec<_> = super::lend(&ranks.comms)
            .into_iter()
            .map(|c| sc.spawn(move || c.finalize()))
            .collect();
        done.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| "finalize panicked".to_string())?
                .map_err(|m| format!("finalize after the replays: {m}"))
        })
    })?;
    for (c, s) in ranks.comms.iter().zip(&others) {
        c.device().stream_destroy(*s).map_err(e)?;
    }
    Ok(())
}

/// Waits for `s` to drain, or fails after `limit` (unordered launches of one communicator
/// would deadlock instead of finishing).
fn drain(d: &nccl::Device, s: StreamHandle, limit: std::time::Duration) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    while !d.stream_query(s).map_err(|e| e.to_string())? {
        if t0.elapsed() > limit {
            return Err(format!("a stream did not drain within {limit:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}

/// Replays and direct calls of the same communicators in flight together, never synchronised
/// in between: graph A (AllReduce a→b) on the capture streams, a direct AllReduce b→c on other
/// streams, then graph B (AllReduce c→d) on the capture streams. Each reads what the one
/// before wrote, so the communicator must order them itself, both ways.
pub fn replays_interleaved_with_direct_calls(ranks: &Ranks, rounds: usize) -> Result<(), String> {
    let e = |e: nccl::Error| e.to_string();
    let n = ranks.comms.len();
    let f = DataType::Float32;
    let mut bufs = Vec::new();
    let mut others = Vec::new();
    for c in &ranks.comms {
        let d = c.device();
        let b: Vec<DevBuffer> = (0..4)
            .map(|_| d.alloc(COUNT * 4))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        bufs.push(b);
        others.push(d.stream_create().map_err(e)?);
    }
    let all_reduce = |from: usize, to: usize, streams: &[StreamHandle]| -> Result<(), String> {
        nccl::group_start();
        for (i, c) in ranks.comms.iter().enumerate() {
            let (b, s) = (&bufs[i], streams[i]);
            unsafe { c.all_reduce_raw(b[from].ptr(), b[to].ptr(), COUNT, f, ReduceOp::SUM, s) }
                .map_err(e)?;
        }
        nccl::group_end().map(|_| ()).map_err(e)
    };
    // Kernels loaded and connections made outside any capture.
    all_reduce(0, 1, &others)?;
    let mut graphs = Vec::new();
    for (from, to) in [(0, 1), (2, 3)] {
        for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
            c.device().capture_begin(*s).map_err(e)?;
        }
        let captured = all_reduce(from, to, &ranks.streams);
        let mut g = Vec::new();
        for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
            g.push(c.device().capture_end(*s).map_err(e)?);
        }
        captured.map_err(|m| format!("issuing into the capture: {m}"))?;
        graphs.push(g);
    }
    let limit = std::time::Duration::from_secs(120);
    for it in 0..rounds {
        for (c, b) in ranks.comms.iter().zip(&bufs) {
            let v: Vec<f32> = (0..COUNT).map(|j| value(it, c.rank(), j)).collect();
            write(&b[0], &v)?;
            for x in &b[1..] {
                write(x, &vec![f32::NAN; COUNT])?;
            }
        }
        for (g, s) in graphs[0].iter().zip(&ranks.streams) {
            g.launch(*s).map_err(e)?;
        }
        all_reduce(1, 2, &others)?;
        for (g, s) in graphs[1].iter().zip(&ranks.streams) {
            g.launch(*s).map_err(e)?;
        }
        for (i, c) in ranks.comms.iter().enumerate() {
            drain(c.device(), ranks.streams[i], limit)?;
            drain(c.device(), others[i], limit)?;
        }
        for (c, b) in ranks.comms.iter().zip(&bufs) {
            let got: Vec<Vec<f32>> = b[1..]
                .iter()
                .map(|x| read(x, COUNT))
                .collect::<Result<_, _>>()?;
            let stages = ["replay A", "direct call after it", "replay B after that"];
            for (k, (what, got)) in stages.iter().zip(&got).enumerate() {
                for (j, &g) in got.iter().enumerate() {
                    let sum: f32 = (0..n).map(|q| value(it, q, j)).sum();
                    let want = sum * (n as f32).powi(k as i32);
                    if g != want {
                        return Err(format!(
                            "round {it}: rank {} {what}: [{j}] = {g} not {want}",
                            c.rank()
                        ));
                    }
                }
            }
        }
    }
    drop(graphs);
    for (c, s) in ranks.comms.iter().zip(&others) {
        c.device().stream_destroy(*s).map_err(e)?;
    }
    Ok(())
}
