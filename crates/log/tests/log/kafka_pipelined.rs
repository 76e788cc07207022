//! Pipelined appends on the Kafka log (it promises `ordered_appends`): a
//! writer calls `append` again before the earlier one is acknowledged, and
//! the log must still acknowledge nothing that does not count, and nothing
//! behind an append that was not acknowledged.

use reservoir_log::fence::read_valid;
use reservoir_log::{EventLog, LogEntry, LogError, Position};

use crate::fixtures;
use crate::kafka::{claimed_writer, config, raw_produce, unique_topic};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_log_promises_ordered_appends() {
    let brokers = require_broker!();
    let log = claimed_writer(config(&brokers, &unique_topic("ordered"), "w", 1)).await;
    assert!(log.ordered_appends());
}

/// Appends in flight together land in call order and are each acknowledged
/// at their own positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_in_flight_together_land_in_call_order() {
    let brokers = require_broker!();
    let log = claimed_writer(config(&brokers, &unique_topic("inflight"), "w", 1)).await;
    let calls: Vec<_> = (0..8)
        .map(|i| log.append(vec![fixtures::record("tenant-p", "w", 1, 1 + 2 * i, 2)]))
        .collect();
    let mut acknowledged = Vec::new();
    for call in calls {
        acknowledged.extend(call.await.expect("acknowledged"));
    }
    let offsets: Vec<u64> = acknowledged.iter().map(|p| p.offset).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    let (counted, _) = read_valid(&log, 0).await.unwrap();
    let counted: Vec<Position> = counted.iter().map(|(p, _)| *p).collect();
    assert_eq!(counted, acknowledged);
    assert_eq!(
        log.read_back_entries(),
        0,
        "a writer alone on its partition: its records follow each other, nothing to read back"
    );
}

/// Something another producer wrote between two appends (here a record, not
/// a claim) is a gap in the offsets: the append after it reads the gap back,
/// finds no claim there, and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_entry_between_appends_is_read_back_and_does_not_fence() {
    let brokers = require_broker!();
    let topic = unique_topic("gap");
    let log = claimed_writer(config(&brokers, &topic, "w", 1)).await;
    let first = log
        .append(vec![fixtures::record("tenant-g", "w", 1, 1, 2)])
        .await
        .unwrap();
    assert_eq!(log.read_back_entries(), 0);
    let foreign = raw_produce(
        &brokers,
        &topic,
        0,
        &LogEntry::Record(fixtures::record("tenant-g", "stranger", 7, 1, 2)),
    )
    .await;
    let second = log
        .append(vec![fixtures::record("tenant-g", "w", 1, 3, 2)])
        .await
        .expect("a foreign record is not a claim: the append counts");
    assert_eq!(foreign as u64, first[0].offset + 1);
    assert_eq!(second[0].offset, first[0].offset + 2);
    assert_eq!(
        log.read_back_entries(),
        2,
        "the foreign record and this append's own record were read back"
    );
    let (counted, _) = read_valid(&log, 0).await.unwrap();
    let counted: Vec<Position> = counted.iter().map(|(p, _)| *p).collect();
    assert_eq!(counted, [first, second].concat());
}

/// A claim that lands between two appends fences the one after it, and every
/// append called behind that one, even though they were handed to the
/// producer before the writer learned of the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_between_pipelined_appends_fences_every_later_one() {
    let brokers = require_broker!();
    let topic = unique_topic("pipefence");
    let zombie = claimed_writer(config(&brokers, &topic, "zombie", 1)).await;
    let before = zombie
        .append(vec![fixtures::record("tenant-z", "zombie", 1, 1, 2)])
        .await
        .unwrap();
    let usurper = claimed_writer(config(&brokers, &topic, "usurper", 1)).await;

    // Both called before either is awaited: both are with the producer.
    let second = zombie.append(vec![fixtures::record("tenant-z", "zombie", 1, 3, 2)]);
    let third = zombie.append(vec![fixtures::record("tenant-z", "zombie", 1, 5, 2)]);
    for (name, result) in [("second", second.await), ("third", third.await)] {
        assert!(
            matches!(result, Err(LogError::Fenced { .. })),
            "{name}: {result:?}"
        );
    }
    let refused = zombie
        .append(vec![fixtures::record("tenant-z", "zombie", 1, 7, 2)])
        .await;
    assert!(
        matches!(refused, Err(LogError::Fenced { .. })),
        "{refused:?}"
    );
    assert!(
        zombie.read_back_entries() > 0,
        "the usurper's claim is a gap in the zombie's offsets: read back"
    );

    let after = usurper
        .append(vec![fixtures::record("tenant-z", "usurper", 2, 3, 2)])
        .await
        .unwrap();
    let (counted, _) = read_valid(&usurper, 0).await.unwrap();
    let counted: Vec<Position> = counted.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        counted,
        [before, after].concat(),
        "only acknowledged records count"
    );
}

/// An append called behind one whose outcome nobody learned (its future was
/// dropped: the writer gave it up) was decided on top of it, so it is not
/// acknowledged: it fails in doubt, and so does every append after it until
/// the writer claims again (and would rebuild its state from the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_behind_an_abandoned_one_is_not_acknowledged() {
    let brokers = require_broker!();
    let log = claimed_writer(config(&brokers, &unique_topic("abandoned"), "w", 1)).await;
    let abandoned = log.append(vec![fixtures::record("tenant-a", "w", 1, 1, 2)]);
    let behind = log.append(vec![fixtures::record("tenant-a", "w", 1, 3, 2)]);
    drop(abandoned);
    let result = behind.await;
    assert!(
        matches!(result, Err(LogError::InDoubt { .. })),
        "{result:?}"
    );
    let refused = log
        .append(vec![fixtures::record("tenant-a", "w", 1, 5, 2)])
        .await;
    assert!(
        matches!(refused, Err(LogError::InDoubt { .. })),
        "{refused:?}"
    );

    let claim = log.claim(0).await.unwrap();
    assert_eq!(claim.epoch, 2);
    log.append(vec![fixtures::record("tenant-a", "w", 2, 7, 2)])
        .await
        .expect("acknowledged after claiming again");
}
