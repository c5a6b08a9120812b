//! `ncclCommQueryProperties` (NCCL 2.29): what a communicator offers the program that asks,
//! for the device API above all (nccl4py's `Communicator` properties read it).

use super::Comm;
use crate::error::Result;

/// How kernels reach ranks they cannot map (NCCL's `ncclGinType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum GinType {
    /// No GPU-initiated networking.
    None = 0,
    /// Descriptors a proxy thread carries over the network (NCCL_GIN_TYPE_PROXY).
    Proxy = 2,
}

/// A communicator's properties ([`Comm::properties`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Properties {
    /// This rank.
    pub rank: usize,
    /// The communicator's size.
    pub nranks: usize,
    /// The CUDA device ordinal.
    pub cuda_dev: i32,
    /// The device's NVML index: PCI bus order over every GPU of the host, whatever
    /// `CUDA_VISIBLE_DEVICES` hides (the ordinal on the simulator).
    pub nvml_dev: i32,
    /// Every rank maps every other's windows: device-API kernels have the whole communicator
    /// as their LSA team (else each rank alone, reaching the others through GIN).
    pub device_api: bool,
    /// Symmetric windows get a multicast object (NVLS is on): `multimem_ptr` works.
    pub multimem: bool,
    /// GIN to ranks outside the LSA team: by proxy where the communicator spans nodes.
    pub gin: GinType,
    /// How many LSA teams the communicator splits into.
    pub lsa_teams: usize,
    /// The host's one-sided calls (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`) work.
    pub host_rma: bool,
    /// GIN over rails (one NIC per local rank): not provided.
    pub railed_gin: GinType,
}

impl Comm {
    /// This communicator's properties (`ncclCommQueryProperties`). Local, not collective.
    pub fn properties(&self) -> Result<Properties> {
        self.check_usable()?;
        let maps_all = self.maps_every_rank();
        Ok(Properties {
            rank: self.rank,
            nranks: self.nranks,
            cuda_dev: self.device.ordinal,
            nvml_dev: self.nvml_index()?,
            device_api: maps_all,
            multimem: self.nvls.is_some(),
            gin: match self.net {
                Some(_) => GinType::Proxy,
                None => GinType::None,
            },
            lsa_teams: if maps_all { 1 } else { self.nranks },
            host_rma: true,
            railed_gin: GinType::None,
        })
    }

    /// The device's index in NVML's order: the driver's GPUs sorted by PCI bus id.
    fn nvml_index(&self) -> Result<i32> {
        if self.device.is_sim() {
            return Ok(self.device.ordinal);
        }
        let mine = crate::topo::normalize_busid(&self.device.props()?.bus_id);
        let mut all: Vec<String> = std::fs::read_dir("/proc/driver/nvidia/gpus")
            .map(|d| {
                d.filter_map(|e| Some(crate::topo::normalize_busid(e.ok()?.file_name().to_str()?)))
                    .collect()
            })
            .unwrap_or_default();
        all.sort();
        Ok(all
            .iter()
            .position(|b| *b == mine)
            .map_or(self.device.ordinal, |i| i as i32))
    }
}
