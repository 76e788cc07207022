//! The progress bar of long runs: entries read, rate and ETA, on standard
//! error, only when it is a terminal and `--quiet` was not given (pipes and
//! CI logs stay clean).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` log entries; hidden unless stderr is a terminal.
pub fn bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} entries  {per_sec}  ETA {eta}",
        )
        .expect("static template"),
    );
    bar
}
