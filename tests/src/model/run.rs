//! The driver: a real server and its model side by side on generated inputs, compared after every input.

use super::*;

/// Per worker: the session epoch, the next contribution index, the last contribution sent.
#[derive(Clone, Debug, Default)]
struct Sender {
    epoch: u32,
    next: u64,
    last: Option<Msg>,
    clock: u64,
}

/// What a set of runs exercised (so a test can show its sequences reach the interesting
/// states).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Sequences run.
    pub runs: u64,
    /// Inputs fed.
    pub inputs: u64,
    /// The highest version reached.
    pub max_version: u64,
    /// Inputs refused.
    pub refused: u64,
    /// `Applied` events.
    pub applied: u64,
    /// `Dropped` events.
    pub dropped: u64,
    /// `WorkerLost` events.
    pub lost: u64,
}

/// Runs `ops` against the real server of `config` and its model; `Err` describes the first
/// disagreement (with the inputs so far).
pub fn run(config: &ProtocolConfig, ops: &[Op]) -> Result<Coverage, String> {
    let params: Vec<f64> = (0..DIM).map(|i| i as f64).collect();
    let scratch = vec![0.0; config.server_scratch_len(DIM).max(1)];
    let mut real = AnyServer::new(config, params, scratch).map_err(|e| format!("{e:?}"))?;
    let Some(mut model) = model_for(config, &real) else { return Err(format!("no model of {}", config.name())) };
    let mut cov = Coverage { runs: 1, ..Coverage::default() };
    let n = config.workers();
    let mut senders = vec![Sender { epoch: 1, ..Sender::default() }; n as usize + 1];
    let mut now_ms = 0u64;
    let mut log: Vec<Input> = Vec::new();
    let is = |c: &ProtocolConfig| match c {
        ProtocolConfig::Wbsp(_) => 1,
        ProtocolConfig::Ssp(_) => 2,
        ProtocolConfig::Bap(_) => 3,
        _ => 0,
    };
    let family = is(config);
    let mut last_version = 0u64;
    let mut counted = Ledger::default();
    for op in ops {
        now_ms += 1;
        let input = match *op {
            Op::Join { w, epoch } => {
                let s = &mut senders[w as usize];
                match epoch {
                    1 => {
                        s.epoch += 1;
                        s.next = 0;
                        s.clock = model.clock();
                    }
                    2 => {}
                    _ => {}
                }
                let e = if epoch == 2 { s.epoch.saturating_sub(1) } else { s.epoch };
                Input::Msg { from: u32::from(w), msg: Msg::Join { epoch: e } }
            }
            Op::Send { w, lag, ahead, future, nan } => {
                let v = model.version_of(u32::from(w));
                let s = &mut senders[w as usize];
                let seq = first_seq(s.epoch) + s.next;
                s.next += 1;
                let base = if future { v + 1 } else { v.saturating_sub(u64::from(lag)) };
                let msg = match family {
                    1 => Msg::Delta { round: base, seq, nan },
                    2 => {
                        let clock = s.clock;
                        s.clock += 1;
                        Msg::Clock { clock, seq, nan }
                    }
                    3 => Msg::Grad { base, iteration: v + 1 + u64::from(ahead), seq, nan },
                    _ => Msg::Grad { base, iteration: base + 1, seq, nan },
                };
                s.last = Some(msg.clone());
                Input::Msg { from: u32::from(w), msg }
            }
            Op::Replay { w } => match senders[w as usize].last.clone() {
                Some(msg) => Input::Msg { from: u32::from(w), msg },
                None => continue,
            },
            Op::Pull { w, lag, ahead } => {
                let have = model.version().saturating_sub(u64::from(lag));
                Input::Msg { from: u32::from(w), msg: Msg::Pull { have, min_clock: model.clock() + u64::from(ahead) } }
            }
            Op::Lost { w } => Input::Lost { w: u32::from(w) },
            Op::Leave { w } => Input::Msg { from: u32::from(w), msg: Msg::Leave },
            Op::Tick { ms } => {
                now_ms += u64::from(ms);
                Input::Timeout
            }
        };
        log.push(input.clone());
        model.sync_with(&real);
        let now = Instant::from_nanos(now_ms * 1_000_000);
        let mut want = Step::default();
        let result = match &input {
            Input::Msg { from, msg } => {
                let m = to_server(msg);
                let r = real.handle(now, WorkerId(*from), m.as_msg());
                let expected = match model.roster().member(*from) {
                    Err(e) => Err(e),
                    Ok(_) if *msg == Msg::Leave => {
                        let was = model.roster().lose(*from);
                        if was {
                            want.events.push(Ev::Lost(*from));
                        }
                        model.lost(now_ms, *from, was, &mut want);
                        Ok(())
                    }
                    Ok(_) => model.message(now_ms, *from, msg, &mut want),
                };
                want.verdict = verdict(expected);
                r
            }
            Input::Lost { w } => {
                let r = real.handle_worker_lost(now, WorkerId(*w));
                let expected = match model.roster().member(*w) {
                    Err(e) => Err(e),
                    Ok(_) => {
                        let was = model.roster().lose(*w);
                        if was {
                            want.events.push(Ev::Lost(*w));
                        }
                        model.lost(now_ms, *w, was, &mut want);
                        Ok(())
                    }
                };
                want.verdict = verdict(expected);
                r
            }
            Input::Timeout => {
                want.verdict = "Ok".into();
                if real.poll_timeout().is_some_and(|t| t <= now) {
                    real.handle_timeout(now);
                }
                model.timeout(now_ms, &mut want);
                Ok(())
            }
        };
        let mut got = Step { verdict: verdict(result), ..Step::default() };
        cov.inputs += 1;
        cov.refused += u64::from(result.is_err());
        while let Some(out) = real.poll_output() {
            match out {
                ServerOutput::Event(e) => {
                    if let Some(ev) = reduce(&e) {
                        got.events.push(ev);
                    }
                    counted_event(&mut counted, &e);
                }
                ServerOutput::Send { to, msg: ToWorker::Model { .. } } => got.models_to.push(match to {
                    Recipient::Worker(w) => w.0,
                    Recipient::AllWorkers => u32::MAX,
                }),
                ServerOutput::Send { .. } => {}
                ServerOutput::Upstream(m) => panic!("the server under test sent {} upstream", m.kind_name()),
            }
        }
        got.events.sort();
        want.events.sort();
        for e in &got.events {
            match e {
                Ev::Applied(..) => cov.applied += 1,
                Ev::Dropped(..) => cov.dropped += 1,
                Ev::Lost(_) => cov.lost += 1,
                _ => {}
            }
        }
        cov.max_version = cov.max_version.max(real.version().0);
        if !model.compares_models() {
            got.models_to.clear();
        }
        got.models_to.sort_unstable();
        want.models_to.sort_unstable();
        let mut problems = Vec::new();
        if got != want {
            problems.push(format!("real {got:?}\n  model {want:?}"));
        }
        if real.version().0 != model.version() {
            problems.push(format!("version: real {} model {}", real.version().0, model.version()));
        }
        if let Some(d) = model.deadline() {
            let real_d = real.poll_timeout().map(|t| t.saturating_duration_since(Instant::ZERO).as_nanos() / 1_000_000);
            if real_d != d {
                problems.push(format!("deadline: real {real_d:?} model {d:?}"));
            }
        }
        let st = *real.stats();
        match Ledger::from_server(&st) {
            Ok(l) if l.applied == counted.applied && l.dropped == counted.dropped => {}
            Ok(l) => problems.push(format!("counters {l:?} but events {counted:?}")),
            Err(e) => problems.push(e),
        }
        if real.version().0 < last_version {
            problems.push("version went down".into());
        }
        last_version = real.version().0;
        if !problems.is_empty() {
            let mut s =
                format!("{} after {} inputs:\n  {}\ninputs:\n", config.name(), log.len(), problems.join("\n  "));
            for i in &log {
                s.push_str(&format!("  {i:?}\n"));
            }
            return Err(s);
        }
    }
    Ok(cov)
}

fn counted_event(l: &mut Ledger, e: &ServerEvent) {
    match *e {
        ServerEvent::Applied { .. } => l.applied += 1,
        ServerEvent::Dropped { reason, .. } => l.add_dropped(reason, 1),
        _ => {}
    }
}

fn reduce(e: &ServerEvent) -> Option<Ev> {
    Some(match *e {
        ServerEvent::Applied { worker, base, version, .. } => Ev::Applied(worker.0, base.0, version.0),
        ServerEvent::Dropped { worker, base, reason } => Ev::Dropped(worker.0, base.0, reason.name()),
        ServerEvent::ModelUpdated { version, contributions, .. } => Ev::Updated(version.0, contributions),
        ServerEvent::WorkerLost { worker } => Ev::Lost(worker.0),
        ServerEvent::WorkerJoined { worker, epoch } => Ev::Joined(worker.0, epoch),
        _ => return None,
    })
}

/// Owned values for a message.
struct Owned {
    msg: Msg,
    values: [f64; DIM],
}

impl Owned {
    fn as_msg(&self) -> ToServer<'_, f64> {
        let values = Values::Slice(&self.values);
        match self.msg {
            Msg::Join { epoch } => ToServer::Join { epoch },
            Msg::Grad { base, iteration, seq, .. } => {
                ToServer::Grad { base: Version(base), iteration, seq, values, loss: None }
            }
            Msg::Delta { round, seq, .. } => {
                ToServer::Delta { round: Version(round), local_steps: 1, seq, values, loss: None }
            }
            Msg::Clock { clock, seq, .. } => ToServer::Clock { clock, seq, values, loss: None },
            Msg::Pull { have, min_clock } => ToServer::Pull { have: Version(have), min_clock },
            Msg::Leave => ToServer::Leave,
        }
    }
}

fn to_server(msg: &Msg) -> Owned {
    let nan = matches!(msg, Msg::Grad { nan: true, .. } | Msg::Delta { nan: true, .. } | Msg::Clock { nan: true, .. });
    let values = if nan { [f64::NAN, 1.0] } else { [1.0, -2.0] };
    Owned { msg: msg.clone(), values }
}

/// Runs `cases` generated sequences of up to `len` inputs (deterministic seed) against
/// `config`'s server and its model; the first disagreement, shrunk, as an error.
pub fn search(config: &ProtocolConfig, cases: u32, len: usize) -> Result<Coverage, String> {
    use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
    let cfg = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(cfg, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let config = *config;
    let total = std::cell::RefCell::new(Coverage::default());
    runner
        .run(&ops(config.workers(), len), |ops| {
            let c = run(&config, &ops).map_err(TestCaseError::fail)?;
            let mut t = total.borrow_mut();
            t.runs += c.runs;
            t.inputs += c.inputs;
            t.max_version = t.max_version.max(c.max_version);
            t.refused += c.refused;
            t.applied += c.applied;
            t.dropped += c.dropped;
            t.lost += c.lost;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(total.into_inner())
}
