//! Giving freed memory back to the system.
//!
//! RocksDB's C++ allocations go to glibc's malloc (Rust's go to mimalloc),
//! which spreads them over per-thread arenas and keeps what is freed inside
//! them. Measured once, with `malloc_stats()` in a server at 2 M reserve →
//! start → settle cycles (`scripts/bench-bounded`): glibc held 164 MB, of
//! which 100 MB was in use; the other 64 MB were free and still resident. A
//! thread returns them every [`TRIM_INTERVAL`] with `malloc_trim(0)`, which
//! releases the free pages of every arena, not only the top of the main heap.
//! Over 10 M cycles the server's peak went from 271 to 243 MiB
//! (`bench-results/bounded-state.md`).
//!
//! A process-wide concern, so the binary starts it (`reservoir serve` and
//! `reservoir project`, the commands that hold databases open); in-process
//! servers of the tests do without.

use std::time::Duration;

/// How often freed memory is returned.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Starts the trimming thread; call it once per process. Without glibc there
/// is nothing to do.
pub fn start_trimming() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    std::thread::Builder::new()
        .name("memory-trim".into())
        .spawn(|| loop {
            std::thread::sleep(TRIM_INTERVAL);
            // SAFETY: malloc_trim takes no pointers and may run at any time.
            unsafe {
                libc::malloc_trim(0);
            }
        })
        .expect("spawn the memory trim thread");
}
