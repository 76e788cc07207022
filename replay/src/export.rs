//! `export`: the events of a range, for analytics tools.
//!
//! Exported are the records that count under the log's validity rule (claims
//! and fenced records are not), with every event in the range, exactly as the
//! log holds them — whether or not `try_apply` accepts them (the replay's
//! findings go to standard error). Two formats:
//! - `jsonl`: one JSON object per event: position, partition, writer, claim
//!   epoch, sequence, `at_ms`, event type and the event body;
//! - `avro`: an Avro object container file whose schema is the topic's value
//!   schema, `io.reservoir.v1.Envelope` (the registered, self-contained
//!   version from `schemas/`), one datum per record (a record cut to the
//!   events in range) — what a Kafka consumer of the topic would decode.

use std::io::Write;

use apache_avro::Writer;
use reservoir_log::codec;
use reservoir_log::{Position, Record};
use serde_json::json;

use crate::engine::Visit;
use crate::Point;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Avro,
}

pub struct Exporter<'w> {
    from: Option<Point>,
    to: Option<Point>,
    jsonl: Option<&'w mut dyn Write>,
    avro: Option<Writer<'static, &'w mut dyn Write>>,
    pub events: u64,
    pub records: u64,
    pub error: Option<String>,
}

/// The registered Envelope schema the Avro export is written with.
fn envelope_schema() -> &'static apache_avro::Schema {
    let subject = format!("{}.Envelope", codec::NAMESPACE);
    &codec::registry()
        .current(&subject)
        .expect("the Envelope schema is registered")
        .schema
}

impl<'w> Exporter<'w> {
    pub fn new(
        out: &'w mut dyn Write,
        format: ExportFormat,
        from: Option<Point>,
        to: Option<Point>,
    ) -> Self {
        let (jsonl, avro) = match format {
            ExportFormat::Jsonl => (Some(out), None),
            ExportFormat::Avro => (None, Some(Writer::new(envelope_schema(), out))),
        };
        Self {
            from,
            to,
            jsonl,
            avro,
            events: 0,
            records: 0,
            error: None,
        }
    }

    fn in_range(&self, p: Position, at_ms: u64) -> bool {
        self.from
            .as_ref()
            .is_none_or(|f| f.admits_from(p.log_partition, p.offset, at_ms))
            && self
                .to
                .as_ref()
                .is_none_or(|t| t.admits_to(p.log_partition, p.offset, at_ms))
    }

    fn export(&mut self, position: Position, record: &Record) -> Result<(), String> {
        let events: Vec<_> = record
            .events
            .iter()
            .filter(|e| self.in_range(position, e.at_ms))
            .cloned()
            .collect();
        if events.is_empty() {
            return Ok(());
        }
        self.records += 1;
        self.events += events.len() as u64;
        if let Some(out) = self.jsonl.as_mut() {
            for e in &events {
                let line = json!({
                    "log_partition": position.log_partition,
                    "offset": position.offset,
                    "partition": record.key,
                    "writer_id": record.writer_id,
                    "claim_epoch": record.claim_epoch,
                    "sequence": e.sequence,
                    "at_ms": e.at_ms,
                    "type": e.body.type_name(),
                    "body": e.body,
                    // The amounts of every dimension after the first.
                    "further": e.further,
                });
                serde_json::to_writer(&mut *out, &line).map_err(|e| e.to_string())?;
                out.write_all(b"\n").map_err(|e| e.to_string())?;
            }
        }
        if let Some(writer) = self.avro.as_mut() {
            let cut = Record {
                events,
                ..record.clone()
            };
            let bytes =
                codec::encode(&reservoir_log::LogEntry::Record(cut)).map_err(|e| e.to_string())?;
            let (_, value) = codec::decode_value(&bytes).map_err(|e| e.to_string())?;
            writer.append_value_ref(&value).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Flushes the container file (or the lines).
    pub fn finish(mut self) -> Result<(), String> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if let Some(writer) = self.avro.take() {
            let out = writer.into_inner().map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
        }
        if let Some(out) = self.jsonl.take() {
            out.flush().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Visit for Exporter<'_> {
    fn record(&mut self, position: Position, record: &Record) {
        if self.error.is_none() {
            if let Err(e) = self.export(position, record) {
                self.error = Some(e);
            }
        }
    }
}
