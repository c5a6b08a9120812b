//! Reading the control socket's stream: headers, inline payloads, and a stash of bytes read
//! ahead.

use super::*;

/// The receiving end's place in the control socket's stream.
pub(super) struct Reader {
    pub(super) reading: Reading,
    pub(super) stash: Stash,
}

/// Bytes read from the control socket ahead of the message being parsed. A small message's
/// header and payload come in one read this way (one system call instead of three: header,
/// payload, and the next header's "nothing yet").
pub(super) struct Stash {
    pub(super) buf: Box<[u8]>,
    /// The unconsumed bytes are `buf[start..end]`.
    pub(super) start: usize,
    pub(super) end: usize,
    /// The socket had no more bytes at the last read of this pass: the next read of the pass
    /// answers "nothing there" without a system call (bytes that arrive meanwhile are read
    /// on the next pass).
    pub(super) drained: bool,
}

/// The stash's size: a small message with its header, and the start of the next.
pub(super) const STASH_BYTES: usize = 8 << 10;

impl Stash {
    pub(super) fn new() -> Stash {
        Stash {
            buf: vec![0; STASH_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            drained: false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Like [`read_now`], served from the stash first; a read for fewer bytes than the stash
    /// holds refills it, a larger one goes straight into `dst`.
    pub(super) fn read(
        &mut self,
        s: &Socket,
        dst: &mut [MaybeUninit<u8>],
    ) -> io::Result<Option<usize>> {
        if dst.is_empty() {
            return Ok(Some(0));
        }
        if self.is_empty() {
            if self.drained {
                return Ok(None);
            }
            if dst.len() >= self.buf.len() {
                let got = read_now(s, dst)?;
                self.drained = got.is_none_or(|n| n < dst.len());
                return Ok(got);
            }
            // SAFETY: the stash's bytes are initialized (zeroed at creation); viewing them as
            // MaybeUninit for the socket to overwrite is sound.
            let room = unsafe {
                std::slice::from_raw_parts_mut(
                    self.buf.as_mut_ptr() as *mut MaybeUninit<u8>,
                    self.buf.len(),
                )
            };
            let Some(n) = read_now(s, room)? else {
                self.drained = true;
                return Ok(None);
            };
            self.drained = n < self.buf.len();
            (self.start, self.end) = (0, n);
        }
        let n = dst.len().min(self.end - self.start);
        for (d, b) in dst[..n]
            .iter_mut()
            .zip(&self.buf[self.start..self.start + n])
        {
            d.write(*b);
        }
        self.start += n;
        Ok(Some(n))
    }
}

/// A receiving end's place in the control socket's stream.
pub(super) enum Reading {
    /// `got` bytes of the next header.
    Header { buf: [u8; HEADER_BYTES], got: usize },
    /// `got` of the `len` bytes of an inline message for `msg`.
    Payload {
        msg: Arc<Msg>,
        len: usize,
        got: usize,
    },
}

impl Reading {
    pub(super) fn header() -> Reading {
        Reading::Header {
            buf: [0; HEADER_BYTES],
            got: 0,
        }
    }
}
