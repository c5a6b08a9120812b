//! Connections whose network handshake is still under way. The thread that wants a connection
//! (init, or a group's end for send/recv) only listens, trades handles through the bootstrap and
//! starts the connect; it makes the connection's memory at once, so the kernel's structures are
//! complete and a kernel may run before the handshake ends (a send fills its own FIFO, a
//! receive waits for its tail). The proxy thread polls the handshake (`accept`, the connect's
//! `poll`), registers the FIFO with the endpoint once it is up, and from then on drives the
//! connection like any other. A handshake that fails, outlives its deadline or whose peer is
//! gone is a connection error like any other (the communicator's async error and abort flag).

use super::conn::{ConnMem, NetConn, Side};
use super::shared::{Grouper, SharedRecv, SharedSend};
use crate::error::{Error, Result};
use crate::net::{Connecting, Listener, SendComm, Waker};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Whether a peer is known gone (dead, aborted, reported hung), and why.
pub(crate) type GoneCheck = Arc<dyn Fn(usize) -> Option<String> + Send + Sync>;

/// A network comm several connections to one peer share (NCCL_NET_SHARED_COMMS), published by
/// the connection that made it; `None` if its handshake failed.
pub(crate) type ShareSlot = Arc<OnceLock<Option<SharedComm>>>;

/// A shared comm, as its users hold it.
#[derive(Clone)]
pub(crate) enum SharedComm {
    Send(Arc<Mutex<Box<dyn SendComm>>>),
    Recv(Arc<Mutex<Grouper>>),
}

/// What a pending connection waits for.
pub(crate) enum Handshake {
    /// A receive side: the peer's connect.
    Listening(Box<dyn Listener>),
    /// A send side: its connect to the peer's handle.
    Connecting(Box<dyn Connecting>),
    /// Either side: the comm another connection makes and shares.
    Sharing(ShareSlot),
}

/// How a pending connection will use its comm once up.
pub(crate) enum Sharing {
    /// Alone, its messages untagged.
    Alone,
    /// It makes the comm that `sharers` connections (itself included) use, and publishes it in
    /// the slot; `max_recvs` receives of a receive side are grouped.
    Owner {
        slot: ShareSlot,
        max_recvs: usize,
        tag: u32,
    },
    /// It uses another's comm ([`Handshake::Sharing`]), its messages tagged.
    User { tag: u32 },
}

/// A connection whose endpoint is not up yet.
pub(crate) struct Pending {
    pub handshake: Handshake,
    pub sharing: Sharing,
    pub mem: ConnMem,
    pub peer_rank: usize,
    /// How the peer is reached, for messages.
    pub peer: String,
    pub deadline: Instant,
    pub gone: Option<GoneCheck>,
}

/// A connection the proxy thread drives: up, or still shaking hands.
pub(crate) enum ProxyConn {
    Coming {
        /// The rank at the other end (kept apart: `pending` is taken when the handshake ends).
        peer_rank: usize,
        pending: Option<Box<Pending>>,
        waker: Option<Waker>,
        /// Its handshake failed (reported once; then left alone).
        failed: bool,
    },
    Up(Box<NetConn>),
}

impl ProxyConn {
    pub(crate) fn pending(p: Pending) -> ProxyConn {
        ProxyConn::Coming {
            peer_rank: p.peer_rank,
            pending: Some(Box::new(p)),
            waker: None,
            failed: false,
        }
    }

    pub(crate) fn peer_rank(&self) -> usize {
        match self {
            ProxyConn::Up(c) => c.peer_rank(),
            ProxyConn::Coming { peer_rank, .. } => *peer_rank,
        }
    }

    /// Its handshake is still under way.
    pub(crate) fn is_coming(&self) -> bool {
        matches!(self, ProxyConn::Coming { failed: false, .. })
    }

    pub(crate) fn set_waker(&mut self, w: Waker) {
        match self {
            ProxyConn::Up(c) => c.set_waker(w),
            ProxyConn::Coming { waker, .. } => *waker = Some(w),
        }
    }

    /// Nothing its kernel published is still to be sent, and no handshake is under way: a
    /// communicator destroyed right after its init lets its handshakes end first, else a peer
    /// still connecting to a listener that closed would take that for a fault.
    pub(crate) fn drained(&self) -> bool {
        match self {
            ProxyConn::Up(c) => c.drained(),
            ProxyConn::Coming { failed, .. } => *failed,
        }
    }

    /// [`NetConn::post`] once up.
    pub(crate) fn post(&mut self) -> Result<bool> {
        match self {
            ProxyConn::Up(c) => c.post(),
            ProxyConn::Coming { .. } => Ok(false),
        }
    }

    /// [`NetConn::progress`] once up; before, a look at the handshake (true when it ended and
    /// the connection is up). An error is returned once.
    pub(crate) fn progress(&mut self, poll: super::conn::Poll) -> Result<bool> {
        let (pending, waker, failed) = match self {
            ProxyConn::Up(c) => return c.progress(poll),
            ProxyConn::Coming {
                pending,
                waker,
                failed,
                ..
            } => (pending, waker, failed),
        };
        if *failed {
            return Ok(false);
        }
        let p = pending
            .as_mut()
            .expect("a pending connection keeps its state until up");
        match p.poll() {
            Ok(None) => Ok(false),
            Ok(Some(side)) => {
                let p = pending.take().expect("checked above");
                let waker = waker.take();
                let mut conn = p.attach(side).inspect_err(|_| *failed = true)?;
                if let Some(w) = waker {
                    conn.set_waker(w);
                }
                *self = ProxyConn::Up(Box::new(conn));
                Ok(true)
            }
            Err(e) => {
                *failed = true;
                if let Sharing::Owner { slot, .. } = &p.sharing {
                    let _ = slot.set(None);
                }
                Err(e.context(format!("network connection with {}", p.peer)))
            }
        }
    }
}

impl Pending {
    /// The endpoint once the handshake ended; an error when it failed, the peer is gone or the
    /// deadline passed.
    fn poll(&mut self) -> Result<Option<Side>> {
        let up = match &mut self.handshake {
            Handshake::Listening(l) => l.accept()?.map(Side::Recv),
            Handshake::Connecting(c) => c.poll()?.map(Side::Send),
            Handshake::Sharing(slot) => match slot.get() {
                None => None,
                Some(None) => {
                    return Err(Error::system(
                        "the connection whose network comm it shares failed",
                    ))
                }
                Some(Some(SharedComm::Send(c))) => {
                    Some(Side::Send(Box::new(SharedSend(c.clone()))))
                }
                Some(Some(SharedComm::Recv(g))) => {
                    Some(Side::Recv(Box::new(SharedRecv(g.clone()))))
                }
            },
        };
        if up.is_some() {
            return Ok(up);
        }
        if let Some(why) = self.gone.as_ref().and_then(|g| g(self.peer_rank)) {
            return Err(Error::remote(format!(
                "not established: the peer is gone: {why}"
            )));
        }
        if Instant::now() > self.deadline {
            return Err(Error::system(
                "not established before its deadline (NCCL_BOOTSTRAP_TIMEOUT_MS)",
            ));
        }
        Ok(None)
    }

    /// The connection, its endpoint `side` up: shared where it makes a comm for others, its
    /// FIFO registered.
    fn attach(self, side: Side) -> Result<NetConn> {
        let (side, tag, shared) = match self.sharing {
            Sharing::Alone => (side, 0, false),
            Sharing::User { tag } => (side, tag, true),
            Sharing::Owner {
                slot,
                max_recvs,
                tag,
            } => {
                let comm = match side {
                    Side::Send(c) => SharedComm::Send(Arc::new(Mutex::new(c))),
                    Side::Recv(c) => SharedComm::Recv(Grouper::new(c, max_recvs)),
                };
                let own = match &comm {
                    SharedComm::Send(c) => Side::Send(Box::new(SharedSend(c.clone()))),
                    SharedComm::Recv(g) => Side::Recv(Box::new(SharedRecv(g.clone()))),
                };
                let _ = slot.set(Some(comm));
                (own, tag, true)
            }
        };
        let conn = NetConn::attach(side, self.mem, self.peer_rank, self.peer)?;
        Ok(conn.with_tag(tag, shared))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::{set_backend, Backend, Device};
    use crate::net::{Mr, Request};
    use crate::proxy::conn::Poll;
    use crate::proxy::{ConnLayout, FifoPlace, ProxyGroup};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    /// What the fakes saw: the threads that polled the connect, and the bytes sent.
    #[derive(Default)]
    struct Seen {
        ready: AtomicBool,
        pollers: Mutex<Vec<String>>,
        sent: AtomicUsize,
        registered: AtomicUsize,
    }

    /// A connect that is up once `ready` is set.
    struct SlowConnect(Arc<Seen>);

    impl Connecting for SlowConnect {
        fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>> {
            let name = std::thread::current().name().unwrap_or("").to_string();
            self.0.pollers.lock().unwrap().push(name);
            Ok(self
                .0
                .ready
                .load(Ordering::Acquire)
                .then(|| Box::new(CountingSend(self.0.clone())) as Box<dyn SendComm>))
        }
    }

    /// A send endpoint whose sends complete at once.
    struct CountingSend(Arc<Seen>);

    impl SendComm for CountingSend {
        unsafe fn reg_mr(&mut self, _ptr: *mut u8, _len: usize, _kind: u32) -> Result<Mr> {
            self.0.registered.fetch_add(1, Ordering::Relaxed);
            Ok(Mr(1))
        }
        fn dereg_mr(&mut self, _mr: Mr) -> Result<()> {
            Ok(())
        }
        fn isend(
            &mut self,
            _mr: Mr,
            _off: usize,
            len: usize,
            _tag: u32,
        ) -> Result<Option<Request>> {
            self.0.sent.fetch_add(len, Ordering::Relaxed);
            Ok(Some(Request(0)))
        }
        fn test(&mut self, _req: Request) -> Result<Option<usize>> {
            Ok(Some(0))
        }
    }

    fn device() -> Device {
        let _ = set_backend(Backend::Sim);
        Device::open(0).expect("device 0")
    }

    fn pending(dev: &Device, handshake: Handshake, sharing: Sharing) -> Pending {
        let layout = ConnLayout { stride: 4096 };
        Pending {
            handshake,
            sharing,
            mem: ConnMem::new(dev, layout, FifoPlace::Host, true, "rank 1").expect("memory"),
            peer_rank: 1,
            peer: "rank 1 (send via fake)".into(),
            deadline: Instant::now() + Duration::from_secs(60),
            gone: None,
        }
    }

    /// The caller hands over a connection whose connect has not completed and goes on: the
    /// proxy thread polls the handshake (never the caller), and once it is up registers the FIFO
    /// and sends the step its kernel published in the meantime.
    #[test]
    fn the_proxy_thread_ends_the_handshake_and_sends_what_waited() {
        let dev = device();
        let seen = Arc::new(Seen::default());
        let p = pending(
            &dev,
            Handshake::Connecting(Box::new(SlowConnect(seen.clone()))),
            Sharing::Alone,
        );
        // The kernel publishes a step before the connection is up: its FIFO is its own.
        p.mem.publish_simple(0, 256);
        let errors = Arc::new(AtomicUsize::new(0));
        let e = errors.clone();
        let group = ProxyGroup::new(
            dev.ordinal,
            Arc::new(move |_, _| {
                e.fetch_add(1, Ordering::Relaxed);
            }),
        );
        group.add(vec![ProxyConn::pending(p)]);
        let wait_for = |what: &str, f: &dyn Fn() -> bool| {
            let t0 = Instant::now();
            while !f() {
                assert!(t0.elapsed() < Duration::from_secs(30), "never: {what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_for("a poll of the connect", &|| {
            seen.pollers.lock().unwrap().len() >= 2
        });
        assert_eq!(
            seen.sent.load(Ordering::Relaxed),
            0,
            "sent before the connect was up"
        );
        assert_eq!(seen.registered.load(Ordering::Relaxed), 0);
        seen.ready.store(true, Ordering::Release);
        wait_for("the waiting step sent", &|| {
            seen.sent.load(Ordering::Relaxed) == 256
        });
        assert_eq!(
            seen.registered.load(Ordering::Relaxed),
            1,
            "the FIFO registered once"
        );
        let pollers = seen.pollers.lock().unwrap().clone();
        let me = std::thread::current().name().unwrap_or("").to_string();
        assert!(
            pollers
                .iter()
                .all(|t| t.starts_with("nccl-proxy-") && *t != me),
            "{pollers:?}"
        );
        assert_eq!(errors.load(Ordering::Relaxed), 0);
    }

    /// A handshake past its deadline, or with a peer the bootstrap knows gone, fails once with
    /// a message that says which; the connection is then left alone and counts as drained.
    #[test]
    fn a_handshake_that_cannot_end_fails_once_saying_why() {
        let dev = device();
        let seen = Arc::new(Seen::default());
        let mut late = pending(
            &dev,
            Handshake::Connecting(Box::new(SlowConnect(seen.clone()))),
            Sharing::Alone,
        );
        late.deadline = Instant::now() - Duration::from_millis(1);
        let mut c = ProxyConn::pending(late);
        assert!(!c.drained(), "a handshake under way is not drained");
        let e = c.progress(Poll::Always).expect_err("past its deadline");
        assert!(
            e.message.contains("deadline") && e.message.contains("rank 1"),
            "{e}"
        );
        assert!(c.progress(Poll::Always).is_ok(), "reported once");
        assert!(c.drained() && !c.is_coming());

        let mut dead = pending(
            &dev,
            Handshake::Connecting(Box::new(SlowConnect(seen.clone()))),
            Sharing::Alone,
        );
        dead.gone = Some(Arc::new(|peer| {
            (peer == 1).then(|| "it was killed".to_string())
        }));
        let e = ProxyConn::pending(dead)
            .progress(Poll::Always)
            .expect_err("the peer is gone");
        assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("it was killed"), "{e}");
    }

    /// Connections sharing one comm come up with it: the user waits for the owner's handshake,
    /// then both send on the one comm, each with its tag; an owner that fails fails its users.
    #[test]
    fn sharers_come_up_with_the_comm_they_share() {
        let dev = device();
        let seen = Arc::new(Seen::default());
        let slot = ShareSlot::default();
        let owner = pending(
            &dev,
            Handshake::Connecting(Box::new(SlowConnect(seen.clone()))),
            Sharing::Owner {
                slot: slot.clone(),
                max_recvs: 8,
                tag: 3,
            },
        );
        let user = pending(
            &dev,
            Handshake::Sharing(slot.clone()),
            Sharing::User { tag: 4 },
        );
        user.mem.publish_simple(0, 128);
        let (mut owner, mut user) = (ProxyConn::pending(owner), ProxyConn::pending(user));
        assert!(!user.progress(Poll::Always).expect("waits"));
        assert!(!owner.progress(Poll::Always).expect("connecting"));
        seen.ready.store(true, Ordering::Release);
        assert!(
            owner.progress(Poll::Always).expect("up"),
            "the owner came up"
        );
        assert!(
            user.progress(Poll::Always).expect("up"),
            "the user came up with it"
        );
        assert!(!user.is_coming() && !owner.is_coming());
        user.progress(Poll::Always).expect("sends");
        assert_eq!(seen.sent.load(Ordering::Relaxed), 128);
        assert_eq!(
            seen.registered.load(Ordering::Relaxed),
            2,
            "each FIFO registered"
        );

        let failed = ShareSlot::default();
        let mut bad_owner = pending(
            &dev,
            Handshake::Connecting(Box::new(SlowConnect(Arc::new(Seen::default())))),
            Sharing::Owner {
                slot: failed.clone(),
                max_recvs: 8,
                tag: 0,
            },
        );
        bad_owner.deadline = Instant::now() - Duration::from_millis(1);
        let mut user = ProxyConn::pending(pending(
            &dev,
            Handshake::Sharing(failed),
            Sharing::User { tag: 1 },
        ));
        assert!(ProxyConn::pending(bad_owner)
            .progress(Poll::Always)
            .is_err());
        let e = user.progress(Poll::Always).expect_err("its owner failed");
        assert!(e.message.contains("shares failed"), "{e}");
    }
}
