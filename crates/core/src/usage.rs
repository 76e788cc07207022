//! What a call really used, as the gateway counted it and the provider reported
//! it. Carried by a settle and recorded in its `Settled` event so the read side
//! can learn per-(route, model) output distributions and input-count drift.
//! Conservation never looks at it: `actual_units` is what the ledger moves.

use serde::{Deserialize, Serialize};

use crate::policy::MAX_UNITS;
use crate::rejection::InvalidInput;
use crate::types::{validate_id, Units};

/// Every part is optional: a gateway reports what it knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Model id the call ran on (e.g. `claude-sonnet-4`; 1..128 bytes of
    /// `[A-Za-z0-9._:/@-]`).
    pub model: Option<String>,
    /// Output tokens the provider reported.
    pub output_tokens: Option<Units>,
    /// Input tokens the gateway counted before the call.
    pub counted_input_tokens: Option<Units>,
    /// Input tokens the provider reported (what it bills), cache reads not
    /// included (Anthropic's `input_tokens` plus `cache_creation_input_tokens`;
    /// OpenAI's `prompt_tokens` minus `cached_tokens`).
    pub reported_input_tokens: Option<Units>,
    /// Input tokens the provider read from its prompt cache (Anthropic's
    /// `cache_read_input_tokens`, OpenAI's `cached_tokens`). Counted in the
    /// input dimensions unless the policy excludes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<Units>,
}

impl Usage {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        // An id like any other: it becomes part of projection keys and URLs.
        if let Some(model) = &self.model {
            validate_id("usage.model", model)?;
        }
        for units in [
            self.output_tokens,
            self.counted_input_tokens,
            self.reported_input_tokens,
            self.cache_read_input_tokens,
        ]
        .into_iter()
        .flatten()
        {
            if units > MAX_UNITS {
                return Err(InvalidInput::AbsurdUnits {
                    units,
                    limit: MAX_UNITS,
                });
            }
        }
        Ok(())
    }
}
