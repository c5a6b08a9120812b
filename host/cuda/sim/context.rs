//! The simulated device itself: current device, properties, memory totals, waiting for all
//! its streams; multicast capability.

use super::*;

impl Context for Device {
    fn make_current(&self) -> Result<()> {
        CURRENT.with(|c| c.set(self.ordinal));
        Ok(())
    }

    fn props(&self) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: "nccl-rs CPU simulator".into(),
            bus_id: format!("0000:{:02x}:00.0", self.ordinal + 1),
            compute_capability: (9, 0),
            sm_count: 4,
        })
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let used: usize = lock(regions())
            .values()
            .filter(|r| r.ordinal == self.ordinal && (r.name.is_some() || r.vmm_fd.is_some()))
            .map(|r| r.bytes)
            .sum();
        let total = 16usize << 30;
        Ok((total.saturating_sub(used), total))
    }

    /// Waits for the legacy stream and every live stream of this device.
    fn synchronize(&self) -> Result<()> {
        let mine: Vec<Arc<Stream>> = lock(registry())
            .streams
            .values()
            .filter(|st| st.ordinal == self.ordinal)
            .cloned()
            .collect();
        let mut first = self.default_stream.sync().err();
        for st in mine {
            if let Err(e) = st.sync() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn multicast_supported(&self) -> Result<bool> {
        Ok(true)
    }

    fn multicast_granularity(&self, _ndev: usize, _bytes: usize) -> Result<usize> {
        Ok(MC_GRANULARITY)
    }
}
