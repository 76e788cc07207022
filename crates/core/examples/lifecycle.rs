//! A reservation's whole life on one partition, printed event by event with the
//! conservation check after each: `cargo run --release -p reservoir-core --example lifecycle`.

use reservoir_core::*;

fn main() {
    let key =
        PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T14:00Z", 31).expect("valid key");
    let policy = Policy::example("tenant-7", "chat.generate", 31);
    let id = |s: &str| ReservationId::new(s).expect("valid id");
    let op = OperationId::new("op-1").expect("valid id");
    let mut partition = Partition::default();
    let script = [
        (0, Command::OpenPartition { key, policy }),
        (
            10,
            Command::Reserve {
                further_units: Vec::new(),
                id: id("rl-1"),
                digest: RequestDigest([1; 32]),
                units: 4_000,
                sizing: None,
            },
        ),
        (
            20,
            Command::Start {
                id: id("rl-1"),
                operation_id: op.clone(),
            },
        ),
        (
            30,
            Command::Settle {
                further_actual_units: Vec::new(),
                id: id("rl-1"),
                operation_id: Some(op),
                actual_units: 1_850,
                usage: None,
            },
        ),
        (
            40,
            Command::Reserve {
                further_units: Vec::new(),
                id: id("rl-2"),
                digest: RequestDigest([2; 32]),
                units: 9_000,
                sizing: None,
            },
        ),
        (
            50,
            Command::Reserve {
                further_units: Vec::new(),
                id: id("rl-1"),
                digest: RequestDigest([1; 32]),
                units: 4_000,
                sizing: None,
            },
        ),
    ];
    for (now_ms, command) in script {
        match decide(&partition, &command, now_ms) {
            Ok(events) if events.is_empty() => {
                println!("{now_ms:>6} ms  idempotent retry: answered from the record")
            }
            Ok(events) => {
                for event in events {
                    apply(&mut partition, &event);
                    partition.check_invariants().expect("conservation holds");
                    let l = &partition.ledger;
                    println!(
                        "{now_ms:>6} ms  #{:<3} {:<16} available {:>6}  reserved {:>6}  spent {:>6}  debt {:>5}  conservation ok",
                        event.sequence,
                        event.body.type_name(),
                        l.available_units,
                        l.reserved_units,
                        l.spent_units,
                        partition.debt_units()
                    );
                }
            }
            Err(rejection) => println!(
                "{now_ms:>6} ms  refused [{}]: {rejection}",
                rejection.code()
            ),
        }
    }
}
