//! Network comms that several proxied connections share (NCCL_NET_SHARED_COMMS): the
//! send/recv connections between two ranks on one network device, where the network matches
//! tags and groups receives (`maxRecvs` > 1). Each connection tags its messages with its own
//! key. The receiving side posts the steps that kernels wait for ([`RecvComm::irecv_awaited`])
//! of up to `maxRecvs` different connections in one `irecv` ([`Grouper`]); steps posted ahead
//! of any kernel (the FIFO's free slots between launches) go alone, since nothing says they
//! will come soon, and a grouped receive completes only once all of its buffers are full.

use crate::error::Result;
use crate::net::{Mr, RecvBuf, RecvComm, Request, SendComm, Waker};
use std::collections::{BTreeSet, HashMap};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest an awaited receive waits for other connections' to be posted with it.
const HOLD: Duration = Duration::from_micros(50);

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's handle on a shared sending comm.
pub(crate) struct SharedSend(pub(crate) Arc<Mutex<Box<dyn SendComm>>>);

impl SendComm for SharedSend {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { lock(&self.0).reg_mr(ptr, len, kind) }
    }
    unsafe fn reg_mr_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { lock(&self.0).reg_mr_dmabuf(ptr, len, kind, offset, fd) }
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        lock(&self.0).dereg_mr(mr)
    }
    fn isend(&mut self, mr: Mr, offset: usize, len: usize, tag: u32) -> Result<Option<Request>> {
        lock(&self.0).isend(mr, offset, len, tag)
    }
    fn test(&mut self, req: Request) -> Result<Option<usize>> {
        lock(&self.0).test(req)
    }
    fn set_waker(&mut self, waker: Waker) {
        lock(&self.0).set_waker(waker)
    }
}

/// A shared receiving comm and the receives its connections asked for. Connections see
/// tickets, not the network's requests: one grouped request serves several of them.
pub(crate) struct Grouper {
    comm: Box<dyn RecvComm>,
    max: usize,
    next_ticket: u64,
    /// Awaited receives not posted yet, in the order asked, and since when the oldest waits.
    queue: Vec<(u64, RecvBuf)>,
    since: Option<Instant>,
    /// Connections (tags) whose kernels wait for steps they cannot post yet (FIFO full).
    waiting: BTreeSet<u32>,
    /// The network's requests in flight and the tickets each serves, in buffer order.
    inflight: Vec<(Request, Vec<u64>)>,
    /// Tickets complete and not yet collected: bytes received (0 for a flush).
    landed: HashMap<u64, usize>,
    /// irecv calls of more than one buffer, and buffers posted through them, for the logs.
    grouped: u64,
    grouped_bufs: u64,
}

impl Grouper {
    /// Wraps `comm`, which takes up to `max_recvs` buffers per irecv.
    pub(crate) fn new(comm: Box<dyn RecvComm>, max_recvs: usize) -> Arc<Mutex<Grouper>> {
        Arc::new(Mutex::new(Grouper {
            comm,
            max: max_recvs.max(1),
            next_ticket: 1,
            queue: Vec::new(),
            since: None,
            waiting: BTreeSet::new(),
            inflight: Vec::new(),
            landed: HashMap::new(),
            grouped: 0,
            grouped_bufs: 0,
        }))
    }

    fn ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// Whether the queue should go out now: as many connections as one irecv takes, every
    /// connection that waits for room is in, or the oldest has waited [`HOLD`].
    fn queue_ready(&self) -> bool {
        let tags: BTreeSet<u32> = self.queue.iter().map(|(_, b)| b.tag).collect();
        tags.len() >= self.max
            || self.waiting.iter().all(|t| tags.contains(t))
            || self.since.is_some_and(|s| s.elapsed() >= HOLD)
    }

    /// Posts the queued receives (all of them where `force`, else once [`Self::queue_ready`]):
    /// groups of up to `max` buffers of different connections, each connection's receives in
    /// the order asked (a tag's messages fill its buffers in posting order). What the network
    /// does not take now stays queued, in order.
    fn post_queue(&mut self, force: bool) -> Result<()> {
        if self.queue.is_empty() || !(force || self.queue_ready()) {
            return Ok(());
        }
        let groups = form_groups(std::mem::take(&mut self.queue), self.max);
        let mut rest = Vec::new();
        for g in groups {
            if !rest.is_empty() {
                rest.extend(g);
                continue;
            }
            let bufs: Vec<RecvBuf> = g.iter().map(|&(_, b)| b).collect();
            match self.comm.irecv(&bufs)? {
                Some(req) => {
                    if bufs.len() > 1 {
                        self.grouped += 1;
                        self.grouped_bufs += bufs.len() as u64;
                    }
                    self.inflight
                        .push((req, g.iter().map(|&(t, _)| t).collect()));
                }
                None => rest.extend(g),
            }
        }
        if rest.is_empty() {
            self.since = None;
        }
        self.queue = rest;
        Ok(())
    }

    /// Collects every completed request's tickets.
    fn test_all(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.inflight.len() {
            match self.comm.test(self.inflight[i].0)? {
                Some(sizes) => {
                    let (_, tickets) = self.inflight.remove(i);
                    for (k, t) in tickets.into_iter().enumerate() {
                        self.landed.insert(t, sizes.get(k).copied().unwrap_or(0));
                    }
                }
                None => i += 1,
            }
        }
        Ok(())
    }
}

/// Splits `queue` into groups of at most `max` buffers with distinct tags, in order: each
/// buffer goes to the first group after the one holding its tag's previous buffer that has
/// room, so groups posted in order keep every tag's order.
fn form_groups(queue: Vec<(u64, RecvBuf)>, max: usize) -> Vec<Vec<(u64, RecvBuf)>> {
    let mut groups: Vec<Vec<(u64, RecvBuf)>> = Vec::new();
    let mut last: HashMap<u32, usize> = HashMap::new();
    for e in queue {
        let start = last.get(&e.1.tag).map_or(0, |g| g + 1);
        let g = match (start..groups.len()).find(|&g| groups[g].len() < max) {
            Some(g) => g,
            None => {
                groups.push(Vec::new());
                groups.len() - 1
            }
        };
        groups[g].push(e);
        last.insert(e.1.tag, g);
    }
    groups
}

/// One connection's handle on a shared receiving comm.
pub(crate) struct SharedRecv(pub(crate) Arc<Mutex<Grouper>>);

impl RecvComm for SharedRecv {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { lock(&self.0).comm.reg_mr(ptr, len, kind) }
    }
    unsafe fn reg_mr_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { lock(&self.0).comm.reg_mr_dmabuf(ptr, len, kind, offset, fd) }
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        lock(&self.0).comm.dereg_mr(mr)
    }
    /// A receive posted ahead: whatever is queued goes first (a tag's order), then this alone.
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        let mut g = lock(&self.0);
        g.post_queue(true)?;
        if !g.queue.is_empty() {
            return Ok(None);
        }
        let Some(req) = g.comm.irecv(bufs)? else {
            return Ok(None);
        };
        let tickets: Vec<u64> = bufs.iter().map(|_| g.ticket()).collect();
        let first = tickets[0];
        g.inflight.push((req, tickets));
        Ok(Some(Request(first)))
    }
    fn irecv_awaited(&mut self, buf: RecvBuf) -> Result<Option<Request>> {
        let mut g = lock(&self.0);
        let t = g.ticket();
        g.queue.push((t, buf));
        g.since.get_or_insert_with(Instant::now);
        Ok(Some(Request(t)))
    }
    fn note_waiting(&mut self, tag: u32, waiting: bool) {
        let mut g = lock(&self.0);
        if waiting {
            g.waiting.insert(tag);
        } else {
            g.waiting.remove(&tag);
        }
    }
    fn test(&mut self, req: Request) -> Result<Option<Vec<usize>>> {
        let mut g = lock(&self.0);
        if let Some(n) = g.landed.remove(&req.0) {
            return Ok(Some(vec![n]));
        }
        g.post_queue(false)?;
        g.test_all()?;
        Ok(g.landed.remove(&req.0).map(|n| vec![n]))
    }
    fn iflush(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        let mut g = lock(&self.0);
        let Some(req) = g.comm.iflush(bufs)? else {
            return Ok(None);
        };
        let t = g.ticket();
        g.inflight.push((req, vec![t]));
        Ok(Some(Request(t)))
    }
    fn set_waker(&mut self, waker: Waker) {
        lock(&self.0).comm.set_waker(waker)
    }
}

impl Drop for Grouper {
    fn drop(&mut self) {
        if self.grouped > 0 {
            log::debug!(
                "shared network receive: {} grouped irecvs of {} buffers in all",
                self.grouped,
                self.grouped_bufs
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(tag: u32, offset: usize) -> RecvBuf {
        RecvBuf {
            mr: Mr(1),
            offset,
            max_len: 8,
            tag,
        }
    }

    #[test]
    fn groups_take_distinct_tags_and_keep_each_tags_order() {
        // Tag 1 asked three times, tag 2 twice, tag 3 once; at most 2 per group.
        let q: Vec<(u64, RecvBuf)> = [(1, 0), (1, 1), (2, 0), (1, 2), (2, 1), (3, 0)]
            .into_iter()
            .enumerate()
            .map(|(i, (t, o))| (i as u64, buf(t, o)))
            .collect();
        let g = form_groups(q, 2);
        let shape: Vec<Vec<(u32, usize)>> = g
            .iter()
            .map(|g| g.iter().map(|(_, b)| (b.tag, b.offset)).collect())
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(1, 0), (2, 0)],
                vec![(1, 1), (2, 1)],
                vec![(1, 2), (3, 0)],
            ]
        );
        for grp in &g {
            let tags: BTreeSet<u32> = grp.iter().map(|(_, b)| b.tag).collect();
            assert_eq!(tags.len(), grp.len(), "a tag twice in one group: {grp:?}");
        }
    }
}
