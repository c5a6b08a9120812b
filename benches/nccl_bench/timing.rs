//! Timing: warm-up, an event per iteration boundary on every GPU's stream, a call's time as the
//! timed loop's length / iterations on the slowest GPU (nccl-tests' time; `--stat median`: the
//! median of the iterations, each the slowest GPU's); the rendezvous of the per-GPU threads.

use crate::args::{Mode, Stat};
use crate::collective::Call;
use crate::data::CheckData;
use crate::output::Measure;
use crate::ranks::{Bench, Lib, Rank};
use crate::Settings;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a per-GPU thread says when it stops because another one failed.
const ECHO: &str = "another GPU's thread failed";

/// With NCCL_RS_BENCH_HOST_TIME set, says on stderr how long the host took to issue one
/// timed iteration (the launch and an event record): when it exceeds the GPU's time per
/// iteration, the table measures the host. `rank` usize::MAX: one thread issuing every rank.
fn report_host_time(lib: Lib, rank: usize, call: &Call, t0: Instant, iters: usize) {
    let elapsed = t0.elapsed(); // before the environment lookup below
    if std::env::var_os("NCCL_RS_BENCH_HOST_TIME").is_none() || iters == 0 {
        return;
    }
    let us = elapsed.as_secs_f64() * 1e6 / iters as f64;
    let who = match rank {
        usize::MAX => "all ranks".to_string(),
        r => format!("rank {r}"),
    };
    eprintln!(
        "# host issue {lib:?} {} {} B {who}: {us:.2} us per iteration",
        call.coll.name(),
        call.counts.size_bytes
    );
}

/// A barrier for the per-GPU threads that gives up when one of them fails.
struct Rendezvous {
    n: usize,
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
}

impl Rendezvous {
    fn new(n: usize) -> Rendezvous {
        Rendezvous {
            n,
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
        }
    }
    fn wait(&self) -> Result<(), String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.2 {
            return Err(ECHO.into());
        }
        let gen = s.1;
        s.0 += 1;
        if s.0 == self.n {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.1 == gen && !s.2 {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.1 == gen {
            return Err(ECHO.into());
        }
        Ok(())
    }
    fn fail(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2 = true;
        self.cv.notify_all();
    }
    fn failed(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2
    }
}

impl Bench {
    /// `warmup` untimed calls, then `iters` timed ones: each GPU of this process's timed
    /// iterations, in ms. Every stream is idle on return.
    pub fn run(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        match self.mode {
            Mode::Thread => self.run_one_thread(lib, call, warmup, iters),
            Mode::Threads => self.run_threads(lib, call, warmup, iters),
        }
    }

    /// `-G n`: captures `n` iterations in a graph per GPU (one thread issuing, as without
    /// graphs), replays it `warmup` times untimed and `iters` times timed; each GPU's replay
    /// times / `n`, in ms.
    pub fn run_graph(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
        n: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let e = |what: &str, r: &Rank, err: nccl::Error| {
            format!("{what} on device {}: {err}", r.comm.cu_device())
        };
        for r in &self.ranks {
            let d = r.comm.device();
            d.capture_begin(r.stream.handle())
                .map_err(|x| e("begin capture", r, x))?;
        }
        let issued = (0..n).try_for_each(|_| self.launch_all(lib, call));
        // Every capture ends, whatever happened inside it.
        let ended: Vec<_> = self
            .ranks
            .iter()
            .map(|r| {
                r.comm
                    .device()
                    .capture_end(r.stream.handle())
                    .map_err(|x| e("end capture", r, x))
            })
            .collect();
        issued.map_err(|m| format!("capturing {n} iterations: {m}"))?;
        let graphs = ended.into_iter().collect::<Result<Vec<_>, String>>()?;
        let replay = || -> Result<(), String> {
            for (g, r) in graphs.iter().zip(&self.ranks) {
                g.launch(r.stream.handle())
                    .map_err(|x| e("graph launch", r, x))?;
            }
            Ok(())
        };
        for _ in 0..warmup {
            replay()?;
        }
        for r in &self.ranks {
            r.stream.synchronize().map_err(|x| e("stream sync", r, x))?;
            r.events[0]
                .record(&r.stream)
                .map_err(|x| e("event record", r, x))?;
        }
        for i in 0..iters {
            replay()?;
            for r in &self.ranks {
                r.events[i + 1]
                    .record(&r.stream)
                    .map_err(|x| e("event record", r, x))?;
            }
        }
        let mut per_rank = Vec::with_capacity(self.ranks.len());
        for r in &self.ranks {
            r.events[iters]
                .synchronize()
                .map_err(|x| e("event sync", r, x))?;
            let times = (0..iters)
                .map(|i| {
                    r.events[i]
                        .elapsed_ms(&r.events[i + 1])
                        .map(|ms| f64::from(ms) / n as f64)
                        .map_err(|x| e("event elapsed time", r, x))
                })
                .collect::<Result<Vec<f64>, String>>()?;
            per_rank.push(times);
        }
        drop(graphs);
        Ok(per_rank)
    }

    fn run_one_thread(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let e = |what: &str, r: &Rank, err: nccl::Error| {
            format!("{what} on device {}: {err}", r.comm.cu_device())
        };
        for _ in 0..warmup {
            self.launch_all(lib, call)?;
        }
        for r in &self.ranks {
            r.stream.synchronize().map_err(|x| e("stream sync", r, x))?;
        }
        if iters == 0 {
            return Ok(vec![Vec::new(); self.ranks.len()]);
        }
        for r in &self.ranks {
            r.events[0]
                .record(&r.stream)
                .map_err(|x| e("event record", r, x))?;
        }
        let t0 = Instant::now();
        for i in 0..iters {
            self.launch_all(lib, call)?;
            for r in &self.ranks {
                r.events[i + 1]
                    .record(&r.stream)
                    .map_err(|x| e("event record", r, x))?;
            }
        }
        report_host_time(lib, usize::MAX, call, t0, iters);
        self.ranks
            .iter()
            .map(|r| {
                r.events[iters]
                    .synchronize()
                    .map_err(|x| e("event sync", r, x))?;
                (0..iters)
                    .map(|i| {
                        r.events[i]
                            .elapsed_ms(&r.events[i + 1])
                            .map(f64::from)
                            .map_err(|x| e("event elapsed time", r, x))
                    })
                    .collect()
            })
            .collect()
    }

    fn run_threads(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let rv = Rendezvous::new(self.ranks.len());
        let body = |ri: usize| -> Result<Vec<f64>, String> {
            let r = &self.ranks[ri];
            let d = r.comm.device();
            let e = |what: &str, err: nccl::Error| {
                format!("{what} on device {}: {err}", r.comm.cu_device())
            };
            // Waits for the stream to drain, giving up if another thread failed.
            let idle = || -> Result<(), String> {
                loop {
                    if r.stream.is_idle().map_err(|x| e("stream query", x))? {
                        return Ok(());
                    }
                    if rv.failed() {
                        return Err(ECHO.into());
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            };
            d.make_current().map_err(|x| e("make current", x))?;
            for _ in 0..warmup {
                self.launch_one(lib, ri, call)?;
            }
            idle()?;
            rv.wait()?;
            if iters == 0 {
                return Ok(Vec::new());
            }
            r.events[0]
                .record(&r.stream)
                .map_err(|x| e("event record", x))?;
            let t0 = Instant::now();
            for i in 0..iters {
                self.launch_one(lib, ri, call)?;
                r.events[i + 1]
                    .record(&r.stream)
                    .map_err(|x| e("event record", x))?;
            }
            report_host_time(lib, ri, call, t0, iters);
            idle()?;
            (0..iters)
                .map(|i| {
                    r.events[i]
                        .elapsed_ms(&r.events[i + 1])
                        .map(f64::from)
                        .map_err(|x| e("event elapsed time", x))
                })
                .collect()
        };
        let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.ranks.len())
                .map(|ri| {
                    let (body, rv) = (&body, &rv);
                    s.spawn(move || {
                        let res = body(ri);
                        if res.is_err() {
                            rv.fail();
                        }
                        res
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a GPU thread panicked".into()))
                })
                .collect()
        });
        // Report the failure itself rather than the other threads giving up because of it.
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        if let Some(first) = errors
            .iter()
            .find(|m| !m.starts_with(ECHO))
            .or(errors.first())
        {
            return Err(first.to_string());
        }
        Ok(results.into_iter().flatten().collect())
    }
}

impl Bench {
    /// The time of one call, in ms, from every GPU's timed iterations (`per_rank`, this
    /// process's) and the other processes' ([`Bench::agree`]).
    fn statistic(&self, per_rank: &[Vec<f64>], stat: Stat) -> Result<f64, String> {
        match stat {
            Stat::Mean => {
                // nccl-tests' time: the timed loop's length / iterations, the slowest GPU's.
                let mut t = [per_rank
                    .iter()
                    .map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64)
                    .fold(0.0, f64::max)];
                self.agree(&mut t, nccl::ReduceOp::MAX)?;
                Ok(t[0])
            }
            Stat::Median => {
                let iters = per_rank.iter().map(Vec::len).min().unwrap_or(0);
                let mut longest: Vec<f64> = (0..iters)
                    .map(|i| per_rank.iter().map(|t| t[i]).fold(0.0, f64::max))
                    .collect();
                self.agree(&mut longest, nccl::ReduceOp::MAX)?;
                Ok(median(&mut longest))
            }
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The check (when asked), the warm-up and the timed iterations of one call on one library.
pub fn measure(
    b: &mut Bench,
    lib: Lib,
    call: &Call,
    data: Option<&CheckData>,
    s: &Settings,
    nranks: usize,
) -> Result<Measure, String> {
    let wrong = match data {
        Some(d) => {
            let mut w = [b.check(lib, call, d)? as f64];
            b.agree(&mut w, nccl::ReduceOp::SUM)?;
            Some(w[0] as usize)
        }
        None => None,
    };
    let per_rank = match s.graph {
        0 => b.run(lib, call, s.warmup, s.iters)?,
        n => b.run_graph(lib, call, s.warmup, s.iters, n)?,
    };
    let time_us = b.statistic(&per_rank, s.stat)? * 1e3;
    let algbw = if time_us > 0.0 {
        call.counts.size_bytes as f64 / 1e3 / time_us
    } else {
        0.0
    };
    Ok(Measure {
        time_us,
        algbw,
        busbw: algbw * call.coll.bus_factor(nranks),
        wrong,
        nccl: None,
    })
}
