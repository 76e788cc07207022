//! Headless Chromium (Debian's package) for the tests that look at a page as
//! a person would: a screenshot, and the requests the page made.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::support::text;

/// Headless Chromium renders one page in a second or two; past this it hangs.
const CHROMIUM_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Debian's `chromium`; its absence fails under CI=true (scripts/setup installs it).
pub fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            if out.status.success() {
                return Some(PathBuf::from(text(&out.stdout).trim()));
            }
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but chromium is not installed (scripts/setup installs Debian's chromium)"
    );
    eprintln!("\n*** SKIPPED (no chromium): the statement page was not rendered; scripts/setup installs it ***\n");
    None
}

/// Renders `page` to `png` in headless Chromium; returns the URLs the page
/// requested (from Chromium's NetLog: requests made on behalf of a file://
/// page, other than file:// and data: ones). Host names resolve nowhere, so
/// nothing leaves the machine even if something were requested.
pub fn render(
    chromium: &Path,
    page: &Path,
    png: &Path,
    window: (u32, u32),
    scratch: &Path,
) -> Vec<String> {
    let netlog = png.with_extension("netlog.json");
    let profile = tempfile::tempdir_in(scratch).unwrap();
    let mut command = Command::new(chromium);
    command
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
        ])
        .args(["--no-first-run", "--disable-background-networking"])
        .arg("--host-resolver-rules=MAP * ~NOTFOUND")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={},{}", window.0, window.1))
        .arg(format!("--log-net-log={}", netlog.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()));
    let out = reservoir_testkit::output_bounded(&mut command, "chromium", CHROMIUM_LIMIT);
    assert!(
        out.status.success() && png.exists(),
        "chromium: {}",
        text(&out.stderr)
    );
    let log: Value = serde_json::from_str(&std::fs::read_to_string(&netlog).unwrap()).unwrap();
    let start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"].clone();
    assert!(start_job.is_u64(), "NetLog without URL_REQUEST_START_JOB");
    let mut urls: Vec<String> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == start_job)
        .filter(|e| {
            let p = &e["params"];
            p["network_isolation_key"]
                .as_str()
                .is_some_and(|k| k.starts_with("file://"))
        })
        .filter_map(|e| e["params"]["url"].as_str())
        .filter(|u| !u.starts_with("file:") && !u.starts_with("data:"))
        .map(str::to_string)
        .collect();
    urls.dedup();
    urls
}
