//! Model checkpoints: the parameters and their version in one file, written atomically,
//! with the identity of the run that wrote them.
//!
//! ```text
//! magic "SYNCKPT\0" (8) | format u32 LE = 4 | name_len u8 | protocol name | dim u64 LE
//! | version u64 LE | dim × f32 LE | rule u8 | 4 × f64 LE knobs | schedule u8
//! | 3 × u64 LE knobs | state_len u64 LE | state_len × f32 LE | settings digest (32)
//! | run_len u8 | run id | label_len u16 LE | label | accepted u64 LE
//! | SHA-256 of everything before it (32)
//! ```
//!
//! **The update rule.** The server's rule ([`Checkpoint::optimizer`]) and its state
//! ([`Checkpoint::optimizer_state`]: exactly [`Optimizer::state_len`] elements, the momentum
//! buffer, Nesterov's velocity or AdamW's moments with a header holding the update count), so
//! a resumed run goes on exactly where the checkpoint left it. Rule: 0 SGD, 1 heavy-ball
//! momentum, 2 Nesterov, 3 AdamW, 4 mean; its knobs `β` (or `β₁`), `β₂`, `ε`, `λ`, unused ones
//! 0. Schedule: 0 constant, 1 step (`every`, `gamma` as `f64` bits), 2 warm-up then cosine
//! (`warmup`, `total`, `floor` as `f64` bits), unused knobs 0.
//!
//! Formats 1 (no rule), 2 and 3 (a momentum coefficient `f64` and, when above 0, the momentum
//! buffer in place of the rule's fields; 2 without identity) are still read: a run with plain
//! SGD or heavy-ball momentum. A run resumed from a checkpoint must have the checkpoint's
//! rule (the caller checks it with [`Checkpoint::optimizer`]).
//!
//! **Identity.** A format-3 checkpoint names the run that wrote it ([`RunIdentity`]): the
//! digest of the run's settings, the run's id (made when the run started afresh, kept by
//! every resumption) and a one-line label of the settings for messages. It also holds the
//! gradients the run accepted up to this checkpoint, over all its resumptions, so that a
//! resumed run goes on with what is left of its budget. An empty run id means no identity.
//!
//! A checkpoint is written by [`crate::file::replace`] (a synced temporary file renamed over
//! `FILE`, the directory synced; never over a device or a FIFO), so a crash leaves the
//! previous checkpoint or the new one, never a mix. Loading checks the magic, the format,
//! the protocol and the dimension against what the caller expects, and the checksum.

use core::fmt;
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use syncopate::Version;
use syncopate::proto::{Optimizer, Rule};

const MAGIC: [u8; 8] = *b"SYNCKPT\0";
const FORMAT: u32 = 4;
const SUM_LEN: usize = 32;
/// The longest label a checkpoint keeps (longer ones are cut at a character boundary).
const MAX_LABEL_LEN: usize = 1024;

/// The run a checkpoint belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunIdentity {
    /// The digest of the run's settings (those a resumed run must have).
    pub settings: [u8; 32],
    /// The run's id: made when the run started afresh, kept by its resumptions (at most
    /// 255 bytes, never empty).
    pub run: String,
    /// The run's settings in words, for messages.
    pub label: String,
}

impl RunIdentity {
    /// A fresh run id: the clock in nanoseconds and the process id, in hex (unique on one
    /// machine for runs started a nanosecond apart or by different processes).
    pub fn new_run_id() -> String {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{nanos:x}-{:x}", std::process::id())
    }
}

/// What a run's checkpoints carry besides the model: the run's identity and the gradients
/// its earlier sessions accepted (the budget a resumed run has already spent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The run that writes the checkpoints (`None`: none known, written as no identity).
    pub identity: Option<RunIdentity>,
    /// Gradients accepted by the run before this server started (0 for a fresh run).
    pub accepted_before: u64,
}

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The protocol that produced it.
    pub protocol: String,
    /// The model version.
    pub version: Version,
    /// The parameters.
    pub params: Vec<f32>,
    /// The server's update rule (plain SGD for a format-1 checkpoint).
    pub optimizer: Optimizer,
    /// The rule's state ([`Optimizer::state_len`] elements), if it keeps any.
    pub optimizer_state: Option<Vec<f32>>,
    /// The run that wrote it (`None`: a format-1 or -2 checkpoint, or none was given).
    pub identity: Option<RunIdentity>,
    /// Gradients the run had accepted when it was written, over all its sessions (0 when
    /// unknown: no identity).
    pub accepted: u64,
}

impl Checkpoint {
    /// The heavy-ball momentum coefficient of the run's rule (0 for any other rule).
    pub fn momentum(&self) -> f64 {
        match self.optimizer.rule {
            Rule::Momentum { beta } => beta,
            _ => 0.0,
        }
    }

    /// With heavy-ball momentum: the model before the last update (the momentum buffer).
    pub fn momentum_buffer(&self) -> Option<&[f32]> {
        match self.optimizer.rule {
            Rule::Momentum { .. } => self.optimizer_state.as_deref().and_then(|s| s.get(..self.params.len())),
            _ => None,
        }
    }
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

/// The bytes of a checkpoint without momentum.
pub fn encode(protocol: &str, version: Version, params: &[f32]) -> Vec<u8> {
    encode_with_momentum(protocol, version, params, None)
}

/// The bytes of a checkpoint; `momentum` is the coefficient and the momentum buffer (the
/// model before the last update) of a run with momentum.
pub fn encode_with_momentum(
    protocol: &str,
    version: Version,
    params: &[f32],
    momentum: Option<(f64, &[f32])>,
) -> Vec<u8> {
    encode_stamped(protocol, version, params, momentum.map(|(b, s)| (Optimizer::momentum(b), s)), None, 0)
}

/// The rule the fields name, if they are the fields of a rule ([`rule_fields`] of it).
fn rule_from_fields(kind: u8, knobs: [f64; 4], schedule: u8, s: [u64; 3]) -> Option<Optimizer> {
    let o = Optimizer::from_fields(kind, knobs, schedule, s)?;
    // One encoding per rule: unused knobs are 0 (bit for bit).
    let (_, written, _, written_s) = o.fields();
    let same = written.iter().zip(knobs).all(|(a, b)| a.to_bits() == b.to_bits()) && written_s == s;
    (same && o.check().is_ok()).then_some(o)
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn cut(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.as_bytes().get(..end).unwrap_or_default()
}

/// The bytes of a checkpoint of the run `identity` (none: no identity), which had accepted
/// `accepted` gradients over all its sessions; `optimizer`: the server's rule and its state
/// (none: plain SGD; a state is written with [`Optimizer::state_len`] elements, cut or padded
/// with zeros).
pub fn encode_stamped(
    protocol: &str,
    version: Version,
    params: &[f32],
    optimizer: Option<(Optimizer, &[f32])>,
    identity: Option<&RunIdentity>,
    accepted: u64,
) -> Vec<u8> {
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
    let (o, state) = optimizer.unwrap_or((Optimizer::SGD, &[]));
    let (kind, knobs, schedule, s) = o.fields();
    out.push(kind);
    knobs.iter().for_each(|k| out.extend_from_slice(&k.to_le_bytes()));
    out.push(schedule);
    s.iter().for_each(|k| out.extend_from_slice(&k.to_le_bytes()));
    let len = o.state_len(params.len());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    for i in 0..len {
        out.extend_from_slice(&state.get(i).copied().unwrap_or(0.0).to_le_bytes());
    }
    let none = RunIdentity::default();
    let id = identity.filter(|i| !i.run.is_empty()).unwrap_or(&none);
    let (run, label) = (cut(&id.run, 255), cut(&id.label, MAX_LABEL_LEN));
    out.extend_from_slice(&id.settings);
    out.push(run.len() as u8);
    out.extend_from_slice(run);
    out.extend_from_slice(&(label.len() as u16).to_le_bytes());
    out.extend_from_slice(label);
    out.extend_from_slice(&accepted.to_le_bytes());
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
    if !(1..=FORMAT).contains(&format) {
        return Err(err(path, format!("format {format}, this build reads 1 to {FORMAT}")));
    }
    let name_len = usize::from(take(1)?.first().copied().unwrap_or(0));
    let protocol = String::from_utf8(take(name_len)?.to_vec()).map_err(|_| err(path, "protocol name is not UTF-8"))?;
    let dim = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
    let version = Version(u64::from_le_bytes(take(8)?.try_into().unwrap_or_default()));
    let data_len =
        usize::try_from(dim).ok().and_then(|d| d.checked_mul(4)).ok_or_else(|| err(path, "bad dimension"))?;
    let floats = |data: &[u8]| {
        data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect::<Vec<_>>()
    };
    let params = floats(take(data_len)?);
    let (mut optimizer, mut optimizer_state) = (Optimizer::SGD, None);
    if (2..4).contains(&format) {
        let momentum = f64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        if !(momentum.is_finite() && (0.0..1.0).contains(&momentum)) {
            return Err(err(path, format!("momentum {momentum} is not in [0, 1)")));
        }
        optimizer = Optimizer::momentum(momentum);
        // A model of no parameters keeps no state: `None`, as the rule's `state_len` says.
        if momentum > 0.0 && data_len > 0 {
            optimizer_state = Some(floats(take(data_len)?));
        }
    } else if format >= 4 {
        let kind = take(1)?.first().copied().unwrap_or(u8::MAX);
        let mut knobs = [0.0; 4];
        for k in &mut knobs {
            *k = f64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        }
        let schedule = take(1)?.first().copied().unwrap_or(u8::MAX);
        let mut s = [0u64; 3];
        for k in &mut s {
            *k = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        }
        optimizer = rule_from_fields(kind, knobs, schedule, s)
            .ok_or_else(|| err(path, "the update rule's fields are not those of a rule in range"))?;
        let len = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        let want = optimizer.state_len(usize::try_from(dim).unwrap_or(usize::MAX));
        if usize::try_from(len).ok() != Some(want) {
            return Err(err(path, format!("the update rule's state has {len} elements, the rule keeps {want}")));
        }
        let state_bytes = want.checked_mul(4).ok_or_else(|| err(path, "bad state length"))?;
        optimizer_state = (want > 0).then(|| take(state_bytes).map(floats)).transpose()?;
    }
    let (mut identity, mut accepted) = (None, 0);
    if format >= 3 {
        let settings: [u8; 32] = take(32)?.try_into().unwrap_or_default();
        let run_len = usize::from(take(1)?.first().copied().unwrap_or(0));
        let run = String::from_utf8(take(run_len)?.to_vec()).map_err(|_| err(path, "run id is not UTF-8"))?;
        let label_len = usize::from(u16::from_le_bytes(take(2)?.try_into().unwrap_or_default()));
        let label = String::from_utf8(take(label_len)?.to_vec()).map_err(|_| err(path, "label is not UTF-8"))?;
        if label.len() > MAX_LABEL_LEN {
            return Err(err(path, format!("settings label of {} bytes (at most {MAX_LABEL_LEN})", label.len())));
        }
        // No identity is written as an empty run id, a zero digest and an empty label: one
        // encoding only, so a checkpoint written again is the same bytes.
        if run.is_empty() && (settings != [0; 32] || !label.is_empty()) {
            return Err(err(path, "a settings digest or label without a run id"));
        }
        accepted = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
        identity = (!run.is_empty()).then_some(RunIdentity { settings, run, label });
    }
    if !rest.is_empty() {
        return Err(err(path, "trailing bytes after the parameters"));
    }
    Ok(Checkpoint { protocol, version, params, optimizer, optimizer_state, identity, accepted })
}

/// Writes a checkpoint to `path` atomically ([`crate::file::replace`]).
pub fn save(path: &Path, protocol: &str, version: Version, params: &[f32]) -> Result<(), CheckpointError> {
    save_with_momentum(path, protocol, version, params, None)
}

/// [`save`] with the momentum coefficient and buffer of a run with momentum.
pub fn save_with_momentum(
    path: &Path,
    protocol: &str,
    version: Version,
    params: &[f32],
    momentum: Option<(f64, &[f32])>,
) -> Result<(), CheckpointError> {
    save_bytes(path, &encode_with_momentum(protocol, version, params, momentum))
}

/// A checkpoint with the server's rule and its state (none: plain SGD) for a run of `stamp`,
/// which has accepted `accepted` gradients in this session: the checkpoint names the run and
/// holds the run's total.
pub fn save_stamped(
    path: &Path,
    protocol: &str,
    version: Version,
    params: &[f32],
    optimizer: Option<(Optimizer, &[f32])>,
    stamp: &Stamp,
    accepted: u64,
) -> Result<(), CheckpointError> {
    let total = stamp.accepted_before.saturating_add(accepted);
    save_bytes(path, &encode_stamped(protocol, version, params, optimizer, stamp.identity.as_ref(), total))
}

/// Writes checkpoint `bytes` to `path` atomically ([`crate::file::replace`]).
fn save_bytes(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    crate::file::replace(path, bytes).map_err(|e| err(path, format!("cannot write: {e}")))
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

/// The journal next to a checkpoint (`FILE.journal`): what the server applied since the
/// checkpoint was written, one line per model update, so that a server killed between two
/// checkpoints and restarted with `--resume` can say exactly which versions' contributions
/// it lost. Each line is written with one `write` (no user-space buffer), so it survives the
/// process being killed with `SIGKILL` (not a power cut: the journal is not synced).
///
/// ```text
/// checkpoint 40 run 18b2c0d1e2f3a4b5-3039 received 160 accepted 160 applied 160 dropped 0
/// update 41 contributions 4 workers 1,1,1,1 received 164 accepted 164 applied 164 dropped 0
/// ```
///
/// Writing a checkpoint starts the journal afresh; the counters are the server's totals.
/// The `run` word (absent for a run without identity) names the run whose checkpoint the
/// journal follows: a journal of another run is refused ([`lost_since`]).
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    run: String,
}

/// The server's totals on a journal line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Contributions received (accepted or refused).
    pub received: u64,
    /// Contributions accepted.
    pub accepted: u64,
    /// Contributions applied.
    pub applied: u64,
    /// Contributions dropped.
    pub dropped: u64,
}

/// What a journal says was lost when the server stopped without a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// The checkpoint's version.
    pub checkpoint: Version,
    /// The versions made after the checkpoint (`first..=last`), if any.
    pub versions: Option<(Version, Version)>,
    /// Contributions those versions combined.
    pub contributions: u64,
    /// Those contributions by worker (index = worker id).
    pub by_worker: Vec<u64>,
    /// The server's totals at the checkpoint.
    pub at_checkpoint: Totals,
    /// The server's totals at its last journaled update (or at the checkpoint).
    pub at_last: Totals,
}

impl Lost {
    /// One line: `versions 41..=43 (12 contributions: worker 0: 3, ...) lost since the
    /// checkpoint at version 40`, or `nothing lost since the checkpoint at version 40`.
    pub fn line(&self) -> String {
        match self.versions {
            None => format!("nothing lost since the checkpoint at version {}", self.checkpoint.0),
            Some((a, b)) => {
                let per: Vec<String> =
                    self.by_worker.iter().enumerate().map(|(w, n)| format!("worker {w}: {n}")).collect();
                format!(
                    "versions {}..={} ({} contributions: {}) lost since the checkpoint at version {}",
                    a.0,
                    b.0,
                    self.contributions,
                    per.join(", "),
                    self.checkpoint.0
                )
            }
        }
    }
}

fn totals_line(t: &Totals) -> String {
    format!("received {} accepted {} applied {} dropped {}", t.received, t.accepted, t.applied, t.dropped)
}

impl Journal {
    /// The journal of the checkpoint at `checkpoint`.
    pub fn path_for(checkpoint: &Path) -> PathBuf {
        let mut p = checkpoint.as_os_str().to_owned();
        p.push(".journal");
        PathBuf::from(p)
    }

    /// Starts the journal of `checkpoint` afresh at `version` with the server's totals, for
    /// the run `run` (empty: no identity).
    pub fn start(checkpoint: &Path, version: Version, totals: &Totals, run: &str) -> Result<Self, CheckpointError> {
        let path = Self::path_for(checkpoint);
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| err(&path, format!("cannot open the journal: {e}")))?;
        let mut j = Self { path, file, run: run.to_owned() };
        j.restart(version, totals)?;
        Ok(j)
    }

    /// A checkpoint of `version` was written: the journal starts again from it.
    pub fn restart(&mut self, version: Version, totals: &Totals) -> Result<(), CheckpointError> {
        self.file.set_len(0).map_err(|e| err(&self.path, format!("cannot truncate the journal: {e}")))?;
        let run = if self.run.is_empty() { String::new() } else { format!("run {} ", self.run) };
        self.write(&format!("checkpoint {} {run}{}\n", version.0, totals_line(totals)))
    }

    /// Model `version` combined `by_worker` contributions (per worker id).
    pub fn update(&mut self, version: Version, by_worker: &[u64], totals: &Totals) -> Result<(), CheckpointError> {
        let count: u64 = by_worker.iter().sum();
        let per: Vec<String> = by_worker.iter().map(u64::to_string).collect();
        let line =
            format!("update {} contributions {count} workers {} {}\n", version.0, per.join(","), totals_line(totals));
        self.write(&line)
    }

    fn write(&mut self, line: &str) -> Result<(), CheckpointError> {
        self.file.write_all(line.as_bytes()).map_err(|e| err(&self.path, format!("cannot write the journal: {e}")))
    }
}

fn parse_totals(words: &[&str]) -> Totals {
    let get = |k: &str| {
        words.iter().position(|w| *w == k).and_then(|i| words.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    Totals { received: get("received"), accepted: get("accepted"), applied: get("applied"), dropped: get("dropped") }
}

/// Reads the journal of `checkpoint` (made at `version` by the run `run`, if known): the
/// updates after it are lost. A missing journal (no run wrote one) loses nothing; a torn
/// last line is ignored; a journal that names another run is refused.
pub fn lost_since(checkpoint: &Path, version: Version, run: Option<&str>) -> Result<Lost, CheckpointError> {
    let path = Journal::path_for(checkpoint);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(err(&path, format!("cannot read the journal: {e}"))),
    };
    let mut lost = Lost { checkpoint: version, ..Lost::default() };
    // Only whole lines: a line torn by the kill has no newline.
    for line in text.split_inclusive('\n').filter_map(|l| l.strip_suffix('\n')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let v = words.get(1).and_then(|v| v.parse::<u64>().ok());
        let named = words.iter().position(|w| *w == "run").and_then(|i| words.get(i + 1)).copied();
        if let (Some("checkpoint"), Some(theirs), Some(ours)) = (words.first().copied(), named, run) {
            if theirs != ours {
                return Err(err(
                    &path,
                    format!(
                        "the journal belongs to run {theirs}, the checkpoint to run {ours}: the journal is not this checkpoint's"
                    ),
                ));
            }
        }
        match (words.first().copied(), v) {
            (Some("checkpoint"), Some(v)) if v <= version.0 => {
                lost.at_checkpoint = parse_totals(&words);
                lost.at_last = lost.at_checkpoint;
            }
            (Some("update"), Some(v)) if v > version.0 => {
                let first = lost.versions.map_or(Version(v), |(a, _)| a);
                lost.versions = Some((first, Version(v)));
                lost.contributions =
                    lost.contributions.saturating_add(words.get(3).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0));
                let per = words.get(5).map(|p| p.split(',').map(|x| x.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>());
                for (w, n) in per.unwrap_or_default().into_iter().enumerate() {
                    if lost.by_worker.len() <= w {
                        lost.by_worker.resize(w + 1, 0);
                    }
                    if let Some(c) = lost.by_worker.get_mut(w) {
                        *c = c.saturating_add(n);
                    }
                }
                lost.at_last = parse_totals(&words);
            }
            // An update the checkpoint holds: the server was killed after writing the
            // checkpoint and before restarting the journal. The checkpoint's totals are this
            // update's.
            (Some("update"), Some(_)) => {
                lost.at_checkpoint = parse_totals(&words);
                lost.at_last = lost.at_checkpoint;
            }
            _ => {}
        }
    }
    Ok(lost)
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
