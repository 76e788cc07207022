//! Authentication in cluster mode: two `reservoir` processes on one Kafka
//! topic with one tokens file and one node credential. The table of `auth`
//! runs through the node that does not own tenant-a's partition, so every
//! write and reservation read of it is forwarded: the owner must decide with
//! the caller's principal (gateway B still gets 404, gateway A 200), and the
//! principal header counts only with the node credential.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use reservoir_log::kafka::log_partition_of_route;
use serde_json::Value;

use crate::auth::{fixture, run_table, send, table, Role, Row, Tokens};
use crate::kafka::brokers;
use crate::support::*;

const PARTITIONS: u32 = 4;

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_keep_the_callers_principal() {
    let Some(brokers) = brokers() else { return };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("reservoir.auth-test.{}.{nanos}", std::process::id());
    let dir = crate::support::tempdir().unwrap();
    let tokens = Tokens::create_in(dir.path());
    let node_token = dir.path().join("node.token");
    std::fs::write(
        &node_token,
        "node-credential-0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let ports = [free_port(), free_port()];
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let data: Vec<_> = (0..2).map(|_| crate::support::tempdir().unwrap()).collect();
    let _nodes: Vec<Node> = (0..2)
        .map(|i| {
            let child = Command::new(crate::cluster::server_bin())
                .args([
                    "serve",
                    "--log",
                    "kafka",
                    "--brokers",
                    &brokers,
                    "--topic",
                    &topic,
                ])
                .args([
                    "--cluster-group",
                    &format!("{topic}.group"),
                    "--node-id",
                    &format!("a{i}"),
                ])
                .args([
                    "--listen",
                    &format!("127.0.0.1:{}", ports[i]),
                    "--peers",
                    &urls.join(","),
                ])
                .args([
                    "--topic-partitions",
                    &PARTITIONS.to_string(),
                    "--writer-shards",
                    "2",
                ])
                .args(["--session-timeout-ms", "6000"])
                .arg("--tokens-file")
                .arg(&tokens.file)
                .arg("--node-token-file")
                .arg(&node_token)
                .arg("--data-dir")
                .arg(data[i].path())
                .env("RESERVOIR_LOG_LEVEL", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn reservoir");
            Node(child)
        })
        .collect();
    let operator = tokens.client(Role::Operator);
    // Both nodes serve, and both know who owns tenant-a's partition.
    let tenant_a = log_partition_of_route("tenant-a", "chat", PARTITIONS);
    let owner = eventually(Duration::from_secs(120), || async {
        let mut owners = Vec::new();
        for url in &urls {
            // Not listening yet is not an answer.
            let r = operator
                .get(format!("{url}/v1/cluster"))
                .send()
                .await
                .ok()?;
            let s = r.status();
            let view: Value = r.json().await.ok()?;
            let parts = view["partitions"].as_array().cloned().unwrap_or_default();
            let serving = s == StatusCode::OK
                && parts.len() == PARTITIONS as usize
                && parts.iter().all(|p| p["state"] == "serving")
                && ["a0", "a1"]
                    .iter()
                    .all(|n| parts.iter().any(|p| p["node_id"] == *n));
            let owner = parts
                .iter()
                .find(|p| p["log_partition"] == tenant_a)
                .map(|p| p["node_id"].clone());
            owners.push(owner.filter(|_| serving)?);
        }
        (owners[0] == owners[1]).then(|| owners[0].clone())
    })
    .await;
    let front = if owner == "a0" { &urls[1] } else { &urls[0] };
    let (at_a, _) = fixture(&tokens, front).await;
    let mut rows = table(&at_a);
    // Without --shard-key-file a cluster issues no shards: whoever passes
    // the scope and subject checks learns that (501), the others are
    // refused as before.
    for Row(_, path, _, expect) in rows.iter_mut() {
        if path.starts_with("/v1/shards") {
            for cell in expect.iter_mut().filter(|c| ![401, 403].contains(*c)) {
                *cell = 501;
            }
        }
    }
    //                                                        none bad gwA  gwB  readA ops  metrics
    rows.push(Row(
        Method::GET,
        "/v1/cluster".into(),
        None,
        [401, 401, 403, 403, 403, 200, 403],
    ));
    rows.push(Row(
        Method::GET,
        "/v1/cluster/node".into(),
        None,
        [401, 401, 403, 403, 403, 200, 403],
    ));
    // The front's own answers are problems too.
    rows.push(Row(
        Method::GET,
        "/v1/cluster/node?offsets=maybe".into(),
        None,
        [401, 401, 403, 403, 403, 400, 403],
    ));
    rows.push(Row(
        Method::DELETE,
        "/v1/cluster".into(),
        None,
        [405, 401, 405, 405, 405, 405, 405],
    ));
    // The front holds none of tenant-a's partitions: its own lookup finds
    // nothing, for an operator (a peer asking gets the same).
    rows.push(Row(
        Method::GET,
        "/v1/cluster/locate/res-a".into(),
        None,
        [401, 401, 403, 403, 403, 404, 403],
    ));
    run_table(&tokens, front, &rows).await;
    // The front really forwarded: the owner answered A's reservation.
    let (s, _, headers) = send(
        &tokens.client(Role::GatewayA),
        front,
        &Method::GET,
        "/v1/reservations/res-a",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(headers.contains_key("x-reservoir-served-by"), "{headers:?}");
    // Gateway B asking for it gets the 404 of an id nobody holds, which
    // does not name the node that holds A's.
    let gateway_b = tokens.client(Role::GatewayB);
    for id in ["res-a", "res-none"] {
        let path = format!("/v1/reservations/{id}");
        let (s, body, headers) = send(&gateway_b, front, &Method::GET, &path, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{id}: {body}");
        assert_eq!(problem_type(&body), "unknown_reservation", "{body}");
        assert_eq!(
            body["detail"],
            format!("unknown reservation {id}"),
            "{body}"
        );
        assert!(
            !headers.contains_key("x-reservoir-served-by"),
            "{id}: {headers:?}"
        );
    }
    // A's id is not B's to reserve again in B's partition, through either
    // node (a single node answers 422; B's partition's writer alone does
    // not know the id).
    assert_ne!(
        tenant_a,
        log_partition_of_route("tenant-b", "chat", PARTITIONS),
        "the tenants' routes must be in two partitions for this check"
    );
    let taken =
        serde_json::json!({"id": "res-a", "subject": "tenant-b", "route": "chat", "units": 1});
    for url in &urls {
        let (s, body, _) = send(
            &gateway_b,
            url,
            &Method::POST,
            "/v1/reservations",
            Some(&taken),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(
            problem_type(&body),
            "exists_with_different_digest",
            "{body}"
        );
    }
    // A client's hop count is not a peer's: the front still asks the owner.
    let r = tokens
        .client(Role::Operator)
        .get(format!("{front}/v1/partitions"))
        .header("x-reservoir-hops", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let listed: Value = r.json().await.unwrap();
    let listed = listed.as_array().unwrap();
    assert!(
        listed.iter().any(|p| p["subject"] == "tenant-a"),
        "the owner's partitions are listed: {listed:?}"
    );
    // The owner finds it for a peer, and for a peer asking on behalf of a
    // principal that sees tenant-a; not for one that does not.
    let owner_url = if front == &urls[0] {
        &urls[1]
    } else {
        &urls[0]
    };
    let on_behalf = |principal: Option<reservoir_server::auth::Principal>| {
        let mut request = reqwest::Client::new()
            .get(format!("{owner_url}/v1/cluster/locate/res-a"))
            .bearer_auth("node-credential-0123456789abcdef0123456789abcdef");
        if let Some(p) = principal {
            let header = reservoir_server::auth::forward::encode(&p).unwrap();
            request = request.header("x-reservoir-principal", header);
        }
        request.send()
    };
    let gateway = |subject: &str| {
        let mut p = reservoir_server::auth::Principal::anonymous();
        p.name = format!("gateway-{subject}");
        p.scopes.insert(reservoir_server::auth::Scope::Gateway);
        p.subjects.exact.insert(subject.to_string());
        p
    };
    assert_eq!(on_behalf(None).await.unwrap().status(), StatusCode::OK);
    let seen = on_behalf(Some(gateway("tenant-a"))).await.unwrap();
    assert_eq!(seen.status(), StatusCode::OK);
    let unseen = on_behalf(Some(gateway("tenant-b"))).await.unwrap();
    assert_eq!(unseen.status(), StatusCode::NOT_FOUND);
    // A principal header counts only with the node credential.
    let forged =
        reservoir_server::auth::forward::encode(&reservoir_server::auth::Principal::unrestricted())
            .unwrap();
    for url in &urls {
        let r = gateway_b
            .get(format!("{url}/v1/partitions"))
            .header("x-reservoir-principal", forged.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{url}");
        let r = reqwest::Client::new()
            .get(format!("{url}/v1/partitions"))
            .header("x-reservoir-principal", forged.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{url}");
        // The node credential alone is no operator.
        let node = reqwest::Client::new()
            .get(format!("{url}/v1/partitions"))
            .bearer_auth("node-credential-0123456789abcdef0123456789abcdef");
        assert_eq!(
            node.send().await.unwrap().status(),
            StatusCode::FORBIDDEN,
            "{url}"
        );
    }
    assert_conserved_at(&operator, front).await;
}

/// A node holding the node credential with authentication off would forward
/// every request as unrestricted, and its peers would believe it.
#[test]
fn a_node_with_the_node_credential_and_authentication_off_does_not_start() {
    let Some(brokers) = brokers() else { return };
    let dir = crate::support::tempdir().unwrap();
    let node_token = dir.path().join("node.token");
    std::fs::write(
        &node_token,
        "node-credential-0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let stderr = crate::cluster::refused_at_start(
        &brokers,
        "reservoir.auth-node-no-tokens",
        &[
            "--node-token-file".into(),
            node_token.into(),
            "--insecure-no-auth".into(),
        ],
    );
    assert!(
        stderr.contains("--node-token-file without a tokens file"),
        "{stderr}"
    );
}
