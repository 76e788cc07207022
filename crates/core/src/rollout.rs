//! Staged rollout and shadow mode: whether a policy enforces its limits on
//! its route or only records what enforcement would have decided.
//!
//! A policy with `shadow_mode` runs in shadow. Otherwise a policy with a
//! [`Rollout`] enforces on a route only if a stable hash of the rollout's
//! salt and the route falls below its fraction (the first seed: "enable real
//! reservations for 1% of routes"), and runs in shadow on the rest. The hash
//! is FNV-1a (64 bit) over `salt`, a newline and the route, reduced to parts
//! per million: the same on every node and in every replay, and monotone in
//! the fraction, so raising it only adds routes.

use serde::{Deserialize, Serialize};

/// Parts per million: the whole.
pub const PER_MILLION: u32 = 1_000_000;

/// The operator's rollout setting, part of the published policy (so in the log).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rollout {
    /// Routes enforced, in parts per million (0 ..= 1,000,000).
    pub enforced_per_million: u32,
    /// Chooses which routes: the same salt keeps the same routes enforced.
    pub salt: String,
}

/// Which mode a reserve was decided in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Enforce,
    Shadow,
}

impl Rollout {
    /// Where `route` falls, in parts per million.
    pub fn place_of(&self, route: &str) -> u32 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let bytes = self.salt.bytes().chain([b'\n']).chain(route.bytes());
        let hash = bytes.fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        u32::try_from(hash % u64::from(PER_MILLION)).expect("below a million")
    }

    /// Whether this rollout enforces on `route`.
    pub fn enforces(&self, route: &str) -> bool {
        self.place_of(route) < self.enforced_per_million
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Vec<String> {
        (0..10_000).map(|i| format!("route-{i}")).collect()
    }

    #[test]
    fn the_fraction_enforced_is_about_the_fraction_asked() {
        let r = Rollout {
            enforced_per_million: 10_000,
            salt: "s".into(),
        };
        let enforced = routes().iter().filter(|x| r.enforces(x)).count();
        // 1% of 10,000 routes: 100, within a generous binomial band.
        assert!((60..=140).contains(&enforced), "{enforced}");
    }

    #[test]
    fn raising_the_fraction_only_adds_routes() {
        let at = |ppm| Rollout {
            enforced_per_million: ppm,
            salt: "salt-1".into(),
        };
        let (low, high) = (at(50_000), at(200_000));
        for route in routes() {
            assert!(!low.enforces(&route) || high.enforces(&route), "{route}");
        }
        assert!(routes().iter().all(|x| at(PER_MILLION).enforces(x)));
        assert!(!routes().iter().any(|x| at(0).enforces(x)));
    }

    #[test]
    fn the_place_is_stable_and_the_salt_changes_it() {
        let a = Rollout {
            enforced_per_million: 0,
            salt: "a".into(),
        };
        // Pinned: a change of the hash would move routes between modes.
        assert_eq!(a.place_of("chat.generate"), 186_457);
        let b = Rollout {
            salt: "b".into(),
            ..a.clone()
        };
        let moved = routes()
            .iter()
            .filter(|x| a.place_of(x) != b.place_of(x))
            .count();
        assert!(moved > 9_900, "{moved}");
    }
}
