//! The initial parameters from worker 0: a transport message, not one of the core's.
//!
//! When the run's settings say so ([`RunSettings::initial_from_worker`]), worker 0's first
//! frame of every session, right after the handshake, is `"INIT"` followed by the model's
//! `dim` parameters as little-endian `f32`. The server takes the first valid one as its
//! initial model and ignores those of later sessions (the model is known by then). Until it
//! has the model, the server holds the other workers' messages (their `Join`s) and answers
//! them once it has it. A vector of another length or with a NaN or infinite element is
//! refused (the worker checks its own before sending, with the same message; the server
//! logs it and cuts the connection).
//!
//! The message has the layout of every transport message ([`F32Codec`]); the framing layer
//! ([`payload`](super::payload)) tells it from the core's messages by its tag.
//!
//! [`RunSettings::initial_from_worker`]: super::settings::RunSettings::initial_from_worker

use super::codec::F32Codec;

/// The first four bytes of the message.
pub const MAGIC: [u8; 4] = *b"INIT";

/// The message's codec.
pub const CODEC: F32Codec = F32Codec { tag: MAGIC, name: "an initial-parameters message", values: "parameters" };

/// Checks a vector as the server's initial model of `dim` parameters: its length, and that
/// every element is finite (the first bad one is named).
pub fn check(params: &[f32], dim: usize) -> Result<(), String> {
    if params.len() != dim {
        return Err(format!("{} parameters, the server's model has {dim}", params.len()));
    }
    match params.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        Some((i, v)) => Err(format!("parameter {i} is {v}: the initial parameters must be finite")),
        None => Ok(()),
    }
}

/// The message carrying `params`, after [`check`]ing them against `dim`.
pub fn encode(params: &[f32], dim: usize) -> Result<Vec<u8>, String> {
    check(params, dim)?;
    Ok(CODEC.encode(params))
}

/// The parameters of a message, [`check`]ed against `dim`.
pub fn decode(payload: &[u8], dim: usize) -> Result<Vec<f32>, String> {
    let params = CODEC.decode(payload)?;
    check(&params, dim)?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_round_trip_and_bad_ones_are_refused_naming_why() {
        let p = [0.5f32, -1.0, 3.0];
        let bytes = encode(&p, 3).unwrap();
        assert!(CODEC.is(&bytes));
        assert_eq!(decode(&bytes, 3).unwrap(), p);
        assert_eq!(decode(&bytes, 4).unwrap_err(), "3 parameters, the server's model has 4");
        assert_eq!(encode(&p, 2).unwrap_err(), "3 parameters, the server's model has 2");
        let e = encode(&[1.0, f32::NAN], 2).unwrap_err();
        assert_eq!(e, "parameter 1 is NaN: the initial parameters must be finite");
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&f32::INFINITY.to_le_bytes());
        assert_eq!(decode(&bad, 3).unwrap_err(), "parameter 1 is inf: the initial parameters must be finite");
        assert_eq!(decode(&bytes[..9], 1).unwrap_err(), "5 bytes of parameters, not a whole number of f32s");
        assert_eq!(decode(b"SY\x02", 1).unwrap_err(), "not an initial-parameters message");
        assert!(!CODEC.is(b"SY\x02\x01"), "a core message is never taken for one");
    }
}
