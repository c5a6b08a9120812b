//! Tests of the registration records' wire form and of the peer table that maps them.

use super::*;

#[test]
fn records_round_trip_and_bad_ones_are_refused() {
    let r = Record {
        id: 7,
        start: 0x1100,
        end: 0x2000,
        base: 0x1000,
        alloc: 5,
        via: Via::Ipc,
        handle: [3; 64],
    };
    assert_eq!(decode(&encode(7, Some(&r))).unwrap(), (7, Some(r)));
    // A VMM record: its handle's mapping must hold the range.
    let t = Ticket {
        pid: 5,
        pid_ns: 6,
        start: 10,
        sock: 0,
        key: 8,
        fd: 9,
    };
    let v = Record {
        via: Via::VmmFd,
        handle: vmm_handle(&t, 0x1000),
        ..r
    };
    assert_eq!(decode(&encode(7, Some(&v))).unwrap(), (7, Some(v)));
    assert_eq!(parse_vmm_handle(&v.handle), (t, 0x1000));
    let short = Record {
        handle: vmm_handle(&t, 0xfff),
        ..v
    };
    assert!(decode(&encode(7, Some(&short))).is_err());
    assert_eq!(decode(&encode(9, None)).unwrap(), (9, None));
    assert!(decode(&[0; 10]).is_err());
    let bad = Record { start: 0x900, ..r };
    assert!(decode(&encode(7, Some(&bad))).is_err());
    let mut odd = encode(7, Some(&r));
    odd[0] = 5;
    assert!(decode(&odd).is_err());
    // Marks: told apart from records, round trip, an unknown kind refused.
    assert_eq!(decode_mark(&encode(7, Some(&r))).unwrap(), None);
    assert_eq!(decode_mark(&encode(9, None)).unwrap(), None);
    for (m, seq) in [(Mark::Coll, 1), (Mark::Recv, 1 << 40)] {
        assert_eq!(decode_mark(&encode_mark(m, seq)).unwrap(), Some((m, seq)));
    }
    let mut bad_mark = encode_mark(Mark::Coll, 3);
    bad_mark[16] = 2;
    assert!(decode_mark(&bad_mark).is_err());
}

/// The table's published entry count, as the kernels read it.
fn count(regs: &PeerRegs) -> u64 {
    let mut b = [0u8; 8];
    regs.table.read(0, &mut b).expect("the count word");
    u64::from_le_bytes(b)
}

/// A peer's registration whose range leaves the allocation its handle maps, or that
/// reuses a live id, is ncclRemoteError and enters nothing; a withdrawal of an unknown id
/// changes nothing.
#[test]
fn registrations_past_their_allocation_or_repeated_are_refused() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let buf = dev.alloc(4096).expect("alloc");
    let (base, handle) = match dev.reg_export(buf.ptr + 256, false).expect("export") {
        crate::cuda::RegExport::Ipc { base, handle } => (base, handle),
        _ => panic!("a device allocation exports an IPC handle"),
    };
    assert_eq!(base, buf.ptr);
    let mut regs = PeerRegs::new(&dev).expect("table");
    let rec = |id: u64, start: u64, end: u64| Record {
        id,
        start,
        end,
        base,
        alloc: 1,
        via: Via::Ipc,
        handle,
    };
    let remote = |e: Error| {
        assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("rank 3"), "{e}");
        e.message
    };
    // A range past the 4096 bytes the handle maps (1 GiB, then one byte too many).
    for end in [base + (1 << 30), base + 4097] {
        let e = regs
            .apply(&dev, 3, 1, Some(rec(1, base + 256, end)), true)
            .expect_err("a range past its allocation");
        assert!(remote(e).contains("holds 4096"));
        assert_eq!((regs.used, count(&regs)), (0, 0), "nothing entered");
        assert!(regs.mappings.is_empty(), "the mapping was not kept");
    }
    // What the allocation holds enters.
    regs.apply(&dev, 3, 1, Some(rec(1, base + 256, base + 4096)), true)
        .expect("inside its allocation");
    assert_eq!((regs.used, count(&regs)), (1, 1));
    // The same id again, even with a good range: refused, the first entry kept.
    let e = regs
        .apply(&dev, 3, 1, Some(rec(1, base, base + 16)), true)
        .expect_err("a live id again");
    assert!(remote(e).contains("id 1 again"));
    assert_eq!((regs.used, count(&regs)), (1, 1));
    // Another id in the same (already mapped) allocation, past its end: refused.
    let e = regs
        .apply(&dev, 3, 2, Some(rec(2, base + 4000, base + 8192)), true)
        .expect_err("past the mapped allocation");
    assert!(remote(e).contains("holds 4096"));
    assert_eq!(regs.mappings.get(&(base, 1)).map(|m| m.refs), Some(1));
    // Withdrawing an id never entered changes nothing; withdrawing id 1 frees the mapping.
    regs.apply(&dev, 3, 77, None, true)
        .expect("unknown withdrawal");
    assert_eq!(regs.by_id.len(), 1);
    regs.apply(&dev, 3, 1, None, true).expect("withdrawal");
    assert!(regs.by_id.is_empty() && regs.mappings.is_empty());
    // A withdrawn id may be registered again.
    regs.apply(&dev, 3, 1, Some(rec(1, base, base + 64)), true)
        .expect("id 1 after its withdrawal");
    drop(regs);
}

/// A withdrawn registration stays mapped until the kernels launched before it are known
/// to have finished (one may still be writing through it), a record of the same
/// allocation meanwhile takes that mapping back, and the release undoes it.
#[test]
fn a_withdrawn_mapping_outlives_the_kernels_launched_before() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let buf = dev.alloc(4096).expect("alloc");
    let handle = match dev.reg_export(buf.ptr, false).expect("export") {
        crate::cuda::RegExport::Ipc { handle, .. } => handle,
        _ => panic!("a device allocation exports an IPC handle"),
    };
    let rec = |id: u64| Record {
        id,
        start: buf.ptr,
        end: buf.ptr + 4096,
        base: buf.ptr,
        alloc: 1,
        via: Via::Ipc,
        handle,
    };
    let key = (buf.ptr, 1);
    let mapped = |p: DevPtr| dev.pointer_extent(p, 1).expect("extent").is_some();
    let mut regs = PeerRegs::new(&dev).expect("table");
    regs.apply(&dev, 1, 1, Some(rec(1)), true).expect("record");
    let local = regs
        .mappings
        .get(&key)
        .map(|m| m.map.ptr())
        .expect("mapped");
    regs.apply(&dev, 1, 1, None, true).expect("withdrawal");
    assert!(
        regs.mappings.is_empty() && regs.by_id.is_empty(),
        "withdrawn"
    );
    assert!(
        mapped(local),
        "still mapped for the kernels launched before"
    );
    regs.apply(&dev, 1, 2, Some(rec(2)), true)
        .expect("the same allocation again");
    assert!(regs.retired.is_empty(), "the mapping was taken back");
    assert_eq!(regs.mappings.get(&key).map(|m| m.map.ptr()), Some(local));
    regs.apply(&dev, 1, 2, None, true).expect("withdrawal");
    assert!(mapped(local));
    // A fence that has not passed keeps it; with nothing launched it goes at once.
    regs.settle(&|| Err(Error::internal("no fence now")));
    assert!(
        mapped(local) && regs.has_retired(),
        "kept while no fence was made"
    );
    regs.settle(&|| Ok(None));
    assert!(!mapped(local), "undone: no kernel could be using it");
    // A record naming the same allocation through another handle is mapped afresh,
    // never through a retired mapping (the key alone may name a new allocation).
    let other = dev.alloc(4096).expect("alloc");
    let other_handle = match dev.reg_export(other.ptr, false).expect("export") {
        crate::cuda::RegExport::Ipc { handle, .. } => handle,
        _ => panic!("a device allocation exports an IPC handle"),
    };
    regs.apply(&dev, 1, 3, Some(rec(3)), true).expect("record");
    let third = regs
        .mappings
        .get(&key)
        .map(|m| m.map.ptr())
        .expect("mapped");
    regs.apply(&dev, 1, 3, None, true).expect("withdrawal");
    let moved = Record {
        handle: other_handle,
        ..rec(4)
    };
    regs.apply(&dev, 1, 4, Some(moved), true)
        .expect("another handle");
    let fourth = regs
        .mappings
        .get(&key)
        .map(|m| m.map.ptr())
        .expect("mapped");
    assert_ne!(third, fourth, "a fresh mapping");
    assert!(
        regs.has_retired() && mapped(third),
        "the old one still waits"
    );
}

/// Records of two allocations that the owner made at the same base (the first freed, its
/// addresses given to the second, while a registration of the first still lives) get a
/// mapping each: offers into the second never go through the mapping of the first.
#[test]
fn an_allocation_at_a_reused_base_is_mapped_apart() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let (a, b) = (
        dev.alloc(4096).expect("alloc"),
        dev.alloc(4096).expect("alloc"),
    );
    let export = |p: DevPtr| match dev.reg_export(p, false).expect("export") {
        crate::cuda::RegExport::Ipc { handle, .. } => handle,
        _ => panic!("a device allocation exports an IPC handle"),
    };
    // Both records claim a's base, as the owner would see it after reusing the addresses.
    let rec = |id: u64, alloc: u64, handle: [u8; 64]| Record {
        id,
        start: a.ptr,
        end: a.ptr + 4096,
        base: a.ptr,
        alloc,
        via: Via::Ipc,
        handle,
    };
    let mut regs = PeerRegs::new(&dev).expect("table");
    regs.apply(&dev, 2, 1, Some(rec(1, 10, export(a.ptr))), true)
        .expect("the first allocation");
    regs.apply(&dev, 2, 2, Some(rec(2, 11, export(b.ptr))), true)
        .expect("the second, at the same base");
    assert_eq!(regs.mappings.len(), 2, "one mapping per allocation");
    let local = |k: (DevPtr, u64)| regs.mappings.get(&k).map(|m| m.map.ptr());
    assert_ne!(local((a.ptr, 10)), local((a.ptr, 11)));
    // The same allocation registered again shares its mapping.
    regs.apply(&dev, 2, 3, Some(rec(3, 11, export(b.ptr))), true)
        .expect("the second again");
    assert_eq!(regs.mappings.len(), 2);
    assert_eq!(regs.mappings.get(&(a.ptr, 11)).map(|m| m.refs), Some(2));
}

/// A peer's VMM record whose owner process has exited is declined at once (its offers
/// then take copies): no error, nothing entered, nothing mapped. Timed only as a hang
/// guard.
#[test]
fn a_vmm_record_of_an_exited_owner_is_declined_at_once() {
    let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
    let dev = Device::open(0).expect("device 0");
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("start a child");
    let pid = child.id();
    child.wait().expect("the child's exit");
    let t = Ticket {
        pid,
        pid_ns: fdpass::pid_namespace(),
        start: 1,
        sock: 0,
        key: 1,
        fd: 3,
    };
    let rec = Record {
        id: 1,
        start: 0x20_0000,
        end: 0x40_0000,
        base: 0x20_0000,
        alloc: 1,
        via: Via::VmmFd,
        handle: vmm_handle(&t, 0x20_0000),
    };
    let mut regs = PeerRegs::new(&dev).expect("table");
    let t0 = std::time::Instant::now();
    regs.apply(&dev, 1, 1, Some(rec), true)
        .expect("declined, not an error");
    assert_eq!((regs.used, count(&regs)), (0, 0));
    assert!(regs.mappings.is_empty());
    let took = t0.elapsed();
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");
}

#[test]
fn offers_translate_only_inside_an_entry_of_their_allocation() {
    let e = [RegEntry {
        peer_start: 0x1000,
        peer_end: 0x2000,
        local: 0x9000,
        alloc: 7,
    }];
    assert_eq!(RegTable::translate(&e, 0x1100, 0x100, 7), Some(0x9100));
    assert_eq!(RegTable::translate(&e, 0x1f00, 0x100, 7), Some(0x9f00));
    assert_eq!(RegTable::translate(&e, 0x1f00, 0x101, 7), None);
    assert_eq!(RegTable::translate(&e, 0xf00, 0x10, 7), None);
    assert_eq!(RegTable::translate(&e, u64::MAX - 4, 0x10, 7), None);
    assert_eq!(
        RegTable::translate(&[RegEntry::default()], 0x10, 0x10, 0),
        None
    );
    // The same range in another allocation (a freed buffer's address reused): not ours to
    // write.
    assert_eq!(RegTable::translate(&e, 0x1100, 0x100, 8), None);
}
