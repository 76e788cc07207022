//! RocksDB table settings every database of ours opens with (the embedded
//! log, the projections, the writer's idempotency index), so a server's
//! memory does not follow the size of what it stores, and a lookup costs the
//! same at ten million records as at one.
//!
//! By default RocksDB keeps each open table file's index and filter blocks in
//! memory outside any cache: with the data on disk growing (a log keeps every
//! record) that memory grows with it, about 15 MiB per million cycles across
//! our databases. Here they live in the block cache, bounded by its capacity,
//! with level-0 files' pinned (they are read on every lookup).
//!
//! They are also *partitioned* (a two-level index, filters cut into
//! [`METADATA_BLOCK_BYTES`] pieces). A cache is split into shards of about
//! 512 KiB each, and a whole-file index or filter block of a full-size table
//! file (64 MiB of data, ~600 KiB of bloom filter for the idempotency index)
//! is larger than a shard: it was read from disk, checksummed and dropped
//! again on *every* lookup. `scripts/bench-bounded` showed it: at 3 M
//! reservations, 12 % of the server's CPU samples were the checksum of filter
//! blocks read back for the lookup every reserve makes, and throughput had
//! fallen 15 %. Partitions are small blocks that stay cached; only the top
//! level of each file is pinned.

use rocksdb::{BlockBasedIndexType, BlockBasedOptions, Cache};

/// Size of one index or filter partition.
pub const METADATA_BLOCK_BYTES: usize = 4 << 10;

/// Table options reading through `cache` (data, index and filter blocks).
pub fn table_options(cache: &Cache) -> BlockBasedOptions {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(METADATA_BLOCK_BYTES);
    table.set_pin_top_level_index_and_filter(true);
    table
}
