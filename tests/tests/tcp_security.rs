//! The TCP edge refuses what it must, with one clear line on both sides, and stays up:
//! wrong secret (caught by the hello's early MAC), missing secret, replayed hello, wrong wire
//! version or worker id, settings other than the ones a worker pinned;
//! oversized, truncated and garbage frames; replayed and tampered frames; slow-loris peers
//! (cut off at the absolute deadline, not at a per-read timeout); listening beyond loopback
//! without a secret.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::net::SocketAddr;
use core::time::Duration;
use std::io::{BufWriter, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;
use syncopate::WorkerId;
use syncopate_adapters::tcp::frame::{FrameReader, FrameTimeout, FrameWriter};
use syncopate_adapters::tcp::handshake::TCP_VERSION;
use syncopate_adapters::tcp::handshake::{self, ClientHello, ClientSide, Message, RefuseCode, Role};
use syncopate_adapters::tcp::{
    DEFAULT_LOST_AFTER, Secret, ServerOptions, StopReason, TcpServer, WorkerOptions, session_max_len,
};

fn secret(s: &[u8]) -> Secret {
    Secret::new(s).unwrap()
}

/// A server that runs until stopped (budget never reached), with short deadlines.
fn idle_server(options: impl FnOnce(&mut ServerOptions)) -> (Running, usize) {
    let w = workload();
    let dim = w.model.dim();
    let mut o = ServerOptions::new(bsp(2));
    o.handshake_timeout = Duration::from_millis(500);
    o.frame_timeout = FrameTimeout { base: Duration::from_millis(300), min_bytes_per_sec: 1 << 20 };
    options(&mut o);
    (start_server(o, &w, plan(u64::MAX, 30)), dim)
}

fn stop(server: Running) {
    server.handle.stop();
    let r = server.finish();
    assert_eq!(r.reason, StopReason::Stopped);
}

fn run_one_worker(addr: SocketAddr, id: u32, key: Option<&Secret>, edit: impl FnOnce(&mut WorkerOptions)) -> String {
    let mut o = worker_options(addr, id);
    o.key = key.map(|s| s.worker_key(WorkerId(id)));
    edit(&mut o);
    o.backoff.give_up_after = Duration::from_secs(2);
    let (r, _) = spawn_worker(o, workload()).join().unwrap();
    r.expect_err("the worker must be refused").to_string()
}

/// Reads until EOF or error; returns how long it took.
fn time_to_close(mut s: &TcpStream, start: Instant) -> Duration {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return start.elapsed(),
            Ok(_) => {}
        }
    }
}

fn raw_hello(edit: impl FnOnce(&mut ClientHello)) -> Vec<u8> {
    let mut h = ClientHello::new(WorkerId(0), Role::Worker, None, None).unwrap();
    edit(&mut h);
    Message::ClientHello(h).encode()
}

/// Sends one handshake message on a raw connection and returns the server's answer.
fn exchange(addr: SocketAddr, payload: &[u8]) -> Message {
    let s = TcpStream::connect(addr).unwrap();
    let mut w = FrameWriter::new(BufWriter::new(s.try_clone().unwrap()), handshake::HANDSHAKE_MAX_LEN);
    let mut r = FrameReader::new(s, handshake::HANDSHAKE_MAX_LEN, FrameTimeout::default());
    w.write_frame(payload).unwrap();
    let mut buf = Vec::new();
    let p = r.read_frame(&mut buf, Some(Instant::now() + Duration::from_secs(3))).unwrap();
    Message::decode(p.of(&buf)).unwrap()
}

#[test]
fn wrong_secret_is_refused_and_logged_on_both_sides() {
    bounded(Duration::from_secs(30), || {
        let (server, dim) = idle_server(|o| o.secret = Some(secret(b"the server's own secret")));
        let _ = dim;
        // The hello's early MAC is wrong: refused before the server says anything else (no
        // nonce, no settings for a stranger).
        let err = run_one_worker(server.addr, 0, Some(&secret(b"a different secret!!")), |_| {});
        assert!(err.contains("refused by peer: authentication failed for worker 0: wrong shared secret"), "{err}");
        server.wait_log("authentication failed for worker 0: wrong shared secret", Duration::from_secs(3));
        match exchange(server.addr, &raw_hello(|h| h.auth = true)) {
            Message::Refuse { code: RefuseCode::AuthFailed, message } => {
                assert!(message.contains("authentication failed for worker 0"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // A server with the wrong secret is caught by the worker (mac_s).
        let key = secret(b"the server's own secret").worker_key(WorkerId(0));
        let impostor = idle_server(|o| o.secret = Some(secret(b"an impostor's secret!"))).0;
        let s = TcpStream::connect(impostor.addr).unwrap();
        let mut w = FrameWriter::new(BufWriter::new(s.try_clone().unwrap()), 512);
        let mut r = FrameReader::new(s, 0, FrameTimeout::default());
        let me = ClientSide {
            worker: WorkerId(0),
            role: Role::Worker,
            key: Some(&key),
            want: None,
            dim: None,
            lost_after: DEFAULT_LOST_AFTER,
            wire: None,
        };
        // The impostor cannot check our early MAC either, so it refuses us; both sides see why.
        let err = handshake::client_handshake(&mut r, &mut w, &me, Instant::now() + Duration::from_secs(3))
            .unwrap_err()
            .to_string();
        assert!(err.contains("wrong shared secret"), "{err}");
        stop(impostor);
        // No secret at all.
        let err = run_one_worker(server.addr, 1, None, |_| {});
        assert!(err.contains("server requires authentication but worker 1 has no shared secret"), "{err}");
        stop(server);
    });
}

#[test]
fn mismatched_version_settings_and_id_are_refused_clearly() {
    bounded(Duration::from_secs(30), || {
        let (server, _) = idle_server(|_| {});
        match exchange(server.addr, &raw_hello(|h| h.wire_version = 99)) {
            Message::Refuse { code: RefuseCode::WireVersion, message } => {
                assert_eq!(message, "wire version mismatch: server speaks 2, worker 99")
            }
            other => panic!("{other:?}"),
        }
        server.wait_log("wire version mismatch: server speaks 2, worker 99", Duration::from_secs(3));
        // A worker of the previous wire version (no loss in its gradients) is refused the same way.
        match exchange(server.addr, &raw_hello(|h| h.wire_version = 1)) {
            Message::Refuse { code: RefuseCode::WireVersion, message } => {
                assert_eq!(message, "wire version mismatch: server speaks 2, worker 1")
            }
            other => panic!("{other:?}"),
        }
        // A worker of the previous transport version, and one of the next.
        for other in [TCP_VERSION - 1, TCP_VERSION + 1] {
            match exchange(server.addr, &raw_hello(|h| h.tcp_version = other)) {
                Message::Refuse { code: RefuseCode::TcpVersion, .. } => {}
                other => panic!("{other:?}"),
            }
        }
        // A worker that pins settings (as a reconnecting worker does) other than the
        // server's: refused, naming the server's.
        for other in [asp(2), bsp(3)] {
            let err = run_one_worker(server.addr, 0, None, |o| o.expect = Some(other));
            assert!(
                err.contains("run settings differ: worker 0 expects other settings than the server's (bsp"),
                "{err}"
            );
        }
        let err = run_one_worker(server.addr, 2, None, |_| {});
        assert!(err.contains("worker id 2 is out of range: the server has workers 0 to 1"), "{err}");
        server.wait_log("run settings differ", Duration::from_secs(3));
        stop(server);
    });
}

#[test]
fn oversized_truncated_and_garbage_frames_before_the_handshake() {
    bounded(Duration::from_secs(30), || {
        let (server, _) = idle_server(|_| {});
        // Garbage that parses as a small frame but not as a hello.
        let s = TcpStream::connect(server.addr).unwrap();
        (&s).write_all(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        (&s).write_all(b"GET / HTTP/1.").unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("malformed handshake message", Duration::from_secs(3));
        // Truncated hello: the peer hangs up inside a frame.
        let s = TcpStream::connect(server.addr).unwrap();
        (&s).write_all(&[60, 0, 0, 0, 0, 0]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("connection closed inside a frame", Duration::from_secs(3));
        // u32::MAX length prefix, many times: refused at once, nothing allocated.
        for _ in 0..200 {
            let s = TcpStream::connect(server.addr).unwrap();
            (&s).write_all(&u32::MAX.to_le_bytes()).unwrap();
            assert!(time_to_close(&s, Instant::now()) < Duration::from_secs(1));
        }
        server.wait_log("frame length 4294967295 exceeds the limit of 512 bytes", Duration::from_secs(3));
        // The server is still fine: a real worker trains.
        let w = workload();
        let h = spawn_worker(worker_options(server.addr, 0), Arc::clone(&w));
        let h2 = spawn_worker(worker_options(server.addr, 1), w);
        thread::sleep(Duration::from_millis(300));
        server.handle.stop();
        let report = server.finish();
        assert!(report.version.0 > 0, "{report:?}");
        assert!(report.handshake_failures >= 202);
        assert!(h.join().unwrap().0.unwrap().stopped && h2.join().unwrap().0.unwrap().stopped);
    });
}

/// Records what goes through it, to replay or tamper with.
struct Tee {
    inner: TcpStream,
    log: Arc<Mutex<Vec<Vec<u8>>>>,
    cur: Vec<u8>,
}

impl Write for Tee {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.cur.extend_from_slice(b);
        self.inner.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.log.lock().unwrap().push(core::mem::take(&mut self.cur));
        self.inner.flush()
    }
}

/// Every flushed write, in order.
type Sent = Arc<Mutex<Vec<Vec<u8>>>>;

/// A raw authenticated session as worker 0: the handshake, then a Join.
fn session(addr: SocketAddr, dim: usize, key: &Secret) -> (TcpStream, FrameWriter<Tee>, Sent) {
    let s = TcpStream::connect(addr).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut w = FrameWriter::new(Tee { inner: s.try_clone().unwrap(), log: Arc::clone(&log), cur: Vec::new() }, 0);
    let mut r = FrameReader::new(s.try_clone().unwrap(), 0, FrameTimeout::default());
    let k = key.worker_key(WorkerId(0));
    let deadline = Instant::now() + Duration::from_secs(3);
    let me = ClientSide {
        worker: WorkerId(0),
        role: Role::Worker,
        key: Some(&k),
        want: None,
        dim: None,
        lost_after: DEFAULT_LOST_AFTER,
        wire: None,
    };
    let (_, settings) = handshake::client_handshake(&mut r, &mut w, &me, deadline).unwrap();
    assert_eq!(settings.dim().unwrap(), dim, "the settings carry the model's shape");
    let join: syncopate::ToServer<'_, f32> = syncopate::ToServer::Join { epoch: 0 };
    let mut buf = vec![0u8; syncopate::wire::encoded_len_to_server(&join)];
    let n = syncopate::wire::encode_to_server(&join, &mut buf).unwrap();
    w.write_frame(&buf[..n]).unwrap();
    (s, w, log)
}

#[test]
fn replayed_tampered_oversized_and_garbage_frames_in_a_session() {
    bounded(Duration::from_secs(30), || {
        let key = secret(b"session test secret");
        let (server, dim) = idle_server(|o| o.secret = Some(key.clone()));
        let max = session_max_len(dim);
        // Replay: the Join frame again (valid MAC, old sequence number).
        let (s, _w, log) = session(server.addr, dim, &key);
        let join_frame = log.lock().unwrap().last().unwrap().clone();
        (&s).write_all(&join_frame).unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("worker 0 lost: frame sequence number 2, expected 3", Duration::from_secs(3));
        // Tamper: flip a payload byte of a fresh frame.
        let (s, mut w, log) = session(server.addr, dim, &key);
        w.get_mut().inner = s.try_clone().unwrap();
        let mut forged = log.lock().unwrap().last().unwrap().clone();
        forged[4..12].copy_from_slice(&3u64.to_le_bytes());
        forged[13] ^= 1;
        (&s).write_all(&forged).unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("frame authentication failed (bad MAC)", Duration::from_secs(3));
        // Oversized length in a session: refused before allocation.
        let (s, _w, _) = session(server.addr, dim, &key);
        (&s).write_all(&((max + 1) as u32).to_le_bytes()).unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log(&format!("exceeds the limit of {max} bytes"), Duration::from_secs(3));
        // Truncated frame in a session.
        let (s, _w, _) = session(server.addr, dim, &key);
        (&s).write_all(&[100, 0, 0, 0, 1, 2, 3]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("connection closed inside a frame (7 of 104 bytes)", Duration::from_secs(3));
        // A well-authenticated frame whose content is garbage: the codec refuses it.
        let (s, mut w, _) = session(server.addr, dim, &key);
        w.write_frame(b"not a syncopate message").unwrap();
        time_to_close(&s, Instant::now());
        server.wait_log("worker 0 sent a bad message", Duration::from_secs(3));
        stop(server);
    });
}

#[test]
fn slow_loris_is_cut_off_at_the_absolute_deadline() {
    bounded(Duration::from_secs(30), || {
        let (server, dim) = idle_server(|o| o.frame_timeout.base = Duration::from_millis(1000));
        // In the handshake: one byte every 50 ms of a valid hello; deadline 500 ms from accept
        // (before the 1 s frame deadline).
        let _ = dim;
        let hello = raw_hello(|_| {});
        let mut frame = ((hello.len() + 8) as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&0u64.to_le_bytes());
        frame.extend_from_slice(&hello);
        let start = Instant::now();
        let s = TcpStream::connect(server.addr).unwrap();
        let s2 = s.try_clone().unwrap();
        let dribble = thread::spawn(move || {
            for b in frame {
                if (&s2).write_all(&[b]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        let took = time_to_close(&s, start);
        assert!(took < Duration::from_millis(550 + 100), "handshake slow loris held for {took:?}");
        assert!(took >= Duration::from_millis(450), "cut too early: {took:?}");
        dribble.join().unwrap();
        server.wait_log("handshake", Duration::from_secs(2));
        // In a session: frame deadline 1 s from the frame's first byte, however steadily the
        // bytes come.
        let s = TcpStream::connect(server.addr).unwrap();
        let mut w = FrameWriter::new(BufWriter::new(s.try_clone().unwrap()), 512);
        let mut r = FrameReader::new(s.try_clone().unwrap(), 512, FrameTimeout::default());
        let me = ClientSide {
            worker: WorkerId(1),
            role: Role::Worker,
            key: None,
            want: None,
            dim: None,
            lost_after: DEFAULT_LOST_AFTER,
            wire: None,
        };
        handshake::client_handshake(&mut r, &mut w, &me, Instant::now() + Duration::from_secs(3)).unwrap();
        let start = Instant::now();
        let s2 = s.try_clone().unwrap();
        let dribble = thread::spawn(move || {
            for b in [200u8, 0, 0, 0].into_iter().chain([0u8; 200]) {
                if (&s2).write_all(&[b]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        let took = time_to_close(&s, start);
        assert!(took < Duration::from_millis(1100 + 50), "session slow loris held for {took:?}");
        assert!(took >= Duration::from_millis(950), "cut too early: {took:?}");
        dribble.join().unwrap();
        server.wait_log("frame not complete within 1000 ms of its first byte", Duration::from_secs(2));
        stop(server);
    });
}

#[test]
fn no_secret_means_loopback_only_unless_insecure() {
    let w = workload();
    let _ = w;
    let o = ServerOptions::new(bsp(2));
    let err = TcpServer::bind("0.0.0.0:0", o.clone()).unwrap_err().to_string();
    assert!(err.contains("refusing to listen on 0.0.0.0:0 without a shared secret"), "{err}");
    let mut insecure = o.clone();
    insecure.insecure = true;
    assert!(TcpServer::bind("0.0.0.0:0", insecure).is_ok());
    let mut with_secret = o;
    with_secret.secret = Some(secret(b"0123456789abcdef"));
    assert!(TcpServer::bind("0.0.0.0:0", with_secret).is_ok());
}

#[test]
fn a_replayed_hello_is_refused() {
    bounded(Duration::from_secs(30), || {
        let key = secret(b"replay test secret!");
        let (server, _) = idle_server(|o| o.secret = Some(key.clone()));
        let hello = Message::ClientHello(
            ClientHello::new(WorkerId(0), Role::Worker, None, Some(&key.worker_key(WorkerId(0)))).unwrap(),
        )
        .encode();
        assert!(matches!(exchange(server.addr, &hello), Message::ServerHello(_)), "a fresh signed hello passes");
        match exchange(server.addr, &hello) {
            Message::Refuse { code: RefuseCode::AuthFailed, message } => {
                assert_eq!(message, "worker 0: replayed hello (nonce seen before)")
            }
            other => panic!("{other:?}"),
        }
        stop(server);
    });
}

#[test]
fn a_reconnecting_worker_refuses_a_server_with_other_settings() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let first = start_server(ServerOptions::new(bsp(2)), &w, plan(u64::MAX, 30));
        let addr = first.addr;
        let workers: Vec<_> = (0..2).map(|i| spawn_worker(worker_options(addr, i), Arc::clone(&w))).collect();
        // Both must have pinned the first run's settings: a worker that had not finished its
        // first handshake when the server crashed pins nothing and may join the second run
        // (a CI run hung that way when worker 0 connected after worker 1).
        first.wait_log("worker 0 connected", Duration::from_secs(10));
        first.wait_log("worker 1 connected", Duration::from_secs(10));
        first.handle.crash();
        first.finish();
        // The same address, another run: the workers pinned the first run's settings.
        let second = start_server_at(
            &addr.to_string(),
            ServerOptions::new(asp(2)),
            vec![0.0; w.model.dim()],
            syncopate::Version::ZERO,
            plan(u64::MAX, 30),
        );
        for h in workers {
            let (r, logs) = h.join().unwrap();
            let err = r.expect_err("a worker never trains under settings it did not start with").to_string();
            assert!(err.contains("run settings differ") && err.contains("asp"), "{err}; {logs:?}");
        }
        second.handle.stop();
        assert_eq!(second.finish().sessions, 0);
    });
}
