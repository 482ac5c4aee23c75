//! The C ABI driven from Rust as C would: every protocol trains a small least-squares
//! problem, and bad calls (null pointers, short buffers, wrong lengths, dead handles) return
//! their error codes.

use core::ffi::c_void;
use core::ptr::{null, null_mut};
use syncopate_ffi::*;

const DIM: usize = 4;

/// Caller-provided, suitably aligned memory (a `Vec<u64>` is 8-byte aligned).
fn block(bytes: usize, align: usize) -> Vec<u64> {
    assert!(align <= 8, "handles need at most 8-byte alignment");
    vec![0u64; bytes.div_ceil(8)]
}

fn config(protocol: u32, workers: u32) -> SyncopateConfig {
    let mut c = core::mem::MaybeUninit::<SyncopateConfig>::uninit();
    // SAFETY: `c` is writable; the call initialises it on success (asserted).
    assert_eq!(unsafe { syncopate_config_default(c.as_mut_ptr(), protocol, workers, 0.2) }, SYNCOPATE_OK);
    // SAFETY: initialised by the successful call above.
    let mut c = unsafe { c.assume_init() };
    c.staleness = 2;
    c.backup_workers = 1;
    c
}

fn last_error() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { syncopate_last_error_message(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8_lossy(&buf[..n.min(255)]).into_owned()
}

struct Cluster {
    server: *mut SyncopateServer,
    workers: Vec<*mut SyncopateWorker>,
    // Owned memory the handles live in; kept alive (and never touched) while they are used.
    _mem: Vec<Vec<u64>>,
    model: Box<[f32; DIM]>,
    // Boxed so each buffer keeps its address while the vector grows.
    #[allow(clippy::vec_box)]
    _worker_params: Vec<Box<[f32; DIM]>>,
    max_len: usize,
}

fn cluster(c: &SyncopateConfig, n: u32) -> Cluster {
    let (mut size, mut wsize, mut max_len) = (0, 0, 0);
    // SAFETY: valid pointers throughout; the memory outlives the handles (owned by `Cluster`).
    unsafe {
        assert_eq!(syncopate_server_size(c, DIM, &mut size), SYNCOPATE_OK);
        assert_eq!(syncopate_worker_size(c, DIM, &mut wsize), SYNCOPATE_OK);
        assert_eq!(syncopate_max_message_len(DIM, &mut max_len), SYNCOPATE_OK);
        let mut mem = vec![block(size, syncopate_server_align())];
        let mut model = Box::new([0.0f32; DIM]);
        let mut server = null_mut();
        let st = syncopate_server_init(mem[0].as_mut_ptr().cast(), size, c, model.as_mut_ptr(), DIM, &mut server);
        assert_eq!(st, SYNCOPATE_OK, "{}", last_error());
        let mut workers = Vec::new();
        let mut params = Vec::new();
        for id in 0..n {
            let mut m = block(wsize, syncopate_worker_align());
            let mut p = Box::new([0.0f32; DIM]);
            let setup = SyncopateWorkerSetup { id, epoch: 0, rejoin_after_ns: 0 };
            let mut w = null_mut();
            let st = syncopate_worker_init(m.as_mut_ptr().cast(), wsize, c, &setup, p.as_mut_ptr(), DIM, &mut w);
            assert_eq!(st, SYNCOPATE_OK, "{}", last_error());
            workers.push(w);
            mem.push(m);
            params.push(p);
        }
        Cluster { server, workers, _mem: mem, model, _worker_params: params, max_len }
    }
}

/// Worker `i`'s gradient of `½‖w − t_i‖²` with targets whose mean is `[1, 2, 3, 4]`.
fn gradient(i: usize, w: &[f32], g: &mut [f32]) {
    for (j, (g, w)) in g.iter_mut().zip(w).enumerate() {
        let target = (j + 1) as f32 + if i % 2 == 0 { 0.01 } else { -0.01 };
        *g = w - target;
    }
}

/// Drains the server's outputs (the driving contract: after every input), delivering each
/// message to its workers.
///
/// # Safety
/// Live handles; `buf` of the cluster's `max_len`.
unsafe fn drain_server(k: &Cluster, now: u64, buf: &mut [u8]) {
    // SAFETY: as the caller promises.
    unsafe {
        loop {
            let mut out = SyncopateServerOutput::default();
            assert_eq!(syncopate_server_poll_output(k.server, &mut out, buf.as_mut_ptr(), buf.len()), SYNCOPATE_OK);
            match out.kind {
                SYNCOPATE_OUTPUT_NONE => break,
                SYNCOPATE_OUTPUT_SEND => {
                    for (i, &w) in k.workers.iter().enumerate() {
                        if out.to_all == 1 || out.to_worker as usize == i {
                            let st = syncopate_worker_handle(w, now, buf.as_ptr(), out.message_len);
                            assert!(st == SYNCOPATE_OK || st == SYNCOPATE_ERR_REJECTED, "{}", last_error());
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Runs the cluster until every worker stopped (the server stops at version 200).
fn train(k: &mut Cluster) -> u64 {
    train_until(k, 200)
}

/// Runs the cluster until every worker stopped; the server stops at version `until` (BSP
/// makes at most one update per tick, so it stops exactly there).
fn train_until(k: &mut Cluster, until: u64) -> u64 {
    let mut buf = vec![0u8; k.max_len];
    let mut server_buf = vec![0u8; k.max_len];
    let mut grad = [0.0f32; DIM];
    let n = k.workers.len();
    let mut stats = SyncopateServerStats::default();
    for tick in 0..20_000u64 {
        let now = tick * 1000;
        // SAFETY: live handles, buffers of the queried sizes, pointers from the outputs used
        // before the next call on the same handle.
        unsafe {
            for (i, &w) in k.workers.iter().enumerate() {
                loop {
                    let mut out = SyncopateWorkerOutput::default();
                    assert_eq!(syncopate_worker_poll_output(w, &mut out, buf.as_mut_ptr(), buf.len()), SYNCOPATE_OK);
                    match out.kind {
                        SYNCOPATE_OUTPUT_NONE => break,
                        SYNCOPATE_OUTPUT_SEND => {
                            let st = syncopate_server_handle(k.server, now, i as u32, buf.as_ptr(), out.message_len);
                            assert_eq!(st, SYNCOPATE_OK, "{}", last_error());
                            drain_server(k, now, &mut server_buf);
                            // One message per worker and tick: the answer may start its next job.
                            break;
                        }
                        SYNCOPATE_OUTPUT_COMPUTE => {
                            let params = core::slice::from_raw_parts(out.params, out.params_len);
                            gradient(i, params, &mut grad);
                            // Refused only when a newer model arrived meanwhile (the job was abandoned).
                            let st = syncopate_worker_handle_gradient(w, now, out.compute_id, grad.as_ptr(), DIM);
                            assert!(st == SYNCOPATE_OK || st == SYNCOPATE_ERR_REJECTED, "{}", last_error());
                        }
                        _ => {}
                    }
                }
            }
            drain_server(k, now, &mut server_buf);
            assert_eq!(syncopate_server_stats(k.server, &mut stats), SYNCOPATE_OK);
            if stats.version >= until {
                assert_eq!(syncopate_server_stop(k.server), SYNCOPATE_OK);
                drain_server(k, now, &mut server_buf);
            }
            let mut stopped = 0;
            for &w in &k.workers {
                let mut s = 0;
                assert_eq!(syncopate_worker_is_stopped(w, &mut s), SYNCOPATE_OK);
                stopped += s as usize;
            }
            if stopped == n {
                return stats.version;
            }
        }
    }
    panic!("the workers did not stop; server at version {}", stats.version);
}

/// `momentum` in the config: the server's memory grows by one model, and its second update
/// adds `β(x₁ − x₀)` to plain SGD's. From 0 with the mean target `t`, step 0.2 and β = 0.5,
/// plain SGD gives `x₂ = 0.36 t` and momentum `x₂ = 0.46 t`.
#[test]
fn momentum_in_the_config_steps_the_server_with_momentum() {
    let plain = config(SYNCOPATE_PROTOCOL_BSP, 4);
    let heavy = SyncopateConfig { momentum: 0.5, ..plain };
    let (mut plain_size, mut heavy_size) = (0, 0);
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(syncopate_server_size(&plain, DIM, &mut plain_size), SYNCOPATE_OK);
        assert_eq!(syncopate_server_size(&heavy, DIM, &mut heavy_size), SYNCOPATE_OK);
    }
    assert_eq!(heavy_size, plain_size + DIM * size_of::<f32>());
    for (c, factor) in [(plain, 0.36f32), (heavy, 0.46)] {
        let mut k = cluster(&c, 4);
        assert_eq!(train_until(&mut k, 2), 2);
        for (j, w) in k.model.iter().enumerate() {
            let want = factor * (j + 1) as f32;
            assert!((w - want).abs() < 1e-5, "momentum {}: model {:?}, want {want} at {j}", c.momentum, k.model);
        }
        // SAFETY: live handles.
        unsafe {
            assert_eq!(syncopate_server_fini(k.server), SYNCOPATE_OK);
            for &w in &k.workers {
                assert_eq!(syncopate_worker_fini(w), SYNCOPATE_OK);
            }
        }
    }
    // Outside [0, 1): refused when the handle is built.
    let bad = SyncopateConfig { momentum: 1.0, ..plain };
    let mut size = 0;
    // SAFETY: valid pointers; the memory outlives the call.
    unsafe {
        assert_eq!(syncopate_server_size(&bad, DIM, &mut size), SYNCOPATE_OK);
        let mut mem = block(size, syncopate_server_align());
        let mut model = [0.0f32; DIM];
        let mut server = null_mut();
        let st = syncopate_server_init(mem.as_mut_ptr().cast(), size, &bad, model.as_mut_ptr(), DIM, &mut server);
        assert_eq!(st, SYNCOPATE_ERR_CONFIG, "{}", last_error());
    }
}

#[test]
fn every_protocol_trains_through_the_c_abi() {
    for protocol in SYNCOPATE_PROTOCOL_BSP..=SYNCOPATE_PROTOCOL_BAP {
        let c = config(protocol, 4);
        let mut k = cluster(&c, 4);
        let version = train(&mut k);
        assert!(version >= 200, "protocol {protocol}: version {version}");
        for (j, w) in k.model.iter().enumerate() {
            assert!((w - (j + 1) as f32).abs() < 2e-2, "protocol {protocol}: model {:?}", k.model);
        }
        // SAFETY: live handles.
        unsafe {
            assert_eq!(syncopate_server_fini(k.server), SYNCOPATE_OK);
            for &w in &k.workers {
                assert_eq!(syncopate_worker_fini(w), SYNCOPATE_OK);
            }
        }
    }
}

/// A buffer that shares a byte with the handle's model or memory is refused before the call
/// touches anything: the COMPUTE output's `params` handed back as the gradient (the WBSP
/// worker writes its model during that call), a gradient half inside the model, and an
/// output buffer inside the model or the handle's block.
#[test]
fn buffers_overlapping_the_handles_memory_are_refused() {
    for protocol in [SYNCOPATE_PROTOCOL_WBSP, SYNCOPATE_PROTOCOL_BSP] {
        let c = config(protocol, 2);
        let mut k = cluster(&c, 2);
        let w = k.workers[0];
        let mut buf = vec![0u8; k.max_len];
        // SAFETY: live handles; the pointers given are valid for the lengths given (they
        // point into memory the test owns), which is exactly what the overlap check is for.
        unsafe {
            let mut out = SyncopateWorkerOutput::default();
            assert_eq!(syncopate_worker_poll_output(w, &mut out, buf.as_mut_ptr(), buf.len()), SYNCOPATE_OK);
            assert_eq!(out.kind, SYNCOPATE_OUTPUT_SEND, "the Join");
            let st = syncopate_server_handle(k.server, 0, 0, buf.as_ptr(), out.message_len);
            assert_eq!(st, SYNCOPATE_OK, "{}", last_error());
            let mut server_buf = vec![0u8; k.max_len];
            drain_server(&k, 0, &mut server_buf);
            let mut compute = None;
            for _ in 0..8 {
                let mut out = SyncopateWorkerOutput::default();
                assert_eq!(syncopate_worker_poll_output(w, &mut out, buf.as_mut_ptr(), buf.len()), SYNCOPATE_OK);
                if out.kind == SYNCOPATE_OUTPUT_COMPUTE {
                    compute = Some(out);
                    break;
                }
            }
            let Some(out) = compute else {
                panic!("protocol {protocol}: no COMPUTE output: {}", last_error());
            };
            let st = syncopate_worker_handle_gradient(w, 0, out.compute_id, out.params, out.params_len);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "protocol {protocol}: the params as the gradient");
            assert!(last_error().contains("`grad` overlaps"), "{}", last_error());
            let worker_model = k._worker_params[0].as_ptr();
            let mut half = [0.0f32; 2 * DIM];
            let straddling = worker_model.wrapping_add(DIM - 1);
            let st = syncopate_worker_handle_gradient(w, 0, out.compute_id, straddling, DIM);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "a gradient straddling the model's end");
            // The entry point with a loss checks the same, before reading anything.
            let st = syncopate_worker_handle_gradient_loss(w, 0, out.compute_id, out.params, out.params_len, 0.5);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "protocol {protocol}: the params as the gradient, with a loss");
            assert!(last_error().contains("`grad` overlaps"), "{}", last_error());
            let st = syncopate_worker_handle_gradient_loss(w, 0, out.compute_id, straddling, DIM, 0.5);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "a gradient with a loss straddling the model's end");
            let model_bytes = k._worker_params[0].as_mut_ptr().cast::<u8>();
            let st = syncopate_worker_poll_output(w, &mut SyncopateWorkerOutput::default(), model_bytes, k.max_len);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "an output buffer over the model");
            let block = k._mem[1].as_mut_ptr().cast::<u8>().wrapping_add(8);
            let st = syncopate_worker_poll_output(w, &mut SyncopateWorkerOutput::default(), block, k.max_len);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "an output buffer inside the handle's block");
            let server_model = k.model.as_mut_ptr().cast::<u8>();
            let mut sout = SyncopateServerOutput::default();
            let st = syncopate_server_poll_output(k.server, &mut sout, server_model, k.max_len);
            assert_eq!(st, SYNCOPATE_ERR_OVERLAP, "an output buffer over the server's model");
            // A gradient of its own is taken.
            half[..DIM].copy_from_slice(core::slice::from_raw_parts(out.params, DIM));
            let st = syncopate_worker_handle_gradient(w, 0, out.compute_id, half.as_ptr(), DIM);
            assert_eq!(st, SYNCOPATE_OK, "{}", last_error());
            let mut ws = SyncopateWorkerStats::default();
            assert_eq!(syncopate_worker_stats(w, &mut ws), SYNCOPATE_OK);
            assert_eq!(ws.outputs_lost, 0);
            let mut ss = SyncopateServerStats { outputs_lost: 7, ..SyncopateServerStats::default() };
            assert_eq!(syncopate_server_stats(k.server, &mut ss), SYNCOPATE_OK);
            assert_eq!(ss.outputs_lost, 0);
        }
    }
}

#[test]
fn bad_calls_return_error_codes() {
    let c = config(SYNCOPATE_PROTOCOL_BSP, 2);
    let k = cluster(&c, 2);
    let mut buf = vec![0u8; k.max_len];
    let mut out = SyncopateServerOutput::default();
    // SAFETY: every call below passes either valid pointers or deliberately bad ones that the
    // library must refuse before using (null, misaligned, short, dead handles).
    unsafe {
        assert_eq!(
            syncopate_server_poll_output(null_mut(), &mut out, buf.as_mut_ptr(), buf.len()),
            SYNCOPATE_ERR_NULL_POINTER
        );
        assert!(last_error().contains("`server`"), "{}", last_error());
        let short = syncopate_server_poll_output(k.server, &mut out, buf.as_mut_ptr(), k.max_len - 1);
        assert_eq!(short, SYNCOPATE_ERR_BUFFER_TOO_SHORT);
        assert_eq!(syncopate_last_error_code(), SYNCOPATE_ERR_BUFFER_TOO_SHORT);
        assert!(last_error().contains(&format!("{} needed", k.max_len)), "{}", last_error());
        assert_eq!(
            syncopate_server_poll_output(k.server, null_mut(), buf.as_mut_ptr(), buf.len()),
            SYNCOPATE_ERR_NULL_POINTER
        );
        assert_eq!(syncopate_server_handle(k.server, 0, 0, null(), 5), SYNCOPATE_ERR_NULL_POINTER);
        assert_eq!(syncopate_server_handle(k.server, 0, 0, buf.as_ptr(), 3), SYNCOPATE_ERR_DECODE);

        // A gradient of the wrong length, encoded and fed to the server.
        let short_grad = [1.0f32; DIM - 1];
        let msg = SyncopateMessage {
            kind: SYNCOPATE_MSG_GRAD,
            epoch: 0,
            version: 0,
            iteration: 0,
            seq: 1,
            clock: 0,
            local_steps: 0,
            pull_now: 0,
            has_loss: 1,
            loss: 0.5,
            values: short_grad.as_ptr(),
            values_len: short_grad.len(),
            payload: null(),
            payload_len: 0,
        };
        let mut written = 0;
        assert_eq!(syncopate_wire_encode(&msg, buf.as_mut_ptr(), 3, &mut written), SYNCOPATE_ERR_BUFFER_TOO_SHORT);
        assert_eq!(syncopate_wire_encode(&msg, buf.as_mut_ptr(), buf.len(), &mut written), SYNCOPATE_OK);
        assert_eq!(syncopate_server_handle(k.server, 0, 0, buf.as_ptr(), written), SYNCOPATE_ERR_WRONG_LENGTH);
        // And decoded back: the fields and the payload survive.
        let mut decoded = msg;
        assert_eq!(syncopate_wire_decode(buf.as_ptr(), written, DIM, &mut decoded), SYNCOPATE_OK);
        assert_eq!((decoded.kind, decoded.seq, decoded.payload_len), (SYNCOPATE_MSG_GRAD, 1, 12));
        assert_eq!((decoded.has_loss, decoded.loss), (1, 0.5));
        let bad_flag = SyncopateMessage { has_loss: 2, ..msg };
        assert_eq!(syncopate_wire_encode(&bad_flag, buf.as_mut_ptr(), buf.len(), &mut written), SYNCOPATE_ERR_ENCODE);
        let mut floats = [0.0f32; DIM - 1];
        assert_eq!(
            syncopate_wire_payload_to_f32(decoded.payload, decoded.payload_len, floats.as_mut_ptr(), 3),
            SYNCOPATE_OK
        );
        assert_eq!(floats, short_grad);
        assert_eq!(
            syncopate_wire_payload_to_f32(decoded.payload, decoded.payload_len, floats.as_mut_ptr(), 2),
            SYNCOPATE_ERR_WRONG_LENGTH
        );

        let w = k.workers[0];
        assert_eq!(syncopate_worker_handle_gradient(w, 0, 0, short_grad.as_ptr(), DIM - 1), SYNCOPATE_ERR_WRONG_LENGTH);
        assert_eq!(syncopate_worker_handle_gradient(w, 0, 0, null(), DIM), SYNCOPATE_ERR_NULL_POINTER);
        let misaligned = buf.as_ptr().add(1).cast::<f32>();
        assert_eq!(syncopate_worker_handle_gradient(w, 0, 0, misaligned, DIM), SYNCOPATE_ERR_MISALIGNED);

        // Memory: misaligned, short, or overlapping the model.
        let mut size = 0;
        assert_eq!(syncopate_server_size(&c, DIM, &mut size), SYNCOPATE_OK);
        let mut mem = block(size + 16, 8);
        let mut model = [0.0f32; DIM];
        let mut s = null_mut();
        let base = mem.as_mut_ptr().cast::<u8>();
        assert_eq!(
            syncopate_server_init(base.add(4).cast::<c_void>(), size, &c, model.as_mut_ptr(), DIM, &mut s),
            SYNCOPATE_ERR_MISALIGNED
        );
        assert_eq!(
            syncopate_server_init(base.cast(), size - 1, &c, model.as_mut_ptr(), DIM, &mut s),
            SYNCOPATE_ERR_BUFFER_TOO_SHORT
        );
        assert_eq!(syncopate_server_init(base.cast(), size, &c, base.add(8).cast(), DIM, &mut s), SYNCOPATE_ERR_CONFIG);
        assert_eq!(
            syncopate_server_init(base.cast(), size, &c, model.as_mut_ptr(), DIM, null_mut()),
            SYNCOPATE_ERR_NULL_POINTER
        );
        let mut bad = c;
        bad.dbw_l_eta_mode = 9;
        bad.protocol = SYNCOPATE_PROTOCOL_DBW;
        assert_eq!(
            syncopate_server_init(base.cast(), size, &bad, model.as_mut_ptr(), DIM, &mut s),
            SYNCOPATE_ERR_CONFIG
        );
        assert!(last_error().contains("dbw_l_eta_mode"), "{}", last_error());

        // A finished handle, and a pointer to something that is not a handle.
        assert_eq!(syncopate_server_fini(k.server), SYNCOPATE_OK);
        assert_eq!(syncopate_server_stop(k.server), SYNCOPATE_ERR_BAD_HANDLE);
        let not_a_handle = [7u64; 4];
        assert_eq!(syncopate_server_stop(not_a_handle.as_ptr().cast_mut().cast()), SYNCOPATE_ERR_BAD_HANDLE);
        assert!(last_error().starts_with("bad handle"), "{}", last_error());
    }
}

#[test]
fn last_error_message_truncates_like_snprintf() {
    // SAFETY: null with length 0 is allowed; `small` is writable for its length.
    unsafe {
        assert_eq!(syncopate_config_default(null_mut(), 0, 1, 0.1), SYNCOPATE_ERR_NULL_POINTER);
        let full = syncopate_last_error_message(null_mut(), 0);
        let mut small = [0xffu8; 8];
        assert_eq!(syncopate_last_error_message(small.as_mut_ptr().cast(), small.len()), full);
        assert_eq!(&small, b"null po\0");
    }
}
