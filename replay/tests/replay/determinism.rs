//! Replay determinism: `state` at the log's end equals the live projection byte
//! for byte (embedded log and broker); `rebuild` gives the same bytes; `verify`
//! is clean on a true projection and names the partition and term of a false one.

use reservoir_projections::store;

use super::support::*;

fn state_of(log_args: &[&str]) -> Vec<u8> {
    let mut args = log_args.to_vec();
    args.push("state");
    let out = replay(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out.stdout
}

fn state_of_projection(dir: &std::path::Path) -> Vec<u8> {
    let out = replay(&["state", "--from-projections", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_at_the_end_equals_the_live_projection_embedded() {
    let (dir, log_dir) = embedded_history().await;
    let live = dir.path().join("projections");
    let db = project_embedded(&log_dir, &live).await;
    drop(db);
    let log = log_dir.to_str().unwrap();
    let replayed = state_of(&["--log-dir", log]);
    let projected = state_of_projection(&live);
    assert!(replayed.len() > 1_000, "{}", text(&replayed));
    assert!(text(&replayed).contains("acme|chat|2026-07|"));
    assert_eq!(text(&replayed), text(&projected));
    assert_eq!(replayed, projected, "byte for byte");

    // rebuild: the projector over the replay tool's read-only view, same bytes.
    let rebuilt = dir.path().join("rebuilt");
    let out = replay(&[
        "--log-dir",
        log,
        "rebuild",
        "--into",
        rebuilt.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(state_of_projection(&rebuilt), projected);
    let live_dump = reservoir_projections::dump(&store::open(&live).unwrap()).unwrap();
    let rebuilt_dump = reservoir_projections::dump(&store::open(&rebuilt).unwrap()).unwrap();
    assert_eq!(live_dump, rebuilt_dump, "every column family identical");

    // verify: clean against the live projection.
    let out = replay(&[
        "--log-dir",
        log,
        "verify",
        "--projections",
        live.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), "");

    // An earlier point: the state is a prefix of history, different from the end.
    let out = replay(&["--log-dir", log, "state", "--as-of", "5"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let early = out.stdout;
    assert_ne!(early, replayed);

    // A projection that lies about one balance term: named, non-zero exit.
    {
        let db = store::open(&rebuilt).unwrap();
        let cf = db.cf_handle(store::BALANCES).unwrap();
        let (key, value) = db
            .iterator_cf(cf, rocksdb::IteratorMode::Start)
            .map(|i| i.unwrap())
            .find(|(k, _)| k.starts_with(b"acme|"))
            .unwrap();
        let mut balance: serde_json::Value = serde_json::from_slice(&value).unwrap();
        let spent = balance["ledger"]["spent_units"].as_u64().unwrap();
        balance["ledger"]["spent_units"] = (spent - 7).into();
        db.put_cf(cf, &key, serde_json::to_vec(&balance).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    let out = replay(&[
        "--log-dir",
        log,
        "verify",
        "--projections",
        rebuilt.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let diffs: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert!(diffs[0]["partition"]
        .as_str()
        .unwrap()
        .starts_with("acme|chat|2026-07|"));
    assert_eq!(diffs[0]["term"], "ledger.spent_units");
    assert_eq!(
        diffs[0]["expected"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap(),
        diffs[0]["found"].as_str().unwrap().parse::<u64>().unwrap() + 7
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_at_the_end_equals_the_live_projection_on_the_broker() {
    let Some(brokers) = brokers() else { return };
    let (dir, topic) = kafka_history(&brokers, "replay").await;
    let live = dir.path().join("projections");
    drop(project(std::sync::Arc::new(kafka(&brokers, &topic).await), &live).await);
    let replayed = state_of(&["--brokers", &brokers, "--topic", &topic]);
    let projected = state_of_projection(&live);
    assert!(text(&replayed).contains("acme|chat|2026-07|"));
    assert_eq!(text(&replayed), text(&projected));
    assert_eq!(replayed, projected, "byte for byte");
    let out = replay(&[
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "verify",
        "--projections",
        live.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
