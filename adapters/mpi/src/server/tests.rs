//! The server loop's unit tests (an MPI singleton).

use super::*;
use crate::Shared;
use crate::ledger::ShardLedger;
use crate::link::Link;
use crate::since;
use mpi::topology::Rank;
use std::time::{Duration, Instant};
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::GroupedConfig;
use syncopate::proto::sharded::ShardLayout;
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::{AnyServer, ProtocolConfig, Server, ToServer, WorkerId};

const N: u32 = 4;

fn protocols() -> Vec<ProtocolConfig> {
    vec![
        ProtocolConfig::Bsp(BspConfig::new(N, 0.5)),
        ProtocolConfig::Asp(AspConfig::new(N, 0.1)),
        ProtocolConfig::Ssp(SspConfig::new(N, 0.5, 3)),
        ProtocolConfig::Bap(BapConfig::new(N, 0.5, 1)),
        ProtocolConfig::Backup(BackupConfig::new(N, 0.5, 1)),
        ProtocolConfig::Dbw(DbwConfig::new(N, 0.5)),
        ProtocolConfig::Wbsp(WbspConfig::new(N, 0.5)),
        ProtocolConfig::Grouped(GroupedConfig::new(N, 0.5, 2)),
    ]
}

/// Three ranks found silent in one pass of the loop: each loss is reported to the
/// protocol right after the other, with no drain in between; every one is taken (none
/// refused) and counted, for every protocol. Runs as an MPI singleton (one rank, so
/// nothing is sent: the outputs are polled, not sent).
#[test]
fn several_silent_ranks_in_one_pass_are_all_lost_and_counted_for_every_protocol() {
    let universe = mpi::initialize().expect("MPI initialises once in this test process");
    let mut link = Some(Link::new(universe.world()));
    for protocol in protocols() {
        let dim = 8;
        let mut server =
            AnyServer::new(&protocol, Shared::zeroed(dim), Shared::zeroed(protocol.server_scratch_len(dim)))
                .and_then(|s| s.with_spare_accumulator(Shared::zeroed(protocol.spare_accumulator_len(dim))))
                .expect("a server");
        let origin = Instant::now();
        for w in 0..N {
            server.handle(since(origin), WorkerId(w), ToServer::Join { epoch: 0 }).expect("a join");
            while server.poll_output().is_some() {}
        }
        let mut lines = Vec::new();
        let mut log = |l: &str| lines.push(l.to_owned());
        let report = ServerReport::empty(N as usize);
        let mut side = Side {
            link: link.take().expect("the link"),
            shard: 0,
            layout: ShardLayout::new(dim, 1).expect("a layout"),
            ranks: Ranks::new(N, 1),
            peers: Peers::new(0, 1, Duration::from_secs(1)),
            report,
            ledger: ShardLedger::default(),
            stop: None,
            summaries: Vec::new(),
            started: Instant::now(),
            log: &mut log,
        };
        let long_ago = Instant::now().checked_sub(Duration::from_secs(10)).expect("an instant");
        for w in 0..3 {
            side.ranks.last_heard[w] = long_ago;
        }
        side.check_silence(&mut server, Duration::from_secs(1), origin);
        let name = protocol.name();
        assert_eq!(side.report.lost, [WorkerId(0), WorkerId(1), WorkerId(2)], "{name}");
        assert_eq!(side.report.refused, 0, "{name}: a loss was refused");
        assert_eq!(side.ranks.live, [N as Rank], "{name}");
        while server.poll_output().is_some() {}
        assert_eq!(server.stats().outputs_lost, 0, "{name}");
        link = Some(side.link);
        assert_eq!(lines.iter().filter(|l| l.contains("lost worker")).count(), 3, "{name}: {lines:?}");
    }
}
