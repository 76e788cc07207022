//! Killing the projector between a batch's apply and its commit, then
//! restarting it, gives the same projection as an uninterrupted rebuild.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use reservoir_log::embedded::EmbeddedLog;
use reservoir_projections::{dump, store, ProjectionError, Projector, ProjectorConfig};

use super::live_vs_rebuilt::assert_same;
use super::support::*;

async fn build_log(path: &std::path::Path) {
    let mut driver = Driver::open(path, "writer-1").await;
    let mut mixed = Mixed::new(&mut driver);
    mixed.run(&mut driver, 30).await;
    let mut driver = driver.reopen(path, "writer-2").await;
    mixed.run(&mut driver, 40).await;
}

#[tokio::test]
async fn failure_between_apply_and_commit_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    build_log(&log_path).await;
    let log = Arc::new(EmbeddedLog::open(&log_path, "reader").unwrap());
    let reference = rebuild(log.clone(), &dir.path().join("reference"), 1_024).await;
    for crash_at in [1, 4, 17] {
        let path = dir.path().join(format!("crash-{crash_at}"));
        let ahead = {
            let db = store::open(&path).unwrap();
            let mut projector = Projector::open(log.clone(), db, config(5)).unwrap();
            projector.fail_before_commit(crash_at);
            loop {
                match projector.step().await {
                    Ok(_) => continue,
                    Err(ProjectionError::InjectedCrash) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(matches!(
                projector.step().await,
                Err(ProjectionError::Poisoned)
            ));
            projector.positions()
        };
        let db = store::open(&path).unwrap();
        let mut projector = Projector::open(log.clone(), db.clone(), config(5)).unwrap();
        // The failed batch's positions never reached the database.
        assert!(projector.positions()[0] < ahead[0]);
        assert_eq!(projector.positions()[0], (crash_at - 1) * 5);
        projector.catch_up().await.unwrap();
        assert_same(&dump(&db).unwrap(), &reference);
    }
}

const CHILD_ENV: &str = "RESERVOIR_PROJECTION_CHILD";

/// Steps the child commits before it is killed.
const KILL_AFTER: usize = 40;
/// In the default (WAL-less) mode the child flushes after every this many steps.
const FLUSH_EVERY: usize = 10;
/// Entries each of the child's steps reads.
const CHILD_STEP: usize = 3;

/// Child (env set): projects in small steps, reporting each commit on stdout;
/// `synced` writes through the WAL, the default mode flushes every
/// [`FLUSH_EVERY`] steps as a full memtable would.
fn child(dirs: &str) {
    let (mode, rest) = dirs.split_once('\n').unwrap();
    let (log_path, db_path) = rest.split_once('\n').unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let log = Arc::new(EmbeddedLog::open(log_path, "child").unwrap());
        let db = store::open(db_path).unwrap();
        let config = ProjectorConfig {
            read_entries_max: CHILD_STEP,
            sync_writes: mode == "synced",
            ..ProjectorConfig::default()
        };
        let mut projector = Projector::open(log, db.clone(), config).unwrap();
        for n in 1.. {
            if projector.step().await.unwrap().entries == 0 {
                break;
            }
            if mode != "synced" && n % FLUSH_EVERY == 0 {
                store::flush(&db).unwrap();
            }
            println!("committed {n}");
        }
    });
}

/// Parent: runs the projector in a child process, SIGKILLs it mid-run,
/// restarts it here and compares with a rebuild. Returns where the restarted
/// projector resumed.
fn sigkill_mid_run_then_restart(mode: &str) -> u64 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    let db_path: PathBuf = dir.path().join("projection");
    runtime.block_on(build_log(&log_path));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "projections::crash::child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{mode}\n{}\n{}", log_path.display(), db_path.display()),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut commits = 0;
    while let Some(Ok(line)) = lines.next() {
        if line.starts_with("committed ") {
            commits += 1;
            if commits == KILL_AFTER {
                break;
            }
        }
    }
    assert_eq!(
        commits, KILL_AFTER,
        "the child finished or died before it could be killed"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    runtime.block_on(async {
        let log = Arc::new(EmbeddedLog::open(&log_path, "reader").unwrap());
        let db = store::open(&db_path).unwrap();
        let mut projector = Projector::open(log.clone(), db.clone(), config(64)).unwrap();
        let resumed_at = projector.positions()[0];
        projector.catch_up().await.unwrap();
        let reference = rebuild(log, &dir.path().join("reference"), 1_024).await;
        assert_same(&dump(&db).unwrap(), &reference);
        resumed_at
    })
}

/// The child half of the SIGKILL tests (does nothing unless spawned by them).
#[test]
fn child_process() {
    if let Ok(dirs) = std::env::var(CHILD_ENV) {
        child(&dirs);
    }
}

/// Synced batches through the WAL: the restart resumes after the last step
/// the child reported (or later), and derives the same projection.
#[test]
fn sigkill_with_synced_writes_resumes_after_the_last_commit() {
    let resumed_at = sigkill_mid_run_then_restart("synced");
    assert!(
        resumed_at >= (KILL_AFTER * CHILD_STEP) as u64,
        "resumed at {resumed_at}"
    );
}

/// The default, WAL-less batches: only flushed steps survive (so the restart
/// resumes exactly at a flush point, which shows the WAL really is off), the
/// lost steps are derived again from the log, and the projection is the same.
#[test]
fn sigkill_without_wal_resumes_at_the_last_flush() {
    let resumed_at = sigkill_mid_run_then_restart("default");
    let flush_offsets = (FLUSH_EVERY * CHILD_STEP) as u64;
    assert_eq!(resumed_at % flush_offsets, 0, "resumed at {resumed_at}");
    assert!(
        resumed_at >= ((KILL_AFTER - FLUSH_EVERY) * CHILD_STEP) as u64,
        "resumed at {resumed_at}"
    );
}
