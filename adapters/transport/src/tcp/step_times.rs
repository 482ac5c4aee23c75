//! The workers' step times: a transport message, not one of the core's.
//!
//! When the run's settings say so ([`RunSettings::report_step_times`]), a worker sends,
//! right before each new contribution (a gradient, delta or clock update; never before a
//! retransmission), `"STEP"` followed by the wall-clock seconds of every gradient step it
//! finished since its previous contribution, oldest first, as little-endian `f32`: one for
//! a gradient, the local steps of a WBSP delta or an SSP clock's steps. A step's time runs
//! from the start of its computation to the moment the worker hands the gradient to its
//! protocol (an emulated straggler's extra time included); a step the protocol abandoned is
//! not in it. The server pairs the times with the contribution that follows them on the same
//! session and hands both to its caller (`serve --record-trace` writes them as a trace).
//!
//! At most [`MAX_STEPS`] times go in one message, and no more than a session's largest
//! frame holds ([`max_per_message`]): a worker keeps the newest that many. An
//! empty list, a time that is not finite and positive, or a length that is not a whole
//! number of `f32`s is refused (the server logs it and cuts the connection), as is the
//! message from a worker of a run that did not ask for it.
//!
//! The message has the layout of every transport message ([`F32Codec`]); the framing layer
//! ([`payload`](super::payload)) tells it from the core's messages by its tag (`"ST"` is
//! never the start of a core message, `"SY"`).
//!
//! [`RunSettings::report_step_times`]: super::settings::RunSettings::report_step_times

use super::codec::F32Codec;

/// The first four bytes of the message.
pub const MAGIC: [u8; 4] = *b"STEP";

/// The message's codec.
pub const CODEC: F32Codec = F32Codec { tag: MAGIC, name: "a step-times message", values: "step times" };

/// The most step times one message carries.
pub const MAX_STEPS: usize = 1024;

/// The most step times one message carries in a session of a model of `dim` parameters:
/// [`MAX_STEPS`], or fewer if the session's largest frame (sized for the model's messages)
/// holds fewer (at least 10 for any model).
pub fn max_per_message(dim: usize) -> usize {
    let frame = syncopate::wire::Limits::for_model(dim).max_message_len::<f32>();
    (frame.saturating_sub(MAGIC.len()) / 4).clamp(1, MAX_STEPS)
}

/// Checks one step time: finite and positive.
fn check(i: usize, seconds: f32) -> Result<(), String> {
    if seconds.is_finite() && seconds > 0.0 {
        Ok(())
    } else {
        Err(format!("step time {i} is {seconds}: a step time must be a finite number of seconds above 0"))
    }
}

/// Checks the times of one message: 1 to [`MAX_STEPS`] of them, each finite and positive.
fn check_all(seconds: &[f32]) -> Result<(), String> {
    if seconds.is_empty() || seconds.len() > MAX_STEPS {
        return Err(format!("{} step times in one message (1 to {MAX_STEPS})", seconds.len()));
    }
    seconds.iter().enumerate().try_for_each(|(i, s)| check(i, *s))
}

/// The message carrying `seconds` (at most [`MAX_STEPS`], each finite and positive).
pub fn encode(seconds: &[f32]) -> Result<Vec<u8>, String> {
    check_all(seconds)?;
    Ok(CODEC.encode(seconds))
}

/// The step times of a message, each checked.
pub fn decode(payload: &[u8]) -> Result<Vec<f32>, String> {
    let seconds = CODEC.decode(payload)?;
    check_all(&seconds)?;
    Ok(seconds)
}

/// A worker's step times not yet sent: the newest that one message holds.
#[derive(Debug)]
pub struct PendingSteps {
    seconds: std::collections::VecDeque<f32>,
    keep: usize,
}

impl PendingSteps {
    /// No steps yet, in a session of a model of `dim` parameters ([`max_per_message`]).
    pub fn new(dim: usize) -> Self {
        Self { seconds: std::collections::VecDeque::new(), keep: max_per_message(dim) }
    }

    /// Adds a finished step of `seconds` (raised to the smallest positive `f32` if the
    /// clock saw no time pass), dropping the oldest beyond what one message holds.
    pub fn push(&mut self, seconds: f64) {
        let s = (seconds as f32).max(f32::MIN_POSITIVE);
        if self.seconds.len() >= self.keep {
            self.seconds.pop_front();
        }
        self.seconds.push_back(if s.is_finite() { s } else { f32::MAX });
    }

    /// The message of the pending steps, which are cleared; `None` if there are none.
    pub fn take_message(&mut self) -> Option<Vec<u8>> {
        if self.seconds.is_empty() {
            return None;
        }
        let seconds: Vec<f32> = self.seconds.drain(..).collect();
        encode(&seconds).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_times_round_trip_and_bad_ones_are_refused_naming_why() {
        let s = [0.05f32, 0.25, 1.5];
        let bytes = encode(&s).unwrap();
        assert!(CODEC.is(&bytes));
        assert_eq!(decode(&bytes).unwrap(), s);
        assert_eq!(encode(&[]).unwrap_err(), "0 step times in one message (1 to 1024)");
        assert!(encode(&[0.1; MAX_STEPS + 1]).is_err());
        assert_eq!(
            encode(&[0.1, -1.0]).unwrap_err(),
            "step time 1 is -1: a step time must be a finite number of seconds above 0"
        );
        for bad in [0.0f32, f32::NAN, f32::INFINITY] {
            let mut b = bytes.clone();
            b[8..12].copy_from_slice(&bad.to_le_bytes());
            assert!(decode(&b).unwrap_err().starts_with("step time 1 is"), "{bad}");
        }
        assert_eq!(decode(&bytes[..9]).unwrap_err(), "5 bytes of step times, not a whole number of f32s");
        assert_eq!(decode(b"STEP").unwrap_err(), "0 step times in one message (1 to 1024)");
        assert_eq!(decode(b"SY\x02").unwrap_err(), "not a step-times message");
        assert!(!CODEC.is(b"SY\x02\x01"), "a core message is never taken for one");
        assert!(!crate::tcp::initial::CODEC.is(&bytes));
    }

    #[test]
    fn random_payloads_decode_to_valid_times_or_a_reason() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 24) as usize;
            let mut bytes = MAGIC.to_vec();
            bytes.extend((0..len).map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8));
            if let Ok(times) = decode(&bytes) {
                assert_eq!(times.len() * 4 + MAGIC.len(), bytes.len());
                assert!(times.iter().all(|t| t.is_finite() && *t > 0.0));
                assert_eq!(encode(&times).unwrap(), bytes, "a decoded message re-encodes to itself");
            }
        }
    }

    #[test]
    fn pending_steps_keep_the_newest_and_clear_when_taken() {
        assert_eq!(max_per_message(1 << 20), MAX_STEPS);
        let small = max_per_message(1);
        assert!(small >= 10, "{small}");
        let mut tiny = PendingSteps::new(1);
        (0..100).for_each(|i| tiny.push(f64::from(i) + 1.0));
        let frame = tiny.take_message().unwrap();
        assert!(frame.len() <= syncopate::wire::Limits::for_model(1).max_message_len::<f32>(), "fits a frame");
        assert_eq!(decode(&frame).unwrap().len(), small);
        let mut p = PendingSteps::new(1 << 20);
        assert_eq!(p.take_message(), None);
        for i in 0..MAX_STEPS + 2 {
            p.push(i as f64 + 1.0);
        }
        p.push(0.0);
        let sent = decode(&p.take_message().unwrap()).unwrap();
        assert_eq!(sent.len(), MAX_STEPS);
        assert_eq!(sent[0], 4.0, "the three oldest were dropped");
        assert_eq!(*sent.last().unwrap(), f32::MIN_POSITIVE, "a step of no measurable time is still a step");
        assert_eq!(p.take_message(), None);
    }
}
