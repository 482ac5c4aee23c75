//! `syncopate serve --shard I/S`: one server of a sharded run, holding the `I`-th of `S`
//! contiguous slices of the model ([`ShardLayout`](syncopate::proto::sharded::ShardLayout)),
//! and its checkpoints.
//!
//! Every shard is started with the run's flags and its own `--shard I/S` and `--listen`;
//! workers list every shard's address in shard order (`work --connect A0,A1,...`). A shard
//! is the protocol's unchanged server over its slice, announcing the run's settings with
//! its index, count and the run's id (`--run-id`), which each worker checks in every
//! shard's handshake.
//!
//! **Checkpoints.** A shard's checkpoint holds its slice. Next to it, `FILE.shard` records
//! whose slice it is (shard, count, elements, run name, the run's id and the digest of the
//! run's settings), written when the shard starts; `--resume` refuses a checkpoint whose
//! record is missing or names another shard, count, model or run, naming what differs. Each
//! shard resumes from its own checkpoint at its own version: the shards keep no common
//! history, so what a resumed shard lost (named by its journal) is lost from its slice only.
//!
//! **Run identity.** Every server with `--checkpoint`, sharded or not, writes its record
//! when it starts afresh (`FILE.shard`, or `FILE.run` for a whole model) with a new run id;
//! its checkpoints and journal carry that id and the settings' digest. `--resume` takes the
//! record's id and refuses a checkpoint of another run (one the record's run, killed before
//! its first checkpoint, left in place) or of other settings, naming what differs.

use crate::tcp::RunSettings;
use crate::tcp::checkpoint::{Checkpoint, RunIdentity};
use clap::Args;
use std::path::{Path, PathBuf};

/// The most shards of one run.
const MAX_SHARDS: u32 = 1024;

/// Flags of `syncopate serve` for a sharded run.
#[derive(Clone, Debug, Default, Args)]
pub struct ShardArgs {
    /// Serve shard I of S (0 <= I < S, S >= 2): the I-th of S contiguous slices of the model.
    /// Start one `serve` per shard with the same flags; workers give every shard's address
    /// in shard order (`work --connect A0,A1,...`).
    #[arg(long, value_name = "I/S", value_parser = parse_shard)]
    pub shard: Option<(u32, u32)>,
    /// The run's name, the same on every shard (at most 64 letters, digits, '-', '_', '.'):
    /// workers refuse a shard
    /// of another run. Without it, shards with the same settings count as one run.
    #[arg(long, value_name = "NAME", requires = "shard", default_value = "", value_parser = parse_run_id)]
    pub run_id: String,
}

/// `I/S` with `0 <= I < S` and `2 <= S <= MAX_SHARDS`.
fn parse_shard(s: &str) -> Result<(u32, u32), String> {
    let bad = |why: &str| format!("'{s}' is not a shard: {why} (expected I/S, e.g. 0/2 for the first of two)");
    let (i, n) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
    let i: u32 = i.trim().parse().map_err(|_| bad("I is not a whole number"))?;
    let n: u32 = n.trim().parse().map_err(|_| bad("S is not a whole number"))?;
    if !(2..=MAX_SHARDS).contains(&n) {
        return Err(bad(&format!("S must be from 2 to {MAX_SHARDS} (without --shard one server holds the model)")));
    }
    if i >= n {
        return Err(bad(&format!("I must be below S ({n})")));
    }
    Ok((i, n))
}

fn parse_run_id(s: &str) -> Result<String, String> {
    if s.len() > crate::tcp::settings::MAX_RUN_ID_LEN {
        return Err(format!("the run id is longer than {} bytes", crate::tcp::settings::MAX_RUN_ID_LEN));
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(format!("the run id '{}' may hold only letters, digits, '-', '_' and '.'", s.escape_default()));
    }
    Ok(s.to_owned())
}

/// Makes `settings` those of the shard `args` names (nothing without `--shard`); refused
/// for a model that does not split into `S` slices of at least one element.
pub(super) fn apply(args: &ShardArgs, settings: &mut RunSettings) -> Result<(), String> {
    let Some((index, count)) = args.shard else { return Ok(()) };
    settings.shard = Some(crate::tcp::ShardSettings { index, count, run: args.run_id.clone() });
    settings.shard_layout().map_err(|e| format!("--shard {index}/{count}: {e}"))?;
    Ok(())
}

/// `, shard I of S (elements A to B)` (both included) for a shard's start line; empty for a whole model.
pub(super) fn describe(settings: &RunSettings) -> String {
    match (&settings.shard, settings.served_range()) {
        (Some(s), Ok(r)) => {
            format!(", shard {} of {} (elements {} to {})", s.index, s.count, r.start, r.end.saturating_sub(1))
        }
        _ => String::new(),
    }
}

/// The record of whose run (and, for a shard, whose slice) a checkpoint holds: `FILE.shard`
/// for a shard, `FILE.run` for a whole model.
pub(super) fn record_path(checkpoint: &Path, settings: &RunSettings) -> PathBuf {
    record_file(checkpoint, settings.shard.is_some())
}

/// [`record_path`] of a shard's (`sharded`) or a whole model's checkpoint.
pub(super) fn record_file(checkpoint: &Path, sharded: bool) -> PathBuf {
    let mut p = checkpoint.as_os_str().to_owned();
    p.push(if sharded { ".shard" } else { ".run" });
    PathBuf::from(p)
}

/// The settings a resumed run must share with its checkpoint: a shard's with the index set
/// to 0 (the same on every shard of a run), without the step-time recording (a trace may
/// be recorded by one session of a run and not by another) and without where the initial
/// model came from (a resumed run takes its model from the checkpoint).
fn common(settings: &RunSettings) -> RunSettings {
    let mut common = settings.clone();
    if let Some(shard) = &mut common.shard {
        shard.index = 0;
    }
    common.report_step_times = false;
    common.initial_from_worker = false;
    common
}

/// The identity of the run `run` of `settings`, as its checkpoints carry it.
pub(super) fn identity(settings: &RunSettings, run: &str) -> Result<RunIdentity, String> {
    let common = common(settings);
    Ok(RunIdentity { settings: common.digest()?, run: run.to_owned(), label: common.label() })
}

/// The record's text for the run `run` of `settings` (one line).
fn record(settings: &RunSettings, run: &str) -> Result<String, String> {
    let digest: String = common(settings).digest()?.iter().map(|b| format!("{b:02x}")).collect();
    let Some(s) = &settings.shard else {
        return Ok(format!("model of {} id {run} settings {digest}\n", settings.dim));
    };
    let r = settings.served_range()?;
    Ok(format!(
        "shard {} of {} elements {}..{} of {} run '{}' id {run} settings {digest}\n",
        s.index, s.count, r.start, r.end, settings.dim, s.run
    ))
}

/// Writes the record of the run `run` next to its checkpoint `checkpoint`, with
/// [`file::replace`](syncopate_transport::file::replace).
pub(super) fn write_record(checkpoint: &Path, settings: &RunSettings, run: &str) -> Result<(), String> {
    let path = record_path(checkpoint, settings);
    syncopate_transport::file::replace(&path, record(settings, run)?.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Checks that the record next to `checkpoint` is of this run's settings (and for a shard,
/// of its own slice) and returns the id of the run that started last on this checkpoint:
/// `None` for a whole model without a record (a checkpoint need not have one).
pub(super) fn check_record(checkpoint: &Path, settings: &RunSettings) -> Result<Option<String>, String> {
    let path = record_path(checkpoint, settings);
    let text = match (std::fs::read_to_string(&path), &settings.shard) {
        (Ok(text), _) => text,
        (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        (Err(e), None) => {
            return Err(format!(
                "checkpoint {}: cannot read its record {} ({e})",
                checkpoint.display(),
                path.display()
            ));
        }
        (Err(e), Some(me)) => {
            return Err(format!(
                "checkpoint {}: cannot read its shard record {} ({e}): it was not written by a shard, so it cannot \
                 resume shard {} of {}",
                checkpoint.display(),
                path.display(),
                me.index,
                me.count
            ));
        }
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let word = |k: &str| words.iter().position(|w| *w == k).and_then(|i| words.get(i + 1)).copied().unwrap_or("?");
    let id = word("id");
    let parses = |w: &str| w.parse::<u32>().is_ok();
    let first = if settings.shard.is_some() { "shard" } else { "model" };
    let shaped =
        words.first() == Some(&first) && (settings.shard.is_none() || (parses(word("shard")) && parses(word("of"))));
    if shaped && text == record(settings, id)? {
        return Ok(Some(id.to_owned()));
    }
    let why = match &settings.shard {
        _ if !shaped => format!(
            "its record is not one (expected a line '{first} ...' as a {} writes it)",
            if settings.shard.is_some() { "shard" } else { "server" }
        ),
        Some(me) if word("shard") != me.index.to_string() || word("of") != me.count.to_string() => format!(
            "it holds shard {} of {}'s slice, this server is shard {} of {}",
            word("shard"),
            word("of"),
            me.index,
            me.count
        ),
        Some(me) if word("run") != format!("'{}'", me.run) => {
            format!("it belongs to run {}, this server to run '{}'", word("run"), me.run)
        }
        _ if id == "?" => "it names no run id (written by an older build): start the run afresh".to_owned(),
        _ => "it was written by a run of other settings (protocol, knobs, model or workload differ)".to_owned(),
    };
    Err(format!("checkpoint {}: {why} (record {})", checkpoint.display(), path.display()))
}

/// Checks that the checkpoint `c` at `path` is the latest of the run the record names
/// (`record_run`; `None`: no record) with these `settings`, and returns the run's id.
pub(super) fn check_identity(
    path: &Path,
    c: &Checkpoint,
    settings: &RunSettings,
    record_run: Option<&str>,
) -> Result<String, String> {
    let ours = identity(settings, "")?;
    let at = format!("checkpoint {} (version {})", path.display(), c.version.0);
    let fresh = "start the run afresh (without --resume)";
    match (&c.identity, record_run) {
        (Some(theirs), _) if theirs.settings != ours.settings => Err(format!(
            "{at} was written by a run of other settings: {}; this server runs {}",
            theirs.label, ours.label
        )),
        (Some(theirs), Some(last)) if theirs.run != last => Err(format!(
            "{at} holds run {}'s model, but run {last} started on this checkpoint after it and stopped before \
             writing its own: {fresh}",
            theirs.run
        )),
        (Some(theirs), _) => Ok(theirs.run.clone()),
        (None, Some(last)) => Err(format!(
            "{at} names no run, but run {last} started on this checkpoint after it and stopped before writing \
             its own: {fresh}"
        )),
        (None, None) => Ok(RunIdentity::new_run_id()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{ProtocolSettings, ShardSettings};
    use syncopate::ProtocolKind;

    #[test]
    fn a_shard_is_i_of_s_with_i_below_s_and_at_least_two_shards() {
        assert_eq!(parse_shard("1/3"), Ok((1, 3)));
        for bad in ["3/3", "0/1", "0/0", "1", "a/2", "1/b", "-1/2", "0/4096"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
        assert!(parse_shard("2/2").unwrap_err().contains("I must be below S (2)"));
        assert!(parse_run_id(&"x".repeat(65)).is_err());
        assert!(parse_run_id("a\nb").is_err() && parse_run_id("a b").is_err());
        assert_eq!(parse_run_id("exp-3.b_1"), Ok("exp-3.b_1".into()));
    }

    fn settings(index: u32, count: u32, run: &str) -> RunSettings {
        let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10);
        s.shard = Some(ShardSettings { index, count, run: run.into() });
        s
    }

    #[test]
    fn a_model_that_does_not_split_is_refused_at_start() {
        let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 3);
        let e = apply(&ShardArgs { shard: Some((0, 4)), run_id: String::new() }, &mut s).unwrap_err();
        assert_eq!(e, "--shard 0/4: a model of 3 elements does not split into 4 shards of at least one element each");
    }

    #[test]
    fn a_checkpoint_resumes_only_its_own_shard_of_its_own_run() {
        let dir = std::env::temp_dir().join(format!("syncopate-shard-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ckpt = dir.join("s.ckpt");
        let e = check_record(&ckpt, &settings(1, 2, "a")).unwrap_err();
        assert!(e.contains("cannot read its shard record") && e.contains("shard 1 of 2"), "{e}");
        write_record(&ckpt, &settings(1, 2, "a"), "x1").unwrap();
        assert_eq!(check_record(&ckpt, &settings(1, 2, "a")).unwrap().as_deref(), Some("x1"));
        let e = check_record(&ckpt, &settings(0, 2, "a")).unwrap_err();
        assert!(e.contains("it holds shard 1 of 2's slice, this server is shard 0 of 2"), "{e}");
        let e = check_record(&ckpt, &settings(1, 3, "a")).unwrap_err();
        assert!(e.contains("it holds shard 1 of 2's slice, this server is shard 1 of 3"), "{e}");
        let e = check_record(&ckpt, &settings(1, 2, "b")).unwrap_err();
        assert!(e.contains("it belongs to run 'a', this server to run 'b'"), "{e}");
        let mut other = settings(1, 2, "a");
        other.protocol.lr = 0.25;
        let e = check_record(&ckpt, &other).unwrap_err();
        assert!(e.contains("other settings"), "{e}");
        std::fs::write(record_path(&ckpt, &settings(1, 2, "a")), "garbage\n").unwrap();
        let e = check_record(&ckpt, &settings(1, 2, "a")).unwrap_err();
        assert!(e.contains("its record is not one") && !e.contains('?'), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn ckpt(identity: Option<RunIdentity>) -> Checkpoint {
        let (protocol, version, params) = ("bsp".to_owned(), syncopate::Version(7), vec![0.0; 10]);
        Checkpoint {
            protocol,
            version,
            params,
            optimizer: Default::default(),
            optimizer_state: None,
            identity,
            accepted: 14,
        }
    }

    #[test]
    fn a_resumed_run_refuses_a_checkpoint_another_run_left_or_of_other_settings() {
        let whole = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10);
        let path = Path::new("m.ckpt");
        let a = identity(&whole, "run-a").unwrap();
        assert_eq!(check_identity(path, &ckpt(Some(a.clone())), &whole, Some("run-a")), Ok("run-a".into()));
        assert_eq!(check_identity(path, &ckpt(Some(a.clone())), &whole, None), Ok("run-a".into()));
        // Run B started on A's checkpoint and was killed before it wrote one.
        let e = check_identity(path, &ckpt(Some(a.clone())), &whole, Some("run-b")).unwrap_err();
        assert!(e.contains("holds run run-a's model, but run run-b started on this checkpoint after it"), "{e}");
        let e = check_identity(path, &ckpt(None), &whole, Some("run-b")).unwrap_err();
        assert!(e.contains("names no run, but run run-b started"), "{e}");
        // Recording a trace is not a setting a resumed run must share; the model is.
        let mut traced = whole.clone();
        traced.report_step_times = true;
        assert!(check_identity(path, &ckpt(Some(a.clone())), &traced, Some("run-a")).is_ok());
        let mut other = whole.clone();
        other.protocol.lr = 0.25;
        let e = check_identity(path, &ckpt(Some(a)), &other, Some("run-a")).unwrap_err();
        assert!(e.contains("other settings") && e.contains("lr=0.5") && e.contains("lr=0.25"), "{e}");
        // A whole model's record: `FILE.run`, and its id comes back.
        let dir = std::env::temp_dir().join(format!("syncopate-run-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ckpt_path = dir.join("m.ckpt");
        assert_eq!(check_record(&ckpt_path, &whole), Ok(None));
        write_record(&ckpt_path, &whole, "run-c").unwrap();
        assert!(dir.join("m.ckpt.run").exists());
        assert_eq!(check_record(&ckpt_path, &whole), Ok(Some("run-c".into())));
        let e = check_record(&ckpt_path, &other).unwrap_err();
        assert!(e.contains("other settings"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
