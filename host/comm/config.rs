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
}

/// `NCCL_CTA_POLICY_DEFAULT`.
pub const CTA_POLICY_DEFAULT: i32 = 0;
/// `NCCL_CTA_POLICY_EFFICIENCY`.
pub const CTA_POLICY_EFFICIENCY: i32 = 1;
/// `NCCL_CTA_POLICY_ZERO` (NCCL 2.28).
pub const CTA_POLICY_ZERO: i32 = 2;

/// The options a communicator runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
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
        ] {
            assert_eq!(
                bad.resolve(None).unwrap_err().code,
                crate::NcclResult::InvalidArgument
            );
        }
        let child = Config::default().resolve(Some(&r)).unwrap();
        assert_eq!((child.min_ctas, child.blocking), (4, false));
        assert_eq!(child.comm_name, None);
    }
}
