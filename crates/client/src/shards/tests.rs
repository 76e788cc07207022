//! The shard book's unit tests: local books, refusals, the lock.

use super::*;
use ed25519_dalek::{Signer, SigningKey};

fn signed(key: &SigningKey, units: u64) -> ShardDocument {
    let mut d = ShardDocument {
        schema: "emergencyShard.v1".into(),
        shard_id: "sh-1".into(),
        partition_key: ShardPartitionKey {
            subject: "t".into(),
            route: "r".into(),
            accounting_epoch: "e".into(),
            policy_generation: 1,
        },
        units,
        gateway_id: "gw".into(),
        gateway_boot_epoch: 1,
        fence_epoch: 1,
        issued_at_ms: 1_000,
        expires_at_ms: 2_000,
        signature: String::new(),
    };
    let sig = key.sign(d.canonical().as_bytes());
    d.signature = format!("ed25519:{}", hex::encode(sig.to_bytes()));
    d
}

fn signed_as(key: &SigningKey, shard_id: &str, units: u64) -> ShardDocument {
    let mut d = signed(key, units);
    d.shard_id = shard_id.into();
    let sig = key.sign(d.canonical().as_bytes());
    d.signature = format!("ed25519:{}", hex::encode(sig.to_bytes()));
    d
}

fn book_public_key() -> String {
    hex::encode(SigningKey::from_bytes(&[7; 32]).verifying_key().to_bytes())
}

/// A book at time 1 500 holding `shards` (id, units) of subject `t`, route `r`.
fn book_of(shards: &[(&str, u64)]) -> ShardBook {
    let key = SigningKey::from_bytes(&[7; 32]);
    let book = ShardBook::new("gw", 1, &book_public_key())
        .unwrap()
        .with_clock(Arc::new(|| 1_500));
    for &(id, units) in shards {
        book.install(signed_as(&key, id, units)).unwrap();
    }
    book
}

fn settled(used_units: u64) -> Settlement {
    Settlement {
        actual_units: used_units,
        operation_id: None,
        usage: None,
    }
}

fn rid(s: &str) -> ReservationId {
    ReservationId::new(s).unwrap()
}

/// Use above a hold comes out of the shard's available units first, as
/// the ledger's settle takes it (`settle_split`); only the rest is owed,
/// and a shard that owes admits nothing (the ledger's debt freeze), even
/// with units available again. The receipts say what each call used.
#[test]
fn use_above_a_hold_takes_available_first_and_an_owing_shard_admits_nothing() {
    let book = book_of(&[("sh-1", 100)]);
    let units = |n| ReserveRequest::units("t", "r", n);
    let a = book.reserve(&rid("a"), &units(10), None).unwrap();
    let b = book.reserve(&rid("b"), &units(10), None).unwrap();
    let c = book.reserve(&rid("c"), &units(10), None).unwrap();
    // Books after each step: available, reserved, spent, overspent.
    let books = || {
        let b = book.books("sh-1").unwrap();
        let terms = (b.local_available_units, b.local_reserved_units);
        (terms.0, terms.1, b.local_spent_units, b.overspent_units)
    };
    a.settle(&settled(30)); // 10 held + 20 of the 70 available
    assert_eq!(books(), (50, 20, 30, 0));
    b.settle(&settled(200)); // 10 held + all 50 available, 140 owed
    assert_eq!(books(), (0, 10, 90, 140));
    c.release(); // its 10 come back to available
    let books = book.books("sh-1").unwrap();
    #[rustfmt::skip]
    assert_eq!(books, ShardBooks { allocated_units: 100, local_available_units: 10, local_reserved_units: 0,
        local_spent_units: 90, local_retired_units: 0, overspent_units: 140 });
    assert_eq!(
        book.admit_local(&rid("d"), &units(5), None).err(),
        Some(NotAdmitted::ShardOwes {
            shard_id: "sh-1".into(),
            overspent_units: 140
        })
    );
    let receipts: Vec<(String, u64)> = book
        .receipts("sh-1")
        .into_iter()
        .map(|r| (r.reservation_id, r.used_units))
        .collect();
    assert_eq!(
        receipts,
        [("a".into(), 30), ("b".into(), 200), ("c".into(), 0)]
    );
}

/// A usage count of any size (a provider's `u64::MAX`) is taken as at
/// most `MAX_UNITS`, the most the ledger accepts, and panics nothing:
/// the books still balance and later calls are answered.
#[test]
fn a_huge_usage_is_clamped_and_panics_nothing() {
    let book = book_of(&[("sh-1", 100)]);
    let units = |n| ReserveRequest::units("t", "r", n);
    let a = book.reserve(&rid("a"), &units(10), None).unwrap();
    let b = book.reserve(&rid("b"), &units(10), None).unwrap();
    a.settle(&settled(u64::MAX));
    b.settle(&settled(u64::MAX));
    let books = book.books("sh-1").unwrap();
    assert_eq!(
        (books.local_spent_units, books.local_available_units),
        (100, 0)
    );
    assert_eq!(books.overspent_units, 2 * MAX_UNITS - 100);
    let receipts: Vec<u64> = book
        .receipts("sh-1")
        .into_iter()
        .map(|r| r.used_units)
        .collect();
    assert_eq!(receipts, [MAX_UNITS, MAX_UNITS]);
    book.note_ledger_reachable();
    assert_eq!(
        book.admit_local(&rid("c"), &units(1), None).err(),
        Some(NotAdmitted::ShardOwes {
            shard_id: "sh-1".into(),
            overspent_units: 2 * MAX_UNITS - 100
        })
    );
}

/// A panic while the book's lock was held poisons it; the book checks
/// its shards' books again and goes on, rather than panicking in every
/// later call (a ledger reserve calls `note_ledger_reachable`, a
/// dropped reservation releases its hold).
#[test]
fn a_poisoned_book_is_checked_and_goes_on() {
    let book = book_of(&[("sh-1", 100)]);
    let a = book
        .reserve(&rid("a"), &ReserveRequest::units("t", "r", 10), None)
        .unwrap();
    let state = book.state.clone();
    let poisoner = std::thread::spawn(move || {
        let _held = state.lock();
        panic!("a panic while the book is locked");
    });
    assert!(poisoner.join().is_err());
    assert!(book.state.is_poisoned());
    book.note_ledger_reachable();
    a.release();
    let b = book
        .reserve(&rid("b"), &ReserveRequest::units("t", "r", 30), None)
        .unwrap();
    b.settle(&settled(20));
    let books = book.books("sh-1").unwrap();
    assert_eq!(
        (books.local_available_units, books.local_spent_units),
        (80, 20)
    );
    assert!(!book.state.is_poisoned(), "checked and cleared");
}

/// A reservation id is admitted locally once per book: after it was
/// settled (a retried provider call under the same request id), or
/// while it is open on another shard of the subject/route. A second
/// receipt under one id would make the ledger refuse the reconcile.
#[test]
fn a_reservation_id_is_admitted_locally_once() {
    let book = book_of(&[("sh-1", 100), ("sh-2", 100)]);
    let units = |n| ReserveRequest::units("t", "r", n);
    let reused = |id: &str, shard: &str| {
        Some(NotAdmitted::ReservationIdReused {
            reservation_id: id.into(),
            shard_id: shard.into(),
        })
    };
    let a = book.reserve(&rid("a"), &units(10), None).unwrap();
    a.settle(&settled(10));
    assert_eq!(
        book.admit_local(&rid("a"), &units(10), None).err(),
        reused("a", "sh-1")
    );
    let b = book.reserve(&rid("b"), &units(80), None).unwrap();
    assert_eq!(book.holder_of("b").as_deref(), Some("sh-1"));
    // sh-1 has 10 left, sh-2 all 100: still refused.
    assert_eq!(
        book.admit_local(&rid("b"), &units(80), None).err(),
        reused("b", "sh-1")
    );
    b.release();
    assert_eq!(
        book.admit_local(&rid("b"), &units(1), None).err(),
        reused("b", "sh-1")
    );
    let receipts = |shard| book.receipts(shard).len();
    assert_eq!((receipts("sh-1"), receipts("sh-2")), (2, 0));
}

/// Each refusal names its reason (the client's error carries it).
#[test]
fn a_refusal_names_its_reason() {
    let book = book_of(&[("sh-1", 100)]);
    let route = |capacity_unit, further_dimensions| RouteInfo {
        subject: "t".into(),
        route: "r".into(),
        policy_generation: 1,
        default_max_tokens: None,
        priority: 0,
        capacity_unit,
        further_dimensions,
    };
    let tokens = route(crate::CapacityUnit::Tokens, 0);
    let no_shard = |subject: &str, units| NotAdmitted::NoShard {
        subject: subject.into(),
        route: "r".into(),
        units,
    };
    #[rustfmt::skip]
    let table: Vec<(ReserveRequest, Option<&RouteInfo>, NotAdmitted)> = vec![
        // request                                     route settings                 => refused
        (ReserveRequest::tokens("t", "r", 5, Some(9)), None,                         NotAdmitted::RouteUnknown),
        (ReserveRequest::tokens("t", "r", 5, None),    Some(&tokens),                NotAdmitted::Unsized),
        (ReserveRequest::units("t", "r", 0),           None,                         NotAdmitted::Unsized),
        (ReserveRequest::units("t", "r", 101),         None,                         no_shard("t", 101)),
        (ReserveRequest::units("u", "r", 1),           Some(&tokens),                no_shard("u", 1)),
    ];
    for (i, (request, route, refused)) in table.into_iter().enumerate() {
        let id = rid(&format!("c{i}"));
        assert_eq!(book.admit_local(&id, &request, route).err(), Some(refused));
    }
    assert_eq!(book.books("sh-1").unwrap().local_available_units, 100);
    let waits = ShardBook::new("gw", 1, &book_public_key())
        .unwrap()
        .with_min_failures(2);
    assert_eq!(
        waits
            .admit_local(&rid("d"), &ReserveRequest::units("t", "r", 1), None)
            .err(),
        Some(NotAdmitted::TooFewFailures {
            failures: 1,
            min_failures: 2
        })
    );
}

/// A call sized by tokens takes one unit of a route counted in
/// requests, its tokens of one counted in tokens, and nothing when the
/// route's settings were never read (the shard does not say its unit).
#[test]
fn a_call_sized_by_tokens_needs_the_routes_unit() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let book = ShardBook::new("gw", 1, &hex::encode(key.verifying_key().to_bytes()))
        .unwrap()
        .with_clock(Arc::new(|| 1_500));
    book.install(signed(&key, 5_000)).unwrap();
    let request = ReserveRequest::tokens("t", "r", 300, Some(200));
    let route = |capacity_unit| RouteInfo {
        subject: "t".into(),
        route: "r".into(),
        policy_generation: 1,
        default_max_tokens: None,
        priority: 0,
        capacity_unit,
        further_dimensions: 0,
    };
    let id = |s: &str| ReservationId::new(s).unwrap();
    assert!(book.reserve(&id("a"), &request, None).is_none());
    let requests = route(crate::CapacityUnit::Requests);
    let b = book.reserve(&id("b"), &request, Some(&requests)).unwrap();
    assert_eq!(b.units(), 1);
    assert_eq!(book.holder_of("b").as_deref(), Some("sh-1"));
    let tokens = route(crate::CapacityUnit::Tokens);
    let c = book.reserve(&id("c"), &request, Some(&tokens)).unwrap();
    assert_eq!(c.units(), 500);
    assert_eq!(book.books("sh-1").unwrap().local_reserved_units, 501);
    b.release();
    assert_eq!(book.holder_of("b"), None);
    c.release();
}

/// Use above a hold is reported in full and taken from the shard's
/// available units; an unknown call's hold stays retired; the receipts
/// say what each call did.
#[test]
fn local_books_through_settle_above_the_hold_and_unknown_usage() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let book = ShardBook::new("gw", 1, &hex::encode(key.verifying_key().to_bytes()))
        .unwrap()
        .with_clock(Arc::new(|| 1_500));
    book.install(signed(&key, 100)).unwrap();
    let request = ReserveRequest::units("t", "r", 40);
    let a = book
        .reserve(&ReservationId::new("a").unwrap(), &request, None)
        .unwrap();
    let b = book
        .reserve(&ReservationId::new("b").unwrap(), &request, None)
        .unwrap();
    assert!(book
        .reserve(&ReservationId::new("c").unwrap(), &request, None)
        .is_none());
    a.settle(&Settlement {
        actual_units: 55,
        operation_id: None,
        usage: None,
    });
    a.release(); // already finished: nothing moves
    assert!(book.mark_usage_unknown("b"));
    b.release(); // likewise
    let books = book.books("sh-1").unwrap();
    #[rustfmt::skip]
    assert_eq!(books, ShardBooks { allocated_units: 100, local_available_units: 5, local_reserved_units: 0,
        local_spent_units: 55, local_retired_units: 40, overspent_units: 0 });
    let receipts: Vec<(String, String, u64)> = book
        .receipts("sh-1")
        .into_iter()
        .map(|r| (r.reservation_id, r.state, r.used_units))
        .collect();
    assert_eq!(
        receipts,
        [
            ("a".to_string(), "SETTLED".to_string(), 55),
            ("b".to_string(), "USAGE_UNKNOWN".to_string(), 40)
        ]
    );
    // A sized request with no bound on its output is not admitted offline.
    let unbounded = ReserveRequest::tokens("t", "r", 5, None);
    assert!(book
        .reserve(&ReservationId::new("d").unwrap(), &unbounded, None)
        .is_none());
}

/// On a route that limits requests a sized call holds one unit, the
/// one its settle reports, not its tokens; on a tokens route it holds
/// counted input plus its output limit.
#[test]
fn a_sized_call_holds_units_of_its_routes_capacity_unit() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let public_key = hex::encode(key.verifying_key().to_bytes());
    let book_of = |units| {
        let book = ShardBook::new("gw", 1, &public_key)
            .unwrap()
            .with_clock(Arc::new(|| 1_500));
        book.install(signed(&key, units)).unwrap();
        book
    };
    let mut route = RouteInfo {
        subject: "t".into(),
        route: "r".into(),
        policy_generation: 1,
        default_max_tokens: Some(1_000),
        priority: 0,
        capacity_unit: crate::CapacityUnit::Requests,
        further_dimensions: 0,
    };
    let sized = ReserveRequest::tokens("t", "r", 500, None);
    let id = |s: &str| ReservationId::new(s).unwrap();
    let requests = book_of(3);
    let _held: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|s| requests.reserve(&id(s), &sized, Some(&route)).unwrap())
        .collect();
    assert_eq!(requests.books("sh-1").unwrap().local_reserved_units, 3);
    assert!(requests.reserve(&id("d"), &sized, Some(&route)).is_none());

    route.capacity_unit = crate::CapacityUnit::Tokens;
    let tokens = book_of(2_000);
    let _hold = tokens.reserve(&id("e"), &sized, Some(&route)).unwrap();
    assert_eq!(tokens.books("sh-1").unwrap().local_reserved_units, 1_500);
    assert!(tokens.reserve(&id("f"), &sized, Some(&route)).is_none());
}

/// The two halves of a reconcile: the body is fixed at the first begin
/// (a retry sends the same receipts), the shard admits nothing from
/// then on, and once the answer is noted a begin answers it.
#[test]
fn a_begun_reconcile_sends_the_same_body_and_admits_nothing() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let book = ShardBook::new("gw", 1, &hex::encode(key.verifying_key().to_bytes()))
        .unwrap()
        .with_clock(Arc::new(|| 1_500));
    book.install(signed(&key, 100)).unwrap();
    let request = ReserveRequest::units("t", "r", 30);
    let a = book
        .reserve(&ReservationId::new("a").unwrap(), &request, None)
        .unwrap();
    assert!(matches!(
        book.begin_reconcile("sh-1"),
        Err(ReconcileError::OpenReservations(1))
    ));
    a.settle(&Settlement {
        actual_units: 10,
        operation_id: None,
        usage: None,
    });
    let Ok(Reconcile::Send(first)) = book.begin_reconcile("sh-1") else {
        panic!("a body to send");
    };
    assert_eq!(first["receipts"][0]["used_units"], 10);
    assert_eq!(first["gateway_boot_epoch"], 1);
    assert!(book
        .reserve(&ReservationId::new("b").unwrap(), &request, None)
        .is_none());
    let Ok(Reconcile::Send(again)) = book.begin_reconcile("sh-1") else {
        panic!("the same body again");
    };
    assert_eq!(first, again);
    let outcome = ReconcileOutcome {
        shard_id: "sh-1".into(),
        outcome: "reminted".into(),
        issued_units: 100,
        spent_units: 10,
        unknown_units: 0,
        reminted_units: 90,
        retired_units: 10,
        excess_units: 0,
        created: true,
    };
    book.note_reconciled("sh-1", outcome.clone());
    assert!(matches!(book.begin_reconcile("sh-1"), Ok(Reconcile::Done(o)) if o == outcome));
    assert!(matches!(
        book.begin_reconcile("sh-2"),
        Err(ReconcileError::UnknownShard(_))
    ));
}
