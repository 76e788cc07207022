//! The hand-built keys are the bytes the `format!` strings they replaced
//! produced: stored keys of an existing database keep their order and
//! meaning; and the keys read back into their parts.

use reservoir_core::PartitionKey;
use reservoir_projections::store;

fn key(generation: u64) -> PartitionKey {
    PartitionKey {
        subject: "tenant-7".into(),
        route: "chat".into(),
        accounting_epoch: "2026-12".into(),
        policy_generation: generation,
    }
}

#[test]
fn keys_are_the_bytes_of_the_formats_they_replaced() {
    for generation in [0, 1, 9, 10, 12_345, u64::MAX] {
        let k = key(generation);
        let partition = format!(
            "{}|{}|{}|{:020}",
            k.subject, k.route, k.accounting_epoch, k.policy_generation
        );
        assert_eq!(store::partition_key(&k), partition);
        assert_eq!(store::parse_partition_key(&partition), Some(k.clone()));
        assert_eq!(
            store::reservation_key(&k, "r-1"),
            format!("{partition}|r-1")
        );
        assert_eq!(
            store::reservation_id_key("r-1", &k),
            format!("r-1|{partition}")
        );
        for at in [0, 7, 1_796_134_079_866, u64::MAX] {
            let finished = store::finished_key(at, &k, "r-1");
            assert_eq!(finished, format!("{at:020}|{partition}|r-1"));
            assert_eq!(
                store::finished_parts(&finished),
                Some((at, partition.as_str(), "r-1"))
            );
            assert_eq!(
                store::keys_of_finished(&finished),
                Some((format!("{partition}|r-1"), format!("r-1|{partition}")))
            );
        }
    }
}

#[test]
fn padded_numbers_sort_as_numbers() {
    let keys: Vec<String> = [3, 20, 100, u64::MAX]
        .iter()
        .map(|&g| store::partition_key(&key(g)))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}
