//! The key that signs emergency shards: ed25519 (`ed25519-dalek`).
//!
//! The key is a file holding the 32-byte secret seed as 64 hex digits. It is
//! either configured (`--shard-key-file`; every node of a cluster must name
//! the same key) or, by default, `<data dir>/shard-signing.key`, generated on
//! first start from the OS's random source and written with mode 0600 (created
//! exclusively, so two processes never write two keys). A key file that the
//! group or others can read is refused at start: a leaked key lets anyone mint
//! shards. The public key is served at `GET /v1/shards/public-key`, so a
//! gateway can verify a shard offline.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use super::ShardDocument;

/// File name of the generated key inside the data directory.
pub const KEY_FILE_NAME: &str = "shard-signing.key";

/// Prefix of a signature string.
pub const SIGNATURE_PREFIX: &str = "ed25519:";

/// Signs and verifies shard documents.
pub struct ShardSigner {
    key: SigningKey,
    path: PathBuf,
}

impl std::fmt::Debug for ShardSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("ShardSigner")
            .field("path", &self.path)
            .field("public_key", &self.public_key_hex())
            .finish()
    }
}

/// Why a presented signature does not verify.
#[derive(Debug, PartialEq, Eq)]
pub enum BadSignature {
    Malformed,
    Mismatch,
}

impl ShardSigner {
    /// Reads the configured key file, or the data directory's, generating the
    /// latter if it does not exist yet.
    pub fn load_or_create(data_dir: &Path, configured: Option<&Path>) -> Result<Self, String> {
        let path = match configured {
            Some(p) => p.to_path_buf(),
            None => data_dir.join(KEY_FILE_NAME),
        };
        if configured.is_none() && !path.exists() {
            std::fs::create_dir_all(data_dir)
                .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| format!("no OS randomness: {e}"))?;
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path);
            match created {
                Ok(mut f) => {
                    f.write_all(hex::encode(seed).as_bytes())
                        .and_then(|_| f.sync_all())
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                }
                // Another process made it first: read theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
            }
        }
        Self::read(&path)
    }

    fn read(path: &Path) -> Result<Self, String> {
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("shard signing key {}: {e}", path.display()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "shard signing key {} is readable by group or others (mode {:o}); chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("shard signing key {}: {e}", path.display()))?;
        let bytes = hex::decode(text.trim())
            .map_err(|_| format!("shard signing key {}: not hex", path.display()))?;
        let seed: [u8; 32] = bytes.try_into().map_err(|_| {
            format!(
                "shard signing key {}: want 32 bytes (64 hex digits)",
                path.display()
            )
        })?;
        Ok(ShardSigner {
            key: SigningKey::from_bytes(&seed),
            path: path.to_path_buf(),
        })
    }

    /// A key from its 32-byte seed, in memory only (the simulator's fixed
    /// key: a run's signatures are the same on every replay).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        ShardSigner {
            key: SigningKey::from_bytes(&seed),
            path: PathBuf::from("(in memory)"),
        }
    }

    /// Hex of the 32-byte public key.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    /// `ed25519:<hex>` over the document's canonical bytes.
    pub fn sign(&self, doc: &ShardDocument) -> String {
        let signature = self.key.sign(doc.canonical().as_bytes());
        format!("{SIGNATURE_PREFIX}{}", hex::encode(signature.to_bytes()))
    }

    /// Whether `doc.signature` is this key's signature over `doc`.
    pub fn verify(&self, doc: &ShardDocument) -> Result<(), BadSignature> {
        verify_with(&self.key.verifying_key(), doc)
    }
}

fn verify_with(key: &VerifyingKey, doc: &ShardDocument) -> Result<(), BadSignature> {
    let hex_sig = doc
        .signature
        .strip_prefix(SIGNATURE_PREFIX)
        .ok_or(BadSignature::Malformed)?;
    let bytes: [u8; 64] = hex::decode(hex_sig)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(BadSignature::Malformed)?;
    key.verify(doc.canonical().as_bytes(), &Signature::from_bytes(&bytes))
        .map_err(|_| BadSignature::Mismatch)
}
