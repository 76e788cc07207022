//! Which log partition a subject/route's records go to: murmur2, as Kafka's
//! Java default partitioner computes it, so other Kafka clients agree. Part
//! of the ledger's wire contract: the Kafka log places records with it, a
//! cluster node routes requests with it, and a client that knows the topic's
//! partition count and who owns each can send a request to its owner.

/// The log partition of every ledger partition of one subject and route (all
/// accounting epochs and policy generations): murmur2 of `subject|route`.
///
/// Placement is by subject and route, not by the whole partition key, because a
/// command can touch two generations of one subject/route at once (publishing
/// generation 2 closes generation 1 in the same batch), and in cluster mode the
/// owner of one Kafka partition must be able to write both. It also lets any
/// node route a request that names only a subject and route (a reserve) to the
/// owner without knowing the active generation.
pub fn log_partition_of_route(subject: &str, route: &str, partitions: u32) -> u32 {
    let mut placement = String::with_capacity(subject.len() + route.len() + 1);
    placement.push_str(subject);
    placement.push('|');
    placement.push_str(route);
    murmur2_partition(placement.as_bytes(), partitions)
}

/// Kafka's default partitioner for keyed records (Java's `murmur2(key) &
/// 0x7fffffff % partitions`), so other Kafka clients agree on placement.
pub fn murmur2_partition(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own murmur2 test vectors (`UtilsTest.testMurmur2` in Apache
    /// Kafka): our placement agrees with Java clients' default partitioner.
    #[test]
    fn murmur2_matches_kafka() {
        let vectors: [(&str, i32); 6] = [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            ("abc", 479470107),
        ];
        for (input, expected) in vectors {
            assert_eq!(murmur2(input.as_bytes()) as i32, expected, "{input}");
        }
        assert_eq!(
            murmur2_partition(b"abc", 8),
            (479470107u32 & 0x7fff_ffff) % 8
        );
    }
}
