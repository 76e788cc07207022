//! Running with authentication: the tokens file reloaded without a restart,
//! the refusal to listen beyond loopback without it, open loopback for the
//! tests and demos, the first operator token `scripts/run` asks for, and
//! `reservoir token create`.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use reservoir_server::auth::tokens::{create, NewToken, TokenSet, TokenStore};
use reservoir_server::auth::AuthConfig;
use serde_json::json;

use crate::auth::{send, Role, Tokens};
use crate::crash::spawn_server_with;
use crate::support::*;

fn reservoir() -> Command {
    Command::new(env!("CARGO_BIN_EXE_reservoir"))
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_file_changes_apply_without_a_restart() {
    let dir = crate::support::tempdir().unwrap();
    let tokens = Tokens::create_in(dir.path());
    let config = reservoir_server::Config {
        auth: AuthConfig {
            reload_interval: Some(Duration::from_millis(50)),
            ..tokens.auth_config()
        },
        ..test_config(dir.path())
    };
    let mut server =
        TestServer::start(Arc::new(reservoir_log::memory::MemoryLog::new()), config).await;
    server.client = tokens.client(Role::Operator);
    let (s, _) = server
        .publish(&policy("tenant-c", "chat", 1, 1_000, 10), "e1")
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let before = std::fs::read_to_string(&tokens.file).unwrap();
    // A token created while the server runs is accepted once it is read.
    let scopes = ["gateway".to_string()];
    let subjects = ["tenant-c".to_string()];
    let new = NewToken {
        principal: "gw-c",
        scopes: &scopes,
        subjects: &subjects,
        subject_prefixes: &[],
    };
    let token = create(&tokens.file, &new).unwrap();
    let client = reqwest::Client::new();
    let reserve = |id: &str| json!({"id": id, "subject": "tenant-c", "route": "chat", "units": 1});
    let ask = |id: String| {
        let client = client.clone();
        let (base, token, body) = (server.base.clone(), token.clone(), reserve(&id));
        async move {
            let r = client
                .post(format!("{base}/v1/reservations"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            r.status()
        }
    };
    let mut n = 0;
    eventually(Duration::from_secs(10), || {
        n += 1;
        let id = format!("r-{n}");
        let ask = ask(id);
        async move { (ask.await == StatusCode::CREATED).then_some(()) }
    })
    .await;
    // A file that does not parse leaves the tokens in force.
    std::fs::write(&tokens.file, "[[token]]\nprincipal = \n").unwrap();
    eventually(Duration::from_secs(10), || async {
        server
            .metrics()
            .await
            .lines()
            .any(|l| l.starts_with("reservoir_tokens_reload_failures_total"))
            .then_some(())
    })
    .await;
    assert_eq!(ask("r-still".into()).await, StatusCode::CREATED);
    // Removing the token revokes it.
    std::fs::write(&tokens.file, &before).unwrap();
    eventually(Duration::from_secs(10), || async {
        (ask("r-gone".into()).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    server.assert_conserved().await;
    server.stop().await;
}

/// A tokens file caught in the middle of a write (emptied by the writer,
/// not yet filled again) is never applied: a change takes effect when two
/// looks in a row read the same bytes. Before, a reload that caught the
/// file empty revoked every token until the next look (seen as a 401 for
/// the operator right after `tokens_file_changes_apply_without_a_restart`
/// rewrote the file).
#[test]
fn a_tokens_file_caught_mid_write_is_never_applied() {
    let dir = crate::support::tempdir().unwrap();
    let tokens = Tokens::create_in(dir.path());
    let whole = std::fs::read(&tokens.file).unwrap();
    let store = TokenStore::open(tokens.file.clone()).unwrap();
    let held = store.current().len();
    assert!(held > 0);
    // The writer has truncated the file and not written it yet.
    std::fs::write(&tokens.file, "").unwrap();
    assert!(!store.reload());
    assert_eq!(store.current().len(), held);
    // It finished: the same file as before, nothing to apply.
    std::fs::write(&tokens.file, &whole).unwrap();
    assert!(!store.reload());
    assert!(!store.reload());
    assert_eq!(store.current().len(), held);
    // A token added is applied at the second look that reads it.
    let scopes = ["gateway".to_string()];
    let subjects = ["tenant-c".to_string()];
    let new = NewToken {
        principal: "gw-new",
        scopes: &scopes,
        subjects: &subjects,
        subject_prefixes: &[],
    };
    create(&tokens.file, &new).unwrap();
    assert!(!store.reload());
    assert!(store.reload());
    assert_eq!(store.current().len(), held + 1);
    // A file emptied on purpose (and left so) revokes every token.
    std::fs::write(&tokens.file, "").unwrap();
    assert!(!store.reload());
    assert!(store.reload());
    assert_eq!(store.current().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tokens_is_refused_beyond_loopback_unless_insecure_is_named() {
    let dir = crate::support::tempdir().unwrap();
    let open = |insecure_no_auth| reservoir_server::Config {
        listen: "0.0.0.0:0".parse().unwrap(),
        auth: AuthConfig {
            insecure_no_auth,
            ..AuthConfig::default()
        },
        ..test_config(dir.path())
    };
    let log = Arc::new(reservoir_log::memory::MemoryLog::new());
    let claim = log.claim("w");
    let refused = reservoir_server::start(
        open(false),
        log.clone(),
        claim.writer_id.clone(),
        vec![claim.epoch],
        std::future::pending(),
    )
    .await;
    let err = refused.err().expect("refused");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{err}"
    );
    assert!(err.contains("--insecure-no-auth"), "{err}");
    // The binary exits non-zero with the same words.
    let out = reservoir()
        .args([
            "serve",
            "--log",
            "memory",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing to listen"),
        "{out:?}"
    );
    // Named explicitly, it runs open.
    let server = TestServer::start(log, open(true)).await;
    let port = server.base.rsplit(':').next().unwrap().to_string();
    let local = format!("http://127.0.0.1:{port}");
    let (s, _) = split(
        reqwest::get(format!("{local}/v1/partitions"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_without_tokens_runs_open_for_tests_and_demos() {
    let (server, _log, _dir) = TestServer::memory().await;
    let (s, _) = server
        .publish(&policy("open", "chat", 1, 100, 1), "e1")
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = server.reserve("open-1", "open", "chat", 5).await;
    assert_eq!(s, StatusCode::CREATED);
    server.assert_conserved().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_creates_an_owner_only_operator_token() {
    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server_with(dir.path(), &["--create-operator-token"]).await;
    let token_file = dir.path().join("operator.token");
    let tokens_file = dir.path().join("tokens.toml");
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&tokens_file), 0o600);
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(token.starts_with("rsv_") && token.len() == 68, "{token}");
    assert!(
        !std::fs::read_to_string(&tokens_file)
            .unwrap()
            .contains(&token),
        "the token itself is never stored"
    );
    let anonymous = reqwest::Client::new();
    let (s, _, _) = send(
        &anonymous,
        &server.base,
        &Method::GET,
        "/v1/partitions",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let operator = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    // The README's walk-through: publish, reserve, read, with the one token.
    let body = json!({"accounting_epoch": "e1", "policy": policy("tenant-7", "chat.generate", 1, 10_000, 100)});
    let (s, _, _) = send(
        &operator,
        &server.base,
        &Method::POST,
        "/v1/policies",
        Some(&body),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let reserve =
        json!({"id": "rl-1", "subject": "tenant-7", "route": "chat.generate", "units": 600});
    let (s, _, _) = send(
        &operator,
        &server.base,
        &Method::POST,
        "/v1/reservations",
        Some(&reserve),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_conserved_at(&operator, &server.base).await;
    // A second start keeps the tokens it has.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let mut again = spawn_server_with(dir.path(), &["--create-operator-token"]).await;
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    let (s, _, _) = send(&operator, &again.base, &Method::GET, "/v1/partitions", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_conserved_at(&operator, &again.base).await;
    again.child.kill().unwrap();
    again.child.wait().unwrap();
}

#[test]
fn token_create_prints_the_token_once_and_stores_its_hash() {
    let dir = crate::support::tempdir().unwrap();
    let file = dir.path().join("tokens.toml");
    let create = |args: &[&str]| {
        reservoir()
            .args(["token", "create", "--tokens-file"])
            .arg(&file)
            .args(args)
            .output()
            .unwrap()
    };
    let out = create(&[
        "--principal",
        "acme-gw",
        "--scope",
        "gateway",
        "--subject",
        "acme",
        "--subject-prefix",
        "acme-",
    ]);
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(mode(&file), 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&token));
    let set = TokenSet::parse(&text).unwrap();
    let principal = set
        .verify(&token)
        .expect("the stored hash verifies the printed token");
    assert_eq!(principal.name, "acme-gw");
    assert!(
        principal.subjects.contains("acme")
            && principal.subjects.contains("acme-eu")
            && !principal.subjects.contains("other")
    );
    assert!(set.verify(&format!("{token}0")).is_none());
    // An unknown scope is refused and leaves the file as it was.
    let out = create(&["--principal", "x", "--scope", "root"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown scope"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // So is a principal too long to forward between cluster nodes (it
    // would work only on the node that owns the caller's partition).
    let mut many = vec!["--principal", "wide", "--scope", "gateway"];
    let subjects: Vec<String> = (0..400)
        .map(|i| format!("tenant-with-a-long-name-{i}"))
        .collect();
    for s in &subjects {
        many.extend(["--subject", s.as_str()]);
    }
    let out = create(&many);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("forwarded between cluster nodes"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // A hundred fit.
    let mut some = vec!["--principal", "wide", "--scope", "gateway"];
    for s in &subjects[..100] {
        some.extend(["--subject", s.as_str()]);
    }
    assert!(create(&some).status.success());
}
