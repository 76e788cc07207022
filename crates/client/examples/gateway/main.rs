//! An example gateway embedding `reservoir-client`: it proxies Anthropic-style
//! streaming requests to a model provider (by default a fake one it starts
//! itself, see `provider.rs`) and holds each call's capacity in the ledger.
//!
//! ```sh
//! scripts/run &    # the ledger on 127.0.0.1:8080; publish a policy for your tenant on route `messages`
//! RESERVOIR_TOKEN=$(cat reservoir-data/operator.token) \
//! cargo run --release -p reservoir-client --example gateway -- \
//!     --ledger http://127.0.0.1:8080 --listen 127.0.0.1:8090 --concurrency 4 --weight tenant-7=5
//! curl -N -H 'content-type: application/json' -H 'x-tenant: tenant-7' localhost:8090/v1/messages \
//!     -d '{"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}'
//! ```

mod app;
mod provider;

use std::collections::BTreeMap;
use std::sync::Arc;

use reservoir_client::{Client, SchedulerConfig, StartScheduler};

#[tokio::main]
async fn main() {
    let mut ledger = "http://127.0.0.1:8080".to_string();
    let mut listen = "127.0.0.1:8090".to_string();
    let mut provider = None;
    let mut concurrency = 16;
    let mut weights = BTreeMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--ledger" => ledger = value,
            "--listen" => listen = value,
            "--provider" => provider = Some(value),
            "--concurrency" => concurrency = value.parse().expect("--concurrency N"),
            "--weight" => {
                let (tenant, w) = value.split_once('=').expect("--weight TENANT=N");
                weights.insert(tenant.to_string(), w.parse().expect("a weight"));
            }
            other => panic!("unknown flag {other}"),
        }
    }
    let provider = match provider {
        Some(url) => url,
        None => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("addr"));
            tokio::spawn(async move { axum::serve(listener, provider::router()).await });
            url
        }
    };
    let gateway = Arc::new(app::Gateway {
        // A gateway token (`reservoir token create --scope gateway ...`), if the ledger authenticates.
        ledger: match std::env::var("RESERVOIR_TOKEN") {
            Ok(token) => Client::builder(&ledger).token(token.trim()).build(),
            Err(_) => Client::new(&ledger),
        },
        scheduler: StartScheduler::new(SchedulerConfig {
            concurrency,
            weights,
            ..SchedulerConfig::default()
        }),
        provider: provider.clone(),
        http: reqwest::Client::new(),
    });
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .expect("bind --listen");
    eprintln!("gateway on http://{listen}, ledger {ledger}, provider {provider}");
    axum::serve(listener, app::router(gateway))
        .await
        .expect("serve");
}
