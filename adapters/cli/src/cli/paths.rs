//! The files a run reads and writes, checked before it starts.
//!
//! An input must be a regular file: a device such as `/dev/zero` never ends and a FIFO
//! blocks, so either is refused, without reading it, naming the flag.
//!
//! An output must be writable as [`file::replace`](syncopate_transport::file::replace)
//! writes (a regular file or a new one, in a directory that exists and takes a new file;
//! never a directory, a device or a FIFO); a file the caller creates itself before the run
//! (a trace) must only not be a device, a FIFO or a socket. No two flags may name the same
//! file. A refusal names the flag, the path and the reason, so a run is never trained only
//! to lose its result at the end.

use std::path::{Path, PathBuf};

/// One file a run writes: the flag that names it and the path.
pub(super) struct Output<'a> {
    /// The flag, as the user typed it (`--save`).
    pub(super) flag: &'static str,
    /// The path the flag gives.
    pub(super) path: &'a Path,
    /// The files written beside it (a checkpoint's journal), named for collisions only.
    pub(super) companions: Vec<(&'static str, PathBuf)>,
    /// Whether to check that it can be written; off for a file the caller creates itself
    /// before the run (and so checks with its own message), compared for collisions only.
    pub(super) probe: bool,
}

impl<'a> Output<'a> {
    /// The output `path` of `flag`, with no companion files.
    pub(super) fn new(flag: &'static str, path: &'a Path) -> Self {
        Self { flag, path, companions: Vec::new(), probe: true }
    }

    /// The output `path` of `flag`, which the caller creates before the run: compared for
    /// collisions only.
    pub(super) fn created_first(flag: &'static str, path: &'a Path) -> Self {
        Self { probe: false, ..Self::new(flag, path) }
    }
}

/// The file `path` names, comparable with another's: a link resolved, the directory made
/// absolute (the file itself may not exist yet).
fn identity(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(dir), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_owned(),
    }
}

/// Checks that the input `path` of `flag` is a regular file (see the module documentation).
pub(super) fn input(flag: &str, path: &Path) -> Result<(), String> {
    syncopate_transport::file::open_regular(path).map(drop).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// Checks every output (see the module documentation).
pub(super) fn check(outputs: &[Output<'_>]) -> Result<(), String> {
    for o in outputs {
        if o.probe {
            syncopate_transport::file::check_replaceable(o.path)
                .map_err(|e| format!("{} {}: {e}", o.flag, o.path.display()))?;
        } else if std::fs::metadata(o.path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            // A FIFO would block the creation; a device would swallow the file.
            return Err(format!(
                "{} {}: a device, FIFO or socket, not a regular file: refusing to write it",
                o.flag,
                o.path.display()
            ));
        }
    }
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    for o in outputs {
        let mut names = vec![(o.flag.to_owned(), identity(o.path))];
        names.extend(o.companions.iter().map(|(what, p)| (format!("{} ({what})", o.flag), identity(p))));
        for (name, id) in names {
            if let Some((other, _)) = seen.iter().find(|(_, s)| *s == id) {
                return Err(format!(
                    "{other} and {name} name the same file {}: each output needs a file of its own",
                    o.path.display()
                ));
            }
            seen.push((name, id));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_flags_naming_one_file_are_refused_by_name_even_through_another_spelling() {
        let dir = std::env::temp_dir().join(format!("syncopate-outputs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let a = dir.join("c.ckpt");
        let b = dir.join("sub/../c.ckpt");
        let e = check(&[Output::new("--checkpoint", &a), Output::new("--save", &b)]).unwrap_err();
        assert!(e.starts_with("--checkpoint and --save name the same file"), "{e}");
        let journal = dir.join("c.ckpt.journal");
        let with_journal =
            Output { companions: vec![("its journal", journal.clone())], ..Output::new("--checkpoint", &a) };
        let e = check(&[with_journal, Output::new("--record-trace", &journal)]).unwrap_err();
        assert!(e.starts_with("--checkpoint (its journal) and --record-trace name the same file"), "{e}");
        check(&[Output::new("--checkpoint", &a), Output::new("--save", &dir.join("m.npy"))]).unwrap();
        let e = check(&[Output::new("--save", &dir)]).unwrap_err();
        assert!(e.contains("a directory, not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
