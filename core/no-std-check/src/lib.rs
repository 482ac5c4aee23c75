//! If `syncopate` or any of its dependencies linked `std`, this staticlib would fail to
//! build with "duplicate lang item `panic_impl`": it is `#![no_std]` and brings its own
//! panic handler. It drives a server and a worker through the public API with static,
//! caller-owned storage, as an embedded user would.

#![no_std]

use core::panic::PanicInfo;
use syncopate::proto::bsp::{BspConfig, BspServer};
use syncopate::{
    AnyServer, AnyWorker, GradientWorker, GradientWorkerConfig, Instant, ProtocolConfig, Server, ServerOutput,
    ToServer, Values, Version, Worker, WorkerId, WorkerOutput, WorkerSetup,
};

#[panic_handler]
fn panic(_: &PanicInfo<'_>) -> ! {
    loop {}
}

/// Runs one BSP step with one worker on a 4-parameter model; returns the new version.
#[unsafe(no_mangle)]
pub extern "C" fn syncopate_no_std_step() -> u64 {
    // Per-worker records inline, for at most 4 workers: no allocation.
    let server =
        BspServer::<f32, [f32; 4], syncopate::proto::Inline<4>>::new(BspConfig::new(1, 0.5), [1.0f32; 4], [0.0f32; 4]);
    let mut server = match server {
        Ok(s) => s,
        Err(_) => return u64::MAX,
    };
    let grad = [1.0f32; 4];
    let msg = ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::Slice(&grad), loss: None };
    if server.handle(Instant::ZERO, WorkerId(0), msg).is_err() {
        return u64::MAX;
    }
    let mut sends = 0u64;
    while let Some(out) = server.poll_output() {
        if let ServerOutput::Send { .. } = out {
            sends += 1;
        }
    }
    let mut worker = match GradientWorker::new(GradientWorkerConfig::new(WorkerId(0)), [0.0f64; 4]) {
        Ok(w) => w,
        Err(_) => return u64::MAX,
    };
    while let Some(WorkerOutput::Send(_)) = worker.poll_output() {}
    server.version().0 + sends
}

/// Builds servers and workers of every protocol through the configuration enums.
#[unsafe(no_mangle)]
pub extern "C" fn syncopate_no_std_any() -> u32 {
    let config = ProtocolConfig::Bsp(BspConfig::new(2, 0.1));
    let mut params = [0.0f32; 8];
    let mut scratch = [0.0f32; 8];
    let ok_server = AnyServer::<f32, &mut [f32]>::new(&config, &mut params[..], &mut scratch[..]).is_ok();
    let mut wp = [0.0f32; 8];
    let mut ws = [0.0f32; 0];
    let setup = WorkerSetup { id: WorkerId(1), epoch: 0, rejoin_after: None };
    let ok_worker = AnyWorker::new(&config, setup, &mut wp[..], &mut ws[..]).is_ok();
    u32::from(ok_server) + u32::from(ok_worker)
}
