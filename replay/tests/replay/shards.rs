//! Emergency shards in an audit: a shard issued and reconciled through the
//! real server shows in the tenant's statement (its rows balance, and the
//! summary says what was issued, spent on the gateway, unknown, reminted and
//! beyond the allocation), and the statement's totals equal the projection's.

use reservoir_core::{EmergencyMode, Ledger};
use reservoir_projections::Projections;
use serde_json::json;

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciled_shard_is_accounted_for_in_the_statement() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    let mut p = policy("acme", "chat", 0);
    p.emergency_mode = EmergencyMode::Enabled;
    let (status, body) = server
        .post(
            "/v1/policies",
            json!({"accounting_epoch": "2026-07", "policy": p}),
        )
        .await;
    assert!(status < 300, "{status} {body}");
    let issue = json!({"subject": "acme", "route": "chat", "units": 300, "gateway_id": "gw-1",
                       "gateway_boot_epoch": 1, "ttl_ms": 60_000, "shard_id": "sh-audit"});
    let (status, shard) = server.post("/v1/shards", issue).await;
    assert_eq!(status, 201, "{shard}");
    let receipts = json!([
        {"reservation_id": "l-1", "state": "SETTLED", "used_units": 100},
        {"reservation_id": "l-2", "state": "USAGE_UNKNOWN", "used_units": 50},
    ]);
    let body = json!({"shard": shard, "gateway_id": "gw-1", "gateway_boot_epoch": 1, "receipts": receipts});
    let (status, outcome) = server.post("/v1/shards/sh-audit/reconcile", body).await;
    assert_eq!(status, 201, "{outcome}");
    server.stop();

    let log_dir = dir.path().join("log");
    let lines = json_lines(&audit(log_dir.to_str().unwrap(), "acme", "jsonl", &[]));
    let rows: Vec<_> = lines.iter().filter(|l| l["kind"] == "event").collect();
    for event in ["ShardIssued", "ShardReminted"] {
        let row = rows
            .iter()
            .find(|r| r["row"]["event"] == event)
            .unwrap_or_else(|| panic!("no {event} row"));
        assert_eq!(row["row"]["conservation"], "ok", "{row}");
    }
    let summary = &lines.last().unwrap()["summary"];
    let u = |k: &str| {
        summary[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {summary}"))
    };
    #[rustfmt::skip]
    let want = [("shards_issued", 1), ("shard_issued_units", 300), ("shards_reconciled", 1),
        ("shard_spent_units", 100), ("shard_unknown_units", 50), ("shard_reminted_units", 150),
        ("shard_excess_units", 0)];
    for (k, v) in want {
        assert_eq!(u(k), v, "{k}");
    }
    let balances: Ledger = serde_json::from_value(summary["balances"].clone()).unwrap();
    assert_eq!(balances.retired_for_emergency_units, 300);
    assert_eq!(balances.reminted_units, 150);
    assert_eq!(balances.check(), Ok(()));
    let db = project_embedded(&log_dir, &dir.path().join("projections")).await;
    let rollup = Projections::detached(db)
        .at()
        .tenant_balance("acme")
        .unwrap()
        .expect("acme projected");
    assert_eq!(balances, rollup.ledger);
}
