//! Length-prefixed frames with sequence numbers, optional MACs, size limits and absolute
//! deadlines.
//!
//! ```text
//! frame = len: u32 LE | seq: u64 LE | payload: len - 8 - tag bytes | tag: 0 or 16 bytes
//! ```
//!
//! `len` counts everything after itself. Frames are numbered from 0 in each direction of a
//! connection, handshake frames included; a frame must carry exactly the next number. In an
//! authenticated session every frame after the handshake ends with
//! `HMAC-SHA256(session key of its direction, len || seq || payload)[..16]`.
//!
//! The reader checks `len` against the connection's current maximum before it reads or
//! allocates anything, and gives every frame an absolute deadline that starts with its first
//! byte ([`FrameTimeout`]): a peer that trickles bytes is cut off however slowly it sends,
//! which a per-`read` timeout alone would not do.

use super::auth::{FrameMac, TAG_LEN};
use core::fmt;
use core::time::Duration;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Bytes of the `len` field.
pub const LEN_BYTES: usize = 4;
/// Bytes of the `seq` field.
pub const SEQ_BYTES: usize = 8;

/// How long a frame may take to arrive once its first byte is in: `base` plus its length
/// at `min_bytes_per_sec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameTimeout {
    /// Allowed for any frame.
    pub base: Duration,
    /// The slowest transfer rate tolerated for large frames, in bytes per second.
    pub min_bytes_per_sec: u64,
}

impl Default for FrameTimeout {
    fn default() -> Self {
        Self { base: Duration::from_secs(10), min_bytes_per_sec: 1 << 20 }
    }
}

impl FrameTimeout {
    /// The time allowed for a frame whose `len` field is `len`.
    pub fn allowed(&self, len: usize) -> Duration {
        let rate = self.min_bytes_per_sec.max(1);
        let extra_ms = (len as u64).saturating_mul(1000) / rate;
        self.base.saturating_add(Duration::from_millis(extra_ms))
    }
}

/// Why a frame could not be read (or written).
#[derive(Debug)]
#[non_exhaustive]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Closed,
    /// The connection ended inside a frame.
    Truncated {
        /// Bytes of the frame (length field included) that arrived.
        got: usize,
        /// Bytes the frame should have had (0 if the length field itself was cut).
        expected: usize,
    },
    /// The length field exceeds the connection's maximum; nothing was allocated.
    TooLarge {
        /// The announced length.
        len: u64,
        /// The maximum.
        max: usize,
    },
    /// The length field is too small to hold a sequence number (and tag).
    TooSmall {
        /// The announced length.
        len: u64,
    },
    /// The frame did not complete within its deadline (counted from its first byte).
    Deadline {
        /// Bytes that had arrived.
        got: usize,
        /// The time allowed.
        allowed: Duration,
    },
    /// No frame started before the wait deadline (not a fault: the caller decides).
    Idle,
    /// The frame's sequence number is not the next one (a gap, a replay or a reorder).
    BadSeq {
        /// The number expected.
        expected: u64,
        /// The number received.
        got: u64,
    },
    /// The frame's MAC does not verify.
    BadMac,
    /// A socket error.
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("connection closed by peer"),
            Self::Truncated { got, expected: 0 } => write!(f, "connection closed inside a frame header ({got} bytes)"),
            Self::Truncated { got, expected } => {
                write!(f, "connection closed inside a frame ({got} of {expected} bytes)")
            }
            Self::TooLarge { len, max } => write!(f, "frame length {len} exceeds the limit of {max} bytes"),
            Self::TooSmall { len } => write!(f, "frame length {len} is too small"),
            Self::Deadline { got, allowed } => {
                write!(
                    f,
                    "frame not complete within {} ms of its first byte ({got} bytes arrived)",
                    allowed.as_millis()
                )
            }
            Self::Idle => f.write_str("no frame before the deadline"),
            Self::BadSeq { expected, got } => write!(f, "frame sequence number {got}, expected {expected}"),
            Self::BadMac => f.write_str("frame authentication failed (bad MAC)"),
            Self::Io(e) => write!(f, "socket error: {e}"),
        }
    }
}

impl core::error::Error for FrameError {}

/// Reads frames from one connection into a caller's buffer.
#[derive(Debug)]
pub struct FrameReader {
    stream: TcpStream,
    max_len: usize,
    timeout: FrameTimeout,
    mac: Option<FrameMac>,
    next_seq: u64,
    hard_deadline: Option<Instant>,
    /// Bytes of the stream read so far (wrapping; only its low bits matter).
    stream_pos: u64,
}

/// Frames at least this long are read at a chosen offset in the caller's buffer (shorter
/// ones, the whole handshake included, at offset 0).
///
/// Why: the kernel copies a received frame from its socket buffers into ours with
/// `rep movsb`, which on some processors crawls when the destination sits just after the
/// source modulo the 4 KiB page (4K aliasing: every load seems to depend on a store just
/// made). The sender's data lies in the kernel's pages at about its stream position modulo
/// the page, and a large buffer from the allocator starts a few bytes into a page, which
/// would put every large frame in that spot. The reader knows its stream position, so it
/// places the frame half a page away from it.
pub const ALIGN_MIN_LEN: usize = 16 << 10;

const PAGE: usize = 4096;

/// The offset into a buffer at `base` where a frame whose first byte is stream byte
/// `frame_pos` lands half a page away from that byte's place in the kernel's pages.
fn copy_friendly_pad(base: usize, frame_pos: u64) -> usize {
    let want = (frame_pos as usize).wrapping_add(PAGE / 2) % PAGE;
    want.wrapping_sub(base % PAGE) % PAGE
}

/// Where a frame's payload sits in the buffer it was read into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FramePayload {
    /// First byte of the payload.
    pub start: usize,
    /// One past its last byte.
    pub end: usize,
}

impl FramePayload {
    /// The payload within `buf`.
    pub fn of<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(self.start..self.end).unwrap_or_default()
    }
}

impl FrameReader {
    /// A reader of frames whose `len` is at most `max_len`.
    pub fn new(stream: TcpStream, max_len: usize, timeout: FrameTimeout) -> Self {
        Self { stream, max_len, timeout, mac: None, next_seq: 0, hard_deadline: None, stream_pos: 0 }
    }

    /// No frame may end later than `deadline` (the handshake's absolute deadline); `None`
    /// lifts the cap.
    pub fn set_hard_deadline(&mut self, deadline: Option<Instant>) {
        self.hard_deadline = deadline;
    }

    /// The socket.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Changes the largest `len` accepted (after the handshake).
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    /// From now on every frame must end with a tag that `mac` verifies.
    pub fn set_mac(&mut self, mac: FrameMac) {
        self.mac = Some(mac);
    }

    /// The sequence number the next frame must carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Reads one frame into `buf` (resized to hold the frame's `len` bytes; the `len` field
    /// itself is not kept) and returns where its payload is: frames of at least
    /// [`ALIGN_MIN_LEN`] bytes may start past offset 0. Waits for the first byte until
    /// `wait_until` (`None`: forever), then gives the frame its own deadline.
    pub fn read_frame(&mut self, buf: &mut Vec<u8>, wait_until: Option<Instant>) -> Result<FramePayload, FrameError> {
        let mut len_bytes = [0u8; LEN_BYTES];
        // The first byte: wait until `wait_until`.
        let first = loop {
            let timeout = match wait_until {
                None => None,
                Some(t) => match t.checked_duration_since(Instant::now()) {
                    Some(d) if !d.is_zero() => Some(d),
                    _ => return Err(FrameError::Idle),
                },
            };
            if let Some(left) = timeout.filter(|d| *d <= COARSE_TIMEOUT_SLACK) {
                // The last stretch of the wait: a socket read timeout would end up to a
                // few scheduler ticks late, so poll instead.
                match self.poll_first_byte(&mut len_bytes[..1], left) {
                    Ok(true) => break Instant::now(),
                    Ok(false) => continue,
                    Err(e) => return Err(e),
                }
            }
            // A long wait blocks on the socket until the slack before the deadline.
            let timeout = timeout.map(|d| d - COARSE_TIMEOUT_SLACK);
            self.stream.set_read_timeout(timeout).map_err(FrameError::Io)?;
            match self.stream.read(&mut len_bytes[..1]) {
                Ok(0) => return Err(FrameError::Closed),
                Ok(_) => break Instant::now(),
                Err(e) if is_timeout(&e) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(FrameError::Io(e)),
            }
        };
        let hard_deadline = self.hard_deadline;
        let cap = |allowed: Duration| match hard_deadline {
            Some(hard) if hard < first + allowed => (hard, hard.saturating_duration_since(first)),
            _ => (first + allowed, allowed),
        };
        let base = self.timeout.base;
        self.read_until(&mut len_bytes[1..], cap(base), 1, 0)?;
        let len = u32::from_le_bytes(len_bytes) as usize;
        let tag_len = if self.mac.is_some() { TAG_LEN } else { 0 };
        if len > self.max_len {
            return Err(FrameError::TooLarge { len: len as u64, max: self.max_len });
        }
        if len < SEQ_BYTES + tag_len {
            return Err(FrameError::TooSmall { len: len as u64 });
        }
        let limit = cap(self.timeout.allowed(len));
        // Where the frame goes in `buf`: at 0, or for a large frame at the offset that keeps
        // the kernel's copy fast (see `ALIGN_MIN_LEN`). Only the bytes the buffer gains are
        // zeroed: the read overwrites the rest, so a large frame costs one pass, not two.
        let pad = if len >= ALIGN_MIN_LEN {
            let frame_pos = self.stream_pos.wrapping_add(LEN_BYTES as u64);
            if buf.capacity() < len + PAGE {
                buf.clear();
                let _ = buf.try_reserve_exact(len + PAGE);
            }
            copy_friendly_pad(buf.as_ptr() as usize, frame_pos)
        } else {
            0
        };
        buf.resize(pad + len, 0);
        let frame = buf.get_mut(pad..).unwrap_or_default();
        self.read_until(frame, limit, LEN_BYTES, len + LEN_BYTES)?;
        self.stream_pos = self.stream_pos.wrapping_add((LEN_BYTES + len) as u64);
        let seq_bytes: [u8; SEQ_BYTES] = frame.get(..SEQ_BYTES).and_then(|s| s.try_into().ok()).unwrap_or_default();
        let seq = u64::from_le_bytes(seq_bytes);
        let end = len - tag_len;
        if let Some(mac) = &self.mac {
            let payload = frame.get(SEQ_BYTES..end).unwrap_or_default();
            let tag = frame.get(end..).unwrap_or_default();
            if !mac.verify(len as u32, seq, payload, tag) {
                return Err(FrameError::BadMac);
            }
        }
        if seq != self.next_seq {
            return Err(FrameError::BadSeq { expected: self.next_seq, got: seq });
        }
        self.next_seq += 1;
        Ok(FramePayload { start: pad + SEQ_BYTES, end: pad + end })
    }

    /// Fills `dst` before `deadline` (`allowed` after the frame's first byte). `before` bytes
    /// of the frame were read already and the frame has `total` bytes (0 if not known yet),
    /// for error messages.
    fn read_until(
        &mut self,
        dst: &mut [u8],
        (deadline, allowed): (Instant, Duration),
        before: usize,
        total: usize,
    ) -> Result<(), FrameError> {
        let mut done = 0;
        while done < dst.len() {
            let now = Instant::now();
            let Some(left) = deadline.checked_duration_since(now).filter(|d| !d.is_zero()) else {
                return Err(FrameError::Deadline { got: before + done, allowed });
            };
            self.stream.set_read_timeout(Some(left)).map_err(FrameError::Io)?;
            let rest = dst.get_mut(done..).unwrap_or_default();
            match self.stream.read(rest) {
                Ok(0) => return Err(FrameError::Truncated { got: before + done, expected: total }),
                Ok(n) => done += n,
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        Ok(())
    }
}

/// How long before a first byte's deadline the reader stops blocking on a socket read
/// timeout (the kernel rounds one up to its scheduler tick and may fire a tick or two late)
/// and polls instead, sleeping at most [`POLL_INTERVAL`] between tries.
const COARSE_TIMEOUT_SLACK: Duration = Duration::from_millis(12);
/// The longest sleep between two polls of the last stretch of a wait.
const POLL_INTERVAL: Duration = Duration::from_micros(100);

impl FrameReader {
    /// Tries to read the first byte of a frame without blocking; if none is there, sleeps
    /// `left` or [`POLL_INTERVAL`], whichever is shorter. `Ok(true)`: the byte was read.
    fn poll_first_byte(&mut self, byte: &mut [u8], left: Duration) -> Result<bool, FrameError> {
        self.stream.set_nonblocking(true).map_err(FrameError::Io)?;
        let read = self.stream.read(byte);
        self.stream.set_nonblocking(false).map_err(FrameError::Io)?;
        match read {
            Ok(0) => Err(FrameError::Closed),
            Ok(_) => Ok(true),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                std::thread::sleep(left.min(POLL_INTERVAL));
                Ok(false)
            }
            Err(e) => Err(FrameError::Io(e)),
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Writes frames to one connection.
#[derive(Debug)]
pub struct FrameWriter<W: Write> {
    out: W,
    max_len: usize,
    mac: Option<FrameMac>,
    next_seq: u64,
}

impl<W: Write> FrameWriter<W> {
    /// A writer of frames whose `len` is at most `max_len` (larger ones are refused, never
    /// truncated).
    pub fn new(out: W, max_len: usize) -> Self {
        Self { out, max_len, mac: None, next_seq: 0 }
    }

    /// Changes the largest `len` sent.
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    /// From now on every frame ends with a tag made with `mac`.
    pub fn set_mac(&mut self, mac: FrameMac) {
        self.mac = Some(mac);
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Writes one frame carrying `payload` and flushes. The header, the payload and the tag
    /// go out in vectored writes straight from their buffers: the payload is never copied
    /// into a frame buffer (a large one is not even copied into the writer's buffer), and the
    /// header does not leave in a packet of its own.
    pub fn write_frame(&mut self, payload: &[u8]) -> io::Result<()> {
        let tag_len = if self.mac.is_some() { TAG_LEN } else { 0 };
        let len = SEQ_BYTES + payload.len() + tag_len;
        if len > self.max_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("refusing to send a frame of {len} bytes: the limit is {}", self.max_len),
            ));
        }
        let len32 = u32::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
        let seq = self.next_seq;
        let mut head = [0u8; LEN_BYTES + SEQ_BYTES];
        head[..LEN_BYTES].copy_from_slice(&len32.to_le_bytes());
        head[LEN_BYTES..].copy_from_slice(&seq.to_le_bytes());
        let tag = self.mac.as_ref().map(|mac| mac.tag(len32, seq, payload));
        let tag = tag.as_ref().map_or(&[][..], |t| &t[..]);
        write_all_vectored(&mut self.out, &mut [IoSlice::new(&head), IoSlice::new(payload), IoSlice::new(tag)])?;
        self.out.flush()?;
        self.next_seq += 1;
        Ok(())
    }
}

/// Writes every byte of `bufs` with vectored writes (std's `write_all_vectored` is not
/// stable yet).
fn write_all_vectored<W: Write>(out: &mut W, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match out.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "failed to write the whole frame")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Socket buffers asked for on a session's connection: room for a whole large frame, so a
/// writer hands a model or gradient to the kernel in one go instead of waking up for every
/// few hundred kilobytes the peer reads. The kernel caps the request at
/// `net.core.{w,r}mem_max` (and doubles it for its bookkeeping).
pub const SOCKET_BUFFER_MAX: usize = 8 << 20;

/// Prepares a connection for frames of up to `max_frame` bytes: `TCP_NODELAY` (a frame
/// leaves as soon as it is written) and send and receive buffers of `max_frame` bytes, at
/// least 256 KiB and at most [`SOCKET_BUFFER_MAX`]. Smaller frames leave the kernel's
/// automatic sizing alone.
pub fn tune_stream(stream: &TcpStream, max_frame: usize) -> io::Result<()> {
    stream.set_nodelay(true)?;
    if max_frame > 256 << 10 {
        let sock = socket2::SockRef::from(stream);
        let size = max_frame.min(SOCKET_BUFFER_MAX);
        sock.set_send_buffer_size(size)?;
        sock.set_recv_buffer_size(size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last stretch of a wait before a deadline polls instead of arming a socket read
    /// timeout (which the kernel rounds up to its scheduler tick): the wait ends idle and
    /// leaves the socket blocking, with no read timeout set.
    #[test]
    fn a_short_wait_polls_instead_of_arming_a_read_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let mut reader = FrameReader::new(client, 64, FrameTimeout::default());
        let mut buf = Vec::new();
        let deadline = Instant::now() + COARSE_TIMEOUT_SLACK / 2;
        assert!(matches!(reader.read_frame(&mut buf, Some(deadline)), Err(FrameError::Idle)));
        assert!(Instant::now() >= deadline, "the wait lasts until its deadline");
        assert_eq!(reader.stream().read_timeout().unwrap(), None, "no read timeout was armed");
    }
    use std::io::BufWriter;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn timeout(ms: u64) -> FrameTimeout {
        FrameTimeout { base: Duration::from_millis(ms), min_bytes_per_sec: 1 << 20 }
    }

    #[test]
    fn frames_round_trip_with_and_without_mac() {
        let (a, b) = pair();
        let mut w = FrameWriter::new(BufWriter::new(a), 1000);
        let mut r = FrameReader::new(b, 1000, timeout(2000));
        let mut buf = Vec::new();
        w.write_frame(b"hello").unwrap();
        let p = r.read_frame(&mut buf, None).unwrap();
        assert_eq!(p.of(&buf), b"hello");
        let mac = FrameMac::new(b"k");
        w.set_mac(mac.clone());
        r.set_mac(mac);
        w.write_frame(b"").unwrap();
        w.write_frame(&[7; 900]).unwrap();
        assert_eq!(r.read_frame(&mut buf, None).unwrap().of(&buf), b"");
        assert_eq!(r.read_frame(&mut buf, None).unwrap().of(&buf), &[7; 900][..]);
        assert!(w.write_frame(&[0; 1000]).is_err(), "over-limit frames are refused");
        assert!(matches!(
            r.read_frame(&mut buf, Some(Instant::now() + Duration::from_millis(50))),
            Err(FrameError::Idle)
        ));
    }

    #[test]
    fn large_frames_land_half_a_page_from_their_stream_position() {
        let (a, b) = pair();
        let max = 3 * ALIGN_MIN_LEN;
        let mut w = FrameWriter::new(BufWriter::new(a), max);
        let mut r = FrameReader::new(b, max, timeout(5000));
        let mac = FrameMac::new(b"k");
        let small = [9u8; 100];
        let large: Vec<u8> = (0..2 * ALIGN_MIN_LEN).map(|i| (i % 251) as u8).collect();
        let mut buf = Vec::new();
        let mut pos = 0usize;
        for (i, payload) in
            [&small[..], &large, &large[..ALIGN_MIN_LEN + 7], &small[..3], &large].into_iter().enumerate()
        {
            if i == 3 {
                w.set_mac(mac.clone());
                r.set_mac(mac.clone());
            }
            w.write_frame(payload).unwrap();
            let p = r.read_frame(&mut buf, None).unwrap();
            assert_eq!(p.of(&buf), payload, "frame {i}");
            let frame_len = SEQ_BYTES + payload.len() + if i >= 3 { TAG_LEN } else { 0 };
            let frame_start = p.start - SEQ_BYTES;
            if frame_len >= ALIGN_MIN_LEN {
                let at = (buf.as_ptr() as usize + frame_start) % PAGE;
                assert_eq!(at, (pos + LEN_BYTES + PAGE / 2) % PAGE, "frame {i}");
            } else {
                assert_eq!(frame_start, 0, "small frames (the handshake) start at 0");
            }
            pos += LEN_BYTES + frame_len;
        }
        assert_eq!(copy_friendly_pad(4096 + 16, 4), 2036);
        assert_eq!(copy_friendly_pad(2052, 4), 0);
        assert_eq!(copy_friendly_pad(3000, u64::MAX), (u64::MAX % 4096 + 2048 + 4096 - 3000) as usize % 4096);
    }

    /// Takes at most 5 bytes per call and fails every other call with `Interrupted`.
    struct Dribble(Vec<u8>, bool);

    impl Write for Dribble {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.1 = !self.1;
            if self.1 {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(5);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
            self.write(first)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn vectored_writes_survive_short_writes_and_interrupts() {
        let mut w = FrameWriter::new(Dribble(Vec::new(), false), 1000);
        w.write_frame(b"hello world").unwrap();
        w.set_mac(FrameMac::new(b"k"));
        w.write_frame(b"").unwrap();
        let mut expect = Vec::new();
        let mut plain = FrameWriter::new(&mut expect, 1000);
        plain.write_frame(b"hello world").unwrap();
        plain.set_mac(FrameMac::new(b"k"));
        plain.write_frame(b"").unwrap();
        assert_eq!(w.get_mut().0, expect);
        assert_eq!(&expect[..LEN_BYTES], &19u32.to_le_bytes(), "len = seq + payload");
        assert_eq!(expect.len(), (LEN_BYTES + 19) + (LEN_BYTES + SEQ_BYTES + TAG_LEN));
    }

    #[test]
    fn tuned_streams_have_nodelay_and_large_buffers() {
        let (a, _b) = pair();
        tune_stream(&a, 64 << 20).unwrap();
        assert!(a.nodelay().unwrap());
        let sock = socket2::SockRef::from(&a);
        // The kernel caps the request at its maximum (and may double it), but never at the
        // small default.
        assert!(sock.send_buffer_size().unwrap() >= 256 << 10);
        assert!(sock.recv_buffer_size().unwrap() >= 256 << 10);
    }

    #[test]
    fn oversized_length_is_refused_before_reading() {
        let (mut a, b) = pair();
        let mut r = FrameReader::new(b, 1000, timeout(2000));
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let mut buf = Vec::new();
        match r.read_frame(&mut buf, None) {
            Err(FrameError::TooLarge { len, max: 1000 }) => assert_eq!(len, u64::from(u32::MAX)),
            other => panic!("{other:?}"),
        }
        assert_eq!(buf.capacity(), 0, "nothing allocated");
    }

    #[test]
    fn bad_mac_bad_seq_truncated_and_small_frames_are_refused() {
        let mac = FrameMac::new(b"k");
        let mut buf = Vec::new();
        // Tampered payload.
        let (a, b) = pair();
        let mut raw = Vec::new();
        let mut w = FrameWriter::new(&mut raw, 100);
        w.set_mac(mac.clone());
        w.write_frame(b"abc").unwrap();
        w.write_frame(b"abc").unwrap();
        let one = raw.len() / 2;
        let mut tampered = raw[..one].to_vec();
        tampered[LEN_BYTES + SEQ_BYTES] ^= 1;
        (&a).write_all(&tampered).unwrap();
        let mut r = FrameReader::new(b, 100, timeout(2000));
        r.set_mac(mac.clone());
        assert!(matches!(r.read_frame(&mut buf, None), Err(FrameError::BadMac)));
        // Replayed frame: the first frame twice.
        let (a, b) = pair();
        (&a).write_all(&raw[..one]).unwrap();
        (&a).write_all(&raw[..one]).unwrap();
        let mut r = FrameReader::new(b, 100, timeout(2000));
        r.set_mac(mac);
        r.read_frame(&mut buf, None).unwrap();
        assert!(matches!(r.read_frame(&mut buf, None), Err(FrameError::BadSeq { expected: 1, got: 0 })));
        // Truncated.
        let (a, b) = pair();
        (&a).write_all(&raw[..one - 3]).unwrap();
        drop(a);
        let mut r = FrameReader::new(b, 100, timeout(2000));
        assert!(matches!(r.read_frame(&mut buf, None), Err(FrameError::Truncated { .. })));
        // Too small to hold a sequence number.
        let (a, b) = pair();
        (&a).write_all(&3u32.to_le_bytes()).unwrap();
        let mut r = FrameReader::new(b, 100, timeout(2000));
        assert!(matches!(r.read_frame(&mut buf, None), Err(FrameError::TooSmall { len: 3 })));
        // Clean close between frames.
        let (a, b) = pair();
        drop(a);
        let mut r = FrameReader::new(b, 100, timeout(2000));
        assert!(matches!(r.read_frame(&mut buf, None), Err(FrameError::Closed)));
    }

    #[test]
    fn trickling_peer_is_cut_off_at_the_frame_deadline() {
        let (a, b) = pair();
        let start = Instant::now();
        let t = std::thread::spawn(move || {
            // One byte every 50 ms: each read succeeds well within any per-read timeout.
            for byte in 20u32.to_le_bytes().iter().chain([0u8; 20].iter()) {
                if (&a).write_all(&[*byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut r = FrameReader::new(b, 100, timeout(300));
        let mut buf = Vec::new();
        let res = r.read_frame(&mut buf, None);
        let took = start.elapsed();
        assert!(matches!(res, Err(FrameError::Deadline { .. })), "{res:?}");
        assert!(took < Duration::from_millis(330 + 50), "cut off after {took:?}");
        drop(r);
        t.join().unwrap();
    }
}
