//! Tests of the checkpoint format.

use super::*;
use syncopate::proto::{AdamW, Schedule};

#[test]
fn round_trip_and_corruption() {
    let dir = std::env::temp_dir().join(format!("syncopate-ckpt-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.ckpt");
    let params = vec![1.5f32, -0.0, f32::MIN_POSITIVE, 3.0];
    save(&path, "bsp", Version(42), &params).unwrap();
    let c = load(&path, "bsp", 4).unwrap();
    assert_eq!(
        c,
        Checkpoint {
            protocol: "bsp".into(),
            version: Version(42),
            params: params.clone(),
            optimizer: Optimizer::SGD,
            optimizer_state: None,
            identity: None,
            accepted: 0
        }
    );
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

#[test]
fn momentum_and_its_buffer_round_trip_and_format_1_reads_as_no_momentum() {
    let path = Path::new("m.ckpt");
    let (params, prev) = ([1.0f32, 2.0], [0.5f32, 1.5]);
    let bytes = encode_with_momentum("asp", Version(7), &params, Some((0.9, &prev)));
    let c = decode(path, &bytes).unwrap();
    assert_eq!((c.momentum(), c.momentum_buffer()), (0.9, Some(&prev[..])));
    assert_eq!(c.params, params);
    for cut in 0..bytes.len() {
        assert!(decode(path, &bytes[..cut]).is_err());
    }
    // A format-1 file (what earlier builds wrote): no momentum fields.
    let mut old = MAGIC.to_vec();
    old.extend_from_slice(&1u32.to_le_bytes());
    old.push(3);
    old.extend_from_slice(b"asp");
    old.extend_from_slice(&2u64.to_le_bytes());
    old.extend_from_slice(&7u64.to_le_bytes());
    old.extend(params.iter().flat_map(|p| p.to_le_bytes()));
    let sum = Sha256::digest(&old);
    old.extend_from_slice(&sum);
    let c = decode(path, &old).unwrap();
    assert_eq!((c.version, c.momentum(), c.momentum_buffer()), (Version(7), 0.0, None));
}

#[test]
fn the_journal_names_the_versions_after_the_checkpoint() {
    let dir = std::env::temp_dir().join(format!("syncopate-journal-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.ckpt");
    assert_eq!(lost_since(&path, Version(3), None).unwrap().versions, None, "no journal: nothing lost");
    let t = |a: u64| Totals { received: a, accepted: a, applied: a, dropped: 0 };
    let mut j = Journal::start(&path, Version(0), &t(0), "r1").unwrap();
    j.update(Version(1), &[1, 1], &t(2)).unwrap();
    j.update(Version(2), &[1, 1], &t(4)).unwrap();
    j.restart(Version(2), &t(4)).unwrap();
    j.update(Version(3), &[1, 1], &t(6)).unwrap();
    j.update(Version(4), &[0, 1], &t(7)).unwrap();
    let lost = lost_since(&path, Version(2), Some("r1")).unwrap();
    assert_eq!(lost.versions, Some((Version(3), Version(4))));
    assert_eq!((lost.contributions, lost.by_worker.clone()), (3, vec![1, 2]));
    assert_eq!((lost.at_checkpoint, lost.at_last), (t(4), t(7)));
    assert_eq!(
        lost.line(),
        "versions 3..=4 (3 contributions: worker 0: 1, worker 1: 2) lost since the checkpoint at version 2"
    );
    // The checkpoint of version 4 was written but the journal not yet restarted: nothing
    // lost, and the checkpoint holds everything applied up to version 4.
    let held = lost_since(&path, Version(4), Some("r1")).unwrap();
    assert_eq!((held.versions, held.contributions), (None, 0));
    assert_eq!((held.at_checkpoint, held.at_last), (t(7), t(7)));
    // A torn last line is ignored.
    fs::OpenOptions::new()
        .append(true)
        .open(Journal::path_for(&path))
        .unwrap()
        .write_all(b"update 5 contributions 1 workers 1,0 accepted 8 applied 8")
        .unwrap();
    assert_eq!(lost_since(&path, Version(2), Some("r1")).unwrap().versions, Some((Version(3), Version(4))));
    // The journal of another run is not this checkpoint's.
    let e = lost_since(&path, Version(2), Some("r2")).unwrap_err().to_string();
    assert!(e.contains("belongs to run r1, the checkpoint to run r2"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_names_its_run_and_the_gradients_it_accepted_over_its_sessions() {
    let path = Path::new("m.ckpt");
    let identity = RunIdentity { settings: [7; 32], run: "abc-1".into(), label: "bsp with 2 workers".into() };
    let stamp = Stamp { identity: Some(identity.clone()), accepted_before: 1000 };
    let bytes = encode_stamped("bsp", Version(9), &[1.0, 2.0], None, stamp.identity.as_ref(), 1012);
    let c = decode(path, &bytes).unwrap();
    assert_eq!((c.identity, c.accepted, c.version), (Some(identity), 1012, Version(9)));
    for cut in 0..bytes.len() {
        assert!(decode(path, &bytes[..cut]).is_err());
    }
    // No identity reads back as none; a label too long is cut at a character boundary.
    let c = decode(path, &encode_with_momentum("bsp", Version(1), &[1.0], None)).unwrap();
    assert_eq!((c.identity, c.accepted), (None, 0));
    let long = RunIdentity { settings: [0; 32], run: "r".into(), label: "é".repeat(MAX_LABEL_LEN) };
    let c = decode(path, &encode_stamped("bsp", Version(1), &[1.0], None, Some(&long), 3)).unwrap();
    assert_eq!(c.identity.unwrap().label.len(), MAX_LABEL_LEN);
    // A format-2 file (no identity) still reads.
    let v2 = old_format(2, "bsp", Version(4), &[1.0], 0.0, None);
    let c = decode(path, &v2).unwrap();
    assert_eq!((c.version, c.identity, c.accepted), (Version(4), None, 0));
    assert_ne!(RunIdentity::new_run_id(), "");
}

/// A checkpoint of format 2 or 3 (a momentum coefficient and buffer in place of the
/// rule's fields; format 3 with `identity`, `accepted` 5).
fn old_format(
    format: u32,
    protocol: &str,
    version: Version,
    params: &[f32],
    beta: f64,
    identity: Option<&RunIdentity>,
) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&format.to_le_bytes());
    out.push(protocol.len() as u8);
    out.extend_from_slice(protocol.as_bytes());
    out.extend_from_slice(&(params.len() as u64).to_le_bytes());
    out.extend_from_slice(&version.0.to_le_bytes());
    out.extend(params.iter().flat_map(|p| p.to_le_bytes()));
    out.extend_from_slice(&beta.to_le_bytes());
    if beta > 0.0 {
        out.extend(params.iter().flat_map(|p| (p - 1.0).to_le_bytes()));
    }
    if format >= 3 {
        let none = RunIdentity::default();
        let id = identity.unwrap_or(&none);
        out.extend_from_slice(&id.settings);
        out.push(id.run.len() as u8);
        out.extend_from_slice(id.run.as_bytes());
        out.extend_from_slice(&(id.label.len() as u16).to_le_bytes());
        out.extend_from_slice(id.label.as_bytes());
        out.extend_from_slice(&5u64.to_le_bytes());
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

#[test]
fn every_rule_and_its_state_round_trip_and_format_3_reads_as_momentum() {
    let path = Path::new("m.ckpt");
    let params = [1.0f32, -2.0, 0.5];
    let rules = [
        Optimizer::SGD,
        Optimizer::momentum(0.9),
        Optimizer::nesterov(0.5).with_schedule(Schedule::Step { every: 3, gamma: 0.5 }),
        Optimizer::adamw(AdamW::default()).with_schedule(Schedule::WarmupCosine { warmup: 2, total: 9, floor: 0.1 }),
        Optimizer::MEAN,
    ];
    for o in rules {
        let state: Vec<f32> = (0..o.state_len(params.len())).map(|i| i as f32 * 0.25).collect();
        let bytes = encode_stamped("bsp", Version(3), &params, Some((o, &state)), None, 0);
        let c = decode(path, &bytes).unwrap();
        assert_eq!(c.optimizer, o);
        assert_eq!(c.optimizer_state.clone().unwrap_or_default(), state, "{o:?}");
        assert_eq!(
            encode_stamped("bsp", Version(3), &params, c.optimizer_state.as_deref().map(|s| (o, s)), None, 0),
            bytes
        );
        for cut in 0..bytes.len() {
            assert!(decode(path, &bytes[..cut]).is_err());
        }
    }
    // A rule out of range, or state of another length, is refused naming the rule.
    let bad = encode_stamped("bsp", Version(3), &params, Some((Optimizer::momentum(1.5), &[0.0; 3])), None, 0);
    assert!(decode(path, &bad).unwrap_err().to_string().contains("update rule"));
    // Format 3 (what the previous build wrote): momentum and its buffer, read as the rule.
    let identity = RunIdentity { settings: [3; 32], run: "r".into(), label: "bsp".into() };
    let c = decode(path, &old_format(3, "bsp", Version(8), &params, 0.5, Some(&identity))).unwrap();
    assert_eq!((c.optimizer, c.momentum_buffer()), (Optimizer::momentum(0.5), Some(&[0.0f32, -3.0, -0.5][..])));
    assert_eq!((c.identity, c.accepted), (Some(identity), 5));
}
