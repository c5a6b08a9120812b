//! The device itself: current context, properties, memory totals, waiting for all its work;
//! multicast capability.

use super::*;

impl Context for Device {
    fn make_current(&self) -> Result<()> {
        let mut cur = std::ptr::null_mut();
        // SAFETY: out-parameter. Reading the current context is cheaper than setting it, and
        // every call of ours makes its context current first.
        if unsafe { sys::cuCtxGetCurrent(&mut cur) } == sys::CUresult::CUDA_SUCCESS
            && cur == self.ctx.0
        {
            return Ok(());
        }
        // SAFETY: the context is retained while self lives.
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx.0) },
            "cuCtxSetCurrent",
        )
    }

    fn props(&self) -> Result<DeviceProps> {
        use sys::CUdevice_attribute::*;
        let mut name = [0 as std::ffi::c_char; 128];
        let mut bus = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffers are as long as the lengths passed.
        unsafe {
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), 128, self.dev),
                "cuDeviceGetName",
            )?;
            check(
                sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, self.dev),
                "cuDeviceGetPCIBusId",
            )?;
        }
        // SAFETY: the driver wrote NUL-terminated strings.
        let cstr = |b: &[std::ffi::c_char]| {
            unsafe { CStr::from_ptr(b.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        let (major, minor) = self.compute_capability()?;
        Ok(DeviceProps {
            name: cstr(&name),
            bus_id: cstr(&bus),
            compute_capability: (major, minor),
            sm_count: self.attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        })
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.make_current()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-parameters; our context is current.
        check(
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    }

    /// Waits for all work of this device's context.
    fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        // SAFETY: our context is current; the call only waits.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED.
    fn multicast_supported(&self) -> Result<bool> {
        Ok(self.attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? != 0)
    }

    /// The granularity of a multicast object of `ndev` devices and `bytes` and of the memory
    /// bound to it: the larger of the multicast and the allocation minimum (both powers of
    /// two). The minimum, not the recommended one, which can be hundreds of MiB.
    fn multicast_granularity(&self, ndev: usize, bytes: usize) -> Result<usize> {
        self.make_current()?;
        let prop = Self::mc_prop(ndev, bytes);
        let mem = self.mc_mem_prop();
        let (mut g, mut a) = (0usize, 0usize);
        // SAFETY: out-parameters and filled property structs.
        unsafe {
            check(
                sys::cuMulticastGetGranularity(
                    &mut g,
                    &prop,
                    sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
                ),
                "cuMulticastGetGranularity",
            )?;
            check(
                sys::cuMemGetAllocationGranularity(
                    &mut a,
                    &mem,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
                "cuMemGetAllocationGranularity",
            )?;
        }
        Ok(g.max(a).max(1))
    }
}
