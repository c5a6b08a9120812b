//! Tests of one proxied connection's step machine.

use super::*;
use crate::cuda::Device;
use nccl_device::abi::{proxy_proto_word, PROTO_LL};
use std::sync::atomic::AtomicUsize;

/// A receive endpoint counting how often it is tested, whose receives never complete
/// (`lands` None) or complete at once with `lands` bytes.
struct FakeRecv {
    tests: Arc<AtomicUsize>,
    lands: Option<usize>,
    next: u64,
}

impl RecvComm for FakeRecv {
    unsafe fn reg_mr(&mut self, _ptr: *mut u8, _len: usize, _kind: u32) -> Result<Mr> {
        Ok(Mr(1))
    }
    fn dereg_mr(&mut self, _mr: Mr) -> Result<()> {
        Ok(())
    }
    fn irecv(&mut self, _bufs: &[RecvBuf]) -> Result<Option<Request>> {
        self.next += 1;
        Ok(Some(Request(self.next)))
    }
    fn test(&mut self, _req: Request) -> Result<Option<Vec<usize>>> {
        self.tests.fetch_add(1, Ordering::Relaxed);
        Ok(self.lands.map(|n| vec![n]))
    }
}

#[test]
fn idle_receive_is_tested_only_when_its_kernel_waits_or_its_turn_comes() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let tests = Arc::new(AtomicUsize::new(0));
    let side = Side::Recv(Box::new(FakeRecv {
        tests: tests.clone(),
        lands: None,
        next: 0,
    }));
    let layout = ConnLayout { stride: 4096 };
    let mut c =
        NetConn::new(side, &dev, layout, FifoPlace::Host, 1, "test".into()).expect("connection");
    let count = || tests.load(Ordering::Relaxed);
    // Posting the first receives is activity: the network is tested.
    assert!(c.post().expect("post"));
    c.progress(Poll::IfActive(Instant::now()))
        .expect("progress");
    assert_eq!(count(), 1);
    // Still in use: tested on every pass.
    c.progress(Poll::IfActive(Instant::now()))
        .expect("progress");
    assert_eq!(count(), 2);
    // Idle (a pass long after): not tested, unless its turn comes.
    let later = Instant::now() + RECV_ACTIVE * 2;
    c.progress(Poll::IfActive(later)).expect("progress");
    assert_eq!(count(), 2);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(count(), 3);
    // The kernel says it waits for step 0 (the steps below 1): tested at once.
    counter(&c.mem, ConnLayout::PROTO)
        .expect("protocol word")
        .store(proxy_proto_word(1, PROTO_LL), Ordering::Relaxed);
    c.progress(Poll::IfActive(later)).expect("progress");
    assert_eq!(count(), 4);
}

/// A step the network reports landed with more bytes than the slot posted for it is
/// ncclRemoteError naming the peer; one that fits lands.
#[test]
fn a_step_landing_larger_than_its_slot_is_refused() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let layout = ConnLayout { stride: 4096 };
    for (size, ok) in [(4096, true), (4097, false), (usize::MAX, false)] {
        let side = Side::Recv(Box::new(FakeRecv {
            tests: Default::default(),
            lands: Some(size),
            next: 0,
        }));
        let mut c = NetConn::new(side, &dev, layout, FifoPlace::Host, 5, "test".into())
            .expect("connection");
        assert!(c.post().expect("post"));
        match c.progress(Poll::Always) {
            Ok(_) => {
                assert!(ok, "a {size}-byte step landed in a 4096-byte slot");
                assert!(c.done > 0);
            }
            Err(e) => {
                assert!(!ok, "{e}");
                assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
                assert!(
                    e.message.contains("rank 5") && e.message.contains(&format!("{size} bytes")),
                    "{e}"
                );
                assert_eq!(c.done, 0, "nothing landed");
            }
        }
    }
}

/// A send endpoint recording the (offset, bytes) of every send, which completes at once.
struct FakeSend {
    sent: Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
}

impl SendComm for FakeSend {
    unsafe fn reg_mr(&mut self, _ptr: *mut u8, _len: usize, _kind: u32) -> Result<Mr> {
        Ok(Mr(1))
    }
    fn dereg_mr(&mut self, _mr: Mr) -> Result<()> {
        Ok(())
    }
    fn isend(&mut self, _mr: Mr, off: usize, len: usize, _tag: u32) -> Result<Option<Request>> {
        let mut sent = self.sent.lock().unwrap();
        sent.push((off, len));
        Ok(Some(Request(sent.len() as u64)))
    }
    fn test(&mut self, _req: Request) -> Result<Option<usize>> {
        Ok(Some(0))
    }
}

/// An LL step published without a release (`SIZE_LL_LINES`) leaves only once its size
/// reached host memory and every line of it holds the step's flag in both halves; a stale
/// line from the slot's previous step (8 steps before) holds it back. A Simple step's size
/// is trusted as it is.
#[test]
fn an_ll_step_published_without_a_release_waits_for_its_lines() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let layout = ConnLayout { stride: 4096 };
    let sent: Arc<std::sync::Mutex<Vec<(usize, usize)>>> = Default::default();
    let side = Side::Send(Box::new(FakeSend { sent: sent.clone() }));
    let mut c =
        NetConn::new(side, &dev, layout, FifoPlace::Host, 3, "test".into()).expect("connection");
    let mem = c.mem.clone();
    let word = |o: usize| counter(&mem, o).unwrap();
    let line = |step: u64, k: usize, flags: [u32; 2]| {
        let p = mem.host_ptr(layout.slot(step) + 16 * k).unwrap() as *mut u32;
        // SAFETY: inside the connection's FIFO, which the test alone writes.
        unsafe {
            p.write_volatile(7);
            p.add(1).write_volatile(flags[0]);
            p.add(2).write_volatile(9);
            p.add(3).write_volatile(flags[1]);
        }
    };
    let nsent = || sent.lock().unwrap().len();
    // Step 0, three lines: its tail landed first, then its size, then its lines one by one.
    word(ConnLayout::TAIL).store(1, Ordering::Release);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(nsent(), 0, "sent before its size landed");
    word(ConnLayout::SIZES).store(48 | SIZE_LL_LINES, Ordering::Release);
    line(0, 0, [1, 1]);
    line(0, 1, [1, 0]);
    line(0, 2, [1, 1]);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(nsent(), 0, "sent with half a line missing");
    line(0, 1, [1, 1]);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(*sent.lock().unwrap(), vec![(0, 48)]);
    assert_eq!(word(ConnLayout::SIZES).load(Ordering::Acquire), SIZE_EMPTY);
    // Steps 1 to 7 as Simple ones (released: trusted), so that step 8 reuses slot 0.
    for step in 1..8u64 {
        let at = ConnLayout::SIZES + 8 * (step % STEPS) as usize;
        word(at).store(64, Ordering::Release);
        word(ConnLayout::TAIL).store(step + 1, Ordering::Release);
        c.progress(Poll::Always).expect("progress");
    }
    assert_eq!(nsent(), 8, "a released Simple step held back");
    // Step 8 in slot 0 as LL: step 0's lines (flag 1) are still there.
    word(ConnLayout::SIZES).store(32 | SIZE_LL_LINES, Ordering::Release);
    word(ConnLayout::TAIL).store(9, Ordering::Release);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(nsent(), 8, "step 8 sent with step 0's lines");
    line(8, 0, [9, 9]);
    line(8, 1, [9, 9]);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(sent.lock().unwrap()[8], (0, 32));
    // Step 9's tail without its size (slot 1 was taken by step 1): nothing more leaves.
    word(ConnLayout::TAIL).store(10, Ordering::Release);
    c.progress(Poll::Always).expect("progress");
    assert_eq!(
        nsent(),
        9,
        "step 9 sent with the size its slot held for step 1"
    );
}

#[test]
fn layout_keeps_counters_apart_and_slots_aligned() {
    let l = ConnLayout { stride: 65536 };
    assert_eq!(ConnLayout::HEAD - ConnLayout::TAIL, CTRL_LINE);
    assert!(ConnLayout::SIZES + 8 * NCCL_STEPS as usize <= ConnLayout::FIFO);
    assert_eq!(l.slot(9) - l.slot(8), 65536);
    assert_eq!(l.slot(8), ConnLayout::FIFO);
    assert_eq!(l.total(), ConnLayout::FIFO + 8 * 65536);
    assert_eq!(ConnLayout::FIFO % 128, 0);
}
