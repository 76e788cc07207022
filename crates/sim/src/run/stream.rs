//! Stream-cancel: a `chat` call whose streamed answer is cut off mid-way
//! (the gateway's caller hung up, or the gateway cancelled it), settled at
//! what the stream had counted, as the client crate's lease settles a
//! dropped stream.
//!
//! The provider's answer is an Anthropic Messages event stream:
//! `message_start` (the input tokens, output 1), `message_delta`s carrying
//! the cumulative output, `message_stop`. The events sent before the cut go
//! through the client crate's own [`SseScanner`] in byte chunks of random
//! size (an event split anywhere, several in one chunk), and their data
//! through its [`UsageMeter`]; now and then a proxy repeats an earlier
//! delta after a later one, which must not lower the count. The settle is
//! what the client's lease sends for a dropped stream
//! ([`UsageMeter::settlement`]: one request on `chat`, the meter's output,
//! its reported input if `message_start` arrived, none if the provider
//! refused the call before streaming, else the gateway's count), as JSON, read by the server's own settle body
//! ([`SettleBody`], which refuses fields it does not know), and translated
//! as the server's settle handler does. The meter agreeing with the events
//! sent is asserted here (a failure is the `panicked` gate, with the seed to
//! replay it).

use reservoir_client::{CapacityUnit, ReserveRequest, SseScanner, UsageMeter};
use reservoir_server::bodies::SettleBody;
use serde_json::json;

use super::*;

/// Deltas in a streamed answer, at most.
const MAX_DELTAS: u64 = 5;

impl World {
    /// What call `c`'s cancelled stream settles with (primary units,
    /// usage): `reported` is what the provider says the input was, `output`
    /// what the whole answer would have used. Draws from the run's generator.
    pub(super) fn cancelled_stream(
        &mut self,
        c: usize,
        (counted_input_tokens, max_tokens): (u64, Option<u64>),
        reported: u64,
        output: u64,
    ) -> (Option<u64>, Option<Usage>) {
        let deltas = self.rng.range(1, MAX_DELTAS);
        let at = |i: u64| output * i / deltas;
        let events = anthropic_events(reported, output, deltas);
        // Events sent before the cut: never the stop (that answer completed).
        let sent = self.rng.index(events.len());
        let mut wire = events[..sent].to_vec();
        // The count the events sent make: the largest cumulative output.
        let counted_output = match sent {
            0 => 0,
            1 => output.min(1),
            n => at(n as u64 - 1).max(output.min(1)),
        };
        if sent > 2 && self.rng.chance(300) {
            // A repeated earlier delta, after a later one.
            let earlier = self.rng.range(1, sent as u64 - 2) as usize;
            wire.push(events[earlier].clone());
            self.count("stream: an earlier delta repeated after a later one");
        }
        let mut bytes = Vec::new();
        for event in &wire {
            let kind = event["type"].as_str().expect("every event has a type");
            bytes.extend_from_slice(format!("event: {kind}\ndata: {event}\n\n").as_bytes());
        }
        let (mut scanner, mut meter) = (SseScanner::default(), UsageMeter::default());
        let mut at_byte = 0;
        while at_byte < bytes.len() {
            let end = (at_byte + self.rng.range(1, 64) as usize).min(bytes.len());
            for data in scanner.push(&bytes[at_byte..end]) {
                meter.observe_sse_data(&data);
            }
            at_byte = end;
        }
        // Cut before its first event: half the time the provider refused the
        // call outright (an error status: it did not run, no input), else
        // the cause is unknown and the gateway's count is charged.
        let refused = sent == 0 && self.rng.chance(500);
        if refused {
            meter.provider_refused();
        }
        let reported_seen = (sent >= 1).then_some(reported);
        assert_eq!(
            (
                meter.output_tokens(),
                meter.reported_input_tokens(),
                meter.finished()
            ),
            (counted_output, reported_seen, false),
            "the client's meter after {sent} of {} events",
            events.len()
        );
        self.count(if refused {
            "stream refused by the provider before its first event (no input)"
        } else if sent == 0 {
            "stream cancelled before its first event (input: the gateway's count)"
        } else {
            "stream cancelled mid-way, settled at the meter's count"
        });
        let call = &self.calls[c];
        let request = ReserveRequest::tokens(
            TENANTS[call.tenant].name,
            call.route.name(),
            counted_input_tokens,
            max_tokens,
        );
        let operation = reservoir_client::OperationId::new(call.operation.as_str())
            .expect("the simulator's operation ids are valid");
        let settlement = meter.settlement(&request, CapacityUnit::Requests, operation);
        let body: SettleBody = serde_json::from_value(
            serde_json::to_value(&settlement).expect("a settlement serializes"),
        )
        .expect("the server reads the client's settle body");
        assert_eq!(
            body.operation_id.as_deref(),
            Some(call.operation.as_str()),
            "the settle names the call's operation"
        );
        (body.actual_units, body.usage.map(Usage::from))
    }
}

/// A provider's whole streamed answer as Anthropic Messages events:
/// `message_start` (the input tokens, output 1), `deltas` cumulative
/// `message_delta`s reaching `output`, `message_stop`.
pub(super) fn anthropic_events(reported: u64, output: u64, deltas: u64) -> Vec<serde_json::Value> {
    let mut events = vec![json!({"type": "message_start", "message": {
        "model": "sim-model",
        "usage": {"input_tokens": reported, "output_tokens": output.min(1)}}})];
    events.extend((1..=deltas).map(
        |i| json!({"type": "message_delta", "usage": {"output_tokens": output * i / deltas}}),
    ));
    events.push(json!({"type": "message_stop"}));
    events
}
