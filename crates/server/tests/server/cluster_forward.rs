//! What a forwarded answer carries: the owner's status, body and headers.
//! A reserve sent to the node that does not own its subject/route is
//! answered with the same rate-limit headers (IETF `RateLimit-Policy` and
//! `RateLimit`, the `x-ratelimit-*` ones) as one sent to the owner, and a
//! 429 with them and its `Retry-After`, plus `x-reservoir-served-by`. The
//! topic replays with conservation afterwards.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::*;
use crate::kafka::brokers;
use crate::support::*;

/// The rate-limit headers of an answer, by name.
fn rate_limit_headers(r: &reqwest::Response) -> BTreeSet<String> {
    r.headers()
        .keys()
        .map(|n| n.as_str().to_string())
        .filter(|n| n.starts_with("ratelimit") || n.starts_with("x-ratelimit-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_answer_keeps_the_owners_headers() {
    let Some(brokers) = brokers() else { return };
    let (topic, bases, nodes) = start_cluster(&brokers, "cluster-forward", &["f1", "f2"]).await;
    let http = client();
    let view = cluster_view(&http, &bases[0]).await;
    let f1 = served_by(&view, "f1");
    let subject = subject_where(|placed| f1.contains(&placed("chat")));
    publish(&http, &bases[0], &policy(&subject, "chat", 1, 100, 10)).await;
    let reserve = |base: &str, id: &str, units: u64| {
        http.post(format!("{base}/v1/reservations"))
            .json(&json!({"id": id, "subject": subject, "route": "chat", "units": units}))
            .send()
    };

    let direct = reserve(&bases[0], "direct", 10).await.unwrap();
    assert_eq!(direct.status(), StatusCode::CREATED);
    let expected = rate_limit_headers(&direct);
    assert!(expected.contains("ratelimit-policy"), "{expected:?}");
    assert!(expected.contains("ratelimit"), "{expected:?}");

    let forwarded = reserve(&bases[1], "forwarded", 10).await.unwrap();
    assert_eq!(forwarded.status(), StatusCode::CREATED);
    assert_eq!(
        forwarded.headers()["x-reservoir-served-by"],
        bases[0].as_str(),
        "forwarded to f1"
    );
    assert_eq!(rate_limit_headers(&forwarded), expected);

    // Refused by the owner for capacity: the 429 keeps what tells the
    // caller when to come back.
    let refused = reserve(&bases[1], "too-much", 90).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "{retry_after}");
    assert_eq!(rate_limit_headers(&refused), expected);

    let acked: Acked = ["direct", "forwarded"]
        .map(|id| (id.to_string(), ("RESERVED".to_string(), None)))
        .into();
    replay_and_check(&brokers, &topic, &acked).await;
    drop(nodes);
}
