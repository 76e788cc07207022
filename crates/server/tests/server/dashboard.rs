//! The operators' dashboard (`deploy/grafana/dashboards/reservoir.json`)
//! against a running server: the real `reservoir` binary gets admissions,
//! refusals (insufficient capacity, debt outstanding), a settlement with a
//! refund and one with an overdraft, an expiry, a usage-unknown and a policy
//! in shadow mode; then every PromQL expression of the dashboard (panels and
//! template variables) names only metrics its live `/metrics` exports, with
//! the labels the expression groups and filters by. The debt and
//! frozen-partition gauges agree with `/v1/partitions`, and conservation holds.
//! Also: Grafana's provisioning, `deploy/prometheus.yml` and the compose
//! services point at each other.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::crash::spawn_server_with;
use crate::support::*;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Labels Prometheus adds to every scraped series; the server never exports them.
const SCRAPE_LABELS: [&str; 2] = ["instance", "job"];

fn dashboard() -> Value {
    let path = format!("{REPO}/deploy/grafana/dashboards/reservoir.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard")).expect("JSON")
}

/// Every PromQL expression in the dashboard: panel targets' `expr` and the
/// template variables' queries.
fn expressions(doc: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, &mut out);
    out
}

/// Identifiers of an expression that are Reservoir metrics, with the label
/// names of the selector that follows each, if any.
fn metrics_named(expr: &str) -> Vec<(String, Vec<String>)> {
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(found) = expr[i..].find("reservoir_") {
        let start = i + found;
        if start > 0 && ident(bytes[start - 1]) {
            i = start + 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        let mut labels = Vec::new();
        if bytes.get(end) == Some(&b'{') {
            let close = end + expr[end..].find('}').expect("a closed selector");
            for matcher in expr[end + 1..close].split(',') {
                let name = matcher.split(['=', '!', '~']).next().unwrap().trim();
                labels.push(name.to_string());
            }
        }
        out.push((expr[start..end].to_string(), labels));
        i = end;
    }
    out
}

/// Labels of every `by (…)` clause.
fn grouped_by(expr: &str) -> Vec<String> {
    expr.split("by (")
        .skip(1)
        .flat_map(|rest| rest.split(')').next().unwrap().split(','))
        .map(|l| l.trim().to_string())
        .collect()
}

/// Metric name → label names, from Prometheus text exposition.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if line[name_end..].starts_with('{') {
            let close = line.find('}').unwrap();
            for pair in line[name_end + 1..close].split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    out
}

/// What the live exposition lacks for the dashboard (empty: nothing).
fn missing(doc: &Value, live: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut missing = Vec::new();
    for expr in expressions(doc) {
        let named = metrics_named(&expr);
        if named.is_empty() {
            missing.push(format!("{expr}: names no reservoir_ metric"));
        }
        let mut labels_here = BTreeSet::new();
        for (metric, selector) in &named {
            let Some(labels) = live.get(metric) else {
                missing.push(format!("{expr}: {metric} is not exported"));
                continue;
            };
            labels_here.extend(labels.iter().cloned());
            for l in selector.iter().filter(|l| !labels.contains(*l)) {
                missing.push(format!("{expr}: {metric} has no label {l}"));
            }
        }
        for l in grouped_by(&expr) {
            if !labels_here.contains(&l) && !SCRAPE_LABELS.contains(&l.as_str()) {
                missing.push(format!(
                    "{expr}: groups by {l}, which none of its metrics has"
                ));
            }
        }
    }
    missing
}

/// A metric an expression names, with its selector's labels.
type Named<'a> = (&'a str, Vec<&'a str>);

#[test]
fn expressions_are_parsed() {
    // (expression, metrics with their selector labels, grouped-by labels)
    let rows: Vec<(&str, Vec<Named>, Vec<&str>)> = vec![
        (
            r#"sum by (route, reason) (rate(reservoir_refusals_total{route=~"$route"}[5m]))"#,
            vec![("reservoir_refusals_total", vec!["route"])],
            vec!["route", "reason"],
        ),
        (
            "histogram_quantile(0.5, sum by (le) (rate(reservoir_append_seconds_bucket[1m])))",
            vec![("reservoir_append_seconds_bucket", vec![])],
            vec!["le"],
        ),
        (
            "label_values(reservoir_admissions_total, route)",
            vec![("reservoir_admissions_total", vec![])],
            vec![],
        ),
        ("sum(rate(my_reservoir_x[1m]))", vec![], vec![]),
    ];
    for (expr, metrics, by) in rows {
        let got = metrics_named(expr);
        let want: Vec<(String, Vec<String>)> = metrics
            .into_iter()
            .map(|(m, l)| (m.to_string(), l.into_iter().map(String::from).collect()))
            .collect();
        assert_eq!(got, want, "{expr}");
        assert_eq!(grouped_by(expr), by, "{expr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_metric_is_exported_by_a_running_server() {
    let doc = dashboard();
    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server_with(dir.path(), &["--refill-interval-ms", "100"]).await;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let request = client.post(format!("{base}{path}")).json(&body);
        async move { split(request.send().await.unwrap()).await }
    };

    let mut acme = policy("acme", "chat", 1, 1_000, 10);
    acme.hold_ttl_ms = 300;
    acme.hard_execution_limit_ms = 300;
    let mut shadowed = policy("shadowed", "chat.shadow", 1, 100, 10);
    shadowed.shadow_mode = true;
    for p in [&acme, &shadowed] {
        let (status, body) = post(
            "/v1/policies",
            json!({"accounting_epoch": "2026-07", "policy": p}),
        )
        .await;
        assert!(status.is_success(), "{status} {body}");
    }
    let reserve = |id: &str, subject: &str, route: &str, units: u64| {
        post(
            "/v1/reservations",
            json!({"id": id, "subject": subject, "route": route, "units": units}),
        )
    };
    // (id, units, started, settled with, expected status of the reserve)
    let steps: Vec<(&str, u64, bool, Option<u64>, StatusCode)> = vec![
        ("a1", 600, true, Some(300), StatusCode::CREATED), // refund: efficiency 0.5
        ("a2", 300, false, None, StatusCode::CREATED),     // never started: expires
        ("a3", 100, true, None, StatusCode::CREATED),      // started, never settled: usage unknown
        ("a4", 500, false, None, StatusCode::TOO_MANY_REQUESTS), // 300 available
        ("a5", 100, true, Some(1_000), StatusCode::CREATED), // overdraft: debt, frozen
        ("a6", 10, false, None, StatusCode::TOO_MANY_REQUESTS), // debt outstanding
    ];
    for (id, units, started, settled, expected) in steps {
        let (status, body) = reserve(id, "acme", "chat", units).await;
        assert_eq!(status, expected, "{id}: {body}");
        if started {
            let (status, body) = post(
                &format!("/v1/reservations/{id}/start"),
                json!({"operation_id": format!("op-{id}")}),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{id}: {body}");
        }
        if let Some(actual) = settled {
            let (status, body) = post(
                &format!("/v1/reservations/{id}/settle"),
                json!({"actual_units": actual}),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{id}: {body}");
        }
    }
    let (status, _) = post(
        "/v1/reservations/nobody/start",
        json!({"operation_id": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Within the burst, then more than is left: would admit, would refuse.
    for (id, units) in [("s1", 50), ("s2", 90)] {
        let (status, body) = reserve(id, "shadowed", "chat.shadow", units).await;
        assert!(
            status.is_success(),
            "shadow mode admits {id}: {status} {body}"
        );
    }

    // The sweeper expires a2 and marks a3; the projector samples its lag
    // every second: poll until the exposition has everything, or say what not.
    let metrics_url = format!("{base}/metrics");
    let fetch = || async {
        let text = client
            .get(&metrics_url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (exported(&text), text)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (live, text) = loop {
        let (live, text) = fetch().await;
        let projected = text.contains("reservoir_frozen_partitions{route=\"chat\"} 1")
            && text.contains("reservoir_usage_unknown_total 1")
            && text.contains("reservoir_expired_total 1");
        if (missing(&doc, &live).is_empty() && projected) || tokio::time::Instant::now() > deadline
        {
            break (live, text);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let gaps = missing(&doc, &live);
    assert!(
        gaps.is_empty(),
        "the dashboard asks for what the server does not export:\n{}\n\n{text}",
        gaps.join("\n")
    );
    assert!(
        expressions(&doc).len() >= 20,
        "read the dashboard's expressions"
    );

    // The projection's gauges say what the writer's partitions say.
    let partitions = assert_conserved_at(&client, &base).await;
    let chat = partitions.iter().find(|p| p["route"] == "chat").unwrap();
    let debt = chat["debt_units"].as_u64().unwrap();
    assert!(debt > 0, "{chat}");
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{route=\"chat\"}} ")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} for chat"))
    };
    assert_eq!(gauge("reservoir_frozen_partitions"), 1.0);
    // Refills repay debt while we look: the projected debt is between the
    // overdraft issued and what is left now.
    let projected_debt = gauge("reservoir_debt_units");
    assert!(
        projected_debt >= debt as f64 && projected_debt <= 700.0,
        "projected {projected_debt}, partition {debt}"
    );
    for reason in ["insufficient_capacity", "debt_outstanding"] {
        assert!(
            text.contains(&format!(
                "reservoir_refusals_total{{reason=\"{reason}\",route=\"chat\"}} 1"
            )),
            "{reason} by route:\n{text}"
        );
    }
    assert!(text.contains(
        "reservoir_shadow_verdicts_total{route=\"chat.shadow\",verdict=\"would_admit\"} 1"
    ));

    assert!(server.terminate().success());
}

/// Grafana loads the dashboard from where compose mounts it, its data source is
/// the compose Prometheus, and Prometheus scrapes every Reservoir service.
#[test]
fn compose_prometheus_and_grafana_point_at_each_other() {
    let yaml = |path: &str| -> serde_yaml::Value {
        let text = std::fs::read_to_string(format!("{REPO}/{path}")).expect(path);
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let compose = yaml("docker-compose.yml");
    let services = compose["services"].as_mapping().unwrap();
    // Mount target → source, per service.
    let volumes = |service: &str| -> BTreeMap<String, String> {
        compose["services"][service]["volumes"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{service} has volumes"))
            .iter()
            .map(|v| {
                let parts: Vec<&str> = v.as_str().unwrap().split(':').collect();
                (parts[1].to_string(), parts[0].to_string())
            })
            .collect()
    };

    // Prometheus: its config is the repository's, and it scrapes every
    // service that runs `reservoir serve` or `reservoir project`, on the port
    // that service listens on.
    let prometheus = volumes("prometheus");
    assert_eq!(
        prometheus
            .get("/etc/prometheus/prometheus.yml")
            .map(String::as_str),
        Some("./deploy/prometheus.yml")
    );
    let scrape = yaml("deploy/prometheus.yml");
    let targets: BTreeSet<String> = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        scrape["scrape_configs"][0]["metrics_path"].as_str(),
        Some("/metrics")
    );
    let mut reservoirs = BTreeSet::new();
    for (name, service) in services {
        let args: Vec<&str> = service["command"]
            .as_sequence()
            .map(|c| c.iter().filter_map(|a| a.as_str()).collect())
            .unwrap_or_default();
        if matches!(args.first(), Some(&"serve") | Some(&"project")) {
            let listen = args.windows(2).find(|w| w[0] == "--listen").unwrap()[1];
            let port = listen.rsplit(':').next().unwrap();
            reservoirs.insert(format!("{}:{port}", name.as_str().unwrap()));
        }
    }
    assert_eq!(reservoirs.len(), 3, "{reservoirs:?}");
    assert_eq!(
        targets, reservoirs,
        "Prometheus scrapes every Reservoir service"
    );

    // Grafana: provisioning and dashboards mounted from deploy/grafana; the
    // file provider reads the mounted folder; the data source is Prometheus.
    let grafana = volumes("grafana");
    assert_eq!(
        grafana.get("/etc/grafana/provisioning").map(String::as_str),
        Some("./deploy/grafana/provisioning")
    );
    let provider = yaml("deploy/grafana/provisioning/dashboards/reservoir.yml");
    let folder = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    assert_eq!(
        grafana.get(folder).map(String::as_str),
        Some("./deploy/grafana/dashboards"),
        "the provider's folder is the mounted dashboards"
    );
    let home = compose["services"]["grafana"]["environment"]
        ["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        .as_str()
        .unwrap();
    assert_eq!(home, format!("{folder}/reservoir.json"));
    let source = yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let source = &source["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    let port = compose["services"]["prometheus"]["ports"][0]
        .as_str()
        .unwrap();
    let port = port.rsplit(':').next().unwrap();
    assert_eq!(
        source["url"].as_str(),
        Some(format!("http://prometheus:{port}").as_str())
    );

    // The dashboard: every panel reads that data source through the variable,
    // ids are unique, and panels do not overlap.
    let doc = dashboard();
    assert_eq!(doc["uid"], "reservoir");
    let uid = source["uid"].as_str().unwrap();
    assert_eq!(doc["templating"]["list"][0]["current"]["value"], uid);
    let panels = doc["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate id {}",
            p["id"]
        );
        let g = &p["gridPos"];
        let n = |k: &str| g[k].as_u64().unwrap();
        assert!(n("x") + n("w") <= 24, "{}", p["title"]);
        for x in n("x")..n("x") + n("w") {
            for y in n("y")..n("y") + n("h") {
                assert!(
                    cells.insert((x, y)),
                    "{} overlaps another panel",
                    p["title"]
                );
            }
        }
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(
                !p["targets"].as_array().unwrap().is_empty(),
                "{}",
                p["title"]
            );
        }
    }
}

/// Histogram samples are folded into their buckets by a thread of the
/// exporter's own, not only when `/metrics` is rendered: the exporter keeps
/// every sample until one of the two, so a node nobody scraped grew with
/// every request it served (bench-results/bounded-state.md).
#[test]
fn histogram_samples_are_folded_without_a_scrape() {
    reservoir_server::telemetry::install();
    let threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_string())
            .collect()
    };
    // A new thread names itself once it runs; until then it has its parent's name.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !threads().iter().any(|name| name == "metrics-upkeep") {
        assert!(
            std::time::Instant::now() < deadline,
            "no upkeep thread among {:?}",
            threads()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
