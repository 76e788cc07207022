//! Cluster mode: which node owns what, learnt from the `x-reservoir-served-by`
//! header a node sets on an answer it forwarded from the partition's owner.
//!
//! With [`crate::ClientBuilder::cluster_nodes`], a reserve whose answer was
//! forwarded teaches the client the owner of its subject/route, and the later
//! reserves of that subject/route and the later steps of that reservation
//! (start, settle, release, read) go to the owner directly, one hop fewer. The
//! client only ever follows a node in the list it was given: a header naming
//! anything else is ignored, so an answer cannot send the gateway's token to
//! a URL the operator did not name.
//!
//! A node that cannot be reached, times out or answers 503 is forgotten (every
//! entry naming it), and the retry goes to the configured URL again, which
//! forwards to whoever owns the partition now. Retries keep their ids, so
//! going another way never makes a second reservation. Each map holds at most
//! [`MAX_ENTRIES`]; a full map starts again empty (the next forwarded answer
//! teaches the owner again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;

use crate::http::Exchange;
use crate::types::{ReservationId, ReserveRequest};

/// The header a forwarding node sets: the owner's URL.
pub const SERVED_BY: &str = "x-reservoir-served-by";

/// Entries each map holds at most.
pub const MAX_ENTRIES: usize = 65_536;

/// What a request is about: its reservation, and for a reserve the
/// subject/route (whose owner is looked up, and learnt, too).
pub(crate) struct About<'a> {
    id: &'a str,
    route: Option<(&'a str, &'a str)>,
}

impl<'a> About<'a> {
    pub(crate) fn reserve(id: &'a ReservationId, request: &'a ReserveRequest) -> Self {
        About {
            id: id.as_str(),
            route: Some((&request.subject, &request.route)),
        }
    }

    /// A later step of reservation `id` (start, settle, release, read).
    pub(crate) fn reservation(id: &'a ReservationId) -> Self {
        About {
            id: id.as_str(),
            route: None,
        }
    }
}

/// Owners learnt so far, and the nodes the client may follow.
pub(crate) struct Owners {
    nodes: Vec<Arc<str>>,
    routes: Mutex<HashMap<(String, String), Arc<str>>>,
    ids: Mutex<HashMap<String, Arc<str>>>,
}

fn normalized(url: &str) -> &str {
    url.trim_end_matches('/')
}

impl Owners {
    pub(crate) fn new(nodes: &[String]) -> Owners {
        Owners {
            nodes: nodes.iter().map(|n| Arc::from(normalized(n))).collect(),
            routes: Mutex::default(),
            ids: Mutex::default(),
        }
    }

    /// The listed node `url` names, if it names one.
    pub(crate) fn listed(&self, url: &str) -> Option<Arc<str>> {
        let url = normalized(url);
        self.nodes.iter().find(|n| &***n == url).cloned()
    }

    /// Where a request `about` goes: the owner learnt for its subject/route
    /// (a reserve) or its reservation; `None`: the configured URL.
    pub(crate) fn of(&self, about: &About<'_>) -> Option<Arc<str>> {
        match about.route {
            Some((subject, route)) => self.of_route(subject, route),
            None => self.of_id(about.id),
        }
    }

    /// What an exchange at `asked` (an owner, or the configured URL when
    /// `None`) teaches: a forwarded answer names the owner of the request's
    /// subject/route and reservation; an owner that answered itself keeps
    /// the reservation; one that failed or answered 503 is forgotten.
    pub(crate) fn learn(&self, exchange: &Exchange, asked: Option<Arc<str>>, about: &About<'_>) {
        let failed = match exchange {
            Exchange::Lost { .. } => true,
            Exchange::Answer { status, .. } => *status == StatusCode::SERVICE_UNAVAILABLE,
        };
        if failed {
            if let Some(node) = asked {
                self.forget(&node);
            }
            return;
        }
        let owner = match exchange {
            Exchange::Answer {
                served_by: Some(url),
                ..
            } => self.listed(url),
            _ => asked,
        };
        let Some(node) = owner else { return };
        if let Some((subject, route)) = about.route {
            self.learn_route(subject, route, node.clone());
        }
        self.learn_id(about.id, node);
    }

    pub(crate) fn of_route(&self, subject: &str, route: &str) -> Option<Arc<str>> {
        let routes = self.routes.lock().expect("owner map");
        routes
            .get(&(subject.to_string(), route.to_string()))
            .cloned()
    }

    pub(crate) fn of_id(&self, id: &str) -> Option<Arc<str>> {
        self.ids.lock().expect("owner map").get(id).cloned()
    }

    fn learn_route(&self, subject: &str, route: &str, node: Arc<str>) {
        let mut routes = self.routes.lock().expect("owner map");
        if routes.len() >= MAX_ENTRIES {
            routes.clear();
        }
        routes.insert((subject.to_string(), route.to_string()), node);
    }

    fn learn_id(&self, id: &str, node: Arc<str>) {
        let mut ids = self.ids.lock().expect("owner map");
        if ids.len() >= MAX_ENTRIES {
            ids.clear();
        }
        ids.insert(id.to_string(), node);
    }

    /// The reservation ended (settled or released): nothing more goes to it.
    pub(crate) fn ended(&self, id: &str) {
        self.ids.lock().expect("owner map").remove(id);
    }

    /// Every entry naming `node` (it failed, or ownership is moving).
    pub(crate) fn forget(&self, node: &str) {
        self.routes
            .lock()
            .expect("owner map")
            .retain(|_, n| &**n != node);
        self.ids
            .lock()
            .expect("owner map")
            .retain(|_, n| &**n != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_nodes_are_followed_and_a_failed_one_is_forgotten() {
        let owners = Owners::new(&["http://a:1/".to_string(), "http://b:2".to_string()]);
        assert_eq!(owners.listed("http://b:2/").as_deref(), Some("http://b:2"));
        assert_eq!(owners.listed("http://evil:3"), None);
        let b = owners.listed("http://b:2").unwrap();
        owners.learn_route("t", "chat", b.clone());
        owners.learn_id("r-1", b.clone());
        owners.learn_id("r-2", owners.listed("http://a:1").unwrap());
        assert_eq!(owners.of_route("t", "chat").as_deref(), Some("http://b:2"));
        owners.forget("http://b:2");
        assert_eq!(owners.of_route("t", "chat"), None);
        assert_eq!(owners.of_id("r-1"), None);
        assert_eq!(owners.of_id("r-2").as_deref(), Some("http://a:1"));
        owners.ended("r-2");
        assert_eq!(owners.of_id("r-2"), None);
    }
}
