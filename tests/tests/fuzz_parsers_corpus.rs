//! The fuzz targets of the adapters' parsers (`tcp_frame`, `handshake`, `session_payloads`,
//! `npy`, `checkpoint`, `journal`, `shard_record`, `scenario_toml`, `trace_csv`) in plain
//! `cargo test`: every committed file of `fuzz/corpus/<target>/` goes through the target's
//! own checks (`fuzz/shared/<target>_check.rs`), and so does every seed this file makes
//! from the real encoders, each of which the checks must accept (so their round trips run).
//!
//! The seeds are the committed corpus's starting point. To write them into
//! `fuzz/corpus/<target>/` (after a deliberate format change, or to add one):
//! `SYNCOPATE_BLESS_CORPUS=1 cargo test -p syncopate-tests --test fuzz_parsers_corpus`.

#[path = "../../fuzz/shared/checkpoint_check.rs"]
mod checkpoint_check;
#[path = "../../fuzz/shared/handshake_check.rs"]
mod handshake_check;
#[path = "../../fuzz/shared/journal_check.rs"]
mod journal_check;
#[path = "../../fuzz/shared/npy_check.rs"]
mod npy_check;
#[path = "../../fuzz/shared/scenario_toml_check.rs"]
mod scenario_toml_check;
#[path = "../../fuzz/shared/scratch.rs"]
mod scratch;
#[path = "../../fuzz/shared/session_payloads_check.rs"]
mod session_payloads_check;
#[path = "../../fuzz/shared/shard_record_check.rs"]
mod shard_record_check;
#[path = "../../fuzz/shared/tcp_frame_check.rs"]
mod tcp_frame_check;
#[path = "../../fuzz/shared/trace_csv_check.rs"]
mod trace_csv_check;

use std::fs;
use std::path::PathBuf;
use syncopate::wire;
use syncopate::{ProtocolKind, ToServer, ToWorker, Values, Version, WorkerId};
use syncopate_adapters::cli::{encode_npy_vector, write_shard_record};
use syncopate_adapters::tcp::auth::FrameMac;
use syncopate_adapters::tcp::checkpoint::{self, Journal, Totals};
use syncopate_adapters::tcp::frame::FrameWriter;
use syncopate_adapters::tcp::handshake::{ClientHello, Message, RefuseCode, Role, ServerHello};
use syncopate_adapters::tcp::settings::{DataSource, WorkloadSettings};
use syncopate_adapters::tcp::{ProtocolSettings, RunSettings, ShardSettings, initial, refusal, step_times};
use syncopate_adapters::trace::{self, GradientStats, Step};

type Seeds = Vec<(String, Vec<u8>)>;
/// A target's checks: panic on a violation, else how much of the input was accepted.
type Check = fn(&[u8]) -> usize;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

/// Writes the seeds when blessing; then runs every committed file and every seed through
/// `check`, and requires each seed to be accepted.
fn run(target: &str, seeds: Seeds, check: Check) {
    let dir = corpus_dir(target);
    if std::env::var_os("SYNCOPATE_BLESS_CORPUS").is_some() {
        fs::create_dir_all(&dir).expect("create the corpus folder");
        for (name, bytes) in &seeds {
            fs::write(dir.join(name), bytes).expect("write a seed");
        }
    }
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no committed corpus for {target}");
    for path in &files {
        check(&fs::read(path).expect("read a corpus file"));
    }
    for (name, bytes) in &seeds {
        assert!(check(bytes) > 0, "{target}: seed {name} is not accepted by the checks");
    }
    println!("{target}: {} committed files, {} seeds", files.len(), seeds.len());
}

fn seed(name: &str, bytes: Vec<u8>) -> (String, Vec<u8>) {
    (name.to_owned(), bytes)
}

fn grad_message() -> Vec<u8> {
    let msg = ToServer::Grad {
        base: Version(3),
        iteration: 3,
        seq: 9,
        values: Values::Slice(&[0.5f32, -1.0, 2.0, 0.25]),
        loss: Some(0.75),
    };
    let mut buf = vec![0u8; wire::encoded_len_to_server(&msg)];
    let n = wire::encode_to_server(&msg, &mut buf).expect("encode");
    buf.truncate(n);
    buf
}

fn model_message() -> Vec<u8> {
    let msg = ToWorker::Model { version: Version(4), clock: 4, values: Values::Slice(&[1.0f32, 2.0, 3.0, 4.0]) };
    let mut buf = vec![0u8; wire::encoded_len_to_worker(&msg)];
    let n = wire::encode_to_worker(&msg, &mut buf).expect("encode");
    buf.truncate(n);
    buf
}

fn client_hello() -> ClientHello {
    ClientHello {
        tcp_version: syncopate_adapters::tcp::handshake::TCP_VERSION,
        wire_version: wire::WIRE_VERSION,
        auth: false,
        role: Role::Worker,
        worker: WorkerId(1),
        nonce: [3; 32],
        want: [0; 32],
        dim: 0,
        lost_after_ms: 10_000,
        wire: None,
        early_mac: [0; 16],
    }
}

fn sharded_settings() -> RunSettings {
    let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Ssp, 4, 0.1), 1000);
    s.protocol.staleness = Some(3);
    s.shard = Some(ShardSettings { index: 1, count: 2, run: "exp-1".into() });
    s.report_step_times = true;
    s
}

fn workload_settings() -> RunSettings {
    let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Backup, 5, 0.5), 7850);
    s.protocol.backup_workers = Some(1);
    s.workload = Some(WorkloadSettings {
        model: "softmax".into(),
        data: DataSource::File { path: "data/train.csv".into(), format: "csv".into(), sha256: [9; 32] },
        batch_size: 32,
        seed: 1,
    });
    s
}

/// Frames as a peer sends them: a mode byte (see `tcp_frame_check`), then the frames.
fn frames(mode: u8, payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut w = FrameWriter::new(vec![mode], tcp_frame_check::max_len(mode));
    for (i, p) in payloads.iter().enumerate() {
        if tcp_frame_check::mac_after(mode) == Some(i) {
            w.set_mac(FrameMac::new(&tcp_frame_check::KEY));
        }
        w.write_frame(p).expect("frame");
    }
    std::mem::take(w.get_mut())
}

#[test]
fn tcp_frame_corpus() {
    let hello = Message::ClientHello(client_hello()).encode();
    let seeds = vec![
        // No MACs, session limit: a hello, a gradient, a heartbeat.
        seed("plain_session", frames(3 | 2 << 2, &[hello.clone(), grad_message(), Vec::new()])),
        // MACs after the first frame, as after an authenticated handshake.
        seed("mac_after_hello", frames(1 | 2 << 2, &[hello, model_message(), Vec::new()])),
        // MACs from the first frame, small limit.
        seed("mac_small", frames(4, &[b"ping".to_vec(), Vec::new()])),
        // A frame long enough to be read at a page-friendly offset.
        seed("large_frame", frames(3 | 3 << 2, &[vec![0x5a; 17 << 10]])),
    ];
    run("tcp_frame", seeds, tcp_frame_check::check);
}

#[test]
fn handshake_corpus() {
    let settings = [
        RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10),
        sharded_settings(),
        workload_settings(),
    ];
    let hello = |s: &RunSettings| {
        Message::ServerHello(ServerHello {
            tcp_version: syncopate_adapters::tcp::handshake::TCP_VERSION,
            wire_version: wire::WIRE_VERSION,
            auth: true,
            nonce: [5; 32],
            server_id: 77,
            epoch: 2,
            version: 40,
            lost_after_ms: 10_000,
            wire: wire::Encoding::F32,
            settings: s.encode().expect("settings"),
            mac: [6; 32],
        })
        .encode()
    };
    let mut auth_hello = client_hello();
    auth_hello.auth = true;
    auth_hello.want = settings[1].digest().expect("digest");
    auth_hello.dim = 1000;
    auth_hello.early_mac = [8; 16];
    let seeds = vec![
        seed("client_hello", Message::ClientHello(client_hello()).encode()),
        seed("client_hello_auth", Message::ClientHello(auth_hello).encode()),
        seed("server_hello_bsp", hello(&settings[0])),
        seed("server_hello_shard", hello(&settings[1])),
        seed("server_hello_workload", hello(&settings[2])),
        seed("client_auth", Message::ClientAuth([1; 32]).encode()),
        seed("accept", Message::Accept([2; 32]).encode()),
        seed("refuse", Message::Refuse { code: RefuseCode::Knobs, message: "staleness 3 against 4".into() }.encode()),
        seed("settings_bsp", settings[0].encode().expect("settings")),
        seed("settings_shard", settings[1].encode().expect("settings")),
        seed("settings_workload", settings[2].encode().expect("settings")),
    ];
    run("handshake", seeds, handshake_check::check);
}

#[test]
fn session_payloads_corpus() {
    let mut pending_seed = vec![3u8];
    for s in [0.05f64, 0.0, f64::NAN, 2.5] {
        pending_seed.extend_from_slice(&s.to_le_bytes());
    }
    let seeds = vec![
        seed("initial_3", initial::encode(&[0.5, -1.0, 3.0], 3).expect("initial")),
        seed("initial_16", initial::encode(&[0.125; 16], 16).expect("initial")),
        seed("step_times_3", step_times::encode(&[0.05, 0.25, 1.5]).expect("steps")),
        seed("step_times_1", step_times::encode(&[f32::MIN_POSITIVE]).expect("steps")),
        seed("not_finite_loss", refusal::NotFinite::Loss.encode()),
        seed("refusal_2_of_3", refusal::Refusal { total: 2, in_a_row: 2, limit: 3 }.encode()),
    ];
    run("session_payloads", seeds, session_payloads_check::check);
    // The pending-steps part accepts nothing: it only has to hold for any input.
    session_payloads_check::check(&pending_seed);
}

/// A `.npy` file as NumPy may write it: `version`, a header, `data`.
fn npy(version: u8, header: &str, data: &[f32]) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    out
}

#[test]
fn npy_corpus() {
    let seeds = vec![
        seed("saved_3", encode_npy_vector(&[1.0, -2.5, 3.25])),
        seed("saved_1", encode_npy_vector(&[0.0])),
        seed("version_2", npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", &[4.0, 5.0])),
        seed(
            "keys_reordered",
            npy(3, "{\"shape\": (2L,), \"fortran_order\": True, \"descr\": \"<f4\"}\n", &[1.0, 2.0]),
        ),
    ];
    run("npy", seeds, npy_check::check);
}

/// A checkpoint of AdamW under a warm-up and cosine schedule, with its state.
fn adamw_checkpoint() -> Vec<u8> {
    use syncopate::proto::{AdamW, Optimizer, Schedule};
    let o =
        Optimizer::adamw(AdamW::default()).with_schedule(Schedule::WarmupCosine { warmup: 2, total: 9, floor: 0.1 });
    let state: Vec<f32> = (0..o.state_len(2)).map(|i| i as f32).collect();
    checkpoint::encode_stamped("asp", Version(5), &[1.0, 2.0], Some((o, &state)), None, 0)
}

/// A checkpoint of rule mean (its state: the header alone).
fn mean_checkpoint() -> Vec<u8> {
    use syncopate::proto::Optimizer;
    let o = Optimizer::MEAN;
    checkpoint::encode_stamped("bsp", Version(1), &[0.5], Some((o, &vec![0.0; o.state_len(1)])), None, 0)
}

/// A checkpoint without its checksum (the check seals it).
fn body(bytes: Vec<u8>) -> Vec<u8> {
    bytes[..bytes.len() - 32].to_vec()
}

#[test]
fn checkpoint_corpus() {
    let params = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0];
    let mut format1 = b"SYNCKPT\0".to_vec();
    format1.extend_from_slice(&1u32.to_le_bytes());
    format1.push(3);
    format1.extend_from_slice(b"asp");
    format1.extend_from_slice(&2u64.to_le_bytes());
    format1.extend_from_slice(&7u64.to_le_bytes());
    format1.extend([1.0f32, 2.0].iter().flat_map(|p| p.to_le_bytes()));
    let seeds = vec![
        seed("bsp_sealed", checkpoint::encode("bsp", Version(42), &params)),
        seed("bsp_body", body(checkpoint::encode("bsp", Version(42), &params))),
        seed(
            "momentum_body",
            body(checkpoint::encode_with_momentum("asp", Version(7), &[1.0, 2.0], Some((0.9, &[0.5, 1.5])))),
        ),
        seed("format1_body", format1),
        seed("adamw_schedule_body", body(adamw_checkpoint())),
        seed("mean_body", body(mean_checkpoint())),
    ];
    run("checkpoint", seeds, checkpoint_check::check);
}

#[test]
fn journal_corpus() {
    // The server's own journal: a checkpoint at 40, two updates.
    let ckpt = scratch::dir("journal-seeds").join("seed.ckpt");
    let totals = |n| Totals { received: n, accepted: n, applied: n, dropped: 0 };
    let mut j = Journal::start(&ckpt, Version(40), &totals(160), "run-1").expect("journal");
    j.update(Version(41), &[1, 1, 1, 1], &totals(164)).expect("update");
    j.update(Version(42), &[2, 0, 1, 1], &totals(168)).expect("update");
    let written = fs::read(Journal::path_for(&ckpt)).expect("read the journal");
    let mut torn = written.clone();
    torn.extend_from_slice(b"update 43 contributions 4 work");
    // An update the checkpoint holds (killed between the checkpoint and the journal restart).
    let held = b"checkpoint 30 received 120 accepted 120 applied 120 dropped 0\n\
update 40 contributions 4 workers 1,1,1,1 received 160 accepted 160 applied 160 dropped 0\n";
    let with_choice = |choice: u8, text: &[u8]| [&[choice][..], text].concat();
    let seeds = vec![
        seed("two_updates", with_choice(4, &written)),
        seed("torn_last_line", with_choice(4, &torn)),
        seed("update_held", with_choice(4, held)),
        seed("all_held", with_choice(254, &written)),
        // A choice byte that is a multiple of 16 also checks the server's own journal.
        seed("server_journal", with_choice(0, &written)),
    ];
    run("journal", seeds, journal_check::check);
    let _ = fs::remove_dir_all(scratch::dir("journal-seeds"));
}

#[test]
fn shard_record_corpus() {
    let dir = scratch::dir("shard-record-seeds");
    let record = |a: u8, b: u8| {
        let ckpt = dir.join(format!("{a}-{b}.ckpt"));
        write_shard_record(&ckpt, &shard_record_check::settings(a, b), "run-1").expect("record");
        let bytes = fs::read(dir.join(format!("{a}-{b}.ckpt.shard"))).expect("read the record");
        [&[a, b][..], &bytes].concat()
    };
    let other_run = {
        let mut r = record(0x10, 0x05);
        r[1] = 0x06;
        r
    };
    let seeds = vec![
        seed("shard_0_of_2", record(0x00, 0x00)),
        seed("shard_1_of_3_run_a", record(0x11, 0x41)),
        seed("shard_4_of_7_long_run", record(0x54, 0xfe)),
    ];
    run("shard_record", seeds, shard_record_check::check);
    // A record of another run is refused (not a seed: the checks accept only the shard's own).
    assert_eq!(shard_record_check::check(&other_run), 0);
    let _ = fs::remove_dir_all(dir);
    let _ = fs::remove_dir_all(scratch::dir("shard_record"));
}

#[test]
fn scenario_toml_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../adapters/sim/scenarios");
    let mut seeds: Seeds = fs::read_dir(&dir)
        .expect("the built-in scenarios")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), fs::read(&p).expect("read")))
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 5);
    seeds.push(seed(
        "small.toml",
        b"name = \"small\"\nworkers = 3\nmax_time_s = 1.0\n[network]\nlatency_ms = 0.5\n\
[[stragglers]]\nworkers = \"0\"\nmodel = \"slow=4\"\n[[protocols]]\nname = \"bsp\"\n[[protocols]]\n\
name = \"ssp\"\nstaleness = [1, 3]\n"
            .to_vec(),
    ));
    run("scenario_toml", seeds, scenario_toml_check::check);
}

#[test]
fn trace_csv_corpus() {
    let steps: Vec<Step> = (0..2u32)
        .flat_map(|w| {
            (0..3u64).map(move |s| Step { worker: w, step: s, seconds: 0.01 * f64::from(w + 1) + 1e-4 * s as f64 })
        })
        .collect();
    let stats: Vec<GradientStats> = (0..steps.len())
        .map(|i| GradientStats {
            loss: Some(2.3 - 0.1 * i as f64),
            grad_norm: Some(1.5),
            mean_norm: (i % 2 == 0).then_some(0.9),
            mean_of: if i % 2 == 0 { 2 } else { 0 },
        })
        .collect();
    let csv = |steps: &[Step], stats: &[GradientStats]| {
        let mut out = Vec::new();
        trace::write_csv_with(&mut out, steps, stats).expect("write");
        out
    };
    let ragged: Vec<Step> = steps.iter().copied().filter(|s| !(s.worker == 1 && s.step == 2)).collect();
    let seeds = vec![
        seed("two_workers.csv", csv(&steps, &[])),
        seed("with_gradients.csv", csv(&steps, &stats)),
        seed("ragged.csv", csv(&ragged, &[])),
    ];
    run("trace_csv", seeds, trace_csv_check::check);
    let _ = fs::remove_dir_all(scratch::dir("trace_csv"));
}

/// The inputs of fuzz findings, `fuzz/regressions/<target>/`, through their target's checks:
///
/// - `npy/error_echoes_a_newline`: a `.npy` error quotes the header's bytes escaped, so a key
///   holding a newline (or any control byte) still makes a one-line error.
/// - `journal/contributions_overflow`: `lost_since` adds a journal's counts saturating, so two
///   updates whose counts sum past `u64::MAX` neither panic nor wrap.
/// - `checkpoint/momentum_without_parameters`: a format-3 checkpoint of momentum over a model
///   of no parameters keeps no state (`None`), as the rule's `state_len` of 0 says.
#[test]
fn fuzz_findings_stay_fixed() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let checks: [(&str, Check); 3] =
        [("npy", npy_check::check), ("journal", journal_check::check), ("checkpoint", checkpoint_check::check)];
    for (target, check) in checks {
        for entry in fs::read_dir(root.join(target)).expect("the regression inputs") {
            check(&fs::read(entry.expect("dir entry").path()).expect("read a regression input"));
        }
    }
}
