//! Mechanisms every protocol shares, written once: the server engine ([`engine`]: model,
//! version, roster, counters, output queue, stall watch and the one implementation of the
//! server verbs), caller-sized per-worker storage ([`table`]), membership and
//! deduplication (`roster`), the output queues (`queue`),
//! the aggregation round of the synchronous protocols (`round`, and the verbs of their
//! servers in `round_server`), the server's update rule ([`optim`]: SGD, momentum, Nesterov,
//! AdamW, learning-rate schedules), the reported minibatch
//! losses on their way into the updates ([`loss`]), gradient admission
//! (`validate`), the stall watchdog (`stall`), the worker engine ([`worker`]: id, epoch,
//! sequence and job numbering, buffers, output queue, stop flag and the one implementation
//! of the worker verbs, over which every protocol's worker is a small policy) and the
//! gradient worker ([`gradient_worker`]) that BSP, ASP, backup workers, DBW and grouped
//! members run.

pub mod engine;
pub mod gradient_worker;
pub mod input;
pub mod loss;
pub mod optim;
pub mod queue;
pub(crate) mod roster;
pub(crate) mod round;
pub(crate) mod round_server;
pub(crate) mod stall;
pub mod table;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub(crate) mod validate;
pub mod worker;

#[cfg(test)]
pub(crate) mod capacity_tests;
#[cfg(test)]
mod loss_tests;
