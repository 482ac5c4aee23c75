//! The one layout of the transport's own messages ([`F32Codec`]): a four-byte ASCII tag, then
//! little-endian `f32` values. Each message type ([`initial`](super::initial),
//! [`step_times`](super::step_times), [`refusal`](super::refusal)) is a constant of it;
//! the framing layer ([`payload`](super::payload)) tells them apart by their tags.

/// A transport message of `f32` values: [`tag`](Self::tag), then the values as little-endian
/// `f32`. Each message type names itself and its values for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F32Codec {
    /// The first four bytes of the message.
    pub tag: [u8; 4],
    /// The message, with its article, for "not …" (`"an initial-parameters message"`).
    pub name: &'static str,
    /// What its values are, for a length error (`"parameters"`).
    pub values: &'static str,
}

impl F32Codec {
    /// Whether `payload` is a message of this type (it starts with the tag).
    pub fn is(&self, payload: &[u8]) -> bool {
        payload.starts_with(&self.tag)
    }

    /// The message carrying `values`.
    pub fn encode(&self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.tag.len().saturating_add(values.len().saturating_mul(4)));
        out.extend_from_slice(&self.tag);
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// The values of a message: its tag checked and its body a whole number of `f32`s. The
    /// values themselves are the message type's to check.
    pub fn decode(&self, payload: &[u8]) -> Result<Vec<f32>, String> {
        let body = payload.strip_prefix(self.tag.as_slice()).ok_or_else(|| format!("not {}", self.name))?;
        if body.len() % 4 != 0 {
            return Err(format!("{} bytes of {}, not a whole number of f32s", body.len(), self.values));
        }
        Ok(body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_frames_f32s_after_its_tag() {
        let c = F32Codec { tag: *b"TEST", name: "a test message", values: "test values" };
        let bytes = c.encode(&[1.5, -2.0]);
        assert_eq!(&bytes[..4], b"TEST");
        assert_eq!(&bytes[4..8], &1.5f32.to_le_bytes());
        assert_eq!(c.decode(&bytes).unwrap(), [1.5, -2.0]);
        assert_eq!(c.decode(&bytes[..7]).unwrap_err(), "3 bytes of test values, not a whole number of f32s");
        assert_eq!(c.decode(b"SY\x02").unwrap_err(), "not a test message");
        assert_eq!(c.decode(b"TEST").unwrap(), Vec::<f32>::new());
    }
}
