//! The run's settings as the server announces them in its handshake: the protocol and its
//! knobs, the model's shape and (for the CLI) the workload. A worker needs only where to
//! connect and its secret; everything else comes from here.
//!
//! The settings travel as their canonical [postcard](https://docs.rs/postcard) encoding
//! ([`RunSettings::encode`]): the same settings always give the same bytes, and a worker
//! refuses bytes that do not decode to settings which encode back to exactly those bytes.
//! A worker that already knows which settings it wants (a reconnecting worker, a group
//! server pinned to a run) sends their SHA-256 ([`RunSettings::digest`]) in its hello, and
//! the server refuses the worker if its own digest differs.
//!
//! The server's update rule ([`RunSettings::optimizer`]) follows the rest as a trailer,
//! present only when the rule is not plain SGD at a constant rate: the settings of a run
//! without a rule encode (and digest) as they did before rules were announced.
//!
//! The protocol is described as the CLI and scenario files describe it (a
//! [`ProtocolSpec`] with the number of workers and the learning rate), and both sides build
//! the core's [`ProtocolConfig`] from it with the same code, so they cannot disagree.

use crate::protocol_spec::{GroupLrScaling, InterruptMode, ProtocolKind, ProtocolSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use syncopate::ProtocolConfig;
use syncopate::proto::{AdamW, Optimizer, Rule, Schedule};

/// The most bytes of encoded settings a server may announce.
pub const MAX_SETTINGS_LEN: usize = 1024;
/// The longest data file path the settings carry.
pub const MAX_PATH_LEN: usize = 400;
/// The largest model dimension a session carries: every model or gradient message of
/// `dim` `f32`s, with its header, sequence number and tag, must fit a frame, whose length
/// is a `u32`.
pub const MAX_DIM: u64 = (u32::MAX as u64 - 4096) / 4;

/// The protocol and its knobs, as `--protocol`, `--workers`, `--lr` and the knob flags give
/// them (unset knobs take their defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProtocolSettings {
    /// The protocol's name as the CLI spells it (`bsp`, `wbsp-overlap`, …).
    pub name: String,
    /// The number of workers.
    pub workers: u32,
    /// The learning rate of one synchronous step (normalised per protocol, see
    /// [`ProtocolSpec::config`]).
    pub lr: f64,
    /// SSP's clock bound, BAP's version bound.
    pub staleness: Option<u64>,
    /// BAP's iteration time limit in milliseconds.
    pub iteration_timeout_ms: Option<f64>,
    /// Static backup workers.
    pub backup_workers: Option<u32>,
    /// Backup and DBW: whether stragglers run to completion (`Some(false)`: they abort;
    /// `None`: the default).
    pub run_to_completion: Option<bool>,
    /// DBW's smallest k.
    pub k_min: Option<u32>,
    /// Grouped: the number of groups.
    pub groups: Option<u32>,
    /// Grouped: the learning-rate scaling, as the CLI spells it (`linear`, `none`, `sqrt`;
    /// `None`: the default).
    pub group_lr_scaling: Option<String>,
    /// WBSP's round deadline in milliseconds.
    pub round_deadline_ms: Option<f64>,
    /// Stall reports after this many milliseconds.
    pub stall_report_ms: Option<f64>,
}

impl ProtocolSettings {
    /// The settings of `spec` with `workers` workers and `lr` where the spec sets none.
    pub fn new(spec: &ProtocolSpec, workers: u32, lr: f64) -> Self {
        Self {
            name: spec.name.as_str().to_owned(),
            workers,
            lr: spec.lr.unwrap_or(lr),
            staleness: spec.staleness,
            iteration_timeout_ms: spec.iteration_timeout_ms,
            backup_workers: spec.backup_workers,
            run_to_completion: spec.interrupt.map(|i| i == InterruptMode::Complete),
            k_min: spec.k_min,
            groups: spec.groups,
            group_lr_scaling: spec.group_lr_scaling.map(|g| g.as_str().to_owned()),
            round_deadline_ms: spec.round_deadline_ms,
            stall_report_ms: spec.stall_report_ms,
        }
    }

    /// The protocol `name` with every knob at its default.
    pub fn named(name: ProtocolKind, workers: u32, lr: f64) -> Self {
        Self::new(&ProtocolSpec::new(name), workers, lr)
    }

    /// The spec these settings describe.
    pub fn spec(&self) -> Result<ProtocolSpec, String> {
        let name = ProtocolKind::from_name(&self.name).ok_or_else(|| format!("unknown protocol '{}'", self.name))?;
        Ok(ProtocolSpec {
            name,
            lr: Some(self.lr),
            staleness: self.staleness,
            iteration_timeout_ms: self.iteration_timeout_ms,
            backup_workers: self.backup_workers,
            interrupt: self.run_to_completion.map(|c| if c { InterruptMode::Complete } else { InterruptMode::Abort }),
            k_min: self.k_min,
            groups: self.groups,
            group_lr_scaling: match &self.group_lr_scaling {
                Some(name) => Some(
                    GroupLrScaling::from_name(name)
                        .ok_or_else(|| format!("unknown group learning-rate scaling '{name}'"))?,
                ),
                None => None,
            },
            round_deadline_ms: self.round_deadline_ms,
            stall_report_ms: self.stall_report_ms,
        })
    }

    /// The core configuration (the same on every side: built by the same code).
    pub fn config(&self) -> Result<ProtocolConfig, String> {
        self.spec()?.config(self.workers, self.lr)
    }
}

/// Where the training data comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataSource {
    /// The built-in digits data set.
    Digits,
    /// A file every worker must also have, byte for byte.
    File {
        /// The path as the server was given it (a worker reads the same path unless told
        /// another).
        path: String,
        /// `csv` or `libsvm`.
        format: String,
        /// SHA-256 of the file's bytes.
        sha256: [u8; 32],
    },
}

/// The model, data and randomness of a run (what `serve`'s workload flags say).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSettings {
    /// The model kind as `--model` spells it (`softmax`, `mlp:32`).
    pub model: String,
    /// The data.
    pub data: DataSource,
    /// Minibatch size of one gradient.
    pub batch_size: u32,
    /// The run's seed (initial model, data split; each worker's minibatch sampler is seeded
    /// from it and the worker's id).
    pub seed: u64,
}

/// Which shard of a sharded run a server is (`serve --shard I/S`): it holds the `index`-th
/// of `count` contiguous slices of the model ([`ShardLayout`](syncopate::proto::sharded::ShardLayout)).
/// Every shard of a run announces the same settings but for `index`; a worker connected to
/// all of them checks that (see [`RunSettings::check_shard`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSettings {
    /// This shard, in `0..count`.
    pub index: u32,
    /// The number of shards.
    pub count: u32,
    /// The run's name as the operator gave it (`--run-id`; empty when none was given), so
    /// that shards of two runs with the same settings are told apart.
    pub run: String,
}

/// The longest run name a shard announces.
pub const MAX_RUN_ID_LEN: usize = 64;

/// Everything a server tells its workers about the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The protocol and its knobs.
    pub protocol: ProtocolSettings,
    /// The model's number of `f32` parameters.
    pub dim: u64,
    /// The workload, when the workers compute gradients of a built-in model (the CLI);
    /// `None` when the application supplies its own gradients.
    pub workload: Option<WorkloadSettings>,
    /// The grouped protocol with its groups as their own processes (`syncopate group`):
    /// the server is the central server, and only group servers may connect to it.
    pub remote_groups: bool,
    /// The shard this server is, when the model is split over several servers; `None`:
    /// the server holds the whole model.
    pub shard: Option<ShardSettings>,
    /// The server has no model until worker 0 sends it: worker 0's first frame of every
    /// session carries the initial parameters ([`initial`](super::initial)).
    pub initial_from_worker: bool,
    /// Every worker sends the times of its gradient steps before each contribution
    /// ([`step_times`](super::step_times)), for a server that records a step-time trace.
    pub report_step_times: bool,
    /// The server's update rule (part of the digest, so a run resumed or rejoined with
    /// another rule is refused). Encoded after the rest, and only when it is not plain SGD
    /// at a constant rate. A worker of rule [`Rule::Mean`] receives each round's mean
    /// gradient, not a model.
    #[serde(skip)]
    pub optimizer: Optimizer,
}

/// [`Rule`] as the settings' trailer encodes it.
#[derive(Serialize, Deserialize)]
enum RuleWire {
    Sgd,
    Momentum(f64),
    Nesterov(f64),
    AdamW { beta1: f64, beta2: f64, eps: f64, weight_decay: f64 },
    Mean,
}

/// [`Schedule`] as the settings' trailer encodes it.
#[derive(Serialize, Deserialize)]
enum ScheduleWire {
    Constant,
    Step { every: u64, gamma: f64 },
    WarmupCosine { warmup: u64, total: u64, floor: f64 },
}

fn to_wire(o: &Optimizer) -> (RuleWire, ScheduleWire) {
    let rule = match o.rule {
        Rule::Sgd => RuleWire::Sgd,
        Rule::Momentum { beta } => RuleWire::Momentum(beta),
        Rule::Nesterov { beta } => RuleWire::Nesterov(beta),
        Rule::AdamW(a) => RuleWire::AdamW { beta1: a.beta1, beta2: a.beta2, eps: a.eps, weight_decay: a.weight_decay },
        Rule::Mean => RuleWire::Mean,
    };
    let schedule = match o.schedule {
        Schedule::Constant => ScheduleWire::Constant,
        Schedule::Step { every, gamma } => ScheduleWire::Step { every, gamma },
        Schedule::WarmupCosine { warmup, total, floor } => ScheduleWire::WarmupCosine { warmup, total, floor },
    };
    (rule, schedule)
}

fn from_wire((rule, schedule): (RuleWire, ScheduleWire)) -> Optimizer {
    let rule = match rule {
        RuleWire::Sgd => Rule::Sgd,
        RuleWire::Momentum(beta) => Rule::Momentum { beta },
        RuleWire::Nesterov(beta) => Rule::Nesterov { beta },
        RuleWire::AdamW { beta1, beta2, eps, weight_decay } => Rule::AdamW(AdamW { beta1, beta2, eps, weight_decay }),
        RuleWire::Mean => Rule::Mean,
    };
    let schedule = match schedule {
        ScheduleWire::Constant => Schedule::Constant,
        ScheduleWire::Step { every, gamma } => Schedule::Step { every, gamma },
        ScheduleWire::WarmupCosine { warmup, total, floor } => Schedule::WarmupCosine { warmup, total, floor },
    };
    Optimizer { rule, schedule }
}

impl RunSettings {
    /// Settings for `protocol` on a model of `dim` parameters, without a workload.
    pub fn new(protocol: ProtocolSettings, dim: usize) -> Self {
        Self {
            protocol,
            dim: dim as u64,
            workload: None,
            remote_groups: false,
            shard: None,
            initial_from_worker: false,
            report_step_times: false,
            optimizer: Optimizer::SGD,
        }
    }

    /// The layout of a sharded run's model ([`Self::dim`] over the shards); refused for a
    /// model that does not split into slices of at least one element. `None` for a run
    /// with one server.
    pub fn shard_layout(&self) -> Result<Option<syncopate::proto::sharded::ShardLayout>, String> {
        let Some(shard) = &self.shard else { return Ok(None) };
        if self.remote_groups {
            return Err("a sharded run has no remote groups (run groups inside each shard)".into());
        }
        if self.report_step_times {
            return Err(
                "a shard records no step times (its workers send them to no shard; record an unsharded run)".into()
            );
        }
        let dim = self.dim()?;
        let layout = syncopate::proto::sharded::ShardLayout::new(dim, shard.count).map_err(|e| e.to_string())?;
        if shard.index >= shard.count {
            return Err(format!("shard {} is outside 0..{}", shard.index, shard.count));
        }
        if shard.run.len() > MAX_RUN_ID_LEN {
            return Err(format!("the run id is longer than {MAX_RUN_ID_LEN} bytes"));
        }
        Ok(Some(layout))
    }

    /// The elements of the model this server holds: all of them, or its shard's slice.
    pub fn served_range(&self) -> Result<core::ops::Range<usize>, String> {
        match (self.shard_layout()?, &self.shard) {
            (Some(layout), Some(shard)) => {
                layout.range(shard.index).ok_or_else(|| format!("shard {} is outside the layout", shard.index))
            }
            _ => Ok(0..self.dim()?),
        }
    }

    /// The digest of the run a shard belongs to: the settings' with the shard index set to
    /// 0, the same on every shard of one run.
    pub fn run_digest(&self) -> Result<[u8; 32], String> {
        let mut common = self.clone();
        if let Some(shard) = &mut common.shard {
            shard.index = 0;
        }
        common.digest()
    }

    /// Checks that these settings, announced by the server at `addr`, are those of shard
    /// `index` of the `count` a worker connects to, in the run of `first` (shard 0's
    /// settings; `None` when these are shard 0's). The error names the shard and says what
    /// differs: not a shard, another number of shards, another position, another run.
    pub fn check_shard(&self, index: u32, count: u32, addr: &str, first: Option<&Self>) -> Result<(), String> {
        let at = format!("shard {index} ({addr})");
        let Some(shard) = &self.shard else {
            return Err(format!(
                "{at} is not a shard: it serves the whole model, so connect to it alone (`--connect {addr}`)"
            ));
        };
        self.shard_layout().map_err(|e| format!("{at}: {e}"))?;
        if shard.count != count {
            return Err(format!("{at} is one of {} shards, but --connect lists {count} addresses", shard.count));
        }
        if shard.index != index {
            return Err(format!(
                "{at} is shard {} of {count}: list the shards' addresses in shard order (shard {} at position {})",
                shard.index, shard.index, shard.index
            ));
        }
        let Some(first) = first else { return Ok(()) };
        let first_run = first.shard.as_ref().map(|s| s.run.as_str()).unwrap_or_default();
        if shard.run != first_run {
            return Err(format!("{at} belongs to run '{}', shard 0 to run '{first_run}'", shard.run));
        }
        if self.run_digest()? != first.run_digest()? {
            return Err(format!("{at} runs other settings than shard 0: {} against {}", self.label(), first.label()));
        }
        Ok(())
    }

    /// The canonical bytes.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut bytes = postcard::to_allocvec(self).map_err(|e| format!("cannot encode the run's settings: {e}"))?;
        if !self.optimizer.is_plain() {
            let trailer = postcard::to_allocvec(&to_wire(&self.optimizer))
                .map_err(|e| format!("cannot encode the run's update rule: {e}"))?;
            bytes.extend_from_slice(&trailer);
        }
        if bytes.len() > MAX_SETTINGS_LEN {
            return Err(format!(
                "the run's settings take {} bytes, at most {MAX_SETTINGS_LEN} fit in the handshake (is the data \
                 path very long?)",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// Settings from their canonical bytes; bytes that are not the canonical encoding of
    /// what they decode to are refused.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (mut s, rest): (Self, _) =
            postcard::take_from_bytes(bytes).map_err(|e| format!("the server's settings do not decode: {e}"))?;
        if !rest.is_empty() {
            let o = from_wire(
                postcard::from_bytes(rest).map_err(|e| format!("the server's update rule does not decode: {e}"))?,
            );
            o.check().map_err(|e| format!("the server's update rule is out of range: {e}"))?;
            s.optimizer = o;
        }
        if s.encode().ok().as_deref() != Some(bytes) {
            return Err("the server's settings are not canonically encoded".into());
        }
        Ok(s)
    }

    /// SHA-256 of the canonical bytes (what a hello pins).
    pub fn digest(&self) -> Result<[u8; 32], String> {
        Ok(digest(&self.encode()?))
    }

    /// The model dimension as a `usize`: from 1 to [`MAX_DIM`], checked before a peer's
    /// settings size any buffer.
    pub fn dim(&self) -> Result<usize, String> {
        usize::try_from(self.dim)
            .ok()
            .filter(|d| *d > 0 && self.dim <= MAX_DIM)
            .ok_or_else(|| format!("the model dimension {} is not usable here (1 to {MAX_DIM})", self.dim))
    }

    /// The configuration every worker of the run uses. Refused for a shard's settings: a
    /// worker of a sharded run connects to every shard ([`Self::shard_worker_config`]).
    pub fn worker_config(&self) -> Result<ProtocolConfig, String> {
        if let Some(shard) = &self.shard {
            return Err(format!(
                "the server is shard {} of {} of a sharded run: connect to every shard, in order (`--connect \
                 A0,A1,...`)",
                shard.index, shard.count
            ));
        }
        self.protocol.config()
    }

    /// The configuration of each inner worker of a sharded run's worker (one per shard).
    pub fn shard_worker_config(&self) -> Result<ProtocolConfig, String> {
        self.protocol.config()
    }

    /// The configuration this server runs: the run's, or for a central server of remote
    /// groups, the central configuration of the protocol's tiers
    /// ([`ProtocolConfig::tiers`]; grouped: ASP over the groups).
    pub fn server_config(&self) -> Result<ProtocolConfig, String> {
        let config = self.protocol.config()?;
        if !self.remote_groups {
            return Ok(config);
        }
        if self.report_step_times {
            return Err("a central server of remote groups records no step times: its peers are group servers, \
                        not workers"
                .into());
        }
        config
            .tiers()
            .map(|t| t.central)
            .ok_or_else(|| format!("remote groups need the grouped protocol, not {}", config.name()))
    }

    /// Refuses an update rule this run's server cannot run (rule `mean` under a protocol
    /// that does not relay round means), naming the rule and the protocol.
    pub fn check_optimizer(&self) -> Result<(), String> {
        if self.optimizer.is_plain() {
            return Ok(());
        }
        let config = self.server_config()?;
        let o = self.optimizer;
        let server: syncopate::AnyServer<f32, Vec<f32>, syncopate::proto::Heap> =
            syncopate::AnyServer::new(&config, vec![0.0; 1], vec![0.0; config.server_scratch_len(1)])
                .map_err(|e| e.to_string())?;
        server.with_optimizer(o, vec![0.0; o.state_len(1)]).map(drop).map_err(|e| e.to_string())
    }

    /// The number of peers that connect to a server of this run: the workers, or the
    /// groups of a central server of remote groups.
    pub fn peers(&self) -> Result<u32, String> {
        Ok(self.server_config()?.workers())
    }

    /// One line naming the protocol, its knobs and the model, for messages.
    pub fn label(&self) -> String {
        let protocol = self.protocol.spec().map_or_else(|_| self.protocol.name.clone(), |s| s.label());
        let mut label = format!("{protocol} with {} workers, {} params", self.protocol.workers, self.dim);
        if let Some(shard) = &self.shard {
            label.push_str(&format!(", shard {} of {}", shard.index, shard.count));
            if !shard.run.is_empty() {
                label.push_str(&format!(" of run '{}'", shard.run));
            }
        }
        if let Some(w) = &self.workload {
            label.push_str(&format!(", model {} batch {} seed {}", w.model, w.batch_size, w.seed));
        }
        if self.initial_from_worker {
            label.push_str(", initial model from worker 0");
        }
        if self.report_step_times {
            label.push_str(", step times recorded");
        }
        if !self.optimizer.is_plain() {
            label.push_str(&format!(", optimizer {}", crate::optimizer_spec::describe(&self.optimizer)));
        }
        label
    }
}

/// SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_dimension_beyond_what_a_frame_carries_is_refused_before_any_buffer() {
        let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Asp, 2, 0.5), 4);
        assert_eq!(s.dim(), Ok(4));
        for dim in [0, MAX_DIM + 1, u64::MAX] {
            s.dim = dim;
            assert!(s.dim().is_err_and(|e| e.contains("not usable")), "{dim}");
        }
        s.dim = MAX_DIM;
        assert!(s.dim().is_ok());
        assert!(crate::tcp::session_max_len(MAX_DIM as usize) <= u32::MAX as usize);
    }

    fn sample() -> RunSettings {
        let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Dbw, 4, 0.5), 650);
        s.protocol.k_min = Some(3);
        s.workload = Some(WorkloadSettings {
            model: "mlp:16".into(),
            data: DataSource::File { path: "d.csv".into(), format: "csv".into(), sha256: [7; 32] },
            batch_size: 16,
            seed: 9,
        });
        s
    }

    #[test]
    fn settings_round_trip_canonically_and_build_the_same_config() {
        let s = sample();
        let bytes = s.encode().unwrap();
        let back = RunSettings::decode(&bytes).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.worker_config().unwrap(), s.worker_config().unwrap());
        assert_eq!(back.digest().unwrap(), digest(&bytes));
        let mut other = s.clone();
        other.protocol.k_min = Some(2);
        assert_ne!(other.digest().unwrap(), s.digest().unwrap());
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(RunSettings::decode(&trailing).is_err());
        // A plain rule written as a trailer is not canonical.
        trailing.push(0);
        assert!(RunSettings::decode(&trailing).is_err());
        for cut in 0..bytes.len() {
            assert!(RunSettings::decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn every_protocol_survives_the_trip() {
        for name in ProtocolKind::ALL {
            let s = RunSettings::new(ProtocolSettings::named(name, 8, 0.5), 100);
            let back = RunSettings::decode(&s.encode().unwrap()).unwrap();
            assert_eq!(back.worker_config().unwrap(), ProtocolSpec::new(name).config(8, 0.5).unwrap());
        }
    }

    #[test]
    fn remote_groups_run_asp_over_the_groups_at_the_central_server() {
        let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Grouped, 4, 0.5), 10);
        s.remote_groups = true;
        let ProtocolConfig::Grouped(g) = s.worker_config().unwrap() else { panic!() };
        assert_eq!(s.server_config().unwrap(), ProtocolConfig::Asp(g.central_config()));
        assert_eq!(s.peers().unwrap(), 2);
        s.protocol = ProtocolSettings::named(ProtocolKind::Bsp, 4, 0.5);
        assert!(s.server_config().unwrap_err().contains("grouped"));
    }

    #[test]
    fn a_shard_serves_its_slice_and_is_checked_against_shard_0_of_its_run() {
        let shard = |index: u32, count: u32, run: &str| {
            let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10);
            s.shard = Some(ShardSettings { index, count, run: run.into() });
            s
        };
        assert_eq!(shard(0, 3, "r").served_range(), Ok(0..4));
        assert_eq!(shard(2, 3, "r").served_range(), Ok(7..10));
        assert_eq!(RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10).served_range(), Ok(0..10));
        assert!(shard(0, 11, "r").served_range().unwrap_err().contains("does not split into 11 shards"));
        assert!(shard(3, 3, "r").shard_layout().unwrap_err().contains("outside 0..3"));
        assert_eq!(shard(0, 2, "r").run_digest(), shard(1, 2, "r").run_digest());
        assert_ne!(shard(0, 2, "r").digest(), shard(1, 2, "r").digest());
        let first = shard(0, 2, "r");
        assert_eq!(first.check_shard(0, 2, "a", None), Ok(()));
        assert_eq!(shard(1, 2, "r").check_shard(1, 2, "b", Some(&first)), Ok(()));
        let e = shard(1, 2, "r").check_shard(0, 2, "b", None).unwrap_err();
        assert!(e.starts_with("shard 0 (b) is shard 1 of 2: list the shards' addresses in shard order"), "{e}");
        let e = shard(1, 3, "r").check_shard(1, 2, "b", Some(&first)).unwrap_err();
        assert_eq!(e, "shard 1 (b) is one of 3 shards, but --connect lists 2 addresses");
        let e = shard(1, 2, "q").check_shard(1, 2, "b", Some(&first)).unwrap_err();
        assert_eq!(e, "shard 1 (b) belongs to run 'q', shard 0 to run 'r'");
        let mut other = shard(1, 2, "r");
        other.protocol.lr = 0.25;
        assert!(other.check_shard(1, 2, "b", Some(&first)).unwrap_err().contains("runs other settings than shard 0"));
        let whole = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 10);
        assert!(whole.check_shard(0, 2, "a", None).unwrap_err().contains("is not a shard"));
        // An unsharded worker is told to connect to every shard; a sharded one gets the config.
        assert!(first.worker_config().unwrap_err().contains("connect to every shard"));
        assert_eq!(first.shard_worker_config(), whole.worker_config());
        let back = RunSettings::decode(&first.encode().unwrap()).unwrap();
        assert_eq!(back, first);
        let mut grouped = shard(0, 2, "r");
        grouped.remote_groups = true;
        assert!(grouped.shard_layout().unwrap_err().contains("no remote groups"));
    }

    #[test]
    fn oversized_settings_are_refused() {
        let mut s = sample();
        s.workload.as_mut().unwrap().data =
            DataSource::File { path: "x".repeat(2000), format: "csv".into(), sha256: [0; 32] };
        assert!(s.encode().unwrap_err().contains("at most 1024"));
    }

    #[test]
    fn the_update_rule_is_in_the_digest_and_absent_when_plain() {
        let s = sample();
        let plain = s.encode().unwrap();
        let mut with = s.clone();
        with.optimizer = Optimizer::momentum(0.0);
        assert_eq!(with.encode().unwrap(), plain, "momentum 0 is plain SGD");
        let rules = [
            Optimizer::momentum(0.9),
            Optimizer::nesterov(0.9),
            Optimizer::adamw(AdamW::default()).with_schedule(Schedule::WarmupCosine {
                warmup: 3,
                total: 9,
                floor: 0.1,
            }),
            Optimizer::MEAN,
            Optimizer::SGD.with_schedule(Schedule::Step { every: 2, gamma: 0.5 }),
        ];
        let mut digests = vec![s.digest().unwrap()];
        for o in rules {
            with.optimizer = o;
            let bytes = with.encode().unwrap();
            assert!(bytes.starts_with(&plain) && bytes.len() > plain.len());
            let back = RunSettings::decode(&bytes).unwrap();
            assert_eq!(back, with);
            assert!(back.label().contains(&format!("optimizer {}", o.rule_name())), "{}", back.label());
            digests.push(back.digest().unwrap());
        }
        digests.sort();
        digests.dedup();
        assert_eq!(digests.len(), rules.len() + 1);
        // A rule out of range from a peer is refused.
        with.optimizer = Optimizer::momentum(0.9);
        let mut bytes = plain.clone();
        bytes.extend_from_slice(&postcard::to_allocvec(&to_wire(&Optimizer::momentum(1.5))).unwrap());
        assert!(RunSettings::decode(&bytes).unwrap_err().contains("out of range"));
    }
}
