//! The reference model of a protocol configuration.

use super::{AspModel, BapModel, GroupedModel, Model, SspModel, SyncModel, WbspModel};
use std::boxed::Box;
use std::vec::Vec;
use syncopate::{AnyServer, ProtocolConfig};

/// The model of `config`'s protocol (grouped has none here).
pub fn model_for(config: &ProtocolConfig, real: &AnyServer<f64, Vec<f64>>) -> Option<Box<dyn Model>> {
    let n = config.workers();
    Some(match (config, real) {
        (ProtocolConfig::Asp(_), _) => Box::new(AspModel::new(n)),
        (ProtocolConfig::Bsp(_), _) => Box::new(SyncModel::new(n, n, false)),
        (ProtocolConfig::Backup(b), _) => Box::new(SyncModel::new(n, n - b.backup_workers, false)),
        (ProtocolConfig::Dbw(_), _) => Box::new(SyncModel::new(n, n, true)),
        (ProtocolConfig::Wbsp(w), _) => {
            Box::new(WbspModel::new(n, w.round_deadline.map(|d| d.as_nanos().div_ceil(1_000_000))))
        }
        (ProtocolConfig::Bap(_), AnyServer::Bap(s)) => Box::new(BapModel::new(n, s.s_bap())),
        (ProtocolConfig::Ssp(s), _) => Box::new(SspModel::new(n, s.staleness)),
        (ProtocolConfig::Grouped(g), _) if g.local_steps == 1 => Box::new(GroupedModel::new(g)),
        _ => return None,
    })
}
