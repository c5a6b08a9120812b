//! The connections between ranks: opening one to a peer (with its greeting), accepting peers'
//! connections, checking their greetings, and reading their frames into the mailbox.

use super::*;
use crate::bootstrap::doorway::{self, Limits};
use crate::bootstrap::keys::Purpose;
use crate::sockets;

/// This rank's connection to one peer.
pub(crate) struct Outgoing {
    stream: TcpStream,
    id: u64,
    write_timeout: Option<Duration>,
}

impl Outgoing {
    /// Connects to `peer` at `addr` and introduces ourselves.
    pub(crate) fn open(
        shared: &Shared,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> Result<Outgoing> {
        Self::open_inner(shared, peer, addr, deadline, false)?
            .ok_or_else(|| Error::internal("bootstrap: a refused connect counted as final"))
    }

    /// As [`Outgoing::open`] to a peer whose listener was up (after init): None, at once,
    /// when the connection is refused (nothing listens there now: the peer is gone).
    pub(crate) fn open_to_live(
        shared: &Shared,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> Result<Option<Outgoing>> {
        Self::open_inner(shared, peer, addr, deadline, true)
    }

    fn open_inner(
        shared: &Shared,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
        live: bool,
    ) -> Result<Option<Outgoing>> {
        let rank = shared.rank;
        let give_up = || shared.is_closed();
        let mut knocks = 0u32;
        loop {
            let connected = match live {
                true => socket::connect_to_live(addr, deadline, give_up),
                false => socket::connect(addr, deadline, give_up),
            };
            let stream = match connected {
                Ok(s) => s,
                Err(e) if live && e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Ok(None)
                }
                Err(e) => {
                    return Err(Error::remote(format!(
                        "bootstrap rank {rank}: cannot connect to rank {peer} at {addr}: {e}"
                    )))
                }
            };
            let Some(id) = shared.register(&stream) else {
                return Err(shared
                    .check_open()
                    .err()
                    .unwrap_or_else(|| Error::system("bootstrap: cannot duplicate a socket")));
            };
            match greet(shared, &stream, peer, deadline) {
                Ok(()) => {
                    let _ = stream.set_read_timeout(None);
                    return Ok(Some(Outgoing {
                        stream,
                        id,
                        write_timeout: None,
                    }));
                }
                Err(Greeting::ClosedAtTheDoor(_)) if Instant::now() < deadline => {
                    // Refused by, or pushed out of, a full doorway (see `doorway.rs`): knock
                    // again after a pause.
                    shared.unregister(id);
                    knocks += 1;
                    std::thread::sleep(socket::knock_pause(knocks));
                }
                Err(Greeting::ClosedAtTheDoor(e) | Greeting::Failed(e)) => {
                    shared.unregister(id);
                    shared.check_open()?;
                    return Err(Error::remote(format!(
                        "bootstrap rank {rank}: cannot greet rank {peer} at {addr}: {e}"
                    )));
                }
            }
        }
    }

    /// Writes one frame. On error the connection is unusable: the caller must `discard` it.
    pub(crate) fn write(&mut self, frame: &[u8], timeout: Duration) -> std::io::Result<()> {
        if self.write_timeout != Some(timeout) {
            self.stream.set_write_timeout(Some(timeout))?;
            self.write_timeout = Some(timeout);
        }
        let mut w = &self.stream;
        std::io::Write::write_all(&mut w, frame)
    }

    pub(crate) fn discard(self, shared: &Shared) {
        let _ = self.stream.shutdown(Shutdown::Both);
        shared.unregister(self.id);
    }
}

/// Why a greeting did not go through.
enum Greeting {
    /// The peer closed the connection before its proof: it may have pushed it out of its
    /// doorway for newer ones, so another try can succeed.
    ClosedAtTheDoor(String),
    Failed(String),
}

/// The connector's half of the greeting: the peer's challenge, our greeting MACed with the key
/// of the pair over both challenges, and the peer's proof that it holds that key too.
fn greet(
    shared: &Shared,
    stream: &TcpStream,
    peer: usize,
    deadline: Instant,
) -> std::result::Result<(), Greeting> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => Greeting::ClosedAtTheDoor(e.to_string()),
        _ => Greeting::Failed(e.to_string()),
    };
    let body = socket::read_frame(stream, wire::MAX_CTRL_BODY, deadline).map_err(closed)?;
    let challenge = match wire::decode(&body) {
        Ok(Msg::Challenge(c)) if c.nonce == shared.nonce => c.challenge,
        Ok(Msg::Challenge(_)) => {
            return Err(Greeting::Failed(
                "it listens for another bootstrap (the rank is gone and its port reused?)".into(),
            ))
        }
        Ok(_) => return Err(Greeting::Failed("it sent no challenge".into())),
        Err(e) => return Err(Greeting::Failed(e.message)),
    };
    let mine = keys::random_u128().map_err(|e| Greeting::Failed(e.message))?;
    let (from, n) = (shared.rank as u32, shared.nranks as u32);
    let fields = wire::greet_fields(challenge, mine, from, peer as u32, n);
    let key = shared.key_with(peer);
    let hello = wire::encode_connect(&Connect {
        nonce: shared.nonce,
        from,
        nranks: n,
        challenge: mine,
        mac: keys::mac(key, Purpose::Greet, &[&fields]),
    });
    socket::write_frame(stream, &hello, deadline).map_err(closed)?;
    let body = socket::read_frame(stream, wire::MAX_CTRL_BODY, deadline).map_err(closed)?;
    match wire::decode(&body) {
        Ok(Msg::Proof { mac })
            if keys::same_mac(mac, keys::mac(key, Purpose::Proof, &[&fields])) =>
        {
            Ok(())
        }
        Ok(_) | Err(_) => Err(Greeting::Failed(format!(
            "it could not prove that it is rank {peer} of this bootstrap (another process on \
             its address?)"
        ))),
    }
}

/// Serves the rank's listener through a doorway (`doorway.rs`) until the bootstrap closes.
pub(super) fn accept_loop(shared: Arc<Shared>, listener: Socket) {
    let mut door = RankDoor {
        shared,
        rejections: sockets::Rejections::default(),
    };
    doorway::serve(&listener, Limits::bootstrap(wire::MAX_CTRL_BODY), &mut door);
}

/// A rank's side of its doorway: greetings checked, proofs sent, readers started.
struct RankDoor {
    shared: Arc<Shared>,
    rejections: sockets::Rejections,
}

impl doorway::Owner for RankDoor {
    fn stopped(&self) -> bool {
        self.shared.is_closed()
    }

    fn challenge(&mut self) -> Option<(u128, Vec<u8>)> {
        let c = keys::random_u128().ok()?;
        let frame = wire::encode_challenge(&wire::Challenge {
            nonce: self.shared.nonce,
            challenge: c,
        });
        Some((c, frame))
    }

    fn admit(
        &mut self,
        stream: TcpStream,
        challenge: u128,
        body: Vec<u8>,
    ) -> std::result::Result<(), String> {
        let shared = &self.shared;
        let (from, fields) = greeting(shared, challenge, &body)?;
        let key = shared.key_with(from);
        let proof = wire::encode_proof(keys::mac(key, Purpose::Proof, &[&fields]));
        socket::write_frame(
            &stream,
            &proof,
            sockets::deadline_after(Duration::from_secs(1)),
        )
        .map_err(|e| format!("cannot send rank {from} our proof: {e}"))?;
        if let Err(e) = socket::bound_silence(&stream) {
            log::warn!(
                "bootstrap rank {}: cannot bound a peer's silence (keepalive, \
                 TCP_USER_TIMEOUT): {e}",
                shared.rank
            );
        }
        let Some(id) = shared.register(&stream) else {
            return Err("the bootstrap is closed".into());
        };
        let s = shared.clone();
        if let Err(e) = sockets::spawn("nccl-bs-recv", move || read_peer(&s, stream, id, from)) {
            shared.unregister(id);
            return Err(format!("cannot start a reader: {e}"));
        }
        Ok(())
    }

    fn rejected(&mut self, from: SocketAddr, why: &str) {
        if self.shared.is_closed() {
            return;
        }
        let rank = self.shared.rank;
        self.rejections.warn(|| {
            format!("bootstrap rank {rank}: dropping an incoming connection from {from}: {why}")
        });
    }
}

/// Checks the `Connect` greeting of an incoming connection: this bootstrap's nonce and size, a
/// rank in range, and the MAC of the pair (that rank, this one) over our challenge and the
/// connector's, compared in constant time: a process that holds no unique id of this job
/// cannot pass as a rank, and a greeting recorded on one connection is worth nothing on
/// another (its challenge differs). The sender's rank, and the fields its MAC covered (what
/// our proof covers too), if all holds.
pub(super) fn greeting(
    shared: &Shared,
    challenge: u128,
    body: &[u8],
) -> std::result::Result<(usize, Vec<u8>), String> {
    let c = match wire::decode(body) {
        Ok(Msg::Connect(c)) if c.nonce == shared.nonce && c.nranks as usize == shared.nranks => c,
        Ok(_) => return Err("not a greeting of this bootstrap".into()),
        Err(e) => return Err(e.message),
    };
    let from = c.from as usize;
    if from >= shared.nranks || from == shared.rank {
        return Err(format!("a greeting as rank {from}, which cannot call us"));
    }
    let fields = wire::greet_fields(challenge, c.challenge, c.from, shared.rank as u32, c.nranks);
    let want = keys::mac(shared.key_with(from), Purpose::Greet, &[&fields]);
    if keys::same_mac(want, c.mac) {
        Ok((from, fields))
    } else {
        Err(format!(
            "a greeting as rank {from} without the proof of our pair (not rank {from}, or a \
             replay)"
        ))
    }
}

pub(super) fn read_peer(shared: &Shared, stream: TcpStream, id: u64, from: usize) {
    let rank = shared.rank;
    let _ = stream.set_nodelay(true);
    shared.peer_opened(from);
    // No read timeout from here on: an idle peer is normal, and `take` carries the deadlines.
    let _ = stream.set_read_timeout(None);
    let mut r = BufReader::with_capacity(64 << 10, &stream);
    let why = loop {
        // A peer that sends faster than we take holds only the budget here; the rest stays
        // in TCP's buffers and then in the sender's (whose send times out).
        if !shared.wait_for_room(from) {
            break "closed".to_string();
        }
        let mut body = match socket::read_frame_untimed(&mut r, wire::MAX_DATA_BODY) {
            Ok(Some(b)) => {
                shared.heard_from(from, false);
                b
            }
            Ok(None) => break "closed by the peer".to_string(),
            Err(e) => break e.to_string(),
        };
        let (channel, tag, header) = match wire::decode(&body) {
            Ok(Msg::Data {
                channel: Channel::Leave,
                ..
            }) => {
                shared.peer_left(from);
                continue;
            }
            Ok(Msg::Data {
                channel: Channel::Beat,
                ..
            }) => {
                shared.heard_from(from, true);
                continue;
            }
            Ok(Msg::Data {
                channel: Channel::Ras,
                tag,
                payload,
            }) => {
                let r = lock(&shared.ras).clone();
                if let Some(r) = r {
                    r(from, tag, payload);
                }
                continue;
            }
            Ok(Msg::Data {
                channel: Channel::Fault,
                tag,
                payload,
            }) => {
                // A rank number from a peer: checked before use.
                if tag as usize >= shared.nranks || payload.len() > wire::MAX_FAIL_TEXT {
                    break format!("a fault notice out of range (rank {tag})");
                }
                shared.reported(Fault {
                    dead: tag as usize,
                    hung: false,
                    reported_by: Some(from),
                    why: String::from_utf8_lossy(payload).into_owned(),
                });
                continue;
            }
            Ok(Msg::Data {
                channel,
                tag,
                payload,
            }) => (channel, tag, body.len() - payload.len()),
            Ok(_) => break "unexpected message".to_string(),
            Err(e) => break e.message,
        };
        body.drain(..header);
        shared.deliver(from, channel, tag, body);
    };
    if !shared.is_closed() {
        log::debug!("bootstrap rank {rank}: connection from rank {from} ended: {why}");
    }
    shared.peer_closed(from, why);
    shared.unregister(id);
}
