//! A tenant's history through the real server, audited: the statement's totals
//! equal the projection's balances, every row balances, and every format works.

use reservoir_core::{Ledger, Term};
use reservoir_projections::Projections;
use serde_json::Value;

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_totals_equal_the_projection() {
    let (dir, log_dir) = embedded_history().await;
    let db = project_embedded(&log_dir, &dir.path().join("projections")).await;
    let projections = Projections::detached(db);
    let log = log_dir.to_str().unwrap();

    let lines = json_lines(&audit(log, "acme", "jsonl", &[]));
    let rows: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "event").collect();
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(lines.last().unwrap()["kind"], "summary");

    // Every row: the tenant's, in log order, balanced after the event.
    let mut last_offset = None;
    for row in &rows {
        let row = &row["row"];
        assert!(
            row["partition"].as_str().unwrap().starts_with("acme|"),
            "{row}"
        );
        assert_eq!(row["conservation"], "ok", "{row}");
        let offset = row["offset"].as_u64().unwrap();
        assert!(last_offset.is_none_or(|l| offset >= l), "rows out of order");
        last_offset = Some(offset);
    }
    let types: Vec<&str> = rows
        .iter()
        .map(|r| r["row"]["event"].as_str().unwrap())
        .collect();
    for t in [
        "PartitionOpened",
        "Reserved",
        "Started",
        "Settled",
        "Expired",
        "AdmissionRefused",
        "Refilled",
        "Released",
    ] {
        assert!(types.contains(&t), "no {t} in {types:?}");
    }
    // One Reserved and one Settled for r1 despite the retries.
    let count = |event: &str, id: &str| {
        rows.iter()
            .filter(|r| r["row"]["event"] == event && r["row"]["reservation"] == id)
            .count()
    };
    assert_eq!(count("Reserved", "r1"), 1);
    assert_eq!(count("Settled", "r1"), 1);

    // The statement's totals equal the projection's balances.
    let balances: Ledger = serde_json::from_value(summary["balances"].clone()).unwrap();
    let rollup = projections
        .at()
        .tenant_balance("acme")
        .unwrap()
        .expect("acme projected");
    assert_eq!(balances, rollup.ledger);
    for p in projections.at().tenant_partitions("acme").unwrap() {
        let ledger: Ledger =
            serde_json::from_value(summary["partitions"][p.key.to_string()].clone()).unwrap();
        assert_eq!(ledger, p.ledger, "{}", p.key);
    }
    let u = |k: &str| summary[k].as_u64().unwrap();
    assert_eq!(u("spent_units"), balances.spent_units);
    assert_eq!(u("minted_units"), balances.minted_units);
    assert_eq!(u("overdraft_issued_units"), balances.overdraft_issued_units);
    assert_eq!(u("overdraft_repaid_units"), balances.overdraft_repaid_units);
    assert_eq!(
        u("overdraft_issued_units"),
        u("overdraft_repaid_units"),
        "debt repaid"
    );
    assert_eq!(u("spent_units"), 450 + 2_200);
    assert_eq!(u("expired_units"), 300);
    assert!(u("refusals") >= 1);
    assert_eq!(u("findings"), 0);
    assert_eq!(u("conservation_failures"), 0);
    // The other formats, and a range: rows only from a later position on.
    for format in ["table", "csv"] {
        let out = replay(&[
            "--log-dir",
            log,
            "audit",
            "--tenant",
            "acme",
            "--format",
            format,
        ]);
        assert!(out.status.success(), "{format}: {}", text(&out.stderr));
        let body = text(&out.stdout);
        assert!(
            body.contains("Settled") && body.contains("spent_units"),
            "{format}:\n{body}"
        );
        if format == "csv" {
            // A change and a running balance column for every term of the ledger.
            let header: Vec<&str> = body.lines().next().unwrap().split(',').collect();
            for term in Term::ALL {
                for column in [format!("delta_{term}"), format!("after_{term}")] {
                    assert_eq!(
                        header.iter().filter(|h| **h == column).count(),
                        1,
                        "{column}: {header:?}"
                    );
                }
            }
        }
    }
    let from = rows[rows.len() / 2]["row"]["offset"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = replay(&[
        "--log-dir",
        log,
        "audit",
        "--tenant",
        "acme",
        "--from",
        &from,
        "--format",
        "jsonl",
    ]);
    assert!(out.status.success());
    let later = text(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"kind\":\"event\""))
        .count();
    assert!(later < rows.len() && later > 0);
}

/// A three-dimension tenant audited in one dimension at a time: every row is
/// that dimension's terms, balanced, and the totals are the server's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cut_in_one_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    let policy = reservoir_core::Policy::example_three_dimensions("dims", "chat", 1);
    let (status, _) = server
        .post(
            "/v1/policies",
            serde_json::json!({"accounting_epoch": "2026-12", "policy": policy}),
        )
        .await;
    assert_eq!(status, 201);
    for (id, output) in [("d1", 1_500), ("d2", 30_000)] {
        let (status, body) = server
            .post(
                "/v1/reservations",
                serde_json::json!({"id": id, "subject": "dims", "route": "chat",
                    "counted_input_tokens": 700, "max_tokens": 2_000}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        server
            .post(
                &format!("/v1/reservations/{id}/start"),
                serde_json::json!({"operation_id": id}),
            )
            .await;
        let (status, body) = server
            .post(
                &format!("/v1/reservations/{id}/settle"),
                serde_json::json!({"usage": {"reported_input_tokens": 650, "output_tokens": output}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let partitions = server.get("/v1/partitions").await;
    server.stop();
    let live = &partitions.as_array().unwrap()[0];
    let log_dir = dir.path().join("log");
    let log = log_dir.to_str().unwrap();
    for (dimension, live_terms) in [
        ("requests", live.clone()),
        ("input_tokens", live["dimensions"][0].clone()),
        ("output_tokens", live["dimensions"][1].clone()),
    ] {
        let out = audit(log, "dims", "jsonl", &["--dimension", dimension]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        let rows: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "event").collect();
        assert!(!rows.is_empty());
        for row in &rows {
            assert_eq!(row["row"]["dimension"], dimension, "{row}");
            assert_eq!(row["row"]["conservation"], "ok", "{row}");
        }
        let summary = &lines.last().unwrap()["summary"];
        let balances: Ledger = serde_json::from_value(summary["balances"].clone()).unwrap();
        balances.check().unwrap();
        for term in Term::ALL {
            assert_eq!(
                balances.get(term),
                live_terms[term.name()].as_u64().unwrap(),
                "{dimension} {term}"
            );
        }
        // The flows summed from the rows are this dimension's too: over the
        // whole log they are its ledger's terms.
        for (flow, term) in [
            ("spent_units", Term::Spent),
            ("minted_units", Term::Minted),
            ("overdraft_issued_units", Term::OverdraftIssued),
            ("overdraft_repaid_units", Term::OverdraftRepaid),
        ] {
            assert_eq!(summary[flow], balances.get(term), "{dimension} {flow}");
        }
        assert_eq!(summary["reservations"], 2, "{dimension}");
    }
    // The output dimension owes what the second call overdrew (less what
    // refill repaid in the milliseconds since); the others owe nothing.
    assert!(live["dimensions"][1]["debt_units"].as_u64().unwrap() > 0);
    assert_eq!(live["dimensions"][0]["debt_units"], 0);
    // The export keeps every dimension's amounts, as the Avro one does.
    let out = replay(&["--log-dir", log, "export", "--format", "jsonl"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let settled: Vec<Value> = json_lines(&out)
        .into_iter()
        .filter(|e| e["type"] == "Settled")
        .collect();
    assert!(!settled.is_empty());
    for e in &settled {
        assert_eq!(e["further"].as_array().map(Vec::len), Some(2), "{e}");
    }
    // A tenant the log never names: an empty statement, and a word saying so.
    let nobody = audit(log, "dimz", "jsonl", &[]);
    assert!(nobody.status.success(), "{}", text(&nobody.stderr));
    assert!(
        text(&nobody.stderr).contains("no events of tenant dimz"),
        "{}",
        text(&nobody.stderr)
    );
    // A range that ends before it starts is refused, not an empty statement.
    let backwards = audit(log, "dims", "jsonl", &["--from", "20", "--to", "10"]);
    assert_eq!(
        backwards.status.code(),
        Some(2),
        "{}",
        text(&backwards.stderr)
    );
    assert!(text(&backwards.stderr).contains("is after --to"));
    let bad = audit(log, "dims", "jsonl", &["--dimension", "cached_tokens"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("not a dimension"),
        "{}",
        text(&bad.stderr)
    );
}

/// A tenant whose generations count in different primary dimensions
/// (requests, then tokens): a statement without `--dimension` would add
/// one to the other, so it is refused, and one cut in either is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_over_unlike_primaries_needs_a_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    let first = reservoir_core::Policy::example_three_dimensions("mix", "chat", 1);
    let second = reservoir_core::Policy::example("mix", "chat", 2);
    assert_ne!(first.capacity_unit, second.capacity_unit);
    for policy in [first, second] {
        let (status, body) = server
            .post(
                "/v1/policies",
                serde_json::json!({"accounting_epoch": "2026-12", "policy": policy}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    server.stop();
    let log_dir = dir.path().join("log");
    let log = log_dir.to_str().unwrap();
    let mixed = audit(log, "mix", "jsonl", &[]);
    assert_eq!(mixed.status.code(), Some(2), "{}", text(&mixed.stderr));
    assert!(
        text(&mixed.stderr).contains("requests and tokens"),
        "{}",
        text(&mixed.stderr)
    );
    for dimension in ["requests", "tokens"] {
        let cut = audit(log, "mix", "jsonl", &["--dimension", dimension]);
        assert!(cut.status.success(), "{dimension}: {}", text(&cut.stderr));
    }
}

/// A generation switch with a reservation in flight, in the statement: the
/// move out and in, then the drain of the closed generation when the
/// reservation's refund moves on, each a row, with the dimension column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_shows_moves_and_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    for generation in [1, 2] {
        let mut p = policy("mover", "chat", 0);
        p.generation = generation;
        let body = serde_json::json!({"accounting_epoch": "2026-12", "policy": p});
        let (status, body) = server.post("/v1/policies", body).await;
        assert_eq!(status, 201, "{body}");
        if generation == 1 {
            let r =
                serde_json::json!({"id": "m1", "subject": "mover", "route": "chat", "units": 300});
            let (status, body) = server.post("/v1/reservations", r).await;
            assert_eq!(status, 201, "{body}");
        }
    }
    let (status, body) = server
        .post("/v1/reservations/m1/release", serde_json::json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    server.stop();
    let log = dir.path().join("log");
    let csv = text(&audit(log.to_str().unwrap(), "mover", "csv", &[]).stdout);
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("{name} in {header:?}"))
    };
    let (event, partition, dimension, drained) = (
        column("event"),
        column("partition"),
        column("dimension"),
        column("drained"),
    );
    let rows: Vec<Vec<&str>> = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[0] == "event")
        .collect();
    let g1 = "mover|chat|2026-12|g1";
    let moves: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|f| f[event].starts_with("Moved"))
        .map(|f| (f[event], f[partition], f[drained]))
        .collect();
    // The publish's move (g1 still holds m1), then the release's refund
    // moving on, after which g1 is drained.
    assert_eq!(
        moves,
        [
            ("MovedOut", g1, "false"),
            ("MovedIn", "mover|chat|2026-12|g2", "false"),
            ("MovedOut", g1, "true"),
            ("MovedIn", "mover|chat|2026-12|g2", "false"),
        ],
        "{csv}"
    );
    assert!(rows.iter().all(|f| f[dimension] == "tokens"), "{csv}");
    let table = text(&audit(log.to_str().unwrap(), "mover", "table", &[]).stdout);
    assert!(
        table.lines().next().unwrap().contains("dimension"),
        "{table}"
    );
    let drained_rows = rows.iter().filter(|f| f[drained] == "true").count();
    assert_eq!(table.matches("| drained").count(), drained_rows, "{table}");
}
