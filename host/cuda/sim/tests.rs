//! The simulator backend's own tests: memory, IPC names, streams, events, VMM, multicast.

use super::*;

/// The size inside an IPC handle comes from a peer: one larger than the shared region is
/// refused (it used to be mapped and recorded as that size, so accesses past the real
/// region faulted); the true size opens.
#[test]
fn an_ipc_handle_claiming_more_than_its_region_is_refused() {
    let dev = Device::open(0).expect("simulated device");
    let p = dev.alloc(4096).expect("alloc");
    let mut h = dev.ipc_handle(p).expect("handle");
    h[4..12].copy_from_slice(&(1u64 << 30).to_le_bytes());
    let e = dev.open_ipc(&h).expect_err("a lying size");
    assert_eq!(e.code, crate::error::NcclResult::InvalidArgument, "{e}");
    assert!(e.message.contains("claims 1073741824 bytes"), "{e}");
    h[4..12].copy_from_slice(&4096u64.to_le_bytes());
    let q = dev.open_ipc(&h).expect("the true size");
    dev.close_ipc(q).expect("close");
    dev.free(p).expect("free");
}

/// A handle naming a shared memory object that is no simulated allocation (another
/// program's, or an SHM transport segment) is refused before it is mapped.
#[test]
fn an_ipc_handle_naming_another_object_is_refused() {
    let dev = Device::open(0).expect("simulated device");
    let foreign = crate::test_aids::ForeignObject::create("peervalues-sim-foreign", 4096);
    let p = dev.alloc(4096).expect("alloc");
    let good = dev.ipc_handle(p).expect("handle");
    let good_name = {
        let end = good[12..]
            .iter()
            .position(|&b| b == 0)
            .map_or(64, |i| 12 + i);
        String::from_utf8(good[12..end].to_vec()).expect("utf-8")
    };
    for name in [
        foreign.name.as_str(),
        "/ncclrs-1@2-shm-3-0to1",
        &format!("{good_name}-x"),
        &format!("{good_name}/x"),
    ] {
        let mut h = good;
        h[12..].fill(0);
        h[12..12 + name.len()].copy_from_slice(name.as_bytes());
        let e = dev.open_ipc(&h).expect_err("a foreign object");
        assert_eq!(e.code, crate::error::NcclResult::InvalidArgument, "{e}");
        assert!(
            e.message.contains("not a simulated device allocation"),
            "{e}"
        );
    }
    let q = dev.open_ipc(&good).expect("a true handle");
    dev.close_ipc(q).expect("close");
    dev.free(p).expect("free");
}

/// A VMM allocation has no IPC handle (as with `cuIpcGetMemHandle`), but its descriptor
/// maps the same memory elsewhere; an import claiming more than the memory is refused,
/// and other memory has no descriptor.
#[test]
fn vmm_memory_is_shared_by_its_descriptor_only() {
    use std::os::fd::AsFd;
    let dev = Device::open(0).expect("simulated device");
    let (p, size) = dev.alloc_vmm(1000, true).expect("alloc_vmm");
    assert_eq!(size, SIM_VMM_GRANULARITY);
    assert!(dev.ipc_handle(p).is_err());
    dev.copy_htod(p + 100, &[1, 2, 3]).unwrap();
    let (base, bytes, fd, _) = dev.vmm_export(p + 100).expect("export").expect("VMM");
    assert_eq!((base, bytes), (p, size));
    assert!(dev.vmm_import(fd.as_fd(), size + 1).is_err());
    let before = vmm_imports();
    let (q, _) = dev.vmm_import(fd.as_fd(), size).expect("import");
    assert_eq!(vmm_imports(), before + 1);
    assert_ne!(q, p);
    let mut got = [0u8; 3];
    dev.copy_dtoh(&mut got, q + 100).unwrap();
    assert_eq!(got, [1, 2, 3]);
    dev.copy_htod(q + 5, &[9]).unwrap();
    dev.copy_dtoh(&mut got[..1], p + 5).unwrap();
    assert_eq!(got[0], 9);
    dev.vmm_unmap(q, size, 0).expect("unmap");
    dev.free(p).expect("free");
    let plain = dev.alloc(64).expect("alloc");
    assert!(dev.vmm_export(plain).expect("no error").is_none());
    dev.free(plain).expect("free");
}
