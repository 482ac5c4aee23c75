//! The event loop both engines (one server, and sharded) run: take the next event, stop at
//! the time budget, advance the clock, handle the event, and ask the engine whether to stop.

use syncopate::{Duration, Instant};

/// An engine the loop drives: its event queue, its clock and its stopping rules.
pub(super) trait Driven {
    /// What the queue holds.
    type Event;
    /// Why the run stops before the next event is taken (`None`: go on).
    fn stop_before(&mut self) -> Option<&'static str>;
    /// The next event and its instant, taken out of the queue (`None`: the queue is empty).
    fn next_event(&mut self) -> Option<(Instant, Self::Event)>;
    /// The clock is about to move to `at` (before the time budget is checked).
    fn passing(&mut self, at: Instant) {
        let _ = at;
    }
    /// Sets the clock.
    fn set_now(&mut self, at: Instant);
    /// Handles one event at the current instant.
    fn handle(&mut self, event: Self::Event);
    /// Why the run stops after the event just handled (`None`: go on).
    fn stop_after(&mut self) -> Option<&'static str>;
}

/// Runs `engine` until it stops; the reason. An event past `max_time` (from virtual time
/// zero) is not handled: the clock stops at the budget (`"max_time"`). An empty queue is
/// `"idle"`.
pub(super) fn drive<D: Driven>(engine: &mut D, max_time: Option<Duration>) -> &'static str {
    loop {
        if let Some(reason) = engine.stop_before() {
            return reason;
        }
        let Some((at, event)) = engine.next_event() else { return "idle" };
        engine.passing(at);
        if let Some(max) = max_time {
            let end = Instant::ZERO + max;
            if at > end {
                engine.set_now(end);
                return "max_time";
            }
        }
        engine.set_now(at);
        engine.handle(event);
        if let Some(reason) = engine.stop_after() {
            return reason;
        }
    }
}
