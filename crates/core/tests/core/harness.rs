//! Given events / when command / then events-or-rejection, with the invariants
//! checked after every event.

#![allow(dead_code)]

use reservoir_core::*;

pub const EPOCH: &str = "2026-07-19T14:00Z";

pub fn rid(s: &str) -> ReservationId {
    ReservationId::new(s).expect("valid reservation id")
}
pub fn op(s: &str) -> OperationId {
    OperationId::new(s).expect("valid operation id")
}
pub fn sid(s: &str) -> ShardId {
    ShardId::new(s).expect("valid shard id")
}
pub fn mid(s: &str) -> MoveId {
    MoveId::new(s).expect("valid move id")
}
pub fn digest(b: u8) -> RequestDigest {
    RequestDigest([b; 32])
}
pub fn key_for(policy: &Policy) -> PartitionKey {
    PartitionKey::new(
        policy.subject.clone(),
        policy.route.clone(),
        EPOCH,
        policy.generation,
    )
    .expect("valid key")
}

/// `Policy::example`: burst 10,000 (opening full), 10,000 units a minute (one unit
/// per 6 ms), max reservation 8,000, hold TTL 180 s, execution limit 600 s, max
/// overdraft 5,000.
pub fn policy() -> Policy {
    Policy::example("tenant-7", "chat.generate", 31)
}

pub fn reserve(id: &str, d: u8, units: Units) -> Command {
    Command::Reserve {
        further_units: Vec::new(),
        id: rid(id),
        digest: digest(d),
        units,
        sizing: None,
    }
}
pub fn start(id: &str, operation: &str) -> Command {
    Command::Start {
        id: rid(id),
        operation_id: op(operation),
    }
}
pub fn settle(id: &str, operation: Option<&str>, actual_units: Units) -> Command {
    Command::Settle {
        further_actual_units: Vec::new(),
        id: rid(id),
        operation_id: operation.map(op),
        actual_units,
        usage: None,
    }
}
pub fn release(id: &str) -> Command {
    Command::Release { id: rid(id) }
}
pub fn expire(id: &str) -> Command {
    Command::Expire { id: rid(id) }
}
pub fn mark_unknown(id: &str) -> Command {
    Command::MarkUsageUnknown { id: rid(id) }
}

/// Names of the event types, for compact `then` columns.
pub fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.body.type_name()).collect()
}

/// One partition under test, its full event history and the writer's clock.
pub struct Harness {
    pub p: Partition,
    pub events: Vec<Event>,
    pub now: TimestampMs,
}

impl Harness {
    /// A partition opened at t = 0 under `policy`.
    pub fn open(policy: Policy) -> Harness {
        let mut h = Harness {
            p: Partition::default(),
            events: Vec::new(),
            now: 0,
        };
        let key = key_for(&policy);
        h.ok(Command::OpenPartition { key, policy });
        h
    }

    pub fn new() -> Harness {
        Harness::open(policy())
    }

    /// *Given* these past events (applied with `try_apply`, which must accept them).
    pub fn given(events: Vec<Event>) -> Harness {
        let mut h = Harness {
            p: Partition::default(),
            events: Vec::new(),
            now: 0,
        };
        for e in events {
            h.apply_checked(e);
        }
        h.now = h.p.last_at_ms;
        h
    }

    /// Moves the writer's clock (forward only: the writer's clock is monotonic).
    pub fn at(&mut self, now: TimestampMs) -> &mut Self {
        assert!(
            now >= self.now,
            "tests only move time forward ({} -> {now})",
            self.now
        );
        self.now = now;
        self
    }

    pub fn advance(&mut self, ms: u64) -> &mut Self {
        self.now += ms;
        self
    }

    fn apply_checked(&mut self, event: Event) {
        try_apply(&mut self.p, &event).unwrap_or_else(|e| panic!("apply of {event:?} failed: {e}"));
        self.p.check_invariants().unwrap_or_else(|e| {
            panic!(
                "invariants broken after {event:?}: {e}\n{:?}",
                self.p.ledger
            )
        });
        self.events.push(event);
    }

    /// *When* this command at the harness clock: decide, apply every event with the
    /// invariants checked after each, and return what `decide` answered. A rejection
    /// must leave the state untouched (decide never mutates; checked anyway).
    pub fn run(&mut self, command: Command) -> Result<Vec<Event>, Rejection> {
        let before = self.p.clone();
        match decide(&self.p, &command, self.now) {
            Ok(events) => {
                if events.is_empty() {
                    assert_eq!(self.p, before);
                }
                for e in events.iter().cloned() {
                    self.apply_checked(e);
                }
                Ok(events)
            }
            Err(rejection) => {
                assert_eq!(self.p, before, "a rejection changed state");
                Err(rejection)
            }
        }
    }

    /// *Then* events (must be accepted).
    #[track_caller]
    pub fn ok(&mut self, command: Command) -> Vec<Event> {
        let c = format!("{command:?}");
        self.run(command)
            .unwrap_or_else(|r| panic!("{c} rejected: {r}"))
    }

    /// *Then* this rejection.
    #[track_caller]
    pub fn rejected(&mut self, command: Command) -> Rejection {
        let c = format!("{command:?}");
        match self.run(command) {
            Ok(events) => panic!("{c} accepted with {events:?}"),
            Err(r) => r,
        }
    }

    /// *Then* nothing: an idempotent retry answered from the record.
    #[track_caller]
    pub fn noop(&mut self, command: Command) {
        let before = self.p.clone();
        let events = self.ok(command);
        assert!(events.is_empty(), "expected no events, got {events:?}");
        assert_eq!(self.p, before);
    }

    pub fn rec(&self, id: &str) -> &Reservation {
        self.p
            .reservation(&rid(id))
            .unwrap_or_else(|| panic!("no reservation {id}"))
    }

    pub fn state(&self, id: &str) -> ReservationState {
        self.rec(id).state
    }

    pub fn ledger(&self) -> Ledger {
        self.p.ledger
    }

    pub fn available(&self) -> Units {
        self.p.ledger.available_units
    }

    /// Hands the history over (for a `given`), after checking it replays.
    pub fn into_events(mut self) -> Vec<Event> {
        let replayed = Partition::replay(&self.events).expect("the recorded events replay");
        assert_eq!(replayed, self.p);
        self.p = Partition::default();
        std::mem::take(&mut self.events)
    }

    /// The next sequence number an event must carry.
    pub fn next_sequence(&self) -> u64 {
        self.p.last_sequence + 1
    }

    /// An event stamped as the next one in this partition, at the current clock.
    pub fn next_event(&self, body: EventBody) -> Event {
        Event::new(self.next_sequence(), self.now.max(self.p.last_at_ms), body)
    }
}

impl Drop for Harness {
    /// Whatever a test did, the log it produced replays to the same state.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let replayed = Partition::replay(&self.events).expect("the recorded events replay");
        assert_eq!(replayed, self.p, "replay differs from the live state");
    }
}
