//! Integration tests of the read side, one binary with a module per area.

mod projections {
    pub mod support;

    mod by_id;
    mod crash;
    mod diagnosis;
    mod dimensions;
    mod keys;
    mod live_vs_rebuilt;
    mod moves;
    mod retention;
    mod scenario;
    mod usage;
}
