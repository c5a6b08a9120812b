//! Tests of the socket network. Loopback only (127.0.0.1 and ::1), interfaces chosen explicitly,
//! the environment never read; every wait is bounded by a deadline.

use super::ifaces::{self, Family};
use super::wire;
use super::*;
use crate::error::NcclResult;
use crate::net::{RecvBuf, Request, PTR_CUDA};
use std::collections::VecDeque;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest any test waits for anything.
const WAIT: Duration = Duration::from_secs(60);

fn opts(nthreads: usize, nsocks: usize, family: Family) -> SocketOptions {
    SocketOptions {
        ifname: Some("=lo".into()),
        family: Some(family),
        nthreads,
        nsocks_per_thread: nsocks,
        handshake_timeout: Duration::from_secs(20),
        retry_count: 3,
        retry_sleep_ms: 10,
        peer_timeout: Some(Duration::from_secs(10)),
        send_timeout: Some(Duration::from_secs(10)),
        inline_below: wire::DEFAULT_INLINE_BELOW,
    }
}

fn lo_net(nthreads: usize, nsocks: usize) -> SocketNet {
    SocketNet::with_options(opts(nthreads, nsocks, Family::V4)).expect("loopback device")
}

/// Listens, connects and accepts, the two sides polled on two threads.
fn pair(net: &SocketNet) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    pair_between(net, net)
}

/// [`pair`] with the sending end made by `sending` and the receiving end by `receiving`.
fn pair_between(
    sending: &SocketNet,
    receiving: &SocketNet,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (handle, mut listener) = receiving.listen(0).expect("listen");
    let mut connecting = sending.connect(0, &handle).expect("connect");
    let deadline = Instant::now() + WAIT;
    std::thread::scope(|s| {
        let acceptor = s.spawn(move || loop {
            if let Some(r) = listener.accept().expect("accept") {
                return r;
            }
            assert!(Instant::now() < deadline, "accept did not finish in time");
            std::thread::sleep(Duration::from_micros(200));
        });
        let send = loop {
            if let Some(c) = connecting.poll().expect("connect poll") {
                break c;
            }
            assert!(Instant::now() < deadline, "connect did not finish in time");
            std::thread::sleep(Duration::from_micros(200));
        };
        (send, acceptor.join().expect("acceptor thread"))
    })
}

/// xorshift64*, seeded with a constant: the same "random" bytes on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        for c in v.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
        v
    }
}

fn reg_send(s: &mut dyn SendComm, buf: &mut [u8]) -> Mr {
    // SAFETY: every buffer registered in these tests outlives the requests that use it: each
    // test waits for its requests, or drops the comm (which joins its threads) first.
    unsafe { s.reg_mr(buf.as_mut_ptr(), buf.len(), PTR_HOST) }.expect("reg_mr")
}

fn reg_recv(r: &mut dyn RecvComm, buf: &mut [u8]) -> Mr {
    // SAFETY: as in `reg_send`.
    unsafe { r.reg_mr(buf.as_mut_ptr(), buf.len(), PTR_HOST) }.expect("reg_mr")
}

fn recv_buf(mr: Mr, max_len: usize) -> RecvBuf {
    RecvBuf {
        mr,
        offset: 0,
        max_len,
        tag: 0,
    }
}

/// Polls `f` until it gives an answer, failing the test at the deadline.
fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no answer within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn wait_send(s: &mut dyn SendComm, req: Request) -> crate::error::Result<usize> {
    wait("send test", || s.test(req).transpose())
}

fn wait_recv(r: &mut dyn RecvComm, req: Request) -> crate::error::Result<Vec<usize>> {
    wait("recv test", || r.test(req).transpose())
}

mod data;
mod formats;
mod listen;
mod timing;
