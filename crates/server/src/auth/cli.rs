//! `reservoir token …`, and the first operator token `scripts/run` asks for.

use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::tokens::{self, NewToken};
use super::{DEFAULT_TOKENS_FILE, OPERATOR_TOKEN_FILE};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token: append its SHA-256 to the tokens file (created 0600)
    /// and print the token, once. A running server picks it up within its
    /// reload interval.
    Create {
        /// The tokens file. Default `./reservoir-data/tokens.toml`.
        #[arg(long, env = "RESERVOIR_TOKENS_FILE")]
        tokens_file: Option<PathBuf>,
        /// Who the token is for (in logs and 403 answers).
        #[arg(long)]
        principal: String,
        /// `gateway`, `tenant-read`, `operator` or `metrics`; repeat for several.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// A subject (tenant) the token reaches; repeat for several.
        #[arg(long = "subject")]
        subjects: Vec<String>,
        /// Every subject starting with this; repeat for several.
        #[arg(long = "subject-prefix")]
        subject_prefixes: Vec<String>,
    },
    /// Print a fresh random token without storing it (e.g. a cluster's node token).
    Generate,
}

pub fn run(command: TokenCommand) -> Result<(), String> {
    match command {
        TokenCommand::Create {
            tokens_file,
            principal,
            scopes,
            subjects,
            subject_prefixes,
        } => {
            let path = tokens_file
                .unwrap_or_else(|| PathBuf::from("./reservoir-data").join(DEFAULT_TOKENS_FILE));
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            let token = tokens::create(
                &path,
                &NewToken {
                    principal: &principal,
                    scopes: &scopes,
                    subjects: &subjects,
                    subject_prefixes: &subject_prefixes,
                },
            )?;
            eprintln!(
                "reservoir: token for {principal} added to {} (only its hash is stored; this is the only time it is shown)",
                path.display()
            );
            println!("{token}");
            Ok(())
        }
        TokenCommand::Generate => {
            println!("{}", tokens::generate()?);
            Ok(())
        }
    }
}

/// With no tokens file in `data_dir` (and none named): creates one holding a
/// token for principal `operator` (scopes operator, gateway and metrics, every
/// subject: enough to try the whole API) and writes the token owner-only to
/// `<data-dir>/operator.token`. Returns the tokens file if it made one.
pub fn create_operator_token(data_dir: &Path) -> Result<Option<PathBuf>, String> {
    let tokens_file = data_dir.join(DEFAULT_TOKENS_FILE);
    if tokens_file.exists() {
        return Ok(None);
    }
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let token_path = data_dir.join(OPERATOR_TOKEN_FILE);
    // A token file left by an earlier, interrupted start would no longer match.
    if token_path.exists() {
        std::fs::remove_file(&token_path)
            .map_err(|e| format!("cannot replace {}: {e}", token_path.display()))?;
    }
    let scopes = ["operator", "gateway", "metrics"].map(String::from);
    // The token file first: without the tokens file the next start makes both again.
    let token = tokens::generate()?;
    tokens::write_private(&token_path, &format!("{token}\n"))?;
    tokens::append(
        &tokens_file,
        &NewToken {
            principal: "operator",
            scopes: &scopes,
            subjects: &[],
            subject_prefixes: &[String::new()],
        },
        &token,
    )?;
    eprintln!(
        "\nreservoir: created an operator token (operator, gateway and metrics for every subject) in {}\n  \
         send it as:  curl -H \"Authorization: Bearer $(cat {})\" ...\n  \
         more tokens: reservoir token create --tokens-file {} --principal NAME --scope gateway --subject TENANT\n",
        token_path.display(),
        token_path.display(),
        tokens_file.display(),
    );
    Ok(Some(tokens_file))
}
