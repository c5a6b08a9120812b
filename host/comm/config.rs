//! `ncclConfig_t` in Rust: what a user may ask of a communicator at creation, and the values
//! it ends up with (config field, else the NCCL_* parameter, else NCCL's default).

use crate::error::{Error, Result};
use nccl_device::abi::MAX_CHANNELS;

/// `NCCL_SPLIT_NOCOLOR`: a rank that splits with this color joins no child communicator.
pub const SPLIT_NOCOLOR: i32 = -1;

/// Communicator options, as `ncclConfig_t`; `None` is `NCCL_CONFIG_UNDEF_*` (the parameter or
/// default applies; a split child inherits its parent's value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// false: creation (and finalize) return at once and complete in the background
    /// (`ncclInProgress`); poll with `get_async_error`. Parameter NCCL_COMM_BLOCKING.
    pub blocking: Option<bool>,
    /// CTA cluster size, 0 to 8 (NCCL_CGA_CLUSTER_SIZE).
    pub cga_cluster_size: Option<i32>,
    /// Fewest CTAs (channels) a collective uses (NCCL_MIN_CTAS).
    pub min_ctas: Option<i32>,
    /// Most CTAs (channels) a collective uses (NCCL_MAX_CTAS).
    pub max_ctas: Option<i32>,
    /// The network to use (NCCL_NET); recorded, only the built-in transports exist.
    pub net_name: Option<String>,
    /// Split children share the parent's resources (NCCL_COMM_SPLIT_SHARE_RESOURCES); recorded,
    /// children always own theirs here.
    pub split_share: Option<bool>,
    /// Network traffic class; recorded.
    pub traffic_class: Option<i32>,
    /// A name shown in logs.
    pub comm_name: Option<String>,
    /// CollNet on or off; recorded (no CollNet here).
    pub collnet_enable: Option<bool>,
    /// `CTAPolicy` (NCCL 2.27/2.28, NCCL_CTA_POLICY): [`CTA_POLICY_DEFAULT`],
    /// [`CTA_POLICY_EFFICIENCY`] (recorded) or [`CTA_POLICY_ZERO`]: AllGather, AlltoAll, Gather
    /// and Scatter on symmetric windows run on the copy engines, with no kernel.
    pub cta_policy: Option<i32>,
    /// `shrinkShare` (NCCL 2.27): a shrunk child shares its parent's resources; recorded,
    /// children always own theirs here.
    pub shrink_share: Option<bool>,
    /// `nvlsCTAs` (NCCL 2.27): CTAs of NVLS collectives, 1 to the build's channels.
    pub nvls_ctas: Option<i32>,
    /// `nChannelsPerNetPeer` (NCCL 2.28, NCCL_NCHANNELS_PER_NET_PEER): channels per remote
    /// peer of point-to-point calls, 1 to 64; recorded.
    pub n_channels_per_net_peer: Option<i32>,
    /// `nvlinkCentricSched` (NCCL 2.28, NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE): a launch
    /// attribute of GPUs of compute capability 10 and newer; recorded.
    pub nvlink_centric_sched: Option<bool>,
    /// `graphUsageMode` (NCCL 2.29, NCCL_GRAPH_MIXING_SUPPORT): 0 no CUDA graphs, 1 one graph,
    /// 2 graphs mixed with each other and with eager calls. Every mode gets mode 2's ordering
    /// here (the strongest), so each is honoured; mode 0 does not refuse a capture.
    pub graph_usage_mode: Option<i32>,
    /// `numRmaCtx` (NCCL 2.29, NCCL_NUM_RMA_CTX): contexts of one-sided operations, at least 1.
    pub num_rma_ctx: Option<i32>,
    /// nccl-rs's own (NCCL_RS_DETERMINISTIC): floating-point AllReduce, ReduceScatter and
    /// Reduce give the same bits whatever the algorithm, protocol, channels, node layout or
    /// cut of the call (`docs/architecture.md`, "Deterministic reductions"). Every rank of
    /// the communicator must ask alike.
    pub deterministic: Option<bool>,
    /// nccl-rs's own (NCCL_RS_DETERMINISTIC_SCRATCH): bytes of device memory the
    /// deterministic mode stages a piece of a call in, at least 4096.
    pub deterministic_scratch: Option<usize>,
}

/// The least staging memory of the deterministic mode ([`Config::deterministic_scratch`]).
pub const MIN_DETERMINISTIC_SCRATCH: usize = 4096;

/// `NCCL_CTA_POLICY_DEFAULT`.
pub const CTA_POLICY_DEFAULT: i32 = 0;
/// `NCCL_CTA_POLICY_EFFICIENCY`.
pub const CTA_POLICY_EFFICIENCY: i32 = 1;
/// `NCCL_CTA_POLICY_ZERO` (NCCL 2.28).
pub const CTA_POLICY_ZERO: i32 = 2;

/// The options a communicator runs with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// Whether creation and finalize wait (NCCL_COMM_BLOCKING).
    pub blocking: bool,
    /// CTAs per cluster on GPUs that have clusters (NCCL_CGA_CLUSTER_SIZE).
    pub cga_cluster_size: i32,
    /// Fewest channels (CTAs) per collective (NCCL_MIN_CTAS).
    pub min_ctas: u32,
    /// Most channels (CTAs) per collective (NCCL_MAX_CTAS).
    pub max_ctas: u32,
    /// The network to use, by name (NCCL_NET).
    pub net_name: Option<String>,
    /// Whether split children share the parent's resources (NCCL_COMM_SPLIT_SHARE_RESOURCES).
    pub split_share: bool,
    /// The network traffic class (NCCL_IB_TC), when set.
    pub traffic_class: Option<i32>,
    /// A name shown in logs.
    pub comm_name: Option<String>,
    /// CollNet on or off (recorded; there is no CollNet here).
    pub collnet_enable: bool,
    /// `CTAPolicy` (NCCL_CTA_POLICY).
    pub cta_policy: i32,
    /// `shrinkShare` (recorded).
    pub shrink_share: bool,
    /// `nvlsCTAs`, when set.
    pub nvls_ctas: Option<u32>,
    /// `nChannelsPerNetPeer`, when set (recorded).
    pub n_channels_per_net_peer: Option<u32>,
    /// `nvlinkCentricSched` (recorded).
    pub nvlink_centric_sched: bool,
    /// `graphUsageMode`: 0, 1 or 2.
    pub graph_usage_mode: u32,
    /// `numRmaCtx` (recorded above 1: one-sided operations take context 0 only).
    pub num_rma_ctx: u32,
    /// Deterministic reductions: the staging bytes of each piece, or None when off.
    pub deterministic: Option<usize>,
}

fn env_bool(p: crate::env::Param) -> bool {
    p.int() != 0
}

impl Config {
    /// A blocking or non-blocking config, everything else unset.
    pub fn blocking(blocking: bool) -> Config {
        Config {
            blocking: Some(blocking),
            ..Config::default()
        }
    }

    /// The values a new communicator uses: each field, else `inherit`'s (a split's parent),
    /// else the parameter table. Out-of-range values are errors, as in NCCL; a maximum above
    /// what this build supports is lowered with a warning, a minimum above the maximum too.
    pub fn resolve(&self, inherit: Option<&ResolvedConfig>) -> Result<ResolvedConfig> {
        let env = |p: crate::env::Param| p.int();
        let blocking = self
            .blocking
            .or(inherit.map(|p| p.blocking))
            .unwrap_or_else(|| env_bool(crate::env::COMM_BLOCKING));
        let cga = self
            .cga_cluster_size
            .or(inherit.map(|p| p.cga_cluster_size))
            .unwrap_or_else(|| env(crate::env::CGA_CLUSTER_SIZE).clamp(0, 8) as i32);
        if !(0..=8).contains(&cga) {
            return Err(Error::invalid_argument(format!(
                "cgaClusterSize {cga} is out of range (0 to 8)"
            )));
        }
        let most = MAX_CHANNELS as i64;
        let min = self
            .min_ctas
            .map(i64::from)
            .or(inherit.map(|p| p.min_ctas as i64))
            .unwrap_or_else(|| env(crate::env::MIN_CTAS));
        let max = self
            .max_ctas
            .map(i64::from)
            .or(inherit.map(|p| p.max_ctas as i64))
            .unwrap_or_else(|| env(crate::env::MAX_CTAS));
        if min < 1 {
            return Err(Error::invalid_argument(format!(
                "minCTAs {min} is out of range (at least 1)"
            )));
        }
        if max < 1 {
            return Err(Error::invalid_argument(format!(
                "maxCTAs {max} is out of range (at least 1)"
            )));
        }
        let max = if max > most {
            log::warn!("maxCTAs {max} is above the {most} channels of this build; using {most}");
            most
        } else {
            max
        };
        let min = if min > max {
            log::warn!("minCTAs {min} is above maxCTAs {max}; using {max}");
            max
        } else {
            min
        };
        let net_name = self
            .net_name
            .clone()
            .or_else(|| inherit.and_then(|p| p.net_name.clone()))
            .or_else(|| crate::env::NET.raw());
        let split_share = self
            .split_share
            .or(inherit.map(|p| p.split_share))
            .unwrap_or_else(|| env_bool(crate::env::COMM_SPLIT_SHARE_RESOURCES));
        let cta_policy = self
            .cta_policy
            .or(inherit.map(|p| p.cta_policy))
            .unwrap_or_else(|| env(crate::env::CTA_POLICY) as i32);
        if !(CTA_POLICY_DEFAULT..=CTA_POLICY_ZERO).contains(&cta_policy) {
            return Err(Error::invalid_argument(format!(
                "CTAPolicy {cta_policy} is none of NCCL_CTA_POLICY_DEFAULT (0), \
                 NCCL_CTA_POLICY_EFFICIENCY (1), NCCL_CTA_POLICY_ZERO (2)"
            )));
        }
        let later = self.resolve_later(inherit)?;
        Ok(ResolvedConfig {
            blocking,
            cga_cluster_size: cga,
            min_ctas: min as u32,
            max_ctas: max as u32,
            net_name,
            split_share,
            traffic_class: self.traffic_class.or(inherit.and_then(|p| p.traffic_class)),
            // A name is the communicator's own: children do not inherit it.
            comm_name: self.comm_name.clone(),
            collnet_enable: self
                .collnet_enable
                .or(inherit.map(|p| p.collnet_enable))
                .unwrap_or(false),
            cta_policy,
            ..later
        })
    }

    /// The fields of NCCL 2.27–2.29 after `CTAPolicy` (the rest of the result is default).
    fn resolve_later(&self, inherit: Option<&ResolvedConfig>) -> Result<ResolvedConfig> {
        let env = |p: crate::env::Param| p.int();
        let ranged = |name: &str, v: i64, lo: i64, hi: i64| -> Result<u32> {
            match (lo..=hi).contains(&v) {
                true => Ok(v as u32),
                false => Err(Error::invalid_argument(format!(
                    "{name} {v} is out of range ({lo} to {hi})"
                ))),
            }
        };
        let nvls_ctas = match self.nvls_ctas {
            Some(n) => Some(ranged("nvlsCTAs", n.into(), 1, MAX_CHANNELS as i64)?),
            None => inherit.and_then(|p| p.nvls_ctas),
        };
        let per_peer = match self.n_channels_per_net_peer {
            Some(n) => Some(ranged("nChannelsPerNetPeer", n.into(), 1, 64)?),
            None => inherit.and_then(|p| p.n_channels_per_net_peer).or_else(|| {
                let v = env(crate::env::NCHANNELS_PER_NET_PEER);
                (1..=64).contains(&v).then_some(v as u32)
            }),
        };
        let mode = match self.graph_usage_mode {
            Some(m) => ranged("graphUsageMode", m.into(), 0, 2)?,
            None => inherit.map_or_else(
                || match env(crate::env::GRAPH_MIXING_SUPPORT) {
                    0 => 0,
                    _ => 2,
                },
                |p| p.graph_usage_mode,
            ),
        };
        let rma = match self.num_rma_ctx {
            Some(n) => ranged("numRmaCtx", n.into(), 1, i32::MAX as i64)?,
            None => inherit.map_or_else(
                || env(crate::env::NUM_RMA_CTX).clamp(1, i32::MAX as i64) as u32,
                |p| p.num_rma_ctx,
            ),
        };
        let deterministic = self
            .deterministic
            .or(inherit.map(|p| p.deterministic.is_some()))
            .unwrap_or_else(|| env_bool(crate::env::RS_DETERMINISTIC));
        let scratch = match self.deterministic_scratch {
            Some(b) => b as i64,
            None => inherit
                .and_then(|p| p.deterministic)
                .map_or_else(|| env(crate::env::RS_DETERMINISTIC_SCRATCH), |b| b as i64),
        };
        if deterministic && scratch < MIN_DETERMINISTIC_SCRATCH as i64 {
            return Err(Error::invalid_argument(format!(
                "deterministic scratch {scratch} is below {MIN_DETERMINISTIC_SCRATCH} bytes"
            )));
        }
        Ok(ResolvedConfig {
            deterministic: deterministic.then_some(scratch as usize),
            shrink_share: self
                .shrink_share
                .or(inherit.map(|p| p.shrink_share))
                .unwrap_or(false),
            nvls_ctas,
            n_channels_per_net_peer: per_peer,
            nvlink_centric_sched: self
                .nvlink_centric_sched
                .or(inherit.map(|p| p.nvlink_centric_sched))
                .unwrap_or_else(|| env_bool(crate::env::NVLINK_UTIL_CENTRIC_SCHED_ENABLE)),
            graph_usage_mode: mode,
            num_rma_ctx: rma,
            ..ResolvedConfig::default()
        })
    }
}

impl ResolvedConfig {
    /// Bounds `n` channels by minCTAs / maxCTAs.
    pub fn bound_channels(&self, n: u32) -> u32 {
        n.clamp(self.min_ctas.max(1), self.max_ctas.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_defaults_bounds_and_inheritance() {
        let r = Config::default().resolve(None).unwrap();
        assert!(r.min_ctas >= 1 && r.max_ctas as usize <= MAX_CHANNELS);
        let c = Config {
            min_ctas: Some(4),
            max_ctas: Some(1000),
            comm_name: Some("x".into()),
            ..Config::blocking(false)
        };
        let r = c.resolve(None).unwrap();
        assert_eq!((r.min_ctas, r.max_ctas), (4, MAX_CHANNELS as u32));
        assert!(!r.blocking);
        assert_eq!(r.bound_channels(1), 4);
        assert_eq!(r.bound_channels(64), MAX_CHANNELS as u32);
        let swapped = Config {
            min_ctas: Some(8),
            max_ctas: Some(2),
            ..Config::default()
        };
        let s = swapped.resolve(None).unwrap();
        assert_eq!((s.min_ctas, s.max_ctas), (2, 2));
        for bad in [
            Config {
                min_ctas: Some(0),
                ..Config::default()
            },
            Config {
                max_ctas: Some(-3),
                ..Config::default()
            },
            Config {
                cga_cluster_size: Some(9),
                ..Config::default()
            },
            Config {
                cta_policy: Some(3),
                ..Config::default()
            },
            Config {
                nvls_ctas: Some(0),
                ..Config::default()
            },
            Config {
                n_channels_per_net_peer: Some(65),
                ..Config::default()
            },
            Config {
                graph_usage_mode: Some(3),
                ..Config::default()
            },
            Config {
                num_rma_ctx: Some(0),
                ..Config::default()
            },
        ] {
            assert_eq!(
                bad.resolve(None).unwrap_err().code,
                crate::NcclResult::InvalidArgument
            );
        }
        let child = Config::default().resolve(Some(&r)).unwrap();
        assert_eq!((child.min_ctas, child.blocking), (4, false));
        assert_eq!(child.comm_name, None);
        // The later fields: defaults, then set values, inherited by a child.
        assert_eq!((r.graph_usage_mode, r.num_rma_ctx), (2, 1));
        let set = Config {
            graph_usage_mode: Some(0),
            num_rma_ctx: Some(4),
            nvls_ctas: Some(2),
            ..Config::default()
        }
        .resolve(None)
        .unwrap();
        let child = Config::default().resolve(Some(&set)).unwrap();
        assert_eq!(
            (child.graph_usage_mode, child.num_rma_ctx, child.nvls_ctas),
            (0, 4, Some(2))
        );
    }
}
