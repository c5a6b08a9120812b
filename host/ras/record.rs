//! One rank's health: what it keeps as operations are issued, and the record it sends when a
//! RAS query asks (text lines `key=value`, every number parsed and range-checked on arrival).

use std::sync::atomic::{AtomicU64, Ordering};

/// Operations remembered by sequence number, to name the one a late rank has not issued.
const RECENT: usize = 64;

/// The operations a rank issues, by the code its recent slots keep.
const OPS: [&str; 7] = [
    "AllReduce",
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "Send",
    "Recv",
];

/// The monotonic clock at the kernel's tick (a few ns to read, against ~40 for the precise
/// one on a VM), in ns: an issue marks its time on every call, and a report wants ms.
fn coarse_now_ns() -> u64 {
    crate::clock::clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// A communicator's health as this rank sees it.
pub(crate) struct Health {
    pub(crate) comm_id: u64,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: i32,
    pub(crate) name: Option<String>,
    /// Operations issued so far.
    issued: AtomicU64,
    /// Slot `seq % RECENT` holds `seq << 8 | code` (code: an index of [`OPS`], 255 unknown) of
    /// the last `RECENT` operations: issuing takes no lock (it runs on every call).
    recent: [AtomicU64; RECENT],
    /// [`coarse_now_ns`] at the last issue, plus one (0: none yet).
    last_ns: AtomicU64,
    /// Whether everything issued has finished (None: cannot tell).
    idle: Box<dyn Fn() -> Option<bool> + Send + Sync>,
    /// The communicator's async error, if one was raised.
    error: Box<dyn Fn() -> Option<String> + Send + Sync>,
}

impl Health {
    pub(crate) fn new(
        comm_id: u64,
        rank: usize,
        nranks: usize,
        device: i32,
        name: Option<String>,
        idle: impl Fn() -> Option<bool> + Send + Sync + 'static,
        error: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Health {
        Health {
            comm_id,
            rank,
            nranks,
            device,
            name,
            issued: AtomicU64::new(0),
            recent: std::array::from_fn(|_| AtomicU64::new(0)),
            last_ns: AtomicU64::new(0),
            idle: Box::new(idle),
            error: Box::new(error),
        }
    }

    /// One more operation (a collective, a send or a receive) issued by the application.
    pub(crate) fn issued(&self, op: &str) {
        let code = OPS.iter().position(|&o| o == op).unwrap_or(255) as u64;
        let seq = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        self.recent[seq as usize % RECENT].store(seq << 8 | code, Ordering::Relaxed);
        self.last_ns.store(coarse_now_ns() + 1, Ordering::Relaxed);
    }

    /// What this rank reports now.
    pub(crate) fn record(&self) -> Record {
        let issued = self.issued.load(Ordering::Relaxed);
        // Slots of the last RECENT sequence numbers; one overwritten meanwhile is left out.
        let mut recent: Vec<(u64, String)> = self
            .recent
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|&v| v >> 8 != 0 && v >> 8 <= issued && issued - (v >> 8) < RECENT as u64)
            .map(|v| {
                let op = OPS.get((v & 0xff) as usize).copied().unwrap_or("?");
                (v >> 8, op.to_string())
            })
            .collect();
        recent.sort_unstable_by_key(|&(q, _)| q);
        let last = self.last_ns.load(Ordering::Relaxed);
        Record {
            rank: self.rank,
            pid: std::process::id(),
            host: host_name(),
            device: self.device,
            issued,
            recent,
            idle_ms: (last != 0).then(|| coarse_now_ns().saturating_sub(last - 1) / 1_000_000),
            done: (self.idle)(),
            error: (self.error)(),
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// One rank's report.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub rank: usize,
    pub pid: u32,
    pub host: String,
    pub device: i32,
    /// Operations issued so far.
    pub issued: u64,
    /// The last ones, by sequence number.
    pub recent: Vec<(u64, String)>,
    /// Milliseconds since the last operation was issued (None: none yet).
    pub idle_ms: Option<u64>,
    /// Whether all of them finished (None: cannot tell).
    pub done: Option<bool>,
    pub error: Option<String>,
}

/// Longest text field accepted from a peer.
const MAX_TEXT: usize = 512;

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| if c == '\n' { ' ' } else { c })
                .take(MAX_TEXT)
                .collect()
        };
        let mut t = format!(
            "rank={}\npid={}\nhost={}\ndevice={}\nissued={}\n",
            self.rank,
            self.pid,
            clean(&self.host),
            self.device,
            self.issued
        );
        for (q, op) in &self.recent {
            t += &format!("op={q}:{}\n", clean(op));
        }
        if let Some(ms) = self.idle_ms {
            t += &format!("idle_ms={ms}\n");
        }
        if let Some(d) = self.done {
            t += &format!("done={}\n", u8::from(d));
        }
        if let Some(e) = &self.error {
            t += &format!("error={}\n", clean(e));
        }
        t.into_bytes()
    }

    /// A peer's record; None when anything is malformed or out of range for `nranks` ranks.
    pub(crate) fn decode(b: &[u8], nranks: usize) -> Option<Record> {
        let text = std::str::from_utf8(b).ok()?;
        let mut r = Record {
            rank: usize::MAX,
            pid: 0,
            host: String::new(),
            device: -1,
            issued: 0,
            recent: Vec::new(),
            idle_ms: None,
            done: None,
            error: None,
        };
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            if v.len() > MAX_TEXT {
                return None;
            }
            match k {
                "rank" => r.rank = v.parse().ok().filter(|&x| x < nranks)?,
                "pid" => r.pid = v.parse().ok()?,
                "host" => r.host = v.to_string(),
                "device" => r.device = v.parse().ok()?,
                "issued" => r.issued = v.parse().ok()?,
                "op" if r.recent.len() < RECENT => {
                    let (q, op) = v.split_once(':')?;
                    r.recent.push((q.parse().ok()?, op.to_string()));
                }
                "idle_ms" => r.idle_ms = Some(v.parse().ok()?),
                "done" => r.done = Some(v == "1"),
                "error" => r.error = Some(v.to_string()),
                _ => return None,
            }
        }
        (r.rank < nranks).then_some(r)
    }

    /// The operation issued with sequence number `seq`, if this rank still remembers it.
    pub(crate) fn op(&self, seq: u64) -> Option<&str> {
        self.recent
            .iter()
            .find(|(q, _)| *q == seq)
            .map(|(_, op)| op.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let h = Health::new(7, 2, 4, 1, None, || Some(false), || None);
        h.issued("AllReduce");
        h.issued("Send");
        let r = h.record();
        assert_eq!(r.issued, 2);
        assert_eq!(r.op(1), Some("AllReduce"));
        assert_eq!(Record::decode(&r.encode(), 4), Some(r.clone()));
        assert_eq!(Record::decode(&r.encode(), 2), None, "rank 2 of 2");
        assert_eq!(Record::decode(b"rank=1\nissued=x\n", 4), None);
        assert_eq!(Record::decode(b"rank=1\nwho=me\n", 4), None);
        assert_eq!(Record::decode(&[0xff, 0xfe], 4), None);
    }

    #[test]
    fn the_last_operations_are_kept_in_order() {
        let h = Health::new(7, 0, 2, 0, None, || None, || None);
        assert_eq!(h.record().idle_ms, None, "nothing issued yet");
        for i in 0..RECENT as u64 + 5 {
            h.issued(if i % 2 == 0 { "Send" } else { "ReduceScatter" });
        }
        h.issued("Frobnicate");
        let r = h.record();
        assert_eq!(r.issued, RECENT as u64 + 6);
        let seqs: Vec<u64> = r.recent.iter().map(|&(q, _)| q).collect();
        assert_eq!(seqs, (7..=RECENT as u64 + 6).collect::<Vec<_>>());
        assert_eq!(r.op(7), Some("Send"), "seq 7 is the 7th issue, i = 6");
        assert_eq!(r.op(8), Some("ReduceScatter"));
        assert_eq!(r.op(RECENT as u64 + 6), Some("?"));
        assert_eq!(r.op(6), None, "fell out of the window");
        assert!(r.idle_ms.is_some_and(|ms| ms < 60_000));
    }
}
