//! `Projections::reservation_by_id`: the id index is written with the record,
//! follows its state, survives a reopen, is rebuilt for a projection made
//! before it existed, and answers the same however the log was cut into steps.

use reservoir_core::{
    Command, OperationId, PartitionKey, Policy, RequestDigest, ReservationId, ReservationState,
};
use reservoir_projections::{store, Projections, Projector};

use super::support::*;

fn reserve(id: &str) -> Command {
    Command::Reserve {
        further_units: Vec::new(),
        id: ReservationId::new(id).unwrap(),
        digest: RequestDigest([1; 32]),
        units: 100,
        sizing: None,
    }
}

fn open_partition<L: reservoir_log::EventLog>(driver: &mut Driver<L>, key: &PartitionKey) {
    driver.open_partition(key, Policy::example(&key.subject, &key.route, 1), 0);
}

fn state(p: &Projections, id: &str) -> Option<(PartitionKey, ReservationState)> {
    p.at()
        .reservation_by_id(id)
        .unwrap()
        .map(|r| (r.key, r.reservation.state))
}

#[tokio::test]
async fn found_by_id_with_its_latest_state_and_unknown_ids_are_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let (chat, summarize) = (key("t1", "chat"), key("t2", "summarize"));
    open_partition(&mut driver, &chat);
    open_partition(&mut driver, &summarize);
    driver.submit(&chat, reserve("r-chat"), 1).unwrap();
    driver.submit(&summarize, reserve("r-sum"), 1).unwrap();
    driver.flush().await;
    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(16)).unwrap();
    projector.catch_up().await.unwrap();
    let p = projector.projections();

    let reserved = ReservationState::Reserved;
    let rows: [(&str, Option<(PartitionKey, ReservationState)>); 5] = [
        ("r-chat", Some((chat.clone(), reserved))),
        ("r-sum", Some((summarize.clone(), reserved))),
        ("r-unknown", None),
        // A prefix of a known id, and strings no id can be.
        ("r", None),
        ("r-chat|x", None),
    ];
    for (id, expected) in rows {
        assert_eq!(state(&p, id), expected, "{id}");
    }

    // The record moves on in later steps; the index still leads to it.
    let id = ReservationId::new("r-chat").unwrap();
    let start = Command::Start {
        id: id.clone(),
        operation_id: OperationId::new("op-1").unwrap(),
    };
    driver.submit(&chat, start, 2).unwrap();
    driver.flush().await;
    projector.catch_up().await.unwrap();
    assert_eq!(
        state(&p, "r-chat"),
        Some((chat.clone(), ReservationState::Started))
    );
    let settle = Command::Settle {
        further_actual_units: Vec::new(),
        id,
        operation_id: None,
        actual_units: 60,
        usage: None,
    };
    driver.submit(&chat, settle, 3).unwrap();
    driver.flush().await;
    projector.catch_up().await.unwrap();
    let record = p.at().reservation_by_id("r-chat").unwrap().unwrap();
    assert_eq!(record.reservation.state, ReservationState::Settled);
    assert_eq!(record.reservation.actual_units, Some(60));
    assert_eq!(
        Some(record),
        p.at().reservation(&chat, "r-chat").unwrap(),
        "the same record as by partition key"
    );
}

#[tokio::test]
async fn the_index_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("projection");
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let chat = key("t1", "chat");
    open_partition(&mut driver, &chat);
    driver.submit(&chat, reserve("r-1"), 1).unwrap();
    driver.flush().await;
    {
        let db = store::open(&path).unwrap();
        let mut projector = Projector::open(driver.log.clone(), db.clone(), config(16)).unwrap();
        projector.catch_up().await.unwrap();
        store::flush(&db).unwrap();
    }
    let db = store::open(&path).unwrap();
    let p = Projections::detached(db);
    assert_eq!(state(&p, "r-1"), Some((chat, ReservationState::Reserved)));
}

#[tokio::test]
async fn a_projection_made_before_the_index_gets_it_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("projection");
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let mut rows = Vec::new();
    for (i, k) in mixed_keys().iter().enumerate() {
        open_partition(&mut driver, k);
        let id = format!("r-{i}");
        driver.submit(k, reserve(&id), 1).unwrap();
        rows.push((id, k.clone()));
    }
    driver.flush().await;
    let reference = {
        let db = store::open(&path).unwrap();
        let mut projector = Projector::open(driver.log.clone(), db.clone(), config(16)).unwrap();
        projector.catch_up().await.unwrap();
        let reference = store::dump(&db).unwrap();
        // What a projection of the previous format holds: records, no index.
        let index = db.cf_handle(store::RESERVATION_IDS).unwrap();
        for (cf, k, _) in &reference {
            if cf == store::RESERVATION_IDS {
                db.delete_cf(index, k).unwrap();
            }
        }
        let p = Projections::detached(db.clone());
        assert_eq!(p.at().reservation_by_id("r-0").unwrap(), None, "index gone");
        store::flush(&db).unwrap();
        reference
    };
    assert_eq!(
        reference
            .iter()
            .filter(|(cf, _, _)| cf == store::RESERVATION_IDS)
            .count(),
        rows.len()
    );

    let db = store::open(&path).unwrap();
    assert_eq!(
        store::dump(&db).unwrap(),
        reference,
        "backfilled as projected"
    );
    let p = Projections::detached(db);
    for (id, k) in rows {
        assert_eq!(
            state(&p, &id),
            Some((k, ReservationState::Reserved)),
            "{id}"
        );
    }
}

#[tokio::test]
async fn an_id_in_two_partitions_answers_the_first_in_key_order_however_stepped() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let (first, second) = (key("t1", "chat"), key("t2", "chat"));
    open_partition(&mut driver, &first);
    open_partition(&mut driver, &second);
    driver.flush().await;
    // Logged into the later partition first, in an earlier step.
    driver.submit(&second, reserve("r-dup"), 1).unwrap();
    driver.flush().await;
    driver.submit(&first, reserve("r-dup"), 2).unwrap();
    driver.flush().await;
    let mut dumps = Vec::new();
    for read_entries_max in [1, 1_024] {
        let db = store::open(dir.path().join(format!("projection-{read_entries_max}"))).unwrap();
        let mut projector =
            Projector::open(driver.log.clone(), db.clone(), config(read_entries_max)).unwrap();
        projector.catch_up().await.unwrap();
        let p = projector.projections();
        assert_eq!(
            state(&p, "r-dup"),
            Some((first.clone(), ReservationState::Reserved)),
            "read_entries_max {read_entries_max}"
        );
        dumps.push(store::dump(&db).unwrap());
    }
    assert_eq!(dumps[0], dumps[1]);
}

/// `Projections::at` answers from the step it was taken at, whatever the
/// projector writes afterwards: a roll-up and its partitions, an id and its
/// record, and the cursor that says what they reflect, all of one step.
#[tokio::test]
async fn a_view_answers_from_the_step_it_was_taken_at() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let (chat, summarize) = (key("t1", "chat"), key("t1", "summarize"));
    open_partition(&mut driver, &chat);
    driver.submit(&chat, reserve("r-1"), 1).unwrap();
    driver.flush().await;
    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(16)).unwrap();
    projector.catch_up().await.unwrap();
    let p = projector.projections();
    let before = p.at();
    let consumed = before.consumed(0).unwrap();

    // The next steps open a second partition of the tenant, reserve in it
    // and release the first reservation.
    open_partition(&mut driver, &summarize);
    driver.submit(&summarize, reserve("r-2"), 2).unwrap();
    let release = Command::Release {
        id: ReservationId::new("r-1").unwrap(),
    };
    driver.submit(&chat, release, 3).unwrap();
    driver.flush().await;
    projector.catch_up().await.unwrap();

    let held = |at: &reservoir_projections::At| {
        let total = at.tenant_balance("t1").unwrap().unwrap();
        let partitions = at.tenant_partitions("t1").unwrap();
        let summed: u64 = partitions.iter().map(|b| b.ledger.reserved_units).sum();
        assert_eq!(
            total.ledger.reserved_units, summed,
            "roll-up = its partitions"
        );
        (partitions.len(), summed)
    };
    assert_eq!(held(&before), (1, 100), "the view taken before");
    assert_eq!(
        state(&p, "r-1"),
        Some((chat.clone(), ReservationState::Released))
    );
    let earlier = before.reservation_by_id("r-1").unwrap().unwrap();
    assert_eq!(earlier.reservation.state, ReservationState::Reserved);
    assert_eq!(before.reservation_by_id("r-2").unwrap(), None);
    assert_eq!(before.consumed(0).unwrap(), consumed);

    let after = p.at();
    assert_eq!(held(&after), (2, 100), "a view taken now");
    assert!(after.consumed(0).unwrap() > consumed);
    check_conservation(&p, &driver);
}
