use super::*;
use std::sync::Arc;

fn dir() -> PathBuf {
    default_dir()
}

#[test]
fn a_region_is_created_private_mapped_by_its_peer_and_unlinked() {
    let server = Region::create(&dir(), 10).unwrap();
    let path = server.path().unwrap();
    assert!(path.file_name().unwrap().to_str().unwrap().starts_with(FILE_PREFIX));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), region_len(10) as u64);
    let worker = Region::open(&path, 10).unwrap();
    assert_eq!(worker.proof(), server.proof(), "the peer reads the same nonce");
    let other = Region::create(&dir(), 10).unwrap();
    assert_ne!(other.proof(), server.proof(), "each region has its own nonce");
    server.unlink();
    assert!(!path.exists());
    server.unlink();
    let path = other.path().unwrap();
    drop(other);
    assert!(!path.exists(), "dropping a region unlinks its file");
}

#[test]
fn a_wrong_size_a_bad_magic_or_a_link_is_not_mapped() {
    let server = Region::create(&dir(), 10).unwrap();
    let path = server.path().unwrap();
    let e = Region::open(&path, 11 << 20).unwrap_err();
    assert!(e.contains("bytes, a region for this model has"), "{e}");
    // A file of the right size that is not a region.
    let fake = dir().join(format!("{FILE_PREFIX}test-fake-{}", std::process::id()));
    std::fs::write(&fake, vec![0u8; region_len(10)]).unwrap();
    let e = Region::open(&fake, 10).unwrap_err();
    assert!(e.contains("bad magic"), "{e}");
    // A truncated region.
    std::fs::write(&fake, vec![0u8; region_len(10) - 1]).unwrap();
    assert!(Region::open(&fake, 10).is_err());
    std::fs::remove_file(&fake).unwrap();
    #[cfg(unix)]
    {
        let link = dir().join(format!("{FILE_PREFIX}test-link-{}", std::process::id()));
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = Region::open(&link, 10).unwrap_err();
        std::fs::remove_file(&link).unwrap();
        assert!(e.contains("not a regular file"), "{e}");
    }
    assert!(Region::open(Path::new("/nonexistent/syncopate"), 10).is_err());
}

#[test]
fn a_slot_is_written_once_until_consumed_and_read_only_at_its_sequence_number() {
    let server = Region::create(&dir(), 100).unwrap();
    let worker = Region::open(&server.path().unwrap(), 100).unwrap();
    let fill = |v: u8, n: usize| {
        move |slot: &mut [u8]| {
            slot[..n].fill(v);
            Ok::<_, ()>(n)
        }
    };
    let (k, len) = worker.try_write(Dir::ToServer, fill(7, 40)).unwrap();
    assert_eq!((k, len), (1, 40));
    assert_eq!(worker.try_write(Dir::ToServer, fill(8, 40)), None, "unconsumed: the writer falls back");
    assert_eq!(server.read(Dir::ToServer, 2, 40), None, "not published");
    assert_eq!(server.read(Dir::ToServer, 1, server.capacity() + 1), None, "past the slot");
    assert_eq!(server.read(Dir::ToServer, 1, 40).unwrap(), &[7u8; 40][..]);
    server.consume(Dir::ToServer, 1);
    assert_eq!(worker.try_write(Dir::ToServer, fill(9, 3)), Some((2, 3)));
    assert_eq!(server.read(Dir::ToServer, 2, 3).unwrap(), &[9u8; 3][..]);
    // The other slot is independent.
    assert_eq!(server.try_write(Dir::ToWorker, fill(5, 10)), Some((1, 10)));
    assert_eq!(worker.read(Dir::ToWorker, 1, 10).unwrap(), &[5u8; 10][..]);
    // A fill that fails or claims more than the slot publishes nothing.
    worker.consume(Dir::ToWorker, 1);
    assert_eq!(server.try_write(Dir::ToWorker, |_| Err::<usize, ()>(())), None);
    let cap = server.capacity();
    assert_eq!(server.try_write(Dir::ToWorker, |_| Ok::<_, ()>(cap + 1)), None);
    assert_eq!(server.try_write(Dir::ToWorker, fill(6, 1)), Some((2, 1)));
}

#[test]
fn the_registry_unlinks_what_is_still_named() {
    let reg = Registry::default();
    let a = Arc::new(Region::create(&dir(), 4).unwrap());
    let b = Arc::new(Region::create(&dir(), 4).unwrap());
    reg.add(&a);
    reg.add(&b);
    let (pa, pb) = (a.path().unwrap(), b.path().unwrap());
    drop(b);
    assert!(!pb.exists());
    reg.unlink_all();
    assert!(!pa.exists());
    assert!(a.path().is_none());
}
