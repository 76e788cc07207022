//! Usage on settle feeds the read side: per-(route, model) digests of output
//! tokens (falling back to `actual_units` under `default`), and input drift
//! per route from counted vs provider-reported input.

use reservoir_core::{
    Command, OperationId, Policy, RequestDigest, ReservationId, RouteEstimate, Usage,
};
use reservoir_projections::{store, Projector};

use super::support::*;

/// Reserves, starts and settles one call with `usage`.
fn call<L: reservoir_log::EventLog>(
    driver: &mut Driver<L>,
    key: &reservoir_core::PartitionKey,
    n: u64,
    actual_units: u64,
    usage: Option<Usage>,
) {
    let id = ReservationId::new(format!("u{n}")).unwrap();
    let now = n * 10;
    let commands = [
        Command::Reserve {
            further_units: Vec::new(),
            id: id.clone(),
            digest: RequestDigest([1; 32]),
            units: 5_000,
            sizing: None,
        },
        Command::Start {
            id: id.clone(),
            operation_id: OperationId::new(format!("op{n}")).unwrap(),
        },
        Command::Settle {
            further_actual_units: Vec::new(),
            id,
            operation_id: None,
            actual_units,
            usage,
        },
    ];
    for command in commands {
        driver.submit(key, command, now).unwrap();
    }
}

/// Exact quantile of `values` (nearest rank).
fn exact(values: &mut [u64], q: f64) -> u64 {
    values.sort_unstable();
    values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1]
}

#[tokio::test]
async fn digests_per_model_from_output_tokens_and_drift_per_route() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let key = key("t1", "summarize");
    let mut policy = Policy::example("t1", "summarize", 1);
    policy.refill.units = 1_000_000;
    policy.refill.interval_ms = 1;
    policy.burst_units = 1_000_000;
    policy.opening_units = 1_000_000;
    driver.open_partition(&key, policy, 0);
    let mut rng = Rng::new(7);
    let (mut outputs_a, mut outputs_b) = (Vec::new(), Vec::new());
    for n in 1..=1_200u64 {
        let output = 200 + rng.below(3_801);
        let usage = match n % 3 {
            // Model a: 200..4,000 output tokens; input counted 1,000, the
            // provider's 1,034, every other call 200 of them read from its
            // prompt cache (reported apart: still the prompt the gateway
            // counted, so still in the drift).
            0 | 1 => {
                outputs_a.push(output);
                let cached = if n % 2 == 0 { 200 } else { 0 };
                Some(Usage {
                    cache_read_input_tokens: (cached > 0).then_some(cached),
                    model: Some("model-a".into()),
                    output_tokens: Some(output),
                    counted_input_tokens: Some(1_000),
                    reported_input_tokens: Some(1_034 - cached),
                })
            }
            // Model b: short outputs, no input report (no drift sample).
            _ => {
                outputs_b.push(output / 10);
                Some(Usage {
                    model: Some("model-b".into()),
                    output_tokens: Some(output / 10),
                    ..Usage::default()
                })
            }
        };
        call(&mut driver, &key, n, 1_000 + output, usage);
    }
    // Without usage, or without output tokens: actual_units under `default`.
    call(&mut driver, &key, 5_000, 4_321, None);
    call(
        &mut driver,
        &key,
        5_001,
        4_321,
        Some(Usage {
            model: Some("model-a".into()),
            counted_input_tokens: Some(100),
            ..Usage::default()
        }),
    );
    driver.flush().await;

    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(64)).unwrap();
    projector.catch_up().await.unwrap();
    let projections = projector.projections();

    let a = projections
        .at()
        .route_estimate("summarize", Some("model-a"), 200)
        .unwrap();
    assert_eq!((a.samples, a.warm), (800, true));
    for (q, got) in [(0.5, a.p50_units), (0.9, a.p90_units), (0.99, a.p99_units)] {
        let want = exact(&mut outputs_a, q) as f64;
        let got = got.unwrap() as f64;
        // Uniform on 200..4,000: 1% rank error is about 38 tokens.
        assert!((got - want).abs() <= 40.0, "q{q}: {got} vs exact {want}");
    }
    let b = projections
        .at()
        .route_estimate("summarize", Some("model-b"), 200)
        .unwrap();
    assert_eq!(b.samples, 400);
    assert!(b.p90_units.unwrap() <= 400, "{b:?}");
    let default = projections
        .at()
        .route_estimate("summarize", Some(store::DEFAULT_MODEL), 1)
        .unwrap();
    assert_eq!(
        (default.samples, default.p50_units),
        (2, Some(4_321)),
        "{default:?}"
    );
    let all = projections
        .at()
        .route_estimate("summarize", None, 200)
        .unwrap();
    assert_eq!((all.samples, all.model.as_str()), (1_202, "*"));

    // The sizing input: the model's estimate at p90.
    let RouteEstimate {
        samples,
        quantile_units,
    } = projections
        .at()
        .route_estimate_at("summarize", Some("model-a"), 900_000)
        .unwrap()
        .unwrap();
    assert_eq!(samples, 800);
    assert!(quantile_units.abs_diff(a.p90_units.unwrap()) <= 1);
    assert_eq!(
        projections
            .at()
            .route_estimate_at("summarize", Some("model-z"), 900_000)
            .unwrap(),
        None
    );

    // Drift: only settles reporting both counted and provider input count.
    let drift = projections.at().input_drift("summarize").unwrap().unwrap();
    assert_eq!(drift.samples, 800);
    assert_eq!(drift.multiplier_ppm(), Some(1_034_000));
    assert!(projections.at().input_drift("chat").unwrap().is_none());
    let state_bytes: usize = store::dump(projections.db())
        .unwrap()
        .iter()
        .filter(|(cf, k, _)| cf == store::DIGESTS && k.starts_with(b"summarize|model-a|"))
        .map(|(_, _, v)| v.len())
        .sum();
    assert!(state_bytes < 16 * 1024, "{state_bytes} bytes");
}
