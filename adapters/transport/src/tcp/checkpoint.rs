//! Model checkpoints: the parameters and their version in one file, written atomically.
//!
//! ```text
//! magic "SYNCKPT\0" (8) | format u32 LE = 1 | name_len u8 | protocol name | dim u64 LE
//! | version u64 LE | dim × f32 LE | SHA-256 of everything before it (32)
//! ```
//!
//! A checkpoint is written to `FILE.tmp`, synced, then renamed over `FILE`, so a crash leaves
//! the previous checkpoint or the new one, never a mix. Loading checks the magic, the format,
//! the protocol and the dimension against what the caller expects, and the checksum.

use core::fmt;
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use syncopate::Version;

const MAGIC: [u8; 8] = *b"SYNCKPT\0";
const FORMAT: u32 = 1;
const SUM_LEN: usize = 32;

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The protocol that produced it.
    pub protocol: String,
    /// The model version.
    pub version: Version,
    /// The parameters.
    pub params: Vec<f32>,
}

/// Why a checkpoint could not be read or written; displays as one line naming the file.
#[derive(Debug)]
pub struct CheckpointError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong.
    pub problem: String,
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}: {}", self.path.display(), self.problem)
    }
}

impl core::error::Error for CheckpointError {}

fn err(path: &Path, problem: impl Into<String>) -> CheckpointError {
    CheckpointError { path: path.to_owned(), problem: problem.into() }
}

/// The bytes of a checkpoint.
pub fn encode(protocol: &str, version: Version, params: &[f32]) -> Vec<u8> {
    let name = protocol.as_bytes().get(..protocol.len().min(255)).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + 4 + 1 + name.len() + 16 + params.len() * 4 + SUM_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&(params.len() as u64).to_le_bytes());
    out.extend_from_slice(&version.0.to_le_bytes());
    for p in params {
        out.extend_from_slice(&p.to_le_bytes());
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// Parses checkpoint bytes (`path` is only for messages).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let split = bytes.len().checked_sub(SUM_LEN).ok_or_else(|| err(path, "file too short"))?;
    let (body, sum) = bytes.split_at(split);
    if body.get(..8) != Some(&MAGIC[..]) {
        return Err(err(path, "not a syncopate checkpoint (bad magic)"));
    }
    if Sha256::digest(body).as_slice() != sum {
        return Err(err(path, "checksum mismatch (file corrupt or truncated)"));
    }
    let mut rest = body.get(8..).unwrap_or_default();
    let mut take = |n: usize| -> Result<&[u8], CheckpointError> {
        let (a, b) = (rest.get(..n), rest.get(n..));
        match (a, b) {
            (Some(a), Some(b)) => {
                rest = b;
                Ok(a)
            }
            _ => Err(err(path, "file too short")),
        }
    };
    let format = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default());
    if format != FORMAT {
        return Err(err(path, format!("format {format}, this build reads {FORMAT}")));
    }
    let name_len = usize::from(take(1)?.first().copied().unwrap_or(0));
    let protocol = String::from_utf8(take(name_len)?.to_vec()).map_err(|_| err(path, "protocol name is not UTF-8"))?;
    let dim = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
    let version = Version(u64::from_le_bytes(take(8)?.try_into().unwrap_or_default()));
    let data_len =
        usize::try_from(dim).ok().and_then(|d| d.checked_mul(4)).ok_or_else(|| err(path, "bad dimension"))?;
    let data = take(data_len)?;
    if !rest.is_empty() {
        return Err(err(path, "trailing bytes after the parameters"));
    }
    let params = data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect::<Vec<_>>();
    Ok(Checkpoint { protocol, version, params })
}

/// Writes a checkpoint to `path` atomically (temporary file, sync, rename).
pub fn save(path: &Path, protocol: &str, version: Version, params: &[f32]) -> Result<(), CheckpointError> {
    let bytes = encode(protocol, version, params);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Persist the rename; not every platform can open a directory.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    };
    write().map_err(|e| err(path, format!("cannot write: {e}")))
}

/// Reads a checkpoint and checks that it was made by `protocol` for a model of `dim`.
pub fn load(path: &Path, protocol: &str, dim: usize) -> Result<Checkpoint, CheckpointError> {
    let bytes = fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let c = decode(path, &bytes)?;
    if c.protocol != protocol {
        return Err(err(path, format!("made by protocol {}, the server runs {protocol}", c.protocol)));
    }
    if c.params.len() != dim {
        return Err(err(path, format!("holds {} parameters, the model has {dim}", c.params.len())));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("syncopate-ckpt-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.ckpt");
        let params = vec![1.5f32, -0.0, f32::MIN_POSITIVE, 3.0];
        save(&path, "bsp", Version(42), &params).unwrap();
        let c = load(&path, "bsp", 4).unwrap();
        assert_eq!(c, Checkpoint { protocol: "bsp".into(), version: Version(42), params: params.clone() });
        assert!(load(&path, "asp", 4).unwrap_err().to_string().contains("made by protocol bsp"));
        assert!(load(&path, "bsp", 5).unwrap_err().to_string().contains("holds 4 parameters"));
        let mut bytes = fs::read(&path).unwrap();
        for i in [0, 10, 30, bytes.len() - 1] {
            bytes[i] ^= 0x40;
            assert!(decode(&path, &bytes).is_err(), "flipped byte {i}");
            bytes[i] ^= 0x40;
        }
        for cut in 0..bytes.len() {
            assert!(decode(&path, &bytes[..cut]).is_err());
        }
        assert!(load(&dir.join("missing"), "bsp", 4).unwrap_err().to_string().contains("cannot read"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
