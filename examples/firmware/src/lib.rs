//! syncopate on a microcontroller: parameter servers and their workers in one Cortex-M4F
//! image, trained on a least-squares problem, reported over semihosting.
//!
//! Both images (`train`: BSP then DBW; `bsp`: BSP alone) run the same steps: take the
//! model buffers (static, [`Memory`]), paint the stack, build a server with
//! [`bsp_server`] / [`dbw_server`] and eight [`GradientWorker`](syncopate::GradientWorker)s
//! on a simulated clock ([`cluster`]), train until the loss falls to [`LOSS_FRACTION`] of
//! its initial value, print the figures, and exit through semihosting with status 0 only
//! if every run reached that loss ("PASS").

#![no_std]
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cluster;
pub mod problem;
pub mod report;
pub mod rng;
pub mod stack;

use cluster::{Cluster, Failure, Goal, Outcome, Worker};
use core::panic::PanicInfo;
use cortex_m_semihosting::{debug, hprintln};
use problem::Problem;
use report::{Millis, Ratio, Sci};
use syncopate::proto::Inline;
use syncopate::proto::bsp::{BspConfig, BspServer};
use syncopate::proto::dbw::{DbwConfig, DbwServer};
use syncopate::{ConfigError, Server};

/// Workers `n`.
pub const WORKERS: usize = 8;
/// Model parameters `d` (`f32`).
pub const DIM: usize = 1024;
/// Rows of the least-squares problem each worker holds.
pub const ROWS_PER_WORKER: usize = 8;
/// The learning rate `η` of both servers (stable for every `k ≥ 2` DBW may choose).
pub const LEARNING_RATE: f64 = 0.5;
/// Seed of the problem and of the step times.
pub const SEED: u64 = 14;
/// A run passes when its loss falls to this fraction of the initial loss.
pub const LOSS_FRACTION: f32 = 1e-6;
/// A run that has not passed after this many model updates fails.
pub const MAX_UPDATES: u64 = 1000;

/// Every tensor the firmware holds, in one static block (`.bss`).
pub struct Memory {
    /// Each worker's model / gradient buffer.
    pub workers: [[f32; DIM]; WORKERS],
    /// The server's storage.
    pub server: ServerMemory,
    /// The host's gradient, computed here and handed to a worker.
    pub grad: [f32; DIM],
}

/// What a server borrows from the caller (one block, so a constructor that takes more
/// storage needs a new field here and a change in [`bsp_server`] / [`dbw_server`] only).
pub struct ServerMemory {
    /// The model.
    pub params: [f32; DIM],
    /// Scratch: the accumulator; DBW also keeps the previous mean gradient.
    pub scratch: [f32; 2 * DIM],
}

/// The BSP server the firmware runs: the one place that builds it.
pub fn bsp_server(memory: &mut ServerMemory) -> Result<BspServer<f32, &mut [f32], Inline<WORKERS>>, ConfigError> {
    BspServer::new(BspConfig::new(WORKERS as u32, LEARNING_RATE), &mut memory.params, &mut memory.scratch)
}

/// The DBW server the firmware runs (the core's defaults: `k_min = 2`, split signal and noise curvatures,
/// stragglers abort): the one place that builds it.
pub fn dbw_server(memory: &mut ServerMemory) -> Result<DbwServer<f32, &mut [f32], Inline<WORKERS>>, ConfigError> {
    DbwServer::new(DbwConfig::new(WORKERS as u32, LEARNING_RATE), &mut memory.params, &mut memory.scratch)
}

// The DBW server's state beside the tensors (its estimator windows are in the same inline
// tables as its worker records) fits in 8 KiB: checked when the image is built.
const _: () = assert!(core::mem::size_of::<DbwServer<f32, &mut [f32], Inline<WORKERS>>>() <= 8 * 1024);

/// The state of a firmware run: its memory, its problem and whether every run passed.
pub struct Firmware {
    memory: &'static mut Memory,
    problem: Problem,
    passed: bool,
}

impl Firmware {
    /// Takes the static memory, paints the stack, builds the problem and prints the setup.
    pub fn start(image: &str) -> Self {
        let Some(memory) = cortex_m::singleton!(: Memory = Memory {
            workers: [[0.0; DIM]; WORKERS],
            server: ServerMemory { params: [0.0; DIM], scratch: [0.0; 2 * DIM] },
            grad: [0.0; DIM],
        }) else {
            fail("the static memory was already taken")
        };
        stack::paint();
        hprintln!(
            "syncopate firmware `{}`: least squares, n = {} workers, d = {} f32 parameters, {} rows of rank {}, eta = {}, seed {}",
            image,
            WORKERS,
            DIM,
            Problem::rows(),
            problem::RANK,
            Sci(LEARNING_RATE as f32),
            SEED
        );
        Self { memory, problem: Problem::new(SEED), passed: true }
    }

    /// Trains a server built by `build` (from the server's storage, the model
    /// zeroed) with eight fresh workers, prints the outcome and returns it.
    pub fn train<'m, S: Server<f32>>(
        &'m mut self,
        name: &str,
        build: impl FnOnce(&'m mut ServerMemory) -> Result<S, ConfigError>,
    ) -> Option<Outcome> {
        let Memory { workers, server, grad } = &mut *self.memory;
        server.params.fill(0.0);
        let goal = Goal { loss_fraction: LOSS_FRACTION, max_updates: MAX_UPDATES };
        hprintln!(
            "{}: state beside the tensors: server {} bytes, {} workers {} bytes each",
            name,
            core::mem::size_of::<S>(),
            WORKERS,
            core::mem::size_of::<Worker<'m>>()
        );
        let outcome = match build(server) {
            Ok(mut server) => Cluster::new(workers, grad, SEED)
                .and_then(|mut cluster| cluster.train(&mut server, &self.problem, goal)),
            Err(e) => Err(Failure::Config(e)),
        };
        match outcome {
            Ok(o) => {
                let t = o.tally;
                hprintln!(
                    "{}: loss {} -> {} in {} updates, {} simulated; {} gradients applied, {} dropped, {} abandoned",
                    name,
                    Sci(o.initial_loss),
                    Sci(o.final_loss),
                    o.updates,
                    Millis(o.elapsed),
                    t.applied,
                    t.dropped,
                    t.abandoned
                );
                if t.k_choices > 0 {
                    hprintln!(
                        "{}: waited for k = {} gradients per update on average (min {}, max {}, of {})",
                        name,
                        Ratio(u64::from(t.k_sum), u64::from(t.k_choices)),
                        t.k_min,
                        t.k_max,
                        WORKERS
                    );
                }
                if !o.reached {
                    hprintln!("{}: FAIL: the loss did not fall to {} of its initial value", name, Sci(LOSS_FRACTION));
                }
                if !o.all_stopped {
                    hprintln!("{}: FAIL: a worker did not stop", name);
                }
                self.passed &= o.reached && o.all_stopped;
                Some(o)
            }
            Err(failure) => {
                self.passed = false;
                match failure {
                    Failure::Config(e) => hprintln!("{}: FAIL: configuration refused: {}", name, e),
                    Failure::Refused { who, reject } => {
                        hprintln!("{}: FAIL: the {} refused an input: {}", name, who, reject)
                    }
                    Failure::Stuck => hprintln!("{}: FAIL: no worker is computing and the goal is not reached", name),
                    Failure::Upstream => hprintln!("{}: FAIL: the server sent a message upstream", name),
                }
                None
            }
        }
    }

    /// Prints RAM use and the verdict, and exits QEMU: status 0 only after "PASS".
    pub fn finish(self) -> ! {
        hprintln!(
            "memory: statics (.data + .bss) {} bytes, of which tensors {} bytes; stack high-water {} bytes",
            stack::statics(),
            core::mem::size_of::<Memory>(),
            stack::high_water()
        );
        if self.passed {
            hprintln!("PASS");
            exit(true)
        }
        fail("a run did not train")
    }
}

/// Prints how many times sooner (in simulated time) `fast` reached the loss than `slow`.
pub fn compare(fast: (&str, &Outcome), slow: (&str, &Outcome)) {
    let (fast_time, slow_time) = (fast.1.elapsed, slow.1.elapsed);
    hprintln!(
        "{} reached the loss {}x sooner than {} in simulated time ({} against {})",
        fast.0,
        Ratio(slow_time.as_nanos(), fast_time.as_nanos()),
        slow.0,
        Millis(fast_time),
        Millis(slow_time)
    );
}

/// Prints `FAIL: why` and exits QEMU with a failure status.
pub fn fail(why: &str) -> ! {
    hprintln!("FAIL: {}", why);
    exit(false)
}

fn exit(pass: bool) -> ! {
    debug::exit(if pass { debug::EXIT_SUCCESS } else { debug::EXIT_FAILURE });
    // Only reached without a semihosting host (a board without a debugger): halt.
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    hprintln!("FAIL: panic: {}", info);
    exit(false)
}
