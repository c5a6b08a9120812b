//! The kernels: a module per kernel from the embedded SASS or PTX, and launches.

use super::*;

impl Kernels for Device {
    /// The kernel `name`; its module (every kernel has its own) is loaded on first use and
    /// kept: the build's SASS for this device where it has some, else the PTX, JIT-compiled
    /// by the driver.
    fn function(&self, name: &str) -> Result<usize> {
        if let Some(f) = self
            .functions
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .get(name)
        {
            return Ok(f.0 as usize);
        }
        self.make_current()?;
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| Error::internal("module cache poisoned"))?;
            match modules.get(name) {
                Some(m) => m.0,
                None => {
                    let t0 = Instant::now();
                    // A kernel's first use may come inside a capture.
                    let _relaxed = RelaxedCapture::enter();
                    let (m, code) = match crate::cuda::ptx::sass(self.sm, name) {
                        Some(cubin) => match self.load_module(&cubin, check_quiet) {
                            Ok(m) => (m, "SASS"),
                            Err(e) => {
                                log::info!("cuda: the SASS of {name} did not load ({e}); JIT-compiling its PTX");
                                (self.load_ptx(name)?, "PTX, JIT-compiled")
                            }
                        },
                        None => (self.load_ptx(name)?, "PTX, JIT-compiled"),
                    };
                    log::info!(
                        "cuda: loaded kernel module {name} ({code}) on device {} in {:.1} ms",
                        self.ordinal,
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                    modules.insert(name.to_string(), Raw(m));
                    m
                }
            }
        };
        // Loaded now, not at its first launch (`preload` says why).
        let f = self.entry(module, name)?;
        self.functions
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .insert(name.to_string(), Raw(f));
        Ok(f as usize)
    }

    fn preload(&self, names: &[&str], jit: &dyn Fn(&str) -> bool) -> Result<usize> {
        let mut done = self
            .preloaded
            .lock()
            .map_err(|_| Error::internal("kernel preload poisoned"))?;
        if *done {
            return Ok(0);
        }
        let t0 = Instant::now();
        let mut loaded = 0;
        for &name in names {
            if jit(name) || crate::cuda::ptx::has_sass(self.sm, name) {
                self.function(name)?;
                loaded += 1;
            }
        }
        let (have, need) = self.reserve_stack()?;
        log::info!(
            "cuda: preloaded {loaded} of {} kernels on device {} in {:.1} ms (stack {} bytes, \
             kernels need {need})",
            names.len(),
            self.ordinal,
            t0.elapsed().as_secs_f64() * 1e3,
            have
        );
        *done = true;
        Ok(loaded)
    }

    /// Launches `func` with one by-value parameter `arg` of `arg_bytes` bytes.
    fn launch(
        &self,
        func: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
        _arg_bytes: usize,
    ) -> Result<()> {
        self.make_current()?;
        let mut params = [arg as *mut c_void];
        // SAFETY: func is a kernel of this context taking one parameter, which `arg` points at.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    func as sys::CUfunction,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.0 as sys::CUstream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

impl Device {
    /// Reserves the local memory the largest kernel loaded so far needs: a launch that needs
    /// more than the context holds makes CUDA grow it, which waits for the context's running
    /// kernels (waits on peers included). Returns (stack bytes now, bytes needed).
    fn reserve_stack(&self) -> Result<(usize, usize)> {
        let need = self.local_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let mut have = 0;
        self.make_current()?;
        // SAFETY: out-parameter; the context is current.
        check(
            unsafe { sys::cuCtxGetLimit(&mut have, sys::CUlimit::CU_LIMIT_STACK_SIZE) },
            "cuCtxGetLimit(stack)",
        )?;
        if need > have {
            // SAFETY: a limit of the current context.
            check(
                unsafe { sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_STACK_SIZE, need) },
                "cuCtxSetLimit(stack)",
            )?;
        }
        Ok((have.max(need), need))
    }

    /// Loads a user's PTX module (the device API's `Module`), JIT-compiled by the driver with
    /// its default limits, and every entry point of it now rather than at its first launch.
    pub fn load_user_module(&self, ptx: &str) -> Result<UserModule> {
        self.make_current()?;
        let t0 = Instant::now();
        let _relaxed = RelaxedCapture::enter();
        let text = std::ffi::CString::new(ptx)
            .map_err(|_| Error::invalid_argument("Module::load: the PTX holds a NUL byte"))?;
        let mut m = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text alive for the call; no options.
        check(
            unsafe {
                sys::cuModuleLoadDataEx(
                    &mut m,
                    text.as_ptr() as *const c_void,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "cuModuleLoadDataEx (a user kernel module)",
        )?;
        let mut module = UserModule {
            module: Raw(m),
            functions: Default::default(),
        };
        let loaded = (|| {
            for (name, bytes) in crate::cuda::module::entries(ptx) {
                let f = self.entry(m, name)?;
                module
                    .functions
                    .insert(name.to_string(), (f as usize, bytes));
            }
            self.reserve_stack()
        })();
        if let Err(e) = loaded {
            // SAFETY: the module just loaded, never launched.
            unsafe { sys::cuModuleUnload(m) };
            return Err(e);
        }
        log::info!(
            "cuda: loaded a user kernel module ({} kernels) on device {} in {:.1} ms",
            module.functions.len(),
            self.ordinal,
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(module)
    }

    /// Unloads a user module; its kernels must have finished.
    pub fn unload_user_module(&self, m: UserModule) -> Result<()> {
        self.make_current()?;
        // SAFETY: a module this context loaded, no longer used.
        check(unsafe { sys::cuModuleUnload(m.module.0) }, "cuModuleUnload")
    }

    /// Launches a user kernel with its one parameter at `arg`.
    pub fn launch_user(
        &self,
        f: usize,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        arg: *const u8,
    ) -> Result<()> {
        self.launch(f, grid, block, stream, arg, 0)
    }

    /// Entry point `name` of a loaded module, loaded now (asking an attribute loads a
    /// function where CUDA's lazy loading would at its first launch, which may wait for the
    /// context's running kernels), its local memory counted for [`Device::reserve_stack`].
    fn entry(&self, module: sys::CUmodule, name: &str) -> Result<sys::CUfunction> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| Error::internal("kernel name holds a NUL byte"))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: out-parameter; module is loaded.
        check(
            unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) },
            &format!("cuModuleGetFunction({name})"),
        )?;
        let mut local = 0;
        // SAFETY: out-parameter; f is a function of a loaded module.
        check(
            unsafe {
                sys::cuFuncGetAttribute(
                    &mut local,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                    f,
                )
            },
            &format!("cuFuncGetAttribute({name})"),
        )?;
        self.local_bytes
            .fetch_max(local.max(0) as usize, std::sync::atomic::Ordering::Relaxed);
        Ok(f)
    }

    /// The module of kernel `name` cut from this device's PTX, JIT-compiled.
    fn load_ptx(&self, name: &str) -> Result<sys::CUmodule> {
        let Some(ptx) = crate::cuda::ptx::for_arch(self.sm) else {
            crate::cuda::ptx::check_built_for(self.sm)?;
            // SASS is compiled from the PTX the build embeds, so this cannot be.
            return Err(Error::internal(format!(
                "kernel {name}: SASS for sm_{} but no PTX",
                self.sm
            )));
        };
        let text = crate::cuda::ptx::family(ptx, name);
        let c =
            std::ffi::CString::new(text).map_err(|_| Error::internal("PTX holds a NUL byte"))?;
        self.load_module(c.as_bytes_with_nul(), check)
    }

    /// Loads a module image: a cubin, or NUL-terminated PTX (JIT-compiled); `check` judges
    /// the result (quiet where a failure only declines the SASS, for the PTX to follow).
    fn load_module(
        &self,
        image: &[u8],
        check: fn(sys::CUresult, &str) -> Result<()>,
    ) -> Result<sys::CUmodule> {
        let mut m = std::ptr::null_mut();
        // Every launch of up to MAX_THREADS threads must fit the register file: the JIT's
        // limit is the one the build gave ptxas for the SASS (a test checks it is
        // 65536 / MAX_THREADS).
        let mut opts = [sys::CUjit_option::CU_JIT_MAX_REGISTERS];
        let mut vals = [crate::ptx::SASS_MAX_REGISTERS as usize as *mut c_void];
        // SAFETY: image is a whole cubin or NUL-terminated PTX text, alive for the call; one
        // option with its value.
        check(
            unsafe {
                sys::cuModuleLoadDataEx(
                    &mut m,
                    image.as_ptr() as *const c_void,
                    1,
                    opts.as_mut_ptr(),
                    vals.as_mut_ptr(),
                )
            },
            "cuModuleLoadDataEx",
        )?;
        Ok(m)
    }
}

/// A user's kernel module loaded on a GPU, and its entry points.
pub struct UserModule {
    module: Raw<sys::CUmodule>,
    functions: crate::cuda::module::Functions,
}

impl UserModule {
    /// The entry point `name` for an argument of `arg_bytes`, or why there is none.
    pub fn function(&self, name: &str, arg_bytes: usize) -> Result<usize> {
        let Some(&(f, bytes)) = self.functions.get(name) else {
            let mut held: Vec<&str> = self.functions.keys().map(String::as_str).collect();
            held.sort_unstable();
            return Err(Error::invalid_usage(format!(
                "Module::launch: kernel {name} is not in this module (it holds {held:?}): \
                 launch a kernel of the crate the PTX was built from"
            )));
        };
        match bytes {
            Some(b) if b != arg_bytes => Err(Error::invalid_usage(format!(
                "Module::launch: kernel {name} takes {b} bytes of argument in its PTX, the \
                 launch passes {arg_bytes}: is the PTX older than the argument's type? (rebuild \
                 the kernel crate; the type must be #[repr(C)])"
            ))),
            _ => Ok(f),
        }
    }
}
