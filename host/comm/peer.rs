//! What every rank tells the others at init: where it runs and how it will launch.

use super::Shape;
use crate::bootstrap::Bootstrap;
use crate::cuda::Device;
use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: u32,
    pub pid: u32,
    pub host_hash: u64,
    pub device: i32,
    pub sim: bool,
    pub bus_id: String,
    pub shape: Shape,
    /// Its captured operations register their buffers for peers in other processes and send
    /// the marks those peers wait for (NCCL_GRAPH_REGISTER, a setting of each process).
    pub graph_register: bool,
}

const BYTES: usize = 4 + 4 + 8 + 4 + 1 + 12 + 16 + 8 + 32 + 4 + 4 + 4 + 4 + 1;

/// Tells hosts apart: the hostname and the boot id (containers on one machine share the boot id
/// but may not share memory, so the hostname counts too).
/// `NCCL_HOSTID`, when set, replaces both (as in NCCL): processes with different values are
/// different nodes, even on one machine.
fn host_hash() -> u64 {
    let mut s = match crate::env::HOSTID.raw().filter(|v| !v.is_empty()) {
        Some(id) => return fnv1a(&format!("hostid:{id}")),
        None => std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
    };
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most len bytes.
    if unsafe { libc::gethostname(name.as_mut_ptr() as *mut libc::c_char, name.len()) } == 0 {
        s.push_str(&String::from_utf8_lossy(&name));
    }
    fnv1a(&s)
}

/// FNV-1a: stable across processes (std's hasher is randomly keyed).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

impl PeerInfo {
    pub fn local(rank: usize, device: &Device, shape: Shape) -> Result<PeerInfo> {
        Ok(PeerInfo {
            rank: rank as u32,
            pid: std::process::id(),
            host_hash: host_hash(),
            device: device.ordinal,
            sim: device.is_sim(),
            bus_id: device.props()?.bus_id,
            shape,
            graph_register: crate::env::GRAPH_REGISTER.int() != 0,
        })
    }

    pub fn same_process(&self, other: &PeerInfo) -> bool {
        self.pid == other.pid && self.host_hash == other.host_hash
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(BYTES);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        v.extend_from_slice(&self.device.to_le_bytes());
        v.push(self.sim as u8);
        v.extend_from_slice(&self.shape.nchannels.to_le_bytes());
        v.extend_from_slice(&self.shape.nthreads.to_le_bytes());
        v.extend_from_slice(&self.shape.slot_bytes.to_le_bytes());
        v.extend_from_slice(&self.shape.algo_mask.to_le_bytes());
        v.extend_from_slice(&self.shape.proto_mask.to_le_bytes());
        v.extend_from_slice(&self.shape.p2p_conns.to_le_bytes());
        v.extend_from_slice(&self.shape.p2p_slot_bytes.to_le_bytes());
        let mut bus = [0u8; 32];
        let b = self.bus_id.as_bytes();
        bus[..b.len().min(32)].copy_from_slice(&b[..b.len().min(32)]);
        v.extend_from_slice(&bus);
        v.extend_from_slice(&self.shape.slice_steps.to_le_bytes());
        v.extend_from_slice(&self.shape.kernel_flags.to_le_bytes());
        v.extend_from_slice(&self.shape.net_nchannels.to_le_bytes());
        v.extend_from_slice(&self.shape.reg_ctas.to_le_bytes());
        v.push(self.graph_register as u8);
        v
    }

    pub fn decode(b: &[u8]) -> Option<PeerInfo> {
        if b.len() != BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let bus = &b[57..89];
        let end = bus.iter().position(|&c| c == 0).unwrap_or(32);
        Some(PeerInfo {
            rank: u32_at(0),
            pid: u32_at(4),
            host_hash: u64::from_le_bytes(b[8..16].try_into().ok()?),
            device: u32_at(16) as i32,
            sim: b[20] != 0,
            shape: Shape {
                nchannels: u32_at(21),
                nthreads: u32_at(25),
                slot_bytes: u32_at(29),
                algo_mask: u64_at(33),
                proto_mask: u64_at(41),
                p2p_conns: u32_at(49),
                p2p_slot_bytes: u32_at(53),
                slice_steps: u32_at(89),
                kernel_flags: u32_at(93),
                net_nchannels: u32_at(97),
                reg_ctas: u32_at(101),
            },
            bus_id: String::from_utf8_lossy(&bus[..end]).into_owned(),
            graph_register: b[105] != 0,
        })
    }

    /// All-gathers every rank's facts and checks they can form one communicator.
    pub fn exchange(bootstrap: &Bootstrap, me: &PeerInfo) -> Result<Vec<PeerInfo>> {
        let all = bootstrap.allgather(&me.encode())?;
        let mut peers = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            let p = PeerInfo::decode(b)
                .filter(|p| p.rank as usize == r)
                .ok_or_else(|| Error::remote(format!("rank {r} sent a malformed peer record")))?;
            p.shape.check_from_peer(r)?;
            peers.push(p);
        }
        // The kernel lab: ranks on this host may share a GPU when asked (in one process they
        // reach each other's memory directly, across processes through CUDA IPC).
        let shared_ok = crate::env::RS_SHARED_GPUS.int() == 1;
        for p in &peers {
            if p.sim != me.sim {
                return Err(Error::invalid_usage(format!(
                    "rank {} uses the {} backend and rank {} the {}: every rank must use the same one",
                    p.rank,
                    if p.sim { "simulator" } else { "cuda" },
                    me.rank,
                    if me.sim { "simulator" } else { "cuda" }
                )));
            }
            if p.rank != me.rank
                && p.host_hash == me.host_hash
                && p.bus_id == me.bus_id
                && (!me.sim || p.pid == me.pid)
                && !shared_ok
            {
                return Err(Error::invalid_usage(format!(
                    "duplicate GPU detected: rank {} and rank {} both on device {} (bus id {})",
                    me.rank, p.rank, me.device, me.bus_id
                )));
            }
        }
        Ok(peers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23, failure 5: rank 0's shape rules every rank, so a record with a huge channel
    /// count made every rank allocate until the process aborted. Such records are refused.
    #[test]
    fn peer_records_out_of_range_are_refused() {
        let good = sample();
        assert!(good.shape.check_from_peer(0).is_ok());
        let mut huge = good.clone();
        huge.shape.nchannels = u32::MAX;
        let back = PeerInfo::decode(&huge.encode()).expect("decodes");
        let e = back.shape.check_from_peer(0).unwrap_err();
        assert!(e.message.contains("nchannels = 4294967295"), "{e}");
        for bad in [
            |s: &mut Shape| s.net_nchannels = 0,
            |s: &mut Shape| s.nthreads = 1 << 20,
            |s: &mut Shape| s.slot_bytes = 1 << 31,
            |s: &mut Shape| s.p2p_conns = 1 << 16,
            |s: &mut Shape| s.p2p_slot_bytes = 100,
            |s: &mut Shape| s.slice_steps = 3,
            |s: &mut Shape| s.kernel_flags = 0x8000_0000,
            |s: &mut Shape| s.reg_ctas = 1 << 20,
        ] {
            let mut p = good.clone();
            bad(&mut p.shape);
            assert!(p.shape.check_from_peer(0).is_err(), "{:?}", p.shape);
        }
    }

    fn sample() -> PeerInfo {
        PeerInfo {
            rank: 3,
            pid: 4242,
            host_hash: 0xdead_beef_1234,
            device: 2,
            sim: true,
            bus_id: "0000:1b:00.0".into(),
            shape: Shape {
                nchannels: 16,
                nthreads: 512,
                slot_bytes: 1 << 19,
                algo_mask: 0x7_0000_0001,
                proto_mask: 0x5555,
                p2p_conns: 3,
                p2p_slot_bytes: 8192,
                slice_steps: 2,
                kernel_flags: 1,
                net_nchannels: 2,
                reg_ctas: 1,
            },
            graph_register: true,
        }
    }

    #[test]
    fn peer_info_round_trips() {
        let p = sample();
        assert_eq!(PeerInfo::decode(&p.encode()), Some(p.clone()));
        assert_eq!(PeerInfo::decode(&p.encode()[1..]), None);
        assert_eq!(host_hash(), host_hash());
    }
}
