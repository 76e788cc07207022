//! Capacity and debt across a subject/route's partitions, through the real
//! server: a publish moves the active generation's capacity and debt into the
//! new one (the total across partitions changes by exactly 0), closed
//! generations drain what their reservations give back into the active one,
//! debt carried over freezes the new generation until refill repays it,
//! rollback runs the earlier policy as a new generation, and a SIGKILL
//! between the halves of a move is completed by recovery.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reservoir_server::clock::ManualClock;
use serde_json::{json, Value};

use crate::crash::{spawn_server_env, FAILPOINT_PAUSES};
use crate::support::*;

/// Σ over the partitions of `subject`/`route` of `term` (primary dimension).
pub(crate) fn sum(parts: &[Value], subject: &str, route: &str, term: &str) -> u64 {
    parts
        .iter()
        .filter(|p| p["subject"] == subject && p["route"] == route)
        .map(|p| p[term].as_u64().unwrap_or_else(|| panic!("{term} in {p}")))
        .sum()
}

/// Capacity the subject/route holds: what can still be admitted or is held.
pub(crate) fn capacity(parts: &[Value], subject: &str, route: &str) -> u64 {
    sum(parts, subject, route, "available_units") + sum(parts, subject, route, "reserved_units")
}

/// Every move out has arrived: the cross-partition halves sum to the same.
pub(crate) fn assert_moves_pair(parts: &[Value], subject: &str, route: &str) {
    for (out, inn) in [
        ("moved_out_units", "moved_in_units"),
        ("debt_moved_out_units", "debt_moved_in_units"),
        ("moves_out", "moves_in"),
    ] {
        assert_eq!(
            sum(parts, subject, route, out),
            sum(parts, subject, route, inn),
            "{out} != {inn}: {parts:?}"
        );
    }
}

fn generation(parts: &[Value], g: u64) -> &Value {
    parts
        .iter()
        .find(|p| p["policy_generation"] == g)
        .unwrap_or_else(|| panic!("no generation {g} in {parts:?}"))
}

pub(crate) async fn reserve_started(s: &TestServer, id: &str, units: u64) {
    let (status, r) = s.reserve(id, "t", "r", units).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let path = format!("/v1/reservations/{id}/start");
    let (status, r) = s
        .post(&path, json!({"operation_id": format!("op-{id}")}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
}

pub(crate) async fn settle(s: &TestServer, id: &str, actual_units: u64) -> Value {
    let path = format!("/v1/reservations/{id}/settle");
    let (status, r) = s.post(&path, json!({"actual_units": actual_units})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_moves_capacity_and_the_total_across_partitions_changes_by_zero() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    reserve_started(&s, "in-flight", 300).await;
    let before = s.assert_conserved().await;
    assert_eq!(capacity(&before, "t", "r"), 1_000);

    let (status, body) = s.publish(&policy("t", "r", 2, 1_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let parts = s.assert_conserved().await;
    assert_eq!(capacity(&parts, "t", "r"), capacity(&before, "t", "r"));
    assert_eq!(
        sum(&parts, "t", "r", "opening_units"),
        1_000,
        "g2 opened with nothing"
    );
    let (g1, g2) = (generation(&parts, 1), generation(&parts, 2));
    assert_eq!(
        (g1["closed"].clone(), g1["available_units"].clone()),
        (json!(true), json!(0))
    );
    assert_eq!(g2["available_units"], 700);
    assert_eq!(g2["moved_in_units"], 700);
    assert_moves_pair(&parts, "t", "r");

    // The settle in the closed generation: its refund (200) moves on to g2.
    let r = settle(&s, "in-flight", 100).await;
    assert_eq!(r["policy_generation"], 1);
    let parts = s.assert_conserved().await;
    let (g1, g2) = (generation(&parts, 1), generation(&parts, 2));
    assert_eq!(g2["available_units"], 900);
    assert_eq!(
        (g1["available_units"].clone(), g1["drained"].clone()),
        (json!(0), json!(true))
    );
    assert_eq!(g2["drained"], false);
    assert_eq!(
        capacity(&parts, "t", "r") + sum(&parts, "t", "r", "spent_units"),
        1_000
    );
    assert_moves_pair(&parts, "t", "r");

    // Generations only increase: a lower one is refused and changes nothing.
    let (status, body) = s.publish(&policy("t", "r", 1, 5_000, 0), "e2").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "generation_not_higher");
    assert_eq!(s.assert_conserved().await.len(), 2);
    s.stop().await;
}

/// A new burst below what would move: the excess stays in the closed
/// partition's `available` (in the books, never admitted again).
/// A closed generation gets no event once its last call finishes, so the
/// idempotency window's rule (records leave memory at a later event's time)
/// never ran there: it kept every finished record in memory, and in every
/// snapshot, for good. Once closed and drained it keeps only the record its
/// last event finished; the others are answered from the on-disk index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_closed_generation_keeps_only_its_last_record_in_memory() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 10_000, 0), "e").await;
    for i in 0..50 {
        reserve_started(&s, &format!("done-{i}"), 10).await;
        settle(&s, &format!("done-{i}"), 5).await;
    }
    reserve_started(&s, "last", 10).await;
    let (status, body) = s.publish(&policy("t", "r", 2, 10_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let parts = s.assert_conserved().await;
    assert_eq!(
        generation(&parts, 1)["reservations_in_memory"],
        51,
        "{parts:?}"
    );
    settle(&s, "last", 5).await;
    let parts = s.assert_conserved().await;
    assert_moves_pair(&parts, "t", "r");
    let g1 = generation(&parts, 1);
    // The last record stays unless the drain's move came a millisecond later.
    let kept = g1["reservations_in_memory"].as_u64().unwrap();
    assert!(kept <= 1, "{g1}");
    assert_eq!(g1["evicted_reservations"].as_u64(), Some(51 - kept), "{g1}");
    // Evicted ones, retried: their own records from disk, nothing moves.
    for id in ["done-7", "last"] {
        let path = format!("/v1/reservations/{id}/settle");
        let (status, again) = s.post(&path, json!({"actual_units": 5})).await;
        assert_eq!(
            (status, &again["state"]),
            (StatusCode::OK, &json!("SETTLED")),
            "{again}"
        );
        let (status, read) = s.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!((status, &read["actual_units"]), (StatusCode::OK, &json!(5)));
    }
    let after = s.assert_conserved().await;
    assert_eq!(sum(&after, "t", "r", "spent_units"), 51 * 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_above_the_new_burst_stays_behind_in_the_closed_generation() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    s.publish(&policy("t", "r", 2, 400, 0), "e").await;
    let parts = s.assert_conserved().await;
    let (g1, g2) = (generation(&parts, 1), generation(&parts, 2));
    assert_eq!(g2["available_units"], 400);
    assert_eq!(g1["available_units"], 600);
    assert_eq!(capacity(&parts, "t", "r"), 1_000);
    assert_moves_pair(&parts, "t", "r");
    let (status, body) = s.reserve("big", "t", "r", 401).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debt_from_the_old_generation_freezes_the_new_one_until_refill_repays_it() {
    const T0: u64 = 1_000_000;
    let clock = ManualClock::new(T0);
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    // 1,000 burst, 100 units a second.
    s.publish(&policy("t", "r", 1, 1_000, 100), "e").await;
    reserve_started(&s, "over", 500).await;
    s.publish(&policy("t", "r", 2, 1_000, 100), "e").await;
    // Used 1,800 of 500 held: 1,300 over, nothing left in g1 to draw from.
    let r = settle(&s, "over", 1_800).await;
    assert_eq!(r["state"], "SETTLED_WITH_DEBT");
    let parts = s.assert_conserved().await;
    let (g1, g2) = (generation(&parts, 1), generation(&parts, 2));
    assert_eq!(g1["debt_units"], 0, "the debt moved on");
    assert_eq!(g2["debt_units"], 1_300);
    assert_eq!(g2["available_units"], 500);
    assert_moves_pair(&parts, "t", "r");

    // g2 has 500 available, but the debt freezes it.
    let (status, body) = s.reserve("frozen", "t", "r", 10).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(problem_type(&body), "debt_outstanding");
    assert_eq!(body["limiting_dimension"], "tokens");
    assert_eq!(body["policy_generation"], 2);
    // The hint repays 1,300 at 100/s: retrying exactly then admits.
    let hint = body["retry_after_ms"].as_u64().unwrap();
    assert_eq!(hint, 13_000);
    clock.advance(hint - 1);
    let (status, body) = s.reserve("frozen", "t", "r", 10).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    clock.advance(1);
    let (status, body) = s.reserve("frozen", "t", "r", 10).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["policy_generation"], 2);
    let parts = s.assert_conserved().await;
    assert_eq!(generation(&parts, 2)["debt_units"], 0);
    assert_moves_pair(&parts, "t", "r");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_with_reservations_in_flight_on_both_generations() {
    let (s, _dir) = TestServer::embedded().await;
    let mut g1_policy = policy("t", "r", 1, 1_000, 0);
    g1_policy.max_reservation_units = 600;
    s.publish(&g1_policy, "e").await;
    let (status, body) = s.post("/v1/policies/t/r/rollback", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "no_previous_generation");

    reserve_started(&s, "on-g1", 200).await;
    s.publish(&policy("t", "r", 2, 2_000, 0), "e").await;
    reserve_started(&s, "on-g2", 300).await;
    let before = capacity(&s.assert_conserved().await, "t", "r");
    assert_eq!(before, 1_000);

    let (status, body) = s
        .post("/v1/policies/t/r/rollback", json!({"generation": 3}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["partition_key"]["policy_generation"], 3);
    // Retried: the same rollback, answered again, nothing new.
    let (status, _) = s
        .post("/v1/policies/t/r/rollback", json!({"generation": 3}))
        .await;
    assert_eq!(status, StatusCode::OK);
    // Retried without a generation (as a client does whose first answer
    // was a 503): the same rollback, not a second one bringing g2 back.
    let (status, body) = s.post("/v1/policies/t/r/rollback", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["partition_key"]["policy_generation"], 3, "{body}");
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["policy"]["generation"], 3);
    assert_eq!(
        active["policy"]["max_reservation_units"], 600,
        "g1's policy again"
    );
    let parts = s.assert_conserved().await;
    assert_eq!(parts.len(), 3);
    assert_eq!(capacity(&parts, "t", "r"), before);
    assert_eq!(generation(&parts, 3)["available_units"], 500);
    assert_eq!(generation(&parts, 2)["closed"], true);
    assert_moves_pair(&parts, "t", "r");

    // New reserves go to g3 under g1's limits.
    let (status, body) = s.reserve("too-big", "t", "r", 601).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Both closed generations still settle, and their refunds reach g3.
    assert_eq!(settle(&s, "on-g1", 50).await["policy_generation"], 1);
    assert_eq!(settle(&s, "on-g2", 100).await["policy_generation"], 2);
    let parts = s.assert_conserved().await;
    assert_eq!(generation(&parts, 3)["available_units"], 500 + 150 + 200);
    for g in [1, 2] {
        assert_eq!(generation(&parts, g)["drained"], true, "{parts:?}");
    }
    assert_eq!(
        capacity(&parts, "t", "r") + sum(&parts, "t", "r", "spent_units"),
        1_000
    );
    assert_moves_pair(&parts, "t", "r");
    s.stop().await;
}

/// The real binary stops at the failpoint after the first half of a
/// publish's move is durable, is SIGKILLed there, and restarts: recovery
/// completes the move, every partition conserves, the sums are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_the_halves_of_a_move_is_completed_by_recovery() {
    let dir = crate::support::tempdir().unwrap();
    let failpoint = [("RESERVOIR_FAILPOINT_MOVE_HALVES", "pause")];
    let mut server = spawn_server_env(dir.path(), &[], &failpoint).await;
    let client = reqwest::Client::new();
    let post = |base: String, path: &'static str, body: Value| {
        let client = client.clone();
        async move {
            let r = client
                .post(format!("{base}{path}"))
                .json(&body)
                .send()
                .await;
            split(r.expect("sent")).await
        }
    };
    let g1 = json!({"accounting_epoch": "e", "policy": policy("t", "r", 1, 1_000, 0)});
    let (status, body) = post(server.base.clone(), "/v1/policies", g1).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let reserve = json!({"id": "held", "subject": "t", "route": "r", "units": 300});
    let (status, body) = post(server.base.clone(), "/v1/reservations", reserve).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let before = assert_conserved_at(&client, &server.base).await;

    let paused = FAILPOINT_PAUSES.load(Ordering::SeqCst);
    let g2 = json!({"accounting_epoch": "e", "policy": policy("t", "r", 2, 1_000, 0)});
    let publish = tokio::spawn(post(server.base.clone(), "/v1/policies", g2));
    killed_at_the_failpoint(&mut server, paused).await;
    publish.abort();

    let mut server = spawn_server_env(dir.path(), &[], &[]).await;
    let parts = assert_conserved_at(&client, &server.base).await;
    assert_eq!(parts.len(), 2, "g2's opening was in the durable first half");
    assert_eq!(capacity(&parts, "t", "r"), capacity(&before, "t", "r"));
    assert_eq!(generation(&parts, 2)["available_units"], 700);
    assert_moves_pair(&parts, "t", "r");
    // The completed move is in the log: a second restart finds the same.
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
    let mut server = spawn_server_env(dir.path(), &[], &[]).await;
    let again = assert_conserved_at(&client, &server.base).await;
    assert_eq!(capacity(&again, "t", "r"), capacity(&before, "t", "r"));
    assert_eq!(sum(&again, "t", "r", "moves_in"), 1);
    assert_moves_pair(&again, "t", "r");
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
}

/// Waits until `server` stops at its failpoint (it had stopped `paused`
/// times before), then SIGKILLs it.
async fn killed_at_the_failpoint(server: &mut crate::crash::ServerProcess, paused: usize) {
    eventually(Duration::from_secs(30), || async {
        (FAILPOINT_PAUSES.load(Ordering::SeqCst) > paused).then_some(())
    })
    .await;
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
}

/// Posts `body` to `base` + `path`: the status and the answer.
async fn post_to(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let r = client
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await;
    split(r.expect("sent")).await
}

/// A publish whose log kept only the successor's opening (as a torn Kafka
/// append can: the failpoint stops there, and the process is SIGKILLed):
/// the first batch after recovery closes the old generation and moves its
/// debt on, so the new one is frozen by it, every partition conserves, a
/// repeated publish is answered as done, and a second restart finds the
/// same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_cut_after_its_opening_is_finished_by_recovery() {
    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server_env(dir.path(), &[], &[]).await;
    let client = reqwest::Client::new();
    let g1 = json!({"accounting_epoch": "e", "policy": policy("t", "r", 1, 1_000, 0)});
    let (status, body) = post_to(&client, &server.base, "/v1/policies", g1).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let reserve = json!({"id": "over", "subject": "t", "route": "r", "units": 500});
    let (status, body) = post_to(&client, &server.base, "/v1/reservations", reserve).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let start = json!({"operation_id": "op-over"});
    let (status, body) = post_to(&client, &server.base, "/v1/reservations/over/start", start).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let used = json!({"actual_units": 1_800});
    let (status, body) = post_to(&client, &server.base, "/v1/reservations/over/settle", used).await;
    assert_eq!(
        (status, &body["state"]),
        (StatusCode::OK, &json!("SETTLED_WITH_DEBT"))
    );
    let before = assert_conserved_at(&client, &server.base).await;
    assert_eq!(generation(&before, 1)["debt_units"], 800);
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");

    let failpoint = [("RESERVOIR_FAILPOINT_MOVE_HALVES", "open-only")];
    let mut server = spawn_server_env(dir.path(), &[], &failpoint).await;
    let paused = FAILPOINT_PAUSES.load(Ordering::SeqCst);
    let g2 = json!({"accounting_epoch": "e", "policy": policy("t", "r", 2, 1_000, 0)});
    let publish = {
        let (client, base, g2) = (client.clone(), server.base.clone(), g2.clone());
        // Never answered: the process is killed at the failpoint.
        tokio::spawn(async move {
            let url = format!("{base}/v1/policies");
            client.post(url).json(&g2).send().await.ok()
        })
    };
    killed_at_the_failpoint(&mut server, paused).await;
    publish.abort();

    let mut server = spawn_server_env(dir.path(), &[], &[]).await;
    let parts = assert_conserved_at(&client, &server.base).await;
    assert_eq!(parts.len(), 2, "g2's opening was durable: {parts:?}");
    let (old, new) = (generation(&parts, 1), generation(&parts, 2));
    assert_eq!(old["closed"], true, "{old}");
    assert_eq!(old["debt_units"], 0, "the debt moved on: {old}");
    assert_eq!(new["debt_units"], 800, "{new}");
    assert_eq!(capacity(&parts, "t", "r"), capacity(&before, "t", "r"));
    assert_moves_pair(&parts, "t", "r");
    let frozen = json!({"id": "frozen", "subject": "t", "route": "r", "units": 1});
    let (status, body) = post_to(&client, &server.base, "/v1/reservations", frozen).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(problem_type(&body), "debt_outstanding", "{body}");
    // The publish, asked again, is done: the same policy, nothing moves.
    let (status, body) = post_to(&client, &server.base, "/v1/policies", g2).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let again = assert_conserved_at(&client, &server.base).await;
    assert_eq!(
        sum(&again, "t", "r", "moves_in"),
        sum(&parts, "t", "r", "moves_in")
    );
    // What finished it is in the log: a second restart finds the same.
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
    let mut server = spawn_server_env(dir.path(), &[], &[]).await;
    let restarted = assert_conserved_at(&client, &server.base).await;
    assert_eq!(generation(&restarted, 1)["closed"], true);
    assert_eq!(generation(&restarted, 2)["debt_units"], 800);
    assert_moves_pair(&restarted, "t", "r");
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
}

/// A policy may hold generation 2^53, the highest there is; a rollback
/// without a generation then has none above it to run as, and says so
/// (409) rather than refusing the policy it would have made (found by
/// `scripts/fuzz-openapi`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_above_the_highest_generation_is_a_conflict() {
    let (s, _dir) = TestServer::embedded().await;
    let highest = reservoir_core::policy::MAX_GENERATION;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let (status, body) = s.publish(&policy("t", "r", highest, 1_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = s.post("/v1/policies/t/r/rollback", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "generation_exhausted", "{body}");
    let parts = s.assert_conserved().await;
    assert_eq!(parts.len(), 2);
    s.stop().await;
}
