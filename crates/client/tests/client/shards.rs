//! Emergency shards on the gateway, against the real `reservoir` binary: the
//! ledger is SIGKILLed mid-traffic and the client keeps admitting from its
//! shard, within it only, with the shard's books balanced after every step;
//! after the ledger returns, reconcile remints exactly the unused units once,
//! a lost acknowledgement retried remints nothing more, and a duplicate
//! reconcile remints 0. A shard bound to another gateway, from an earlier
//! boot epoch (a restarted process), tampered with, or expired admits
//! nothing, and without a usable shard the client refuses (fails closed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reservoir_client::shards::{ShardBook, ShardBooks, ShardDocument, ShardRefused};
use reservoir_client::{Client, Error, ReserveRequest, Settlement};
use serde_json::Value;

use crate::proxy::FaultProxy;
use crate::support::*;

fn shard_policy(burst: u64) -> Value {
    let mut p = policy("t", "r", burst);
    p["emergency_mode"] = "enabled".into();
    p
}

async fn public_key(ledger: &Ledger) -> String {
    let (status, key) = ledger.get("/v1/shards/public-key").await;
    assert_eq!(status, 200, "{key}");
    key["public_key"].as_str().unwrap().to_string()
}

/// The shard's equation, checked here too (the book asserts it after every
/// operation itself).
fn balanced(b: ShardBooks) -> ShardBooks {
    assert_eq!(
        b.allocated_units,
        b.local_available_units
            + b.local_reserved_units
            + b.local_spent_units
            + b.local_retired_units,
        "{b:?}"
    );
    b
}

fn settlement(actual_units: u64) -> Settlement {
    Settlement {
        actual_units,
        operation_id: None,
        usage: None,
    }
}

/// A client whose every attempt opens a fresh connection: once the ledger
/// is dead, an attempt fails to connect (the ledger was not reached, so the
/// shard may admit). A pooled connection to the killed process could instead
/// fail after the request was written, which is RESERVATION_UNKNOWN and
/// rightly never admitted from the shard.
fn unpooled(base: &str, book: Option<Arc<ShardBook>>, deadline_ms: u64) -> Client {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut b = Client::builder(base)
        .http(http)
        .retry(quick_retry(Duration::from_millis(deadline_ms)));
    if let Some(book) = book {
        b = b.fallback(book);
    }
    b.build()
}

/// The partition's available and retired units, conservation checked.
async fn ledger_books(ledger: &Ledger) -> (u64, u64, u64) {
    let p = ledger.partition("t", "r").await;
    let u = |k: &str| p[k].as_u64().unwrap();
    (
        u("available_units"),
        u("retired_for_emergency_units"),
        u("reminted_units"),
    )
}

#[tokio::test]
async fn a_partitioned_ledger_admits_within_the_shard_and_reconciles_once() {
    let mut ledger = Ledger::start().await;
    ledger.publish(shard_policy(1_000), None).await;
    let book = Arc::new(ShardBook::new("gw-1", 1, &public_key(&ledger).await).unwrap());
    let shard = book
        .issue(&ledger.http, &ledger.base(), "t", "r", 300, 600_000)
        .await
        .unwrap();
    assert_eq!(ledger_books(&ledger).await, (700, 300, 0));
    balanced(book.books(&shard.shard_id).unwrap());

    let client = unpooled(&ledger.base(), Some(book.clone()), 300);
    // Healthy: the ledger admits, the shard is untouched.
    let r = client
        .reserve(ReserveRequest::units("t", "r", 50))
        .await
        .unwrap();
    assert!(!r.is_local());
    r.start()
        .await
        .unwrap()
        .finish_with(settlement(50))
        .await
        .unwrap();
    assert_eq!(ledger_books(&ledger).await, (650, 300, 0));
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!(b.local_available_units, 300);

    // The ledger dies mid-traffic (SIGKILL): the shard admits, within itself.
    ledger.kill();
    let settled = client
        .reserve(ReserveRequest::units("t", "r", 100))
        .await
        .unwrap();
    assert!(settled.is_local());
    let lease = settled.start().await.unwrap();
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!(
        (b.local_available_units, b.local_reserved_units),
        (200, 100)
    );
    lease.finish_with(settlement(60)).await.unwrap();
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_available_units, b.local_spent_units), (240, 60));

    let released = client
        .reserve(ReserveRequest::units("t", "r", 40))
        .await
        .unwrap();
    assert!(released.is_local());
    released.release().await.unwrap();
    balanced(book.books(&shard.shard_id).unwrap());

    let unknown = client
        .reserve(ReserveRequest::units("t", "r", 100))
        .await
        .unwrap();
    let unknown_id = unknown.id().as_str().to_string();
    let lease = unknown.start().await.unwrap();
    assert!(book.mark_usage_unknown(&unknown_id));
    drop(lease); // its background settle finds nothing left to move
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!(
        (
            b.local_available_units,
            b.local_spent_units,
            b.local_retired_units
        ),
        (140, 60, 100)
    );

    // Beyond the shard: refused, fail closed.
    let beyond = client.reserve(ReserveRequest::units("t", "r", 141)).await;
    assert!(
        matches!(beyond, Err(Error::Unavailable(_))),
        "refused beyond the shard"
    );
    balanced(book.books(&shard.shard_id).unwrap());

    // The ledger returns (a new process, a new port); the first reconcile's
    // answer is lost after the ledger committed it.
    ledger.server = Some(ServerProcess::spawn(ledger.dir.path()).await);
    assert_eq!(ledger_books(&ledger).await, (650, 300, 0));
    let proxy = FaultProxy::start(ledger.addr()).await;
    let prefix = format!("POST /v1/shards/{}/reconcile ", shard.shard_id);
    proxy.drop_answers(&prefix, 1);
    let lost = book
        .reconcile(&ledger.http, &proxy.base(), &shard.shard_id)
        .await;
    assert!(lost.is_err(), "the answer was dropped: {lost:?}");
    assert_eq!(proxy.dropped(&prefix), 1);
    // The ledger already reminted: 300 − 60 spent − 100 unknown = 140.
    assert_eq!(ledger_books(&ledger).await, (790, 300, 140));
    // Retried: the ledger answers its record and remints nothing more.
    let outcome = book
        .reconcile(&ledger.http, &proxy.base(), &shard.shard_id)
        .await
        .unwrap();
    assert_eq!(
        (
            outcome.reminted_units,
            outcome.spent_units,
            outcome.unknown_units,
            outcome.created
        ),
        (140, 60, 100, false)
    );
    assert_eq!(proxy.forwarded(&prefix), 2);
    assert_eq!(ledger_books(&ledger).await, (790, 300, 140));
    // Once reconciled, the book answers from its record and admits nothing more.
    let again = book
        .reconcile(&ledger.http, &proxy.base(), &shard.shard_id)
        .await
        .unwrap();
    assert_eq!(again, outcome);
    assert_eq!(proxy.forwarded(&prefix), 2);
    // A duplicate reconcile straight from the receipts remints 0 too.
    let (status, dup) = ledger
        .post(
            &prefix[5..prefix.len() - 1],
            serde_json::json!({"shard": shard, "gateway_id": "gw-1", "gateway_boot_epoch": 1,
                               "receipts": book.receipts(&shard.shard_id)}),
        )
        .await;
    assert_eq!(
        (status, dup["reminted_units"].as_u64()),
        (200, Some(140)),
        "{dup}"
    );
    assert_eq!(ledger_books(&ledger).await, (790, 300, 140));
}

#[tokio::test]
async fn a_foreign_restarted_tampered_or_expired_shard_admits_nothing() {
    let mut ledger = Ledger::start().await;
    ledger.publish(shard_policy(1_000), None).await;
    let key = public_key(&ledger).await;
    let now = Arc::new(AtomicU64::new(0));
    let clock = {
        let now = now.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    };
    let gw1 = Arc::new(
        ShardBook::new("gw-1", 1, &key)
            .unwrap()
            .with_clock(clock.clone())
            .with_min_failures(2),
    );
    let shard = gw1
        .issue(&ledger.http, &ledger.base(), "t", "r", 200, 600_000)
        .await
        .unwrap();
    now.store(shard.issued_at_ms, Ordering::SeqCst);
    assert_eq!(ledger_books(&ledger).await, (800, 200, 0));

    let tampered = |f: &dyn Fn(&mut ShardDocument)| {
        let mut d = shard.clone();
        f(&mut d);
        d
    };
    #[rustfmt::skip]
    let table: Vec<(&str, u64, ShardDocument, ShardRefused)> = vec![
        // book's gateway, boot epoch, presented shard                          => refused
        ("gw-2", 1, shard.clone(),                                               ShardRefused::OtherGateway("gw-1".into())),
        ("gw-1", 2, shard.clone(),                                               ShardRefused::OtherBootEpoch(1)),
        ("gw-1", 1, tampered(&|d| d.units = 900),                                ShardRefused::BadSignature),
        ("gw-2", 1, tampered(&|d| d.gateway_id = "gw-2".into()),                 ShardRefused::BadSignature),
        ("gw-1", 2, tampered(&|d| d.gateway_boot_epoch = 2),                     ShardRefused::BadSignature),
        ("gw-1", 1, tampered(&|d| d.expires_at_ms += 1),                         ShardRefused::BadSignature),
        ("gw-1", 1, shard.clone(),                                               ShardRefused::Duplicate(shard.shard_id.clone())),
    ];
    for (gateway, boot, doc, refused) in table {
        let book = if (gateway, boot) == ("gw-1", 1) {
            gw1.clone()
        } else {
            Arc::new(ShardBook::new(gateway, boot, &key).unwrap())
        };
        assert_eq!(
            book.install(doc.clone()),
            Err(refused),
            "{gateway} {boot} {doc:?}"
        );
    }

    // The ledger dies (the clients read the route's settings before). A
    // restarted gateway (boot epoch 2) holds no shard: it refuses, as does
    // a client with no fallback at all.
    let base = ledger.base();
    let mut clients = Vec::new();
    for fallback in [
        Some(Arc::new(ShardBook::new("gw-1", 2, &key).unwrap())),
        None,
        Some(gw1.clone()),
    ] {
        let client = unpooled(&base, fallback, 200);
        client.route("t", "r").await.unwrap();
        clients.push(client);
    }
    let client = clients.pop().unwrap();
    ledger.kill();
    for other in clients {
        let refused = other.reserve(ReserveRequest::units("t", "r", 1)).await;
        assert!(
            matches!(refused, Err(Error::Unavailable(_))),
            "fails closed: {refused:?}"
        );
    }

    // gw-1 admits only from the second consecutive unreachable reserve on,
    // and nothing once its shard expired (the rest is retired locally).
    let first = client.reserve(ReserveRequest::units("t", "r", 10)).await;
    assert!(matches!(first, Err(Error::Unavailable(_))));
    let second = client
        .reserve(ReserveRequest::units("t", "r", 10))
        .await
        .unwrap();
    assert!(second.is_local());
    second
        .start()
        .await
        .unwrap()
        .finish_with(settlement(10))
        .await
        .unwrap();
    let b = balanced(gw1.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_available_units, b.local_spent_units), (190, 10));
    now.store(shard.expires_at_ms, Ordering::SeqCst);
    let expired = client.reserve(ReserveRequest::units("t", "r", 10)).await;
    assert!(matches!(expired, Err(Error::Unavailable(_))));
    let b = balanced(gw1.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_available_units, b.local_retired_units), (0, 190));
    assert_eq!(
        ShardBook::new("gw-1", 1, &key)
            .unwrap()
            .with_clock(clock)
            .install(shard.clone()),
        Err(ShardRefused::Expired)
    );

    // Back: the expired shard's unused units come back (inside the grace).
    ledger.server = Some(ServerProcess::spawn(ledger.dir.path()).await);
    let outcome = gw1
        .reconcile(&ledger.http, &ledger.base(), &shard.shard_id)
        .await
        .unwrap();
    assert_eq!(
        (outcome.reminted_units, outcome.spent_units, outcome.created),
        (190, 10, true)
    );
    assert_eq!(ledger_books(&ledger).await, (990, 200, 190));
}

/// The seed's "central-ledger partition mid-traffic": workers run reserve →
/// start → settle while the ledger is SIGKILLed under them. Calls the ledger
/// held are its business (conservation holds there whatever they reached);
/// every call the shard admitted is in its books, which balance throughout,
/// the shard never admits beyond its allocation, and the reconcile remints
/// exactly what the local calls did not spend.
#[tokio::test]
async fn a_partition_mid_traffic_spends_only_the_shard() {
    const WORKERS: usize = 4;
    const CYCLES: usize = 20;
    let mut ledger = Ledger::start().await;
    ledger.publish(shard_policy(100_000), None).await;
    let book = Arc::new(ShardBook::new("gw-1", 1, &public_key(&ledger).await).unwrap());
    let shard = book
        .issue(&ledger.http, &ledger.base(), "t", "r", 1_000, 600_000)
        .await
        .unwrap();
    let client = unpooled(&ledger.base(), Some(book.clone()), 300);
    let started = Arc::new((AtomicU64::new(0), tokio::sync::Notify::new()));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (client, started) = (client.clone(), started.clone());
        workers.push(tokio::spawn(async move {
            // (local units spent, local calls refused beyond the shard)
            let (mut local_spent, mut refused) = (0u64, 0u64);
            for _ in 0..CYCLES {
                let reserved = client.reserve(ReserveRequest::units("t", "r", 50)).await;
                started.0.fetch_add(1, Ordering::SeqCst);
                started.1.notify_waiters();
                let r = match reserved {
                    Ok(r) => r,
                    Err(Error::Unavailable(_)) => {
                        refused += 1;
                        continue;
                    }
                    // The kill landed after the request was written.
                    Err(Error::ReservationUnknown { .. }) => continue,
                    Err(e) => panic!("{e}"),
                };
                let local = r.is_local();
                let Ok(lease) = r.start().await else {
                    continue; // a ledger hold whose start the kill cut off
                };
                if lease.finish_with(settlement(40)).await.is_ok() && local {
                    local_spent += 40;
                }
            }
            (local_spent, refused)
        }));
    }
    // Kill once the traffic is under way.
    while started.0.load(Ordering::SeqCst) < (WORKERS * 2) as u64 {
        let notified = started.1.notified();
        if started.0.load(Ordering::SeqCst) >= (WORKERS * 2) as u64 {
            break;
        }
        notified.await;
    }
    ledger.kill();
    let (mut local_spent, mut refused) = (0, 0);
    for w in workers {
        let (spent, r) = w.await.unwrap();
        local_spent += spent;
        refused += r;
    }
    // The kill comes after 8 of the 80 calls; nearly all the rest ask the
    // shard, which holds 24 calls of 40 (a 25th is refused: 40 left < 50).
    assert!(local_spent > 0, "the shard admitted");
    assert!(refused > 0, "and refused beyond itself");
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!(b.local_spent_units, local_spent);
    assert_eq!(b.local_reserved_units, 0);
    assert!(b.local_spent_units <= 1_000);

    ledger.server = Some(ServerProcess::spawn(ledger.dir.path()).await);
    let before = ledger_books(&ledger).await;
    let outcome = book
        .reconcile(&ledger.http, &ledger.base(), &shard.shard_id)
        .await
        .unwrap();
    assert_eq!(outcome.spent_units, local_spent);
    assert_eq!(outcome.reminted_units, 1_000 - local_spent);
    let after = ledger_books(&ledger).await;
    assert_eq!(after.2, before.2 + 1_000 - local_spent, "reminted once");
    assert_eq!(
        after.1, 1_000,
        "the shard's units stay retired at the source"
    );
}

/// `with_min_failures(n)` counts *consecutive* unreachable reserves: one the
/// ledger answered in between starts the count over, so an outage must last
/// n reserves again before the shard admits.
#[tokio::test]
async fn a_reserve_the_ledger_answered_starts_the_failure_count_over() {
    let ledger = Ledger::start().await;
    ledger.publish(shard_policy(1_000), None).await;
    let book = Arc::new(
        ShardBook::new("gw-1", 1, &public_key(&ledger).await)
            .unwrap()
            .with_min_failures(2),
    );
    let shard = book
        .issue(&ledger.http, &ledger.base(), "t", "r", 300, 600_000)
        .await
        .unwrap();
    // Two clients sharing the book: one cut off from the ledger once it read
    // the route's settings (nothing listens at its address any more, so no
    // attempt can reach it), one reaching it.
    let (cut_off, _dead_port) = cut_off_after_reading_the_route(&ledger, book.clone(), 200).await;
    let reaching = unpooled(&ledger.base(), Some(book.clone()), 2_000);
    async fn reserve(c: &Client) -> Result<reservoir_client::Reservation, Error> {
        c.reserve(ReserveRequest::units("t", "r", 10)).await
    }

    assert!(matches!(
        reserve(&cut_off).await,
        Err(Error::Unavailable(_))
    ));
    let answered = reserve(&reaching).await.unwrap();
    assert!(!answered.is_local());
    answered.release().await.unwrap();
    // Without the reset this would be the second failure, admitted locally.
    assert!(
        matches!(reserve(&cut_off).await, Err(Error::Unavailable(_))),
        "the answered reserve in between starts the count over"
    );
    let local = reserve(&cut_off).await.unwrap();
    assert!(local.is_local(), "the second consecutive failure admits");
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_reserved_units, b.local_available_units), (10, 290));
    local.release().await.unwrap();
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_reserved_units, b.local_available_units), (0, 300));
    // The ledger's own books: the shard carved out, the answered reserve released.
    assert_eq!(ledger_books(&ledger).await, (700, 300, 0));
}

/// A client that read the route's settings from the ledger through a proxy,
/// which then stops: from then on every attempt fails to connect (the
/// ledger is not reached, so the shard may admit), while the ledger itself
/// stays up for the test's other clients.
async fn cut_off_after_reading_the_route(
    ledger: &Ledger,
    book: Arc<ShardBook>,
    deadline_ms: u64,
) -> (Client, reservoir_testkit::DeadPort) {
    let proxy = FaultProxy::start(ledger.addr()).await;
    let client = unpooled(&proxy.base(), Some(book), deadline_ms);
    client.route("t", "r").await.unwrap();
    (client, proxy.stop().await)
}

/// A route whose settings the client never read is not admitted from a
/// shard: its capacity unit is unknown, and a guessed one (tokens) would
/// settle a call of a route counted in requests as its tokens, a debt of
/// thousands of requests at reconcile. Once read, the local call holds and
/// settles in the route's own unit.
#[tokio::test]
async fn a_route_never_read_is_not_admitted_from_a_shard() {
    let mut ledger = Ledger::start().await;
    let mut p = shard_policy(1_000);
    p["capacity_unit"] = "requests".into();
    ledger.publish(p, None).await;
    let book = Arc::new(ShardBook::new("gw-1", 1, &public_key(&ledger).await).unwrap());
    let shard = book
        .issue(&ledger.http, &ledger.base(), "t", "r", 100, 600_000)
        .await
        .unwrap();
    let cold = unpooled(&ledger.base(), Some(book.clone()), 200);
    let warm = unpooled(&ledger.base(), Some(book.clone()), 200);
    warm.route("t", "r").await.unwrap();
    ledger.kill();

    let refused = cold.reserve(ReserveRequest::units("t", "r", 1)).await;
    assert!(
        matches!(&refused, Err(Error::Unavailable(why)) if why.contains("never read")),
        "a route never read fails closed: {refused:?}"
    );
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!(b.local_available_units, 100, "nothing taken from the shard");

    let local = warm
        .reserve(ReserveRequest::tokens("t", "r", 1_200, Some(300)))
        .await
        .unwrap();
    assert!(local.is_local());
    assert_eq!(
        (local.route().capacity_unit, local.reserved_units()),
        (reservoir_client::CapacityUnit::Requests, 1)
    );
    let id = local.id().clone();
    let settled = local.start().await.unwrap().finish().await.unwrap();
    assert_eq!(settled.actual_units, 1, "one request, not its tokens");
    let b = balanced(book.books(&shard.shard_id).unwrap());
    assert_eq!((b.local_spent_units, b.overspent_units), (1, 0));

    // The same id again (a retried provider call under its request id):
    // refused, or the reconcile would carry two receipts of one id.
    let again = warm
        .reserve_as(id, ReserveRequest::units("t", "r", 1))
        .await;
    assert!(
        matches!(&again, Err(Error::Unavailable(why)) if why.contains("admitted locally before")),
        "{again:?}"
    );
    assert_eq!(book.receipts(&shard.shard_id).len(), 1);
}

/// The gateway names the shard it asks for, so a lost answer is asked
/// again under the same id: the ledger answers the shard it issued the
/// first time, and one shard's units are carved out, not two.
#[tokio::test]
async fn a_lost_issue_answer_is_asked_again_under_the_same_shard_id() {
    let ledger = Ledger::start().await;
    ledger.publish(shard_policy(1_000), None).await;
    let book = Arc::new(ShardBook::new("gw-1", 1, &public_key(&ledger).await).unwrap());
    let proxy = FaultProxy::start(ledger.addr()).await;
    const ISSUE: &str = "POST /v1/shards ";
    proxy.drop_answers(ISSUE, 1);
    let shard = book
        .issue(&ledger.http, &proxy.base(), "t", "r", 300, 600_000)
        .await
        .unwrap();
    assert_eq!(
        (proxy.dropped(ISSUE), proxy.forwarded(ISSUE)),
        (1, 2),
        "one lost answer, one retry"
    );
    assert_eq!(
        ledger_books(&ledger).await,
        (700, 300, 0),
        "one shard issued"
    );
    assert_eq!(
        balanced(book.books(&shard.shard_id).unwrap()).allocated_units,
        300
    );
}

/// The most a local call's use counts is the most the ledger takes in any
/// amount (its `MAX_UNITS`, the bound its API documents).
#[tokio::test]
async fn a_local_use_is_bounded_as_the_ledger_bounds_amounts() {
    let ledger = Ledger::start().await;
    let (status, api) = ledger.get("/openapi.json").await;
    assert_eq!(status, 200);
    let issue = &api["components"]["schemas"]["IssueShardBody"]["properties"]["units"];
    assert_eq!(
        issue["maximum"].as_u64(),
        Some(reservoir_client::shards::MAX_UNITS),
        "{issue}"
    );
}
