//! The kernel table (every entry the device crate built for the host) and launches: a thread
//! per simulated GPU thread.

use super::*;

impl Kernels for Device {
    fn function(&self, name: &str) -> Result<usize> {
        kernel_table()
            .1
            .get(name)
            .copied()
            .ok_or_else(|| Error::internal(format!("the simulator has no kernel {name}")))
    }

    /// The simulator's kernels are functions of this program: nothing to load.
    fn preload(&self, _names: &[&str], _jit: &dyn Fn(&str) -> bool) -> Result<usize> {
        Ok(0)
    }

    fn launch(
        &self,
        func: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
        size: usize,
    ) -> Result<()> {
        let entry = *kernel_table()
            .0
            .get(func)
            .ok_or_else(|| Error::internal("bad simulator kernel handle"))?;
        // The parameter is copied now (as cuLaunchKernel does); its size must be the kernel's.
        let body: Box<dyn Fn() + Send + Sync> = match entry {
            Entry::Coll(f) if size == std::mem::size_of::<CollArgs>() => {
                // SAFETY: the caller passes a parameter of the kernel's type (checked by size).
                let a: CollArgs = unsafe { std::ptr::read_unaligned(arg as *const CollArgs) };
                COLL_FLAGS.fetch_or(a.flags, Ordering::Relaxed);
                if a.algo == nccl_device::abi::ALGO_NVLS {
                    NVLS_LAUNCHES.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: the host wired `a` to live buffers and a communicator, as on a GPU.
                Box::new(move || unsafe { f(&a) })
            }
            Entry::P2p(f) if size == std::mem::size_of::<P2pArgs>() => {
                // SAFETY: as above.
                let a: P2pArgs = unsafe { std::ptr::read_unaligned(arg as *const P2pArgs) };
                P2P_FLAGS.fetch_or(a.flags, Ordering::Relaxed);
                // SAFETY: as above.
                Box::new(move || unsafe { f(&a) })
            }
            Entry::Wait(f) if size == std::mem::size_of::<nccl_device::abi::WaitArgs>() => {
                // SAFETY: as above.
                let a =
                    unsafe { std::ptr::read_unaligned(arg as *const nccl_device::abi::WaitArgs) };
                // SAFETY: the host names live words and the abort flag, as on a GPU.
                Box::new(move || unsafe { f(&a) })
            }
            _ => {
                return Err(Error::internal(
                    "simulated kernel launched with a parameter of the wrong size",
                ))
            }
        };
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
        self.launch_body(grid, block, stream, Arc::from(body))
    }
}

impl Device {
    /// Queues `body` on `stream` as a grid of `grid` CTAs of `block` threads, each a host
    /// thread running it (the built-in kernels' launches, and user kernels of the device API).
    pub(crate) fn launch_body(
        &self,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        body: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<()> {
        let s = self.stream(stream)?;
        s.push_replayable(Arc::new(move || {
            let body = body.clone();
            Box::new(move || {
                let body = &*body;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    std::thread::scope(|sc| {
                        let ctas: Vec<_> = (0..grid)
                            .map(|b| {
                                sc.spawn(move || {
                                    nccl_device::arch::sim::run_cta(b, grid, block, body)
                                })
                            })
                            .collect();
                        // Joined here, so a CTA's panic reaches the stream with its message.
                        for cta in ctas {
                            if let Err(p) = cta.join() {
                                std::panic::resume_unwind(p);
                            }
                        }
                    })
                }));
                r.map_err(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "kernel panicked".into())
                })
            })
        }));
        Ok(())
    }
}
