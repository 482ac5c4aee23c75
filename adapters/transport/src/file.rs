//! Files an adapter writes whole (checkpoints, `.npy` models, shard records) and files it
//! reads whole: one rule for each.
//!
//! **Replacing** ([`replace`]): the bytes go to a new temporary file in the target's
//! directory, which is synced, renamed over the target, and then the directory is synced:
//! a crash leaves the old file or the new one, never a mix, and a finished replacement
//! survives a power cut. Only a regular file is replaced: a path that names a directory, a
//! device, a FIFO or a socket is refused and left as it is. A symbolic link is written
//! through: the file it points to is replaced and the link stays; a link to nothing, or to
//! something other than a regular file, is refused. A new file gets the mode a new file
//! gets (0666 less the umask); a replaced one keeps its mode.
//!
//! **Checking before a run** ([`check_replaceable`]): the same refusals, and a probe file
//! created and removed in the target's directory, so that a run whose output cannot be
//! written is refused before it trains rather than after.
//!
//! **Reading** ([`open_regular`], [`read_regular`]): only a regular file is read (a device
//! such as `/dev/zero` never ends, a FIFO blocks), opened without blocking and read up to a
//! bound the caller gives.

use std::fs::{self, File, Metadata};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Distinguishes the temporary files of one process.
static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);
/// Names tried for a temporary file before giving up (each is new to this process; a
/// clash means a file of that name was left by another process).
const TEMP_TRIES: u32 = 64;

/// What a file-system object is, in words (`a directory`, `a character device`).
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_file() { "a regular file" } else { "not a regular file" }
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// The file a replacement of `path` writes, and its metadata if it exists: `path` itself,
/// or for a symbolic link the file it points to. Refused: a path without a file name, an
/// existing object that is not a regular file, a link to nothing.
fn target(path: &Path) -> io::Result<(PathBuf, Option<Metadata>)> {
    if path.file_name().is_none() {
        return Err(refused("not a file name".into()));
    }
    let link = match fs::symlink_metadata(path) {
        Ok(meta) => meta.file_type().is_symlink(),
        // Nothing there yet (or a parent that is no directory, which the caller's check of the
        // directory names).
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Ok((path.to_owned(), None));
        }
        Err(e) => return Err(e),
    };
    let resolved = if link {
        fs::canonicalize(path)
            .map_err(|e| refused(format!("a symbolic link that points to nothing that can be written ({e})")))?
    } else {
        path.to_owned()
    };
    let meta = fs::metadata(&resolved)?;
    if !meta.is_file() {
        let what = kind(&meta);
        let through = if link { format!("a symbolic link to {what} ({})", resolved.display()) } else { what.into() };
        return Err(refused(format!("{through}, not a regular file: refusing to replace it")));
    }
    Ok((resolved, Some(meta)))
}

/// The directory holding `file` (`.` for a bare name).
fn directory(file: &Path) -> &Path {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Creates a new temporary file next to `file`, named `.NAME.PID.N.tmp`.
fn create_temp(file: &Path) -> io::Result<(PathBuf, File)> {
    let name = file.file_name().unwrap_or_default();
    let mut last = None;
    for _ in 0..TEMP_TRIES {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp = file.with_file_name(tmp_name);
        match fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary file name")))
}

/// Replaces the file at `path` with `bytes`, atomically and durably (see the module
/// documentation for what is refused and how links are followed).
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (file, existing) = target(path)?;
    let (tmp, mut f) = create_temp(&file)?;
    let written = (|| {
        f.write_all(bytes)?;
        if let Some(meta) = &existing {
            f.set_permissions(meta.permissions())?;
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &file)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_directory(directory(&file))
}

/// Syncs a directory, so that a rename in it survives a power cut.
fn sync_directory(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Other platforms cannot open a directory as a file; the rename is all there is.
        let _ = dir;
        Ok(())
    }
}

/// Checks that [`replace`] could write `path` now: the same refusals, and a probe file
/// created (and removed) in its directory. The error says what is wrong, without the path.
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    let (file, _) = target(path)?;
    let dir = directory(&file);
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(meta) => return Err(refused(format!("{} is {}, not a directory", dir.display(), kind(&meta)))),
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Err(refused(format!("the directory {} does not exist", dir.display())));
        }
        Err(e) => return Err(e),
    }
    let (tmp, f) = create_temp(&file)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create a file in {}: {e}", dir.display())))?;
    drop(f);
    fs::remove_file(tmp)
}

/// Opens the regular file at `path` for reading, and its length: anything else (a
/// directory, a device, a FIFO, a socket) is refused without blocking.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        // A FIFO's open blocks until a writer comes; a regular file ignores the flag.
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(format!("{}, not a regular file", kind(&meta))));
    }
    Ok((file, meta.len()))
}

/// The bytes of the regular file at `path`, refused when it holds more than `limit`.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    if len > limit {
        return Err(refused(format!("{len} bytes, more than the {limit} this file may hold")));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // The file may have grown since its length was read: the bound holds regardless.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(refused(format!("more than the {limit} bytes this file may hold")));
    }
    Ok(bytes)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _, symlink};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("syncopate-file-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success(), "mkfifo");
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_is_replaced_whole_keeping_its_mode_and_no_temporary_file_is_left() {
        let dir = scratch("replace");
        let path = dir.join("m.bin");
        replace(&path, b"one").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        replace(&path, b"two!").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two!");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        assert_eq!(entries(&dir), ["m.bin"]);
        check_replaceable(&path).unwrap();
        check_replaceable(&dir.join("new.bin")).unwrap();
        assert_eq!(entries(&dir), ["m.bin"], "the probe is removed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_a_device_or_a_directory_is_refused_and_left_as_it_is() {
        let dir = scratch("special");
        let fifo = dir.join("f");
        mkfifo(&fifo);
        for path in [fifo.as_path(), Path::new("/dev/null"), dir.as_path()] {
            let e = replace(path, b"x").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}: {e}", path.display());
            assert!(e.to_string().contains("not a regular file: refusing to replace it"), "{e}");
            assert!(check_replaceable(path).is_err(), "{}", path.display());
        }
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        assert!(replace(&fifo, b"x").unwrap_err().to_string().starts_with("a FIFO"));
        assert!(replace(Path::new("/dev/null"), b"x").unwrap_err().to_string().starts_with("a character device"));
        assert_eq!(entries(&dir), ["f"], "no temporary file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symbolic_link_is_written_through_and_a_link_to_a_device_or_nothing_is_refused() {
        let dir = scratch("links");
        let real = dir.join("real.bin");
        fs::write(&real, b"old").unwrap();
        let link = dir.join("link.bin");
        symlink(&real, &link).unwrap();
        replace(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
        assert_eq!(fs::read(&real).unwrap(), b"new", "its target is replaced");
        let to_null = dir.join("null.bin");
        symlink("/dev/null", &to_null).unwrap();
        let e = replace(&to_null, b"x").unwrap_err().to_string();
        assert!(e.starts_with("a symbolic link to a character device (/dev/null)"), "{e}");
        let dangling = dir.join("dangling.bin");
        symlink(dir.join("missing/x"), &dangling).unwrap();
        assert!(replace(&dangling, b"x").unwrap_err().to_string().contains("points to nothing"));
        assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_found_before_anything_is_written() {
        let dir = scratch("missing");
        let e = check_replaceable(&dir.join("no/such/f.npy")).unwrap_err().to_string();
        assert!(e.contains("no/such does not exist"), "{e}");
        fs::write(dir.join("plain"), b"").unwrap();
        let e = check_replaceable(&dir.join("plain/f.npy")).unwrap_err().to_string();
        assert!(e.contains("plain is a regular file, not a directory"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_regular_files_are_read_and_never_past_the_bound() {
        let dir = scratch("read");
        let fifo = dir.join("f");
        mkfifo(&fifo);
        // Would block forever in a plain open.
        assert!(open_regular(&fifo).unwrap_err().to_string().starts_with("a FIFO, not a regular file"));
        assert!(read_regular(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string().contains("character device"));
        assert!(open_regular(&dir).unwrap_err().to_string().starts_with("a directory"));
        let path = dir.join("r");
        fs::write(&path, [7u8; 10]).unwrap();
        assert_eq!(read_regular(&path, 10).unwrap(), [7u8; 10]);
        assert!(read_regular(&path, 9).unwrap_err().to_string().contains("10 bytes, more than the 9"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
