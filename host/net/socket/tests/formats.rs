//! What goes on the wire: headers and handles, and how a message is cut into pieces.

use super::*;

#[test]
fn wire_formats() {
    for addr in ["127.0.0.1:4242", "[::1]:65535", "[fd00::1:2]:1"] {
        let h = wire::HandleInfo {
            addr: addr.parse().unwrap(),
            tag: 0x1234_5678_9abc_def0,
        };
        let b = wire::encode_handle(&h);
        assert_eq!(wire::decode_handle(&b).unwrap(), h);
    }
    let mut b = wire::encode_handle(&wire::HandleInfo {
        addr: "127.0.0.1:1".parse().unwrap(),
        tag: 1,
    });
    b[9] = 5;
    assert_eq!(
        wire::decode_handle(&b).unwrap_err().code,
        NcclResult::InvalidArgument
    );
    let hello = wire::Hello {
        tag: 77,
        conn: wire::ConnId {
            pid: 1234,
            serial: 99,
        },
        data_index: Some(15),
        nthreads: 4,
        nsocks: 4,
    };
    let b = wire::encode_hello(&hello);
    assert_eq!(wire::decode_hello(&b).unwrap(), hello);
    let ctrl = wire::Hello {
        data_index: None,
        ..hello
    };
    assert_eq!(
        wire::decode_hello(&wire::encode_hello(&ctrl)).unwrap(),
        ctrl
    );
    for bad in [
        wire::Hello {
            data_index: Some(16),
            ..hello
        },
        wire::Hello {
            nthreads: 17,
            nsocks: 1,
            ..hello
        },
        wire::Hello {
            nthreads: 8,
            nsocks: 9,
            data_index: None,
            ..hello
        },
    ] {
        assert!(wire::decode_hello(&wire::encode_hello(&bad)).is_err());
    }
    for inline in [false, true] {
        let h = wire::encode_header(123_456, 9, inline);
        assert_eq!(wire::decode_header(&h), Some((123_456, 9, inline)));
        let mut h = h;
        h[15] ^= 2;
        assert_eq!(wire::decode_header(&h), None);
    }
    // The two check words differ in their last bit only: each flip of it is the other way.
    let mut h = wire::encode_header(7, 1, false);
    h[12] ^= 1;
    assert_eq!(wire::decode_header(&h), Some((7, 1, true)));
}

#[test]
fn pieces_cover_each_message_once() {
    for nsocks in [1usize, 2, 3, 16, 64] {
        for len in [
            0usize,
            1,
            wire::MIN_CHUNK - 1,
            wire::MIN_CHUNK,
            wire::MIN_CHUNK + 1,
            300_001,
            1 << 20,
            (64 << 20) + 7,
        ] {
            let mut next = 0;
            let mut used = 0;
            for i in 0..nsocks {
                let r = wire::piece(len, nsocks, i);
                if r.is_empty() {
                    continue;
                }
                assert_eq!(r.start, next, "len {len} nsocks {nsocks} socket {i}");
                assert!(r.len() >= wire::MIN_CHUNK.min(len - r.start));
                next = r.end;
                used += 1;
            }
            // Whatever a sender's inline limit, a message it sends in pieces is covered (an
            // empty one by no piece).
            assert_eq!(next, len, "len {len} nsocks {nsocks}");
            assert_eq!(used == 0, len == 0, "len {len} nsocks {nsocks}");
        }
    }
    let d = wire::DEFAULT_INLINE_BELOW;
    assert!(wire::sends_inline(0, d) && wire::sends_inline(4096, d));
    assert!(!wire::sends_inline(d, d) && !wire::sends_inline(1 << 20, d));
    assert!(wire::sends_inline(0, 0) && !wire::sends_inline(1, 0));
    assert!(wire::sends_inline(1 << 20, 2 << 20));
    // 16 sockets each carry 4 MiB of 64 MiB.
    assert_eq!(wire::piece(64 << 20, 16, 15), (60 << 20)..(64 << 20));
    assert_eq!(wire::thread_of(5, 4), 1);
}
