//! Listening and connecting: loopback over IPv4 and IPv6, strangers and floods at the
//! listener, tags, interfaces and their selection, the geometry NCCL allows.

use super::*;

#[test]
fn ipv6_loopback() {
    let net = match SocketNet::with_options(opts(2, 1, Family::V6)) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback address ({e})");
            return;
        }
    };
    assert_eq!(net.address(0).unwrap(), IpAddr::V6(Ipv6Addr::LOCALHOST));
    let (mut s, mut r) = pair(&net);
    let mut a = Rng(9).bytes(1 << 20);
    let mut b = vec![0u8; 1 << 20];
    let smr = reg_send(s.as_mut(), &mut a);
    let rmr = reg_recv(r.as_mut(), &mut b);
    let rq = r.irecv(&[recv_buf(rmr, b.len())]).unwrap().unwrap();
    let sq = s.isend(smr, 0, a.len(), 0).unwrap().unwrap();
    assert_eq!(wait_send(s.as_mut(), sq).unwrap(), 1 << 20);
    assert_eq!(wait_recv(r.as_mut(), rq).unwrap(), vec![1 << 20]);
    assert!(a == b);
}

#[test]
fn listener_ignores_strangers_and_gives_up_on_incomplete_connections() {
    let net = SocketNet::with_options(SocketOptions {
        handshake_timeout: Duration::from_millis(300),
        ..opts(1, 2, Family::V4)
    })
    .unwrap();
    let (handle, mut listener) = net.listen(0).unwrap();
    let info = wire::decode_handle(&handle).unwrap();
    assert_eq!(info.addr.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    // A stranger writing garbage is dropped.
    let mut stranger = TcpStream::connect(info.addr).unwrap();
    stranger.write_all(&[0xee; wire::HELLO_BYTES]).unwrap();
    // A control socket whose data sockets never come.
    let mut half = TcpStream::connect(info.addr).unwrap();
    let hello = wire::encode_hello(&wire::Hello {
        tag: info.tag,
        conn: wire::ConnId { pid: 1, serial: 1 },
        data_index: None,
        nthreads: 1,
        nsocks: 2,
    });
    half.write_all(&hello).unwrap();
    // A real connection still gets through.
    let mut c = net.connect(0, &handle).unwrap();
    let mut got_comm = false;
    let e = wait("the incomplete connection's error", || {
        if !got_comm {
            let _ = c.poll().unwrap();
        }
        match listener.accept() {
            Ok(Some(_)) => {
                got_comm = true;
                None
            }
            Ok(None) => None,
            Err(e) => Some(e),
        }
    });
    assert!(got_comm, "the real connection was not accepted first");
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("1 of its 3 sockets"), "{}", e.message);
    drop((stranger, half));
}

/// A flood of 4,000 silent connections to a listener holds at most `MAX_PENDING` of its
/// descriptors (newer sockets push the oldest waiting ones out), and a real connection made
/// while the flood is held gets through with the default deadlines: its sockets say hello at
/// once and are read in the call that accepts them. (Before, 128 silent sockets held for up to
/// the connection timeout kept every later one in the backlog.)
#[test]
fn a_flood_of_silent_connections_holds_few_descriptors() {
    crate::test_aids::allow_descriptors(16384);
    let net = SocketNet::with_options(opts(1, 2, Family::V4)).unwrap();
    let (handle, mut listener) = net.listen(0).unwrap();
    let info = wire::decode_handle(&handle).unwrap();
    let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let flood_size = 4000;
    let before = fds();
    let flood: Vec<_> = (0..flood_size)
        .map(|_| TcpStream::connect(info.addr).unwrap())
        .collect();
    // Until the whole flood left the backlog (each call takes at most 64).
    for _ in 0..flood_size / 32 {
        assert!(listener.accept().unwrap().is_none(), "nobody greeted");
    }
    // This process holds the flood's own sockets too; the listener may add MAX_PENDING. (Other
    // tests open and close sockets meanwhile: a wide margin, far below twice the flood.)
    let during = fds();
    assert!(
        during <= before + flood_size + handshake::MAX_PENDING + 100,
        "{flood_size} silent connections: descriptors {before} -> {during}"
    );
    let start = Instant::now();
    let mut c = net.connect(0, &handle).unwrap();
    let mut sender = None;
    let _receiver = wait("the real connection behind the flood", || {
        if sender.is_none() {
            sender = c.poll().unwrap();
        }
        listener.accept().unwrap()
    });
    eprintln!(
        "a connection behind {flood_size} silent ones: accepted in {:?}, descriptors {before} -> \
         {during} during the flood",
        start.elapsed()
    );
    drop(flood);
}

/// A listener's tag shows neither the process id nor a counter, and one tag says nothing of
/// the next: two tags of one process differ in more than a counter's low bits (a secret
/// masking a counter made their XOR a small number, so one handle gave every tag away).
#[test]
fn listener_tags_are_unrelated() {
    let (a, b) = (handshake::next_tag(), handshake::next_tag());
    assert_ne!(a >> 96, u128::from(std::process::id()), "{a:#x}");
    assert!(a ^ b > u128::from(u32::MAX), "{a:#x} and {b:#x}");
}

#[test]
fn connect_to_nobody_fails_in_time() {
    let net = lo_net(1, 1);
    let (handle, listener) = net.listen(0).unwrap();
    drop(listener);
    let e = match net.connect(0, &handle) {
        Err(e) => e,
        Ok(mut c) => wait("connect's failure", || c.poll().err()),
    };
    assert_eq!(e.code, NcclResult::RemoteError);
    assert!(e.message.contains("127.0.0.1"), "{}", e.message);
    let zero = [0u8; crate::net::HANDLE_BYTES];
    assert_eq!(
        net.connect(0, &zero).err().map(|e| e.code),
        Some(NcclResult::InvalidArgument)
    );
    assert!(net.connect(1, &handle).is_err());
}

#[test]
fn loopback_properties() {
    let net = SocketNet::with_ifname("=lo").unwrap();
    assert_eq!(net.name(), "Socket");
    assert_eq!(net.ndevs(), 1);
    let p = net.properties(0).unwrap();
    assert_eq!(p.name, "lo");
    assert_eq!(p.guid, 0);
    assert_eq!(p.ptr_support, PTR_HOST);
    // lo has no PCI device and no speed in sysfs.
    assert_eq!(p.pci_path, "");
    assert_eq!(p.speed_mbps, DEFAULT_SPEED_MBPS);
    assert_eq!((p.latency_us, p.port), (0.0, 0));
    assert_eq!((p.max_comms, p.max_recvs), (65536, 1));
    assert_eq!(net.geometry(0).unwrap(), (1, 1));
    assert!(net.properties(1).is_err());
}

#[test]
fn unknown_interface_lists_the_real_ones() {
    let e = SocketNet::with_ifname("=no-such-if0")
        .err()
        .expect("must fail");
    assert_eq!(e.code, NcclResult::InvalidUsage);
    assert!(e.message.contains("no-such-if0"), "{}", e.message);
    assert!(e.message.contains("lo (127.0.0.1"), "{}", e.message);
}

#[test]
fn geometry_is_clamped_as_nccl() {
    let o = |t, s| SocketOptions {
        nthreads: t,
        nsocks_per_thread: s,
        ..SocketOptions::default()
    };
    assert_eq!(super::geometry(&o(0, 0), "lo"), (1, 1));
    assert_eq!(super::geometry(&o(4, 4), "lo"), (4, 4));
    assert_eq!(super::geometry(&o(40, 1), "lo"), (16, 1));
    assert_eq!(super::geometry(&o(16, 8), "lo"), (16, 4));
    assert_eq!(super::geometry(&o(3, 64), "lo"), (3, 21));
}

fn addrs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
    list.iter()
        .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
        .collect()
}

fn names(v: &[(String, IpAddr)]) -> Vec<&str> {
    v.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn interface_selection() {
    let all = addrs(&[
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("eth0", "fe80::1"),
        ("eth0", "10.0.0.2"),
        ("eth1", "fd00::5"),
        ("docker0", "172.17.0.1"),
        ("virbr0", "192.168.122.1"),
        ("ens1f0", "10.2.0.2"),
        ("ens1f0", "fd00::7"),
    ]);
    let sel = |spec: Option<&str>, fam| ifaces::select(&all, spec, fam);
    // Default: not lo, docker*, virbr*; IPv4 first within an interface.
    let d = sel(None, None).unwrap();
    assert_eq!(names(&d), ["eth0", "eth1", "ens1f0"]);
    assert_eq!(d[0].1, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(d[1].1, "fd00::5".parse::<IpAddr>().unwrap());
    // ib* first when there is one.
    let mut with_ib = all.clone();
    with_ib.extend(addrs(&[("ib0", "10.9.0.1")]));
    assert_eq!(
        names(&ifaces::select(&with_ib, None, None).unwrap()),
        ["ib0"]
    );
    // docker/virbr, then lo, only when nothing else exists.
    let few = addrs(&[("lo", "127.0.0.1"), ("docker0", "172.17.0.1")]);
    assert_eq!(
        names(&ifaces::select(&few, None, None).unwrap()),
        ["docker0"]
    );
    let lo = addrs(&[("lo", "127.0.0.1")]);
    assert_eq!(names(&ifaces::select(&lo, None, None).unwrap()), ["lo"]);
    // Prefixes, exclusions, exact names.
    assert_eq!(names(&sel(Some("eth"), None).unwrap()), ["eth0", "eth1"]);
    assert_eq!(
        names(&sel(Some("ens,dock"), None).unwrap()),
        ["docker0", "ens1f0"]
    );
    assert_eq!(
        names(&sel(Some("^eth,lo"), None).unwrap()),
        ["docker0", "virbr0", "ens1f0"]
    );
    assert_eq!(names(&sel(Some("=eth0"), None).unwrap()), ["eth0"]);
    assert_eq!(
        names(&sel(Some("^=eth0"), None).unwrap()),
        ["lo", "eth1", "docker0", "virbr0", "ens1f0"]
    );
    assert_eq!(names(&sel(Some("=eth0,=eth1"), None).unwrap()), ["eth0"]);
    assert_eq!(
        names(&sel(Some("=eth0,eth1"), None).unwrap()),
        ["eth0", "eth1"]
    );
    // Families: link-local IPv6 does not count.
    assert_eq!(
        names(&sel(Some("eth"), Some(Family::V6)).unwrap()),
        ["eth1"]
    );
    let v6 = sel(None, Some(Family::V6)).unwrap();
    assert_eq!(names(&v6), ["eth1", "ens1f0"]);
    assert_eq!(v6[1].1, "fd00::7".parse::<IpAddr>().unwrap());
    assert_eq!(
        sel(Some("=lo"), Some(Family::V6)).unwrap()[0].1,
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    );
    // Nothing matches: the error names the value and what exists.
    let e = sel(Some("=eth"), None).unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage);
    assert!(
        e.message.contains("NCCL_SOCKET_IFNAME==eth"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("eth0 (fe80::1, 10.0.0.2)"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("ens1f0 (10.2.0.2, fd00::7)"),
        "{}",
        e.message
    );
    let e = sel(Some("=eth1"), Some(Family::V4)).unwrap_err();
    assert!(e.message.contains("AF_INET"), "{}", e.message);
    // No interface at all.
    let e = ifaces::select(&[], None, None).unwrap_err();
    assert_eq!(e.code, NcclResult::SystemError);
    assert!(e.message.contains("none"), "{}", e.message);
    // At most 16 devices.
    let many: Vec<(String, IpAddr)> = (0..20u8)
        .map(|i| {
            (
                format!("eth{i}"),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, i + 1)),
            )
        })
        .collect();
    assert_eq!(
        ifaces::select(&many, None, None).unwrap().len(),
        ifaces::MAX_IFS
    );
    // Family names.
    assert_eq!(Family::parse("AF_INET"), Some(Family::V4));
    assert_eq!(Family::parse("af_inet6"), Some(Family::V6));
    assert_eq!(Family::parse("AF_UNIX"), None);
}
