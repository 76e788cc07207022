//! Identities and small value types shared by commands, events and state.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::rejection::InvalidInput;

/// Capacity is counted in whole units (tokens, requests, ...). Never fractional.
pub type Units = u64;

/// Milliseconds since the Unix epoch, as assigned by the partition's writer.
/// The core never reads a clock: every timestamp arrives inside a command.
pub type TimestampMs = u64;

/// Longest identifier we accept anywhere (reservation, operation, shard, move ids,
/// and each part of a partition key). A limit with a name and a test.
pub const MAX_ID_BYTES: usize = 128;

/// Checks an identifier: 1..=MAX_ID_BYTES bytes of `[A-Za-z0-9._:/@-]`.
/// Kept strict so ids are safe in URLs, log keys and CSV without escaping.
pub fn validate_id(kind: &'static str, value: &str) -> Result<(), InvalidInput> {
    if value.is_empty() || value.len() > MAX_ID_BYTES {
        return Err(InvalidInput::IdLength { kind });
    }
    let ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'-'));
    if !ok {
        return Err(InvalidInput::IdCharacters { kind });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps an identifier.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
                let value = value.into();
                validate_id($kind, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidInput;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// Client-chosen reservation id: the idempotency key of a reserve.
    ReservationId,
    "reservation id"
);
string_id!(
    /// Id the executor binds when it starts the call; the operation receipt names it.
    OperationId,
    "operation id"
);
string_id!(
    /// Id of an emergency shard (`emergencyShard.v1`).
    ShardId,
    "shard id"
);
string_id!(
    /// Id pairing the two halves of a capacity move between partitions.
    MoveId,
    "move id"
);

/// sha256 of the canonical request. Same reservation id + same digest is a retry;
/// same id + different digest is a different request and is rejected.
///
/// Serialized (JSON read models, snapshots, state documents) as 64 lowercase
/// hex digits. Documents written before that hold an array of 32 numbers,
/// which is still read.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestDigest(pub [u8; 32]);

impl RequestDigest {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl Serialize for RequestDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut digits = [0u8; 64];
        hex::encode_to_slice(self.0, &mut digits).expect("64 digits for 32 bytes");
        serializer.serialize_str(std::str::from_utf8(&digits).expect("hex is ASCII"))
    }
}

impl<'de> Deserialize<'de> for RequestDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Digest;
        impl<'de> serde::de::Visitor<'de> for Digest {
            type Value = RequestDigest;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sha-256 digest: 64 hex digits, or an array of 32 bytes")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RequestDigest, E> {
                let mut bytes = [0u8; 32];
                hex::decode_to_slice(v, &mut bytes).map_err(E::custom)?;
                Ok(RequestDigest(bytes))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<RequestDigest, A::Error> {
                let bytes =
                    <[u8; 32]>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(RequestDigest(bytes))
            }
        }
        deserializer.deserialize_any(Digest)
    }
}

impl fmt::Debug for RequestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

/// The aggregate's identity. One writer owns a partition at a time, and all its
/// events go to one log partition, in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionKey {
    /// Who is limited, e.g. `tenant-7`.
    pub subject: String,
    /// What is limited, e.g. `chat.generate`.
    pub route: String,
    /// Accounting window the balances belong to, e.g. `2026-07-19T14:00Z`.
    pub accounting_epoch: String,
    /// Policy generation the partition runs under.
    pub policy_generation: u64,
}

impl PartitionKey {
    pub fn new(
        subject: impl Into<String>,
        route: impl Into<String>,
        accounting_epoch: impl Into<String>,
        policy_generation: u64,
    ) -> Result<Self, InvalidInput> {
        let key = Self {
            subject: subject.into(),
            route: route.into(),
            accounting_epoch: accounting_epoch.into(),
            policy_generation,
        };
        key.validate()?;
        Ok(key)
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate_id("subject", &self.subject)?;
        validate_id("route", &self.route)?;
        validate_id("accounting epoch", &self.accounting_epoch)?;
        Ok(())
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}|{}|{}|g{}",
            self.subject, self.route, self.accounting_epoch, self.policy_generation
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A digest is written as hex; one written as 32 numbers, as read models
    /// and snapshots held it before, is still read; anything else is refused.
    #[test]
    fn a_digest_is_hex_and_the_old_array_form_still_reads() {
        let digest = RequestDigest(std::array::from_fn(|i| (i * 8) as u8));
        let hex = serde_json::to_value(digest).unwrap();
        assert_eq!(hex, serde_json::json!(digest.to_hex()));
        assert_eq!(digest.to_hex().len(), 64);
        assert!(digest.to_hex().starts_with("00081018"));
        let old = serde_json::to_value(digest.0).unwrap();
        assert!(old.is_array());
        for form in [hex, old] {
            assert_eq!(
                serde_json::from_value::<RequestDigest>(form).unwrap(),
                digest
            );
        }
        for bad in [
            serde_json::json!("00"),
            serde_json::json!("zz".repeat(32)),
            serde_json::json!([1, 2, 3]),
            serde_json::json!(7),
        ] {
            assert!(
                serde_json::from_value::<RequestDigest>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
