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

/// Parent: runs the projector in a child process, SIGKILLs it mid-run,
/// restarts it here and compares with a rebuild. Child (env set): projects in
/// small synced steps, reporting each commit on stdout.
#[test]
fn sigkill_mid_run_then_restart() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if let Ok(dirs) = std::env::var(CHILD_ENV) {
        let (log_path, db_path) = dirs.split_once('\n').unwrap();
        return runtime.block_on(async {
            let log = Arc::new(EmbeddedLog::open(log_path, "child").unwrap());
            let db = store::open(db_path).unwrap();
            let config = ProjectorConfig {
                read_entries_max: 3,
                sync_writes: true,
                ..ProjectorConfig::default()
            };
            let mut projector = Projector::open(log, db, config).unwrap();
            for n in 0.. {
                if projector.step().await.unwrap().entries == 0 {
                    break;
                }
                println!("committed {n}");
            }
        });
    }
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    let db_path: PathBuf = dir.path().join("projection");
    runtime.block_on(build_log(&log_path));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "projections::crash::sigkill_mid_run_then_restart",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}\n{}", log_path.display(), db_path.display()),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut commits = 0;
    while let Some(Ok(line)) = lines.next() {
        if line.starts_with("committed ") {
            commits += 1;
            if commits == 40 {
                break;
            }
        }
    }
    assert_eq!(
        commits, 40,
        "the child finished or died before it could be killed"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    runtime.block_on(async {
        let log = Arc::new(EmbeddedLog::open(&log_path, "reader").unwrap());
        let db = store::open(&db_path).unwrap();
        let mut projector = Projector::open(log.clone(), db.clone(), config(64)).unwrap();
        let resumed_at = projector.positions()[0];
        assert!(resumed_at >= 40 * 3, "resumed at {resumed_at}");
        projector.catch_up().await.unwrap();
        let reference = rebuild(log, &dir.path().join("reference"), 1_024).await;
        assert_same(&dump(&db).unwrap(), &reference);
    });
}
