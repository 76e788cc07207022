//! Integration tests of `reservoir-replay`, one binary with a module per area.
//! Histories come from the real `reservoir` server binary over HTTP; the replay
//! tool runs as its own binary, as an auditor would run it.

mod replay {
    mod audit;
    pub mod browser;
    mod decode;
    mod determinism;
    mod html;
    mod shards;
    pub mod support;
    mod tamper;
}
