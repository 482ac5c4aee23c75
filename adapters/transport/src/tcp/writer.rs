//! A session's writer thread, the same on every side of a connection (the server's per-worker
//! connections, a group server's upstream session, the worker's and the sharded worker's
//! sessions): it sends the frames queued for it and, whenever nothing was sent for one
//! heartbeat interval, a heartbeat (a frame with an empty payload), so a long computation on
//! the sending side never delays the heartbeats its peer judges its liveness by.
//!
//! A worker's uploads carry their ledger class ([`Upload`]): the writer counts the
//! contributions it wrote whole ([`Ledger`]) and hands the encoded buffers back for reuse.

use super::frame::FrameWriter;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use syncopate::wire;
use syncopate::{ToServer, WorkerStats};

/// What a writer thread sends: a frame's payload.
pub(crate) trait Outgoing {
    /// The frame's payload.
    fn payload(&self) -> &[u8];
}

impl Outgoing for Arc<Vec<u8>> {
    fn payload(&self) -> &[u8] {
        self
    }
}

impl Outgoing for (Vec<u8>, Upload) {
    fn payload(&self) -> &[u8] {
        &self.0
    }
}

/// Writes the frames queued on `frames` until the queue closes, and a heartbeat whenever
/// nothing was written for `beat`; `written` sees every frame once it is written whole.
pub(crate) fn write_with_heartbeats<W: std::io::Write, T: Outgoing>(
    writer: &mut FrameWriter<W>,
    frames: &Receiver<T>,
    beat: Duration,
    written: impl FnMut(T),
) -> std::io::Result<()> {
    write_placed(writer, frames, beat, written, |_| None)
}

/// [`write_with_heartbeats`], where `place` may put a frame's payload elsewhere (a
/// shared-memory slot, [`shm`](super::shm)) and return the small frame sent in its stead.
pub(crate) fn write_placed<W: std::io::Write, T: Outgoing>(
    writer: &mut FrameWriter<W>,
    frames: &Receiver<T>,
    beat: Duration,
    mut written: impl FnMut(T),
    mut place: impl FnMut(&[u8]) -> Option<[u8; super::shm::messages::SlotFrame::LEN]>,
) -> std::io::Result<()> {
    loop {
        match frames.recv_timeout(beat) {
            Ok(frame) => {
                match place(frame.payload()) {
                    Some(small) => writer.write_frame(&small)?,
                    None => writer.write_frame(frame.payload())?,
                }
                written(frame);
            }
            Err(RecvTimeoutError::Timeout) => writer.write_frame(&[])?,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
}

/// Frames waiting for a worker session's writer thread: a small bound, so a slow link pushes
/// back on the worker instead of queueing without limit.
pub(crate) const UPLOADS_IN_FLIGHT: usize = 2;

/// What a frame a worker uploads is, for the conservation ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upload {
    /// A contribution with a new sequence number.
    New,
    /// A contribution sent before (same sequence number).
    Again,
    /// Any other message.
    Other,
}

impl Upload {
    /// Encodes `msg` into a buffer from `spare` (or a new one) and records it in `stats`
    /// (the counters of one connection's sequence numbers); returns the frame with its class.
    pub(crate) fn encode(
        msg: &ToServer<'_, f32>,
        enc: wire::Encoding,
        stats: &mut WorkerStats,
        spare: &Receiver<Vec<u8>>,
    ) -> Result<(Vec<u8>, Self), String> {
        let mut out = spare.try_recv().unwrap_or_default();
        out.resize(wire::encoded_len_to_server_as(msg, enc), 0);
        let n = wire::encode_to_server_as(msg, enc, &mut out)
            .map_err(|e| format!("cannot encode {}: {e}", msg.kind_name()))?;
        out.truncate(n);
        Ok((out, Self::classify(msg, stats)))
    }

    /// [`Self::encode`] in `f32` (a session with shared memory has the `f32` wire), with a
    /// contribution encoded straight into the worker's slot of
    /// `region` when that is free: the frame is then the slot frame
    /// ([`shm`](super::shm)); otherwise the message itself.
    pub(crate) fn encode_placed(
        msg: &ToServer<'_, f32>,
        stats: &mut WorkerStats,
        spare: &Receiver<Vec<u8>>,
        region: &super::shm::Region,
    ) -> Result<(Vec<u8>, Self), String> {
        use super::shm::messages::SlotFrame;
        let contribution = matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
        let placed = contribution
            .then(|| region.try_write(super::shm::Dir::ToServer, |slot| wire::encode_to_server(msg, slot)))
            .flatten();
        let Some((seq, len)) = placed else {
            return Self::encode(msg, wire::Encoding::F32, stats, spare);
        };
        let len = u32::try_from(len).map_err(|_| format!("a {} message too long for a slot", msg.kind_name()))?;
        let mut out = spare.try_recv().unwrap_or_default();
        out.clear();
        out.extend_from_slice(&SlotFrame { seq, len }.encode());
        Ok((out, Self::classify(msg, stats)))
    }

    /// Records `msg` in `stats` and says what it is for the ledger.
    fn classify(msg: &ToServer<'_, f32>, stats: &mut WorkerStats) -> Self {
        let before = *stats;
        stats.record(msg);
        if stats.contributions > before.contributions {
            Self::New
        } else if stats.resent > before.resent {
            Self::Again
        } else {
            Self::Other
        }
    }
}

/// The contributions one session's writer wrote whole.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Distinct contributions.
    pub sent: AtomicU64,
    /// Contributions written again with a sequence number already sent.
    pub resent: AtomicU64,
}

impl Ledger {
    /// The counts so far: `(sent, resent)`.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.sent.load(Ordering::SeqCst), self.resent.load(Ordering::SeqCst))
    }
}

/// A worker session's writer: [`write_with_heartbeats`] over its uploads, counting each in
/// `ledger` and handing its buffer back to `give_back` (dropped when that is full).
pub(crate) fn write_uploads<W: std::io::Write>(
    writer: &mut FrameWriter<W>,
    frames: &Receiver<(Vec<u8>, Upload)>,
    beat: Duration,
    ledger: &Ledger,
    give_back: &Sender<Vec<u8>>,
) -> std::io::Result<()> {
    write_with_heartbeats(writer, frames, beat, |(frame, class)| {
        match class {
            Upload::New => ledger.sent.fetch_add(1, Ordering::SeqCst),
            Upload::Again => ledger.resent.fetch_add(1, Ordering::SeqCst),
            Upload::Other => 0,
        };
        let _ = give_back.try_send(frame);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;
    use syncopate::{Version, msg::Values};

    #[test]
    fn uploads_are_counted_by_class_and_idle_time_becomes_heartbeats() {
        let (tx, rx) = bounded::<(Vec<u8>, Upload)>(UPLOADS_IN_FLIGHT);
        let (give_back, spare) = bounded::<Vec<u8>>(4);
        let ledger = Ledger::default();
        let mut stats = WorkerStats::default();
        let grad = [1.0f32; 3];
        let msg = ToServer::Grad { base: Version(0), iteration: 1, seq: 1, values: Values::Slice(&grad), loss: None };
        let first = Upload::encode(&msg, wire::Encoding::F32, &mut stats, &spare).unwrap();
        let first_len = first.0.len();
        let again = Upload::encode(&msg, wire::Encoding::F32, &mut stats, &spare).unwrap();
        assert_eq!((first.1, again.1), (Upload::New, Upload::Again));
        let mut writer = FrameWriter::new(Vec::new(), 1 << 10);
        std::thread::scope(|s| {
            s.spawn(|| {
                tx.send(first).unwrap();
                std::thread::sleep(Duration::from_millis(30));
                tx.send(again).unwrap();
                drop(tx);
            });
            write_uploads(&mut writer, &rx, Duration::from_millis(5), &ledger, &give_back).unwrap();
        });
        assert_eq!(ledger.counts(), (1, 1));
        assert_eq!(spare.len(), 2, "both buffers come back");
        // Every frame is a length and a sequence number before its payload; a heartbeat has
        // none, and the pause between the uploads held several.
        let head = 4 + 8;
        let uploads = 2 * (head + first_len);
        let written = writer.get_mut().len();
        assert_eq!((written - uploads) % head, 0);
        assert!(written - uploads >= 2 * head, "{written} bytes: too few heartbeats");
    }
}
