//! RocksDB table settings every database of ours opens with (the embedded
//! log, the projections, the writer's idempotency index), so a server's
//! memory does not follow the size of what it stores.
//!
//! By default RocksDB keeps each open table file's index and filter blocks in
//! memory outside any cache: with the data on disk growing (a log keeps every
//! record) that memory grows with it, about 15 MiB per million cycles across
//! our databases. Here they live in the block cache, bounded by its capacity,
//! with level-0 files' pinned (they are read on every lookup).

use rocksdb::{BlockBasedOptions, Cache};

/// Table options reading through `cache` (data, index and filter blocks).
pub fn table_options(cache: &Cache) -> BlockBasedOptions {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table
}
