//! The running count of a streamed call: [`UsageMeter`] folds provider usage
//! as it arrives (Anthropic `message_start` / `message_delta`, OpenAI's final
//! `usage` chunk, or deltas the gateway counts itself), and [`SseScanner`]
//! cuts a proxied byte stream into server-sent events to feed it.
//!
//! Counts only go up: providers report cumulative output, so the meter keeps
//! the largest value seen, and a repeated or reordered event can never lower
//! what a cancelled stream is charged.

use serde_json::Value;

use crate::types::{CapacityUnit, OperationId, ReserveRequest, Settlement, Usage};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageMeter {
    output_tokens: u64,
    reported_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    model: Option<String>,
    finished: bool,
    refused: bool,
}

impl UsageMeter {
    pub fn output_tokens(&self) -> u64 {
        self.output_tokens
    }

    /// The provider's input count without its cache reads (Anthropic's
    /// `input_tokens` + `cache_creation_input_tokens`; OpenAI's
    /// `prompt_tokens` less `cached_tokens`), as the ledger takes it.
    pub fn reported_input_tokens(&self) -> Option<u64> {
        self.reported_input_tokens
    }

    /// Prompt tokens the provider read from its cache (Anthropic's
    /// `cache_read_input_tokens`, OpenAI's `cached_tokens`), reported apart
    /// so a policy can leave them out of its input dimensions.
    pub fn cache_read_input_tokens(&self) -> Option<u64> {
        self.cache_read_input_tokens
    }

    /// The model the provider says answered, if it said.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The provider signalled the end of the message (`message_stop`, a
    /// `finish_reason`, OpenAI's usage chunk).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The provider answered the call with an error status before streaming
    /// anything (a 429, a 400, a 5xx): it did not run, so the settle charges
    /// no input unless the provider reported some. Without this, a stream
    /// that ended before its first event is charged the gateway's count: its
    /// request may have reached the provider, and an unknown use is never
    /// counted as unused.
    pub fn provider_refused(&mut self) {
        self.refused = true;
    }

    /// Output tokens the gateway counted itself (a provider without usage in its stream).
    pub fn add_output_tokens(&mut self, n: u64) {
        self.output_tokens = self.output_tokens.saturating_add(n);
    }

    /// A cumulative output count from anywhere.
    pub fn saw_output_total(&mut self, total: u64) {
        self.output_tokens = self.output_tokens.max(total);
    }

    fn saw_input(&mut self, n: u64) {
        self.reported_input_tokens = Some(self.reported_input_tokens.unwrap_or(0).max(n));
    }

    fn saw_cache_reads(&mut self, n: u64) {
        self.cache_read_input_tokens = Some(self.cache_read_input_tokens.unwrap_or(0).max(n));
    }

    /// What settling `request` now would send, on a route counted in `unit`:
    /// input (the provider's reported count with its cache reads, else the
    /// gateway's, or 0 if the provider refused the call:
    /// [`UsageMeter::provider_refused`]) plus the output counted so far. A [`crate::Lease`] settles with it, on finish
    /// and when a cancelled stream drops it.
    pub fn settlement(
        &self,
        request: &ReserveRequest,
        unit: CapacityUnit,
        operation_id: OperationId,
    ) -> Settlement {
        let counted = match request.sizing {
            crate::Sizing::Tokens {
                counted_input_tokens,
                ..
            } => Some(counted_input_tokens),
            crate::Sizing::Units(_) => None,
        };
        // A refusal reports 0 input, so the ledger charges none either.
        let reported = match (self.reported_input_tokens(), self.refused) {
            (None, true) => Some(0),
            (reported, _) => reported,
        };
        let cache_reads = reported.and(self.cache_read_input_tokens);
        let input = match reported {
            Some(reported) => reported.saturating_add(cache_reads.unwrap_or(0)),
            None => counted.unwrap_or(0),
        };
        let output = self.output_tokens();
        let model = self
            .model()
            .map(str::to_string)
            .or_else(|| request.model.clone())
            .filter(|m| crate::ReservationId::new(m.as_str()).is_ok());
        Settlement {
            actual_units: unit.units(input, output),
            operation_id: Some(operation_id),
            usage: Some(Usage {
                model,
                output_tokens: Some(output),
                counted_input_tokens: counted,
                reported_input_tokens: reported,
                cache_read_input_tokens: cache_reads,
            }),
        }
    }

    /// One Anthropic Messages stream event (the `data:` JSON).
    pub fn observe_anthropic(&mut self, event: &Value) {
        let usage = match event["type"].as_str() {
            Some("message_start") => {
                if let Some(m) = event["message"]["model"].as_str() {
                    self.model = Some(m.to_string());
                }
                &event["message"]["usage"]
            }
            Some("message_delta") => &event["usage"],
            Some("message_stop") => {
                self.finished = true;
                return;
            }
            _ => return,
        };
        if let Some(n) = usage["input_tokens"].as_u64() {
            // Cache writes are prompt the provider processed and bills.
            let written = usage["cache_creation_input_tokens"].as_u64().unwrap_or(0);
            self.saw_input(n.saturating_add(written));
        }
        if let Some(n) = usage["cache_read_input_tokens"].as_u64() {
            self.saw_cache_reads(n);
        }
        if let Some(n) = usage["output_tokens"].as_u64() {
            self.saw_output_total(n);
        }
    }

    /// One OpenAI Chat Completions stream chunk: the model on every chunk,
    /// usage on the final one (`stream_options.include_usage`).
    pub fn observe_openai(&mut self, chunk: &Value) {
        if let Some(m) = chunk["model"].as_str() {
            self.model = Some(m.to_string());
        }
        let usage = &chunk["usage"];
        if let Some(n) = usage["prompt_tokens"].as_u64() {
            // prompt_tokens includes the cached ones: the ledger takes them apart.
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
            self.saw_input(n.saturating_sub(cached.unwrap_or(0)));
            if let Some(cached) = cached {
                self.saw_cache_reads(cached);
            }
        }
        if let Some(n) = usage["completion_tokens"].as_u64() {
            self.saw_output_total(n);
            self.finished = true;
        }
        if let Some(choices) = chunk["choices"].as_array() {
            if choices.iter().any(|c| c["finish_reason"].is_string()) {
                self.finished = true;
            }
        }
    }

    /// One SSE `data:` payload of either provider (`[DONE]` ends OpenAI's stream).
    pub fn observe_sse_data(&mut self, data: &str) {
        if data.trim() == "[DONE]" {
            self.finished = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if v.get("type").is_some() {
            self.observe_anthropic(&v);
        } else {
            self.observe_openai(&v);
        }
    }
}

/// Cuts a byte stream into SSE events' `data:` payloads (joined by `\n` when
/// an event has several). Bytes are passed on untouched by the caller; this
/// only reads them.
#[derive(Debug, Default)]
pub struct SseScanner {
    buffer: Vec<u8>,
}

impl SseScanner {
    /// The data of every event completed by `chunk`.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = find_event_end(&self.buffer) {
            let raw: Vec<u8> = self.buffer.drain(..end.0 + end.1).collect();
            let text = String::from_utf8_lossy(&raw[..end.0]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

/// Where the first blank line ends an event: (event length, separator length).
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_events_fold_into_a_running_count() {
        let mut m = UsageMeter::default();
        // (event, output after it, reported input after it, finished)
        let table = [
            (
                json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 120, "output_tokens": 1}}}),
                1,
                Some(120),
                false,
            ),
            (
                json!({"type": "content_block_delta", "delta": {"text": "hi"}}),
                1,
                Some(120),
                false,
            ),
            (
                json!({"type": "message_delta", "usage": {"output_tokens": 450}}),
                450,
                Some(120),
                false,
            ),
            (
                json!({"type": "message_delta", "usage": {"output_tokens": 900}}),
                900,
                Some(120),
                false,
            ),
            // An older, repeated delta never lowers the count.
            (
                json!({"type": "message_delta", "usage": {"output_tokens": 450}}),
                900,
                Some(120),
                false,
            ),
            (json!({"type": "ping"}), 900, Some(120), false),
            (json!({"type": "message_stop"}), 900, Some(120), true),
        ];
        for (event, output, input, finished) in table {
            m.observe_anthropic(&event);
            assert_eq!(
                (m.output_tokens(), m.reported_input_tokens(), m.finished()),
                (output, input, finished),
                "{event}"
            );
        }
        assert_eq!(m.model(), Some("claude-x"));
    }

    #[test]
    fn openai_reports_usage_in_its_final_chunk() {
        let mut m = UsageMeter::default();
        m.observe_sse_data(r#"{"object":"chat.completion.chunk","model":"gpt-x","choices":[{"delta":{"content":"a"},"finish_reason":null}],"usage":null}"#);
        assert_eq!((m.output_tokens(), m.finished()), (0, false));
        m.add_output_tokens(3); // the gateway's own count meanwhile
        m.observe_sse_data(r#"{"object":"chat.completion.chunk","model":"gpt-x","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":70}}"#);
        assert_eq!(
            (m.output_tokens(), m.reported_input_tokens(), m.finished()),
            (70, Some(50), true)
        );
        m.observe_sse_data("[DONE]");
        assert_eq!(m.model(), Some("gpt-x"));
    }

    #[test]
    fn the_scanner_finds_events_across_chunk_boundaries() {
        let mut s = SseScanner::default();
        assert!(s.push(b"event: message_start\ndata: {\"a\"").is_empty());
        assert_eq!(
            s.push(b":1}\n\nevent: ping\ndata: {}\n\n"),
            vec!["{\"a\":1}", "{}"]
        );
        assert_eq!(
            s.push(b"data: x\r\ndata: y\r\n\r\n: comment\n\n"),
            vec!["x\ny"]
        );
        assert!(s.push(b"data: partial").is_empty());
    }

    /// Cache reads are reported apart from the input, as the ledger takes
    /// them (so a policy can leave them out), and cache writes are input;
    /// the settle's amount counts the whole prompt either way.
    #[test]
    fn cache_reads_are_reported_apart_and_charged_in_the_amount() {
        let request = ReserveRequest::tokens("t", "chat", 1_000, Some(500));
        let operation = OperationId::new("op-1").unwrap();
        let anthropic = json!({"type": "message_start", "message": {"model": "claude-x",
            "usage": {"input_tokens": 30, "cache_creation_input_tokens": 70,
                      "cache_read_input_tokens": 900, "output_tokens": 1}}});
        let openai = json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 1_000,
            "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 900}}});
        let uncached = json!({"model": "gpt-x", "choices": [],
            "usage": {"prompt_tokens": 1_000, "completion_tokens": 1}});
        // (stream, reported input, cache reads, actual units)
        let table = [
            (anthropic, Some(100), Some(900), 1_001),
            (openai, Some(100), Some(900), 1_001),
            (uncached, Some(1_000), None, 1_001),
        ];
        for (event, reported, cached, actual) in table {
            let mut m = UsageMeter::default();
            m.observe_sse_data(&event.to_string());
            let s = m.settlement(&request, CapacityUnit::Tokens, operation.clone());
            let usage = s.usage.unwrap();
            assert_eq!(
                (usage.reported_input_tokens, usage.cache_read_input_tokens),
                (reported, cached),
                "{event}"
            );
            assert_eq!(s.actual_units, actual, "{event}");
        }
        // A refused call reports no input, and no cache reads with it.
        let mut m = UsageMeter::default();
        m.provider_refused();
        let usage = m
            .settlement(&request, CapacityUnit::Tokens, operation)
            .usage
            .unwrap();
        assert_eq!(
            (usage.reported_input_tokens, usage.cache_read_input_tokens),
            (Some(0), None)
        );
    }

    /// The settle a lease sends at any point of a stream: the provider's
    /// input once reported, else the gateway's count; the output so far;
    /// the route's unit; the model the stream named.
    #[test]
    fn a_settlement_counts_what_the_stream_said_so_far() {
        let request = ReserveRequest::tokens("t", "chat", 100, Some(500));
        let operation = OperationId::new("op-1").unwrap();
        let mut m = UsageMeter::default();
        // (event fed before settling, unit, actual units, reported input, output, model)
        let table = [
            (None, CapacityUnit::Tokens, 100, None, 0, None),
            (None, CapacityUnit::Requests, 1, None, 0, None),
            (
                Some(
                    json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 120, "output_tokens": 1}}}),
                ),
                CapacityUnit::Tokens,
                121,
                Some(120),
                1,
                Some("claude-x"),
            ),
            (
                Some(json!({"type": "message_delta", "usage": {"output_tokens": 40}})),
                CapacityUnit::Tokens,
                160,
                Some(120),
                40,
                Some("claude-x"),
            ),
            (
                None,
                CapacityUnit::Requests,
                1,
                Some(120),
                40,
                Some("claude-x"),
            ),
        ];
        for (event, unit, actual, reported, output, model) in table {
            if let Some(event) = event {
                m.observe_anthropic(&event);
            }
            let s = m.settlement(&request, unit, operation.clone());
            let usage = s.usage.expect("a settlement carries its usage");
            assert_eq!(
                (
                    s.actual_units,
                    usage.reported_input_tokens,
                    usage.counted_input_tokens,
                    usage.output_tokens,
                    usage.model.as_deref(),
                    s.operation_id.as_ref(),
                ),
                (
                    actual,
                    reported,
                    Some(100),
                    Some(output),
                    model,
                    Some(&operation)
                ),
                "{unit:?}"
            );
        }
    }

    /// A call the provider refused before streaming is charged no input; one
    /// that ended before its first event for any other reason is charged the
    /// gateway's count.
    #[test]
    fn a_refused_call_is_charged_no_input_and_a_silent_one_its_count() {
        let request = ReserveRequest::tokens("t", "chat", 100, Some(500));
        let operation = OperationId::new("op-1").unwrap();
        let silent = UsageMeter::default();
        let mut refused = UsageMeter::default();
        refused.provider_refused();
        for (meter, actual, reported) in [(&silent, 100, None), (&refused, 0, Some(0))] {
            let s = meter.settlement(&request, CapacityUnit::Tokens, operation.clone());
            let usage = s.usage.unwrap();
            assert_eq!(
                (
                    s.actual_units,
                    usage.reported_input_tokens,
                    usage.counted_input_tokens
                ),
                (actual, reported, Some(100))
            );
        }
        // A request still counts on a route that limits requests.
        let s = refused.settlement(&request, CapacityUnit::Requests, operation);
        assert_eq!(s.actual_units, 1);
    }
}
