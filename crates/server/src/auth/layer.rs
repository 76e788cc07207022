//! The two HTTP layers and the extractor handlers use.
//!
//! - [`authenticate`], on the whole router: turns `Authorization: Bearer …`
//!   into a [`Principal`] in the request's extensions (anonymous without the
//!   header; a bad token is 401 at once). A principal already there was put
//!   by this process's own outer router (cluster mode), and is kept.
//! - [`require`], on each route: the scopes that grant it; anonymous is 401,
//!   a principal without one of them (or without the `{subject}`/`{tenant}`
//!   of the path) is 403.
//! - [`Principal`] as an extractor: what a handler checks a body's subject or
//!   a looked-up reservation against.

use std::sync::Arc;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

use super::{forward, Auth, Principal, Scope};
use crate::problem::ApiError;

/// 401, with the challenge RFC 6750 asks for.
pub fn unauthorized(detail: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", detail).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"reservoir\""),
    );
    response
}

pub fn forbidden(detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail)
}

/// The bearer token of `Authorization`, `Ok(None)` without the header.
pub(crate) fn bearer(headers: &HeaderMap) -> Result<Option<&str>, &'static str> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| "Authorization is not ASCII")?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() => {
            Ok(Some(token.trim()))
        }
        _ => Err("Authorization must be `Bearer <token>`"),
    }
}

/// Who the request comes from, or why it is a 401.
fn principal_of(auth: &Auth, parts: &Parts) -> Result<Principal, &'static str> {
    let Some(store) = &auth.store else {
        return Ok(Principal::unrestricted());
    };
    let token = bearer(&parts.headers)?;
    let forwarded = parts.headers.get(forward::PRINCIPAL_HEADER);
    let Some(token) = token else {
        return match forwarded {
            Some(_) => Err("a forwarded principal needs the node credential"),
            None => Ok(Principal::anonymous()),
        };
    };
    if let Some(node) = &auth.node {
        if node.matches(token) {
            return match forwarded {
                Some(value) => forward::decode(value).ok_or("unreadable forwarded principal"),
                None => Ok(Principal::node()),
            };
        }
    }
    if forwarded.is_some() {
        return Err("a forwarded principal needs the node credential");
    }
    store
        .current()
        .verify(token)
        .cloned()
        .ok_or("unknown bearer token")
}

/// The outer layer: a [`Principal`] in every request's extensions.
pub async fn authenticate(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    if parts.extensions.get::<Principal>().is_none() {
        match principal_of(&auth, &parts) {
            Ok(principal) => {
                parts.extensions.insert(principal);
            }
            Err(detail) => return unauthorized(detail),
        }
    }
    next.run(Request::from_parts(parts, body)).await
}

/// `route`, granted to `allowed` only (checked against the path's
/// `{subject}` or `{tenant}` where it has one).
pub fn require<S: Clone + Send + Sync + 'static>(
    allowed: &'static [Scope],
    route: MethodRouter<S>,
) -> MethodRouter<S> {
    route.layer(axum::middleware::from_fn_with_state(allowed, check))
}

async fn check(
    State(allowed): State<&'static [Scope]>,
    params: Result<RawPathParams, RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let params = match params {
        Ok(params) => params,
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text())
                .into_response()
        }
    };
    let subject = params
        .iter()
        .find(|(name, _)| *name == "subject" || *name == "tenant")
        .map(|(_, value)| value);
    if let Some(refused) = refusal(request.extensions().get::<Principal>(), allowed, subject) {
        return refused;
    }
    next.run(request).await
}

/// The refusal, if any: 401 for no or an anonymous principal; 403 for one
/// without a scope of `allowed`, or without `subject` where the request
/// names one.
pub fn refusal(
    principal: Option<&Principal>,
    allowed: &[Scope],
    subject: Option<&str>,
) -> Option<Response> {
    let Some(principal) = principal else {
        return Some(unauthorized("no credentials"));
    };
    if principal.is_anonymous() {
        return Some(unauthorized("this route needs a bearer token"));
    }
    if principal.may(allowed, subject) {
        return None;
    }
    let detail = match subject {
        Some(s) if principal.may(allowed, None) => {
            format!("principal {} does not hold subject {s}", principal.name)
        }
        _ => format!(
            "principal {} lacks the scope for this route",
            principal.name
        ),
    };
    Some(forbidden(detail).into_response())
}

/// A handler's caller, as [`authenticate`] found it (anonymous if the layer
/// is missing, which grants nothing).
impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Principal>()
            .cloned()
            .unwrap_or_else(Principal::anonymous))
    }
}

impl Principal {
    /// 403 unless a body's `subject` is this principal's under one of `allowed`.
    pub fn require_subject(&self, allowed: &[Scope], subject: &str) -> Result<(), ApiError> {
        match self.may(allowed, Some(subject)) {
            true => Ok(()),
            false => Err(forbidden(format!(
                "principal {} does not hold subject {subject}",
                self.name
            ))),
        }
    }
}
