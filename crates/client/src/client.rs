//! [`Client`]: the ledger's HTTP API as retried, typed steps.
//!
//! Each step is sent again with the same arguments until it is answered or its
//! deadline passes (see [`crate::retry`]): reserve keeps its id and body,
//! start its operation id, settle its amount. A reserve that may have reached
//! the ledger but was never answered ends as [`Error::ReservationUnknown`],
//! resolved by [`Client::resolve`] — the same reserve again, which the ledger
//! answers with the original receipt if it holds one.

use reqwest::StatusCode;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::background::Background;
use crate::error::Error;
use crate::fallback::{Fallback, NotAdmitted};
use crate::http::{problem, rejected, Exchange};
use crate::lease::{Hold, Reservation};
use crate::owners::{About, Owners};
use crate::retry::{self, Attempt, RetryPolicy};
use crate::transport::{ReqwestTransport, Timer, TokioTimer, Transport};
use crate::types::{
    path_segment, ActivePolicyBody, OperationId, Receipt, ReservationId, ReserveRequest, RouteInfo,
    Settlement,
};

/// Builds a [`Client`].
pub struct ClientBuilder {
    base_url: String,
    retry: RetryPolicy,
    transport: Option<Arc<dyn Transport>>,
    timer: Option<Arc<dyn Timer>>,
    fallback: Option<Arc<dyn Fallback>>,
    token: Option<String>,
    cluster_nodes: Vec<String>,
}

impl ClientBuilder {
    /// Every node of the cluster (their URLs as the nodes name each other in
    /// `--peers`). Requests still start at the configured URL; a forwarded
    /// answer then names the owner of its partition, and later requests for
    /// the same subject/route or reservation go there directly, if it is one
    /// of these (see [`crate::owners`]). Empty (the default): always the
    /// configured URL.
    pub fn cluster_nodes(mut self, nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.cluster_nodes = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// The bearer token sent on every request (`reservoir token create
    /// --scope gateway --subject ...`); the ledger answers 401 without one
    /// when it authenticates.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// A `reqwest::Client` of the gateway's own (connection pool, TLS, proxies).
    pub fn http(mut self, http: reqwest::Client) -> Self {
        self.transport = Some(Arc::new(ReqwestTransport { http }));
        self
    }

    /// What carries the requests instead of reqwest (see [`crate::transport`]).
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// The retry loop's clock and sleeps instead of tokio's (see [`crate::transport`]).
    pub fn timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.timer = Some(timer);
        self
    }

    /// What to admit while the ledger cannot be reached (emergency shards plug in here).
    pub fn fallback(mut self, fallback: Arc<dyn Fallback>) -> Self {
        self.fallback = Some(fallback);
        self
    }

    pub fn build(self) -> Client {
        Client {
            inner: Arc::new(Inner {
                transport: self
                    .transport
                    .unwrap_or_else(|| Arc::new(ReqwestTransport::default())),
                timer: self
                    .timer
                    .unwrap_or_else(|| Arc::new(TokioTimer::default())),
                base: self.base_url.trim_end_matches('/').to_string(),
                retry: self.retry,
                routes: Mutex::new(HashMap::new()),
                background: Arc::default(),
                fallback: self.fallback,
                token: self.token,
                owners: (!self.cluster_nodes.is_empty()).then(|| Owners::new(&self.cluster_nodes)),
            }),
        }
    }
}

/// The gateway's handle on the ledger; cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) timer: Arc<dyn Timer>,
    pub(crate) base: String,
    pub(crate) retry: RetryPolicy,
    routes: Mutex<HashMap<(String, String), RouteInfo>>,
    pub(crate) background: Arc<Background>,
    fallback: Option<Arc<dyn Fallback>>,
    pub(crate) token: Option<String>,
    /// Owners learnt from forwarded answers (`None`: no cluster nodes given).
    pub(crate) owners: Option<Owners>,
}

impl Client {
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.to_string(),
            retry: RetryPolicy::default(),
            transport: None,
            timer: None,
            fallback: None,
            token: None,
            cluster_nodes: Vec::new(),
        }
    }

    pub fn new(base_url: &str) -> Client {
        Client::builder(base_url).build()
    }

    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// Reserves under a fresh id and returns the RESERVED handle (start it, or
    /// drop it to release). Reads the route first (cached), so the handle knows
    /// the capacity unit and priority.
    pub async fn reserve(&self, request: ReserveRequest) -> Result<Reservation, Error> {
        self.reserve_as(ReservationId::random(), request).await
    }

    /// The same under an id of the caller's (e.g. its own request id).
    pub async fn reserve_as(
        &self,
        id: ReservationId,
        request: ReserveRequest,
    ) -> Result<Reservation, Error> {
        let route = match self.route(&request.subject, &request.route).await {
            Ok(route) => route,
            Err(Error::Unavailable(why)) => return self.fall_back(id, request, None, why),
            Err(e) => return Err(e),
        };
        match self.reserve_receipt(&id, &request).await {
            Ok(receipt) => {
                let route = if receipt.policy_generation != route.policy_generation {
                    // A newer generation took over: its priority and unit, if readable now.
                    self.refresh_route(&request.subject, &request.route)
                        .await
                        .unwrap_or(route)
                } else {
                    route
                };
                Ok(Reservation::new(
                    self.clone(),
                    request,
                    route,
                    Hold::Ledger(receipt),
                ))
            }
            Err(Error::Unavailable(why)) => self.fall_back(id, request, Some(route), why),
            Err(e) => Err(e),
        }
    }

    /// The ledger was never reached: ask the fallback, if any, for a local
    /// hold. Only for a route whose settings were read before: the hold
    /// settles in the route's capacity unit, and a guessed one would settle
    /// a call of a route counted in requests as its tokens.
    fn fall_back(
        &self,
        id: ReservationId,
        request: ReserveRequest,
        route: Option<RouteInfo>,
        why: String,
    ) -> Result<Reservation, Error> {
        let Some(fallback) = &self.inner.fallback else {
            return Err(Error::Unavailable(why));
        };
        let not_admitted = |reason: NotAdmitted| {
            Error::Unavailable(format!("{why}; not admitted locally: {reason}"))
        };
        let Some(route) = route.or_else(|| self.cached_route(&request.subject, &request.route))
        else {
            return Err(not_admitted(NotAdmitted::RouteUnknown));
        };
        let hold = fallback
            .admit(&id, &request, &route)
            .map_err(not_admitted)?;
        metrics::counter!("reservoir_client_fallback_admissions_total").increment(1);
        Ok(Reservation::new(
            self.clone(),
            request,
            route,
            Hold::Local { id, hold },
        ))
    }

    /// `POST /v1/reservations` with `id`, retried with the same id and body.
    /// Lost answers end as [`Error::ReservationUnknown`]; an `Unavailable`
    /// means no attempt can have reached the ledger.
    pub async fn reserve_receipt(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
    ) -> Result<Receipt, Error> {
        let body = request.body(id);
        let maybe_reached = std::sync::atomic::AtomicBool::new(false);
        // The last refusal, when 429s are retried (`retry_refusals`): the
        // ledger decided, so running out of time ends in it, never in a
        // fallback that would admit what the ledger refused.
        let refused = Mutex::new(None);
        let result = retry::run(
            &self.inner.retry,
            self.inner.timer.as_ref(),
            "reserve",
            |timeout| {
                let body = &body;
                let maybe_reached = &maybe_reached;
                let refused = &refused;
                async move {
                    let exchange = self
                        .exchange_about(
                            About::reserve(id, request),
                            reqwest::Method::POST,
                            "/v1/reservations",
                            Some(body),
                            timeout,
                        )
                        .await;
                    let reached = match &exchange {
                        Exchange::Lost { maybe_sent, .. } => *maybe_sent,
                        Exchange::Answer { status, body, .. } => may_have_applied(*status, body),
                    };
                    if reached {
                        maybe_reached.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if let Exchange::Answer {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        retry_after,
                        body,
                        ..
                    } = &exchange
                    {
                        *refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(Error::Refused {
                            problem: Box::new(crate::http::problem(body)),
                            retry_after: *retry_after,
                        });
                    }
                    self.classify(exchange)
                }
            },
            Error::Unavailable,
        )
        .await;
        let refused = refused.into_inner().unwrap_or_else(|p| p.into_inner());
        let result = match (result, refused) {
            (Err(Error::Unavailable(_)), Some(refusal))
                if !maybe_reached.load(Ordering::SeqCst) =>
            {
                Err(refusal)
            }
            (result, _) => result,
        };
        if let Some(fallback) = &self.inner.fallback {
            // The ledger decided (admitted, refused or rejected) this reserve,
            // or a resolve of it: reachable, whatever came before.
            if matches!(
                result,
                Ok(_) | Err(Error::Refused { .. } | Error::Rejected { .. })
            ) {
                fallback.ledger_answered();
            }
        }
        match result {
            Err(Error::Unavailable(last)) if maybe_reached.into_inner() => {
                metrics::counter!("reservoir_client_reservation_unknown_total").increment(1);
                Err(Error::ReservationUnknown {
                    id: id.clone(),
                    last,
                })
            }
            other => other,
        }
    }

    /// Resolves RESERVATION_UNKNOWN: the same reserve, same id and body,
    /// asked again. The ledger answers the original receipt if it committed
    /// one, else reserves now; either way exactly one debit.
    pub async fn resolve(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
    ) -> Result<Receipt, Error> {
        self.reserve_receipt(id, request).await
    }

    /// RESERVED → STARTED under `operation_id` (repeatable with the same one).
    pub async fn start(
        &self,
        id: &ReservationId,
        operation_id: &OperationId,
    ) -> Result<Receipt, Error> {
        let body = serde_json::json!({ "operation_id": operation_id });
        self.write(
            id,
            &format!("/v1/reservations/{}/start", path_segment(id.as_str())),
            &body,
            "start",
            false,
        )
        .await
    }

    /// Settles with a fixed amount; every retry sends the same one.
    pub async fn settle(
        &self,
        id: &ReservationId,
        settlement: &Settlement,
    ) -> Result<Receipt, Error> {
        let body =
            serde_json::to_value(settlement).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let receipt = self
            .write(
                id,
                &format!("/v1/reservations/{}/settle", path_segment(id.as_str())),
                &body,
                "settle",
                true,
            )
            .await?;
        crate::metrics::settled(&receipt);
        Ok(receipt)
    }

    /// Gives back an unstarted reservation.
    pub async fn release(&self, id: &ReservationId) -> Result<Receipt, Error> {
        let body = serde_json::json!({});
        let receipt = self
            .write(
                id,
                &format!("/v1/reservations/{}/release", path_segment(id.as_str())),
                &body,
                "release",
                true,
            )
            .await?;
        crate::metrics::settled(&receipt);
        Ok(receipt)
    }

    /// The committed receipt, or `None` if the ledger holds no such id.
    pub async fn get(&self, id: &ReservationId) -> Result<Option<Receipt>, Error> {
        let path = format!("/v1/reservations/{}", path_segment(id.as_str()));
        let result = retry::run(
            &self.inner.retry,
            self.inner.timer.as_ref(),
            "get",
            |timeout| {
                let path = &path;
                async move {
                    let exchange = self
                        .exchange_about(
                            About::reservation(id),
                            reqwest::Method::GET,
                            path,
                            None,
                            timeout,
                        )
                        .await;
                    match exchange {
                        Exchange::Answer { status, body, .. }
                            if status == StatusCode::NOT_FOUND =>
                        {
                            match problem(&body).code() {
                                "unknown_reservation" => Attempt::Done(None),
                                _ => Attempt::Fail(rejected(status, &body)),
                            }
                        }
                        other => match self.classify::<Receipt>(other) {
                            Attempt::Done(r) => Attempt::Done(Some(r)),
                            Attempt::Again { why, after } => Attempt::Again { why, after },
                            Attempt::Fail(e) => Attempt::Fail(e),
                        },
                    }
                }
            },
            Error::Unavailable,
        )
        .await;
        result
    }

    /// The route's settings (default `max_tokens`, priority, capacity unit), cached.
    pub async fn route(&self, subject: &str, route: &str) -> Result<RouteInfo, Error> {
        match self.cached_route(subject, route) {
            Some(info) => Ok(info),
            None => self.refresh_route(subject, route).await,
        }
    }

    fn cached_route(&self, subject: &str, route: &str) -> Option<RouteInfo> {
        let routes = self.inner.routes.lock().expect("route cache");
        routes
            .get(&(subject.to_string(), route.to_string()))
            .cloned()
    }

    /// Reads the route's active policy again (a receipt showed a newer generation).
    pub async fn refresh_route(&self, subject: &str, route: &str) -> Result<RouteInfo, Error> {
        let path = format!(
            "/v1/policies/{}/{}",
            path_segment(subject),
            path_segment(route)
        );
        let info: RouteInfo = retry::run(
            &self.inner.retry,
            self.inner.timer.as_ref(),
            "policy",
            |timeout| {
                let path = &path;
                async move {
                    let exchange = self
                        .exchange(reqwest::Method::GET, path, None, timeout)
                        .await;
                    match self.classify::<ActivePolicyBody>(exchange) {
                        Attempt::Done(body) => Attempt::Done(RouteInfo::from(body)),
                        Attempt::Again { why, after } => Attempt::Again { why, after },
                        Attempt::Fail(e) => Attempt::Fail(e),
                    }
                }
            },
            Error::Unavailable,
        )
        .await?;
        self.inner
            .routes
            .lock()
            .expect("route cache")
            .insert((subject.to_string(), route.to_string()), info.clone());
        Ok(info)
    }

    /// Puts the route's default `max_tokens` into a provider request body that
    /// sets none (`max_tokens`, or OpenAI's `max_completion_tokens`); returns the
    /// limit the request now carries. Reserve with it, and sizing is exact.
    pub async fn inject_max_tokens(
        &self,
        subject: &str,
        route: &str,
        body: &mut Value,
    ) -> Result<Option<u64>, Error> {
        for key in ["max_tokens", "max_completion_tokens"] {
            if let Some(given) = body.get(key).and_then(Value::as_u64) {
                return Ok(Some(given));
            }
        }
        let info = self.route(subject, route).await?;
        if let (Some(default), Some(object)) = (info.default_max_tokens, body.as_object_mut()) {
            object.insert("max_tokens".to_string(), default.into());
        }
        Ok(info.default_max_tokens)
    }

    /// Waits until every settle or release begun by a dropped handle finished.
    pub async fn flush(&self) {
        self.inner.background.idle().await;
    }

    /// Background settles or releases that failed for good (see the logs for which).
    pub fn background_failures(&self) -> u64 {
        self.inner.background.failures()
    }

    /// A step of reservation `id` (start, settle, release), at its owner
    /// when known; `ends`: the step ends the reservation.
    async fn write(
        &self,
        id: &ReservationId,
        path: &str,
        body: &Value,
        step: &'static str,
        ends: bool,
    ) -> Result<Receipt, Error> {
        let receipt = retry::run(
            &self.inner.retry,
            self.inner.timer.as_ref(),
            step,
            |timeout| async move {
                let exchange = self
                    .exchange_about(
                        About::reservation(id),
                        reqwest::Method::POST,
                        path,
                        Some(body),
                        timeout,
                    )
                    .await;
                self.classify(exchange)
            },
            Error::Unavailable,
        )
        .await?;
        if let (true, Some(owners)) = (ends, &self.inner.owners) {
            owners.ended(id.as_str());
        }
        Ok(receipt)
    }

    /// The owner learnt for a subject/route, if any (cluster mode with
    /// [`ClientBuilder::cluster_nodes`]; see [`crate::owners`]).
    pub fn owner_of_route(&self, subject: &str, route: &str) -> Option<String> {
        let owners = self.inner.owners.as_ref()?;
        owners.of_route(subject, route).map(|n| n.to_string())
    }

    /// The owner learnt for reservation `id`, if any.
    pub fn owner_of_reservation(&self, id: &ReservationId) -> Option<String> {
        let owners = self.inner.owners.as_ref()?;
        owners.of_id(id.as_str()).map(|n| n.to_string())
    }
}

/// Whether a POST answered `status` may have been applied all the same: a
/// 503 from a writer that appended and was then fenced, a 502 or 504 from a
/// proxy that forwarded the request and stopped waiting. Not a 503
/// `not_ready`: a ledger still recovering from its log decides nothing, so
/// a reserve it answered that way is not unknown (and may fall back to a
/// shard once the retries give up).
pub(crate) fn may_have_applied(status: StatusCode, body: &[u8]) -> bool {
    match status {
        StatusCode::SERVICE_UNAVAILABLE => crate::http::problem(body).code() != "not_ready",
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => true,
        _ => false,
    }
}
