//! The connections between ranks: opening one to a peer (with its greeting), accepting peers'
//! connections, checking their greetings, and reading their frames into the mailbox.

use super::*;
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
        let connected = match live {
            true => socket::connect_to_live(addr, deadline, give_up),
            false => socket::connect(addr, deadline, give_up),
        };
        let stream = match connected {
            Ok(s) => s,
            Err(e) if live && e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
            Err(e) => {
                return Err(Error::remote(format!(
                    "bootstrap rank {rank}: cannot connect to rank {peer} at {addr}: {e}"
                )))
            }
        };
        let Some(key) = shared.key_now(peer) else {
            return Err(Error::internal(format!(
                "bootstrap rank {rank}: no key for the pair with rank {peer} yet"
            )));
        };
        let Some(id) = shared.register(&stream) else {
            return Err(shared
                .check_open()
                .err()
                .unwrap_or_else(|| Error::system("bootstrap: cannot duplicate a socket")));
        };
        let hello = wire::encode_connect(&Connect {
            nonce: shared.nonce,
            from: rank as u32,
            nranks: shared.nranks as u32,
            key,
        });
        let out = Outgoing {
            stream,
            id,
            write_timeout: None,
        };
        if let Err(e) = socket::write_frame(&out.stream, &hello, deadline) {
            shared.unregister(id);
            return Err(Error::remote(format!(
                "bootstrap rank {rank}: cannot greet rank {peer} at {addr}: {e}"
            )));
        }
        Ok(Some(out))
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

pub(super) fn accept_loop(shared: Arc<Shared>, listener: Socket) {
    loop {
        // At most MAX_HANDSHAKES connections in their greeting at once: past that, new ones
        // wait in the kernel's backlog (no thread, no descriptor of ours) until one is through.
        let Some(permit) = shared.handshakes.enter(|| shared.is_closed()) else {
            return;
        };
        let accepted = listener.accept();
        if shared.is_closed() {
            return;
        }
        match accepted {
            Ok((sock, _)) => {
                let stream: TcpStream = sock.into();
                if let Err(e) = socket::bound_silence(&stream) {
                    log::warn!(
                        "bootstrap rank {}: cannot bound a peer's silence (keepalive, \
                         TCP_USER_TIMEOUT): {e}",
                        shared.rank
                    );
                }
                let Some(id) = shared.register(&stream) else {
                    return;
                };
                let s = shared.clone();
                if let Err(e) =
                    sockets::spawn("nccl-bs-recv", move || read_peer(&s, stream, id, permit))
                {
                    log::warn!("bootstrap rank {}: cannot start a reader: {e}", shared.rank);
                    shared.unregister(id);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("bootstrap rank {}: accept failed: {e}", shared.rank);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Checks the `Connect` greeting of an incoming connection: this bootstrap's nonce, a rank in
/// range, and the key of the pair (that rank, this one), compared in constant time: a process
/// that knows only the unique id cannot pass as a rank, nor can another member, which holds
/// the keys of its own pairs only. The sender's rank if all holds.
pub(super) fn greeting(shared: &Shared, stream: &TcpStream) -> std::result::Result<usize, String> {
    let deadline = sockets::deadline_after(socket::handshake_wait());
    let body =
        socket::read_frame(stream, wire::MAX_CTRL_BODY, deadline).map_err(|e| e.to_string())?;
    let c = match wire::decode(&body) {
        Ok(Msg::Connect(c)) if c.nonce == shared.nonce && c.nranks as usize == shared.nranks => c,
        Ok(_) => return Err("not a greeting of this bootstrap".into()),
        Err(e) => return Err(e.message),
    };
    let from = c.from as usize;
    if from >= shared.nranks || from == shared.rank {
        return Err(format!("a greeting as rank {from}, which cannot call us"));
    }
    match shared.key_of(from, deadline) {
        Some(k) if same_key(k, c.key) => Ok(from),
        Some(_) => Err(format!(
            "a greeting as rank {from} without the key of our pair (not rank {from})"
        )),
        None => Err(format!(
            "a greeting as rank {from}, the key of whose pair with us is not known yet"
        )),
    }
}

pub(super) fn read_peer(shared: &Shared, stream: TcpStream, id: u64, permit: socket::Permit) {
    let rank = shared.rank;
    let _ = stream.set_nodelay(true);
    let greeted = greeting(shared, &stream);
    drop(permit);
    let from = match greeted {
        Ok(f) => f,
        Err(why) => {
            if !shared.is_closed() {
                let who = stream.peer_addr().map(|a| a.to_string());
                log::warn!(
                    "bootstrap rank {rank}: dropping an incoming connection from {}: {why}",
                    who.as_deref().unwrap_or("?")
                );
            }
            shared.unregister(id);
            return;
        }
    };
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
                ..
            }) => {
                let r = lock(&shared.ras).clone();
                if let Some(r) = r {
                    r(from, tag);
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
