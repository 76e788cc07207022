//! `audit --format html`: a history with refusals, an overdraft repaid by
//! refills, an expiry and a generation switch, drawn as one page. The page's
//! totals are the JSON statement's; the timeline's polylines, read back
//! through the chart's own pixel mapping, are the JSON rows' running
//! balances; the page is self-contained (no URL in it, and headless Chromium
//! loading it without its Content Security Policy requests nothing, which a
//! control page shows the check would see); and its screenshot has the chart
//! in it. Bad input (no room for the rows, an output that cannot be created,
//! a terminal as output) is a clear error, never a panic.
//!
//! `RESERVOIR_STATEMENT_EXAMPLE=PATH` copies the screenshot to PATH: that is
//! how `replay/docs/statement-example.png` (the README's) was made.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use reservoir_core::{Ledger, Term};
use serde_json::{json, Value};

use super::browser::{chromium, render};
use super::support::*;

/// The chart's window for screenshots (the README's example image too).
const WINDOW: (u32, u32) = (1200, 1300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_page_draws_the_json_statement() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    tenant_history(&server).await;
    generation_switch(&server).await;
    server.stop();
    let log = dir.path().join("log");
    let log = log.to_str().unwrap();

    let (rows, summary) = jsonl_statement(log, &[]);
    for row in &rows {
        assert_eq!(row["conservation"], "ok", "{row}");
    }
    assert_eq!(summary["conservation_failures"], 0);
    assert!(summary["refusals"].as_u64().unwrap() >= 2, "{summary}");
    assert!(summary["overdraft_issued_units"].as_u64().unwrap() > 0);
    assert!(summary["expired_units"].as_u64().unwrap() > 0);
    assert!(summary["minted_units"].as_u64().unwrap() > 0);

    let page_path = dir.path().join("statement.html");
    let out = audit(log, "acme", "html", &["-o", page_path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&page_path).unwrap();

    self_contained(&page);
    totals_equal(&page, &summary);
    let changes = series_equal(&page, &rows, &summary);
    assert_eq!(
        changes, [true; 4],
        "every series moves: a history worth drawing"
    );
    refusals_marked(&page, &rows, &summary);
    for what in ["generation switch", "closed chat · 2026-07 · g1", "g1, g2"] {
        assert!(page.contains(what), "no {what:?} on the page");
    }
    assert!(!page.contains("class=\"broken\""), "a broken check drawn");

    // A range that starts mid-history: it opens with the balances before it.
    let from = rows[rows.len() / 2]["offset"].as_u64().unwrap().to_string();
    let (later, later_summary) = jsonl_statement(log, &["--from", &from]);
    assert!(
        later.len() < rows.len()
            && later_summary["balances_at_start"]["spent_units"].as_u64() > Some(0)
    );
    let out = audit(log, "acme", "html", &["--from", &from]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let later_page = text(&out.stdout);
    totals_equal(&later_page, &later_summary);
    series_equal(&later_page, &later, &later_summary);

    let Some(chromium) = chromium() else { return };
    // The content itself, without the policy that would block a request:
    // nothing is fetched.
    let open = page.replace(
        "<meta http-equiv=\"Content-Security-Policy\"",
        "<meta name=\"x\"",
    );
    assert_ne!(open, page, "the page declares its Content Security Policy");
    let open_path = dir.path().join("statement-open.html");
    std::fs::write(&open_path, &open).unwrap();
    let shot = dir.path().join("statement.png");
    let requests = render(&chromium, &open_path, &shot, WINDOW, dir.path());
    assert!(requests.is_empty(), "the page requested {requests:?}");
    screenshot_has_the_chart(&shot);
    if let Ok(example) = std::env::var("RESERVOIR_STATEMENT_EXAMPLE") {
        std::fs::copy(&shot, &example).unwrap();
        eprintln!("statement screenshot written to {example}");
    }

    // The control: a page with one image from a (closed) loopback port is seen
    // requesting it, so an empty list above means something.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let probe = format!("http://127.0.0.1:{port}/probe.png");
    let control_path = dir.path().join("control.html");
    std::fs::write(
        &control_path,
        open.replace("</body>", &format!("<img src=\"{probe}\"></body>")),
    )
    .unwrap();
    let requests = render(
        &chromium,
        &control_path,
        &dir.path().join("control.png"),
        WINDOW,
        dir.path(),
    );
    assert_eq!(requests, vec![probe], "the control page's request is seen");

    bad_input(log, dir.path());
}

/// A new generation for acme/chat (the first is closed; its reservations still
/// finish), one call settled on it, one refused.
async fn generation_switch(s: &Server) {
    let mut p = policy("acme", "chat", 400);
    p.generation = 2;
    let (status, body) = s
        .post(
            "/v1/policies",
            json!({"accounting_epoch": "2026-07", "policy": p}),
        )
        .await;
    assert!(status < 300, "{status} {body}");
    let reserve = |id: &str, units: u64| json!({"id": id, "subject": "acme", "route": "chat", "units": units});
    // Generation 2 opens with what generation 1 had left (a publish moves
    // capacity, never mints it): if that is short of 200, retrying at the
    // hinted time admits the same reserve.
    let (mut status, mut body) = s.post("/v1/reservations", reserve("g2-1", 200)).await;
    if status == 429 {
        let wait = body["retry_after_ms"].as_u64().expect("a retry hint");
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        (status, body) = s.post("/v1/reservations", reserve("g2-1", 200)).await;
    }
    assert_eq!(status, 201, "{body}");
    s.post(
        "/v1/reservations/g2-1/start",
        json!({"operation_id": "op-g2"}),
    )
    .await;
    let (status, _) = s
        .post("/v1/reservations/g2-1/settle", json!({"actual_units": 150}))
        .await;
    assert_eq!(status, 200);
    let (status, body) = s.post("/v1/reservations", reserve("g2-big", 1_000)).await;
    assert_eq!(status, 429, "{body}");
    let parts = s.get("/v1/partitions").await;
    for p in parts.as_array().unwrap() {
        assert_eq!(p["conservation"], "ok", "{p}");
    }
}

/// The JSON lines statement: its rows and its summary.
fn jsonl_statement(log: &str, extra: &[&str]) -> (Vec<Value>, Value) {
    let lines = json_lines(&audit(log, "acme", "jsonl", extra));
    let rows = lines
        .iter()
        .filter(|l| l["kind"] == "event")
        .map(|l| l["row"].clone())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "summary");
    (rows, last["summary"].clone())
}

/// No URL anywhere, nothing that could load one, and a policy against it.
fn self_contained(page: &str) {
    assert!(
        page.contains("content=\"default-src 'none'; style-src 'unsafe-inline'\""),
        "no Content Security Policy"
    );
    let lower = page.to_ascii_lowercase();
    for needle in [
        "http://",
        "https://",
        "//",
        "<script",
        "<link",
        "<img",
        "<iframe",
        "<object",
        "<embed",
        "url(",
        "@import",
        " src=",
        "srcset",
        "xlink:href",
    ] {
        let hits = lower.matches(needle).count();
        // `//` may only appear inside the URLs counted above (none).
        assert_eq!(hits, 0, "{needle:?} appears {hits} times in the page");
    }
    for href in lower.split(" href=\"").skip(1) {
        assert!(
            href.starts_with('#'),
            "a link out of the page: {}",
            &href[..40.min(href.len())]
        );
    }
}

/// `data-summary="KEY">VALUE<` cells.
fn summary_cells(page: &str) -> BTreeMap<String, String> {
    page.split("data-summary=\"")
        .skip(1)
        .map(|rest| {
            let (key, rest) = rest.split_once("\">").unwrap();
            let (value, _) = rest.split_once('<').unwrap();
            (key.to_string(), value.to_string())
        })
        .collect()
}

fn totals_equal(page: &str, summary: &Value) {
    let cells = summary_cells(page);
    let mut expected: Vec<(String, String)> = summary
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| !v.is_object())
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    for group in ["balances", "balances_at_start"] {
        for term in Term::ALL {
            expected.push((
                format!("{group}.{term}"),
                summary[group][term.name()].to_string(),
            ));
        }
    }
    assert!(expected.len() > 30);
    for (key, value) in expected {
        assert_eq!(cells.get(&key), Some(&value), "{key} on the page");
    }
}

/// Attribute `name` of the tag that starts `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let start = tag
        .find(&format!(" {name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {}", &tag[..80.min(tag.len())]))
        + name.len()
        + 3;
    let len = tag[start..].find('"').unwrap();
    &tag[start..start + len]
}

/// Maps pixels back to data through the mapping the figure declares.
struct Mapping {
    x: (f64, f64, f64, f64),
    y: (f64, f64, f64, f64),
}

impl Mapping {
    fn of(figure: &str) -> Mapping {
        let n = |name: &str| attr(figure, name).parse::<f64>().unwrap();
        Mapping {
            x: (
                n("data-x0-ms"),
                n("data-x1-ms"),
                n("data-px-x0"),
                n("data-px-x1"),
            ),
            y: (0.0, n("data-y1-units"), n("data-px-y0"), n("data-px-y1")),
        }
    }
    fn value(axis: (f64, f64, f64, f64), px: f64) -> f64 {
        let (v0, v1, p0, p1) = axis;
        v0 + (px - p0) / (p1 - p0) * (v1 - v0)
    }
    /// One pixel, in data units.
    fn pixel(axis: (f64, f64, f64, f64)) -> f64 {
        ((axis.1 - axis.0) / (axis.3 - axis.2)).abs()
    }
}

fn figure(page: &str) -> &str {
    let start = page.find("<figure class=\"timeline\"").expect("a timeline");
    &page[start..start + page[start..].find("</figure>").unwrap()]
}

/// The tenant's balance of every charted term at the start of the range and
/// after every row, in time order: per partition its balance at the start
/// (the summary's), then each row's balance, summed over partitions.
fn expected_series(rows: &[Value], summary: &Value) -> Vec<(u64, [u64; 4])> {
    let mut order: Vec<&Value> = rows.iter().collect();
    order.sort_by_key(|r| r["at_ms"].as_u64().unwrap());
    let ledger = |v: &Value| -> Ledger { serde_json::from_value(v.clone()).unwrap() };
    let mut latest: BTreeMap<String, Ledger> = summary["partitions_at_start"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), ledger(v)))
        .collect();
    let sums = |latest: &BTreeMap<String, Ledger>| {
        let sum = |f: fn(&Ledger) -> u64| latest.values().map(f).sum::<u64>();
        [
            sum(|l| l.available_units),
            sum(|l| l.reserved_units),
            sum(|l| l.spent_units),
            sum(|l| l.debt_units().unwrap()),
        ]
    };
    let start = (order[0]["at_ms"].as_u64().unwrap(), sums(&latest));
    let mut series = vec![start];
    for row in order {
        latest.insert(
            row["partition"].as_str().unwrap().to_string(),
            ledger(&row["balance"]),
        );
        series.push((row["at_ms"].as_u64().unwrap(), sums(&latest)));
    }
    series
}

fn points(polyline: &str) -> Vec<(f64, f64)> {
    attr(polyline, "points")
        .split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// Checks every drawn series against the statement; says which ones change.
fn series_equal(page: &str, rows: &[Value], summary: &Value) -> Vec<bool> {
    let fig = figure(page);
    let map = Mapping::of(fig);
    let expected = expected_series(rows, summary);
    let colors: Vec<(&str, &str)> = attr(fig, "data-series")
        .split(' ')
        .map(|s| s.split_once('=').unwrap())
        .collect();
    let names = [
        "available_units",
        "reserved_units",
        "spent_units",
        "debt_units",
    ];
    assert_eq!(colors.iter().map(|c| c.0).collect::<Vec<_>>(), names);
    let (tx, ty) = (1.5 * Mapping::pixel(map.x), 1.5 * Mapping::pixel(map.y));
    let mut changes = Vec::new();
    for (i, (name, color)) in colors.into_iter().enumerate() {
        let lines: Vec<&str> = fig
            .split("<polyline")
            .skip(1)
            .filter(|p| attr(p, "stroke").eq_ignore_ascii_case(color))
            .collect();
        assert_eq!(lines.len(), 1, "{name}: one polyline in {color}");
        let pts = points(lines[0]);
        // The start, then for every row the step: (t, before), (t, after).
        assert_eq!(pts.len(), 2 * expected.len() - 1, "{name}");
        let mut changed = false;
        for (n, (at_ms, values)) in expected.iter().enumerate() {
            let (px, py) = pts[2 * n];
            let (x, y) = (Mapping::value(map.x, px), Mapping::value(map.y, py));
            assert!(
                (x - *at_ms as f64).abs() <= tx,
                "{name} row {n}: x {x} for {at_ms}"
            );
            let want = values[i] as f64;
            assert!(
                (y - want).abs() <= ty,
                "{name} row {n}: drawn {y}, the statement says {want} (±{ty})"
            );
            changed |= n > 0 && values[i] != expected[n - 1].1[i];
        }
        changes.push(changed);
    }
    changes
}

fn refusals_marked(page: &str, rows: &[Value], summary: &Value) {
    let fig = figure(page);
    let map = Mapping::of(fig);
    let color = attr(fig, "data-refusal-color");
    let crosses: Vec<(f64, f64)> = fig
        .split("<line")
        .skip(1)
        .filter(|l| attr(l, "stroke").eq_ignore_ascii_case(color))
        .map(|l| {
            let n = |a: &str| attr(l, a).parse::<f64>().unwrap();
            ((n("x1") + n("x2")) / 2.0, (n("y1") + n("y2")) / 2.0)
        })
        .collect();
    let expected = &expected_series(rows, summary)[1..];
    let mut order: Vec<&Value> = rows.iter().collect();
    order.sort_by_key(|r| r["at_ms"].as_u64().unwrap());
    let refused: Vec<(u64, u64)> = order
        .iter()
        .zip(expected)
        .filter(|(r, _)| r["event"] == "AdmissionRefused")
        .map(|(_, (at, v))| (*at, v[0]))
        .collect();
    assert_eq!(crosses.len(), 2 * refused.len(), "two strokes per refusal");
    let (tx, ty) = (1.5 * Mapping::pixel(map.x), 1.5 * Mapping::pixel(map.y));
    for (cross, (at, available)) in crosses.chunks(2).map(|c| c[0]).zip(refused) {
        assert!((Mapping::value(map.x, cross.0) - at as f64).abs() <= tx);
        assert!((Mapping::value(map.y, cross.1) - available as f64).abs() <= ty);
    }
}

/// The screenshot is the window's size and shows the chart's lines.
fn screenshot_has_the_chart(png_path: &Path) {
    let file = std::io::BufReader::new(std::fs::File::open(png_path).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), WINDOW);
    let channels = info.line_size / info.width as usize;
    assert!(channels >= 3, "{:?}", info.color_type);
    let near = |px: &[u8], rgb: (u8, u8, u8)| {
        px[0].abs_diff(rgb.0) < 24 && px[1].abs_diff(rgb.1) < 24 && px[2].abs_diff(rgb.2) < 24
    };
    let pixels: Vec<&[u8]> = buf[..info.line_size * info.height as usize]
        .chunks(channels)
        .collect();
    for (name, rgb) in [
        ("available", (0x1F, 0x77, 0xB4)),
        ("spent", (0x2C, 0xA0, 0x2C)),
    ] {
        let n = pixels.iter().filter(|p| near(p, rgb)).count();
        assert!(
            n > 300,
            "{name}: only {n} pixels of its colour in the screenshot"
        );
    }
}

/// Bad input: a clear message and exit status 2, no panic, no page.
fn bad_input(log: &str, dir: &Path) {
    let missing = dir.join("no-such-dir").join("statement.html");
    let rows: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--html-rows-max", "3"], "at most 3 rows"),
        (vec!["-o", missing.to_str().unwrap()], "cannot create"),
    ];
    for (extra, message) in rows {
        let out = audit(log, "acme", "html", &extra);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(message) && !err.contains("panicked"),
            "{extra:?}: {err}"
        );
    }
    // A run that fails part way leaves the file it was to write as it was
    // (here: an older statement) and nothing half-written beside it.
    let older = dir.join("older.html");
    std::fs::write(&older, "an older statement").unwrap();
    let out = audit(
        log,
        "acme",
        "html",
        &["--html-rows-max", "3", "-o", older.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&older).unwrap(),
        "an older statement"
    );
    assert!(!dir.join("older.html.partial").exists());
    // A pipe is a file too: the page goes to standard output.
    let out = audit(log, "acme", "html", &[]);
    assert!(out.status.success() && text(&out.stdout).starts_with("<!DOCTYPE html>"));
    // A terminal is not: refused before the log is read.
    let command = format!(
        "{} --log-dir {log} audit --tenant acme --format html",
        replay_binary()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("run script(1)");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("an HTML statement is a file"));
    // A tenant without events: a page that says so.
    let out = audit(log, "nobody", "html", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("No event in the range."));
}
