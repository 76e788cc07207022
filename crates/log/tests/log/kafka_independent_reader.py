#!/usr/bin/env python3
"""An independent reader of the event topic: not our code path, not our client.

Reads every partition of a topic from the beginning with confluent-kafka and
decodes every value with fastavro, knowing only `schemas/registry.json` (the
checked-in id mapping) and the `.avsc` files it names: strip the 5-byte
Confluent header (magic 0, big-endian schema id), look the id up, read the Avro
datum with that schema. Prints one JSON object per Kafka record:

  {"partition", "offset", "key", "headers", "schema_id", "subject",
   "fingerprint", "value"}

`fingerprint` is sha256 of the schema's Parsing Canonical Form, computed here by
fastavro, so the caller can check the header the writer set. Unions come out as
{"branch": <full name>, "value": ...} so the caller sees which event type each
body is. Exit status 0 only if every value decoded.

usage: kafka_independent_reader.py BROKERS TOPIC SCHEMAS_DIR
"""

import hashlib
import io
import json
import struct
import sys
import uuid

import fastavro
from confluent_kafka import Consumer, TopicPartition
from fastavro.schema import to_parsing_canonical_form


def load_registry(schemas_dir):
    with open(f"{schemas_dir}/registry.json") as f:
        registry = json.load(f)
    by_id = {}
    for line in registry["schemas"]:
        with open(f"{schemas_dir}/{line['schema']}") as f:
            raw = json.load(f)
        parsed = fastavro.parse_schema(raw)
        canonical = to_parsing_canonical_form(raw)
        by_id[line["id"]] = {
            "subject": line["subject"],
            "schema": parsed,
            "fingerprint": "sha256:" + hashlib.sha256(canonical.encode()).hexdigest(),
        }
    return by_id


def tag_unions(value):
    """fastavro's return_record_name gives unions as (name, value) tuples."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return {"branch": value[0], "value": tag_unions(value[1])}
    if isinstance(value, dict):
        return {k: tag_unions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [tag_unions(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def keep_raw_logical_types():
    """Timestamps stay the longs on the wire: a legal i64::MAX expiry does not
    fit Python's datetime, and the comparison wants the wire value anyway."""
    for name in list(fastavro.read.LOGICAL_READERS):
        fastavro.read.LOGICAL_READERS[name] = lambda datum, *_: datum


def main():
    keep_raw_logical_types()
    brokers, topic, schemas_dir = sys.argv[1:4]
    registry = load_registry(schemas_dir)
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"independent-reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = sorted(metadata.topics[topic].partitions)
    # The end of each partition is where the fetch reports PartitionEOF (its high
    # watermark is exact; tansu's ListOffsets answer is not).
    pending = set(partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    failures = 0
    idle_polls = 0
    while pending:
        message = consumer.poll(1.0)
        if message is None:
            idle_polls += 1
            if idle_polls > 30:
                print(f"gave up waiting for partitions {sorted(pending)}", file=sys.stderr)
                return 2
            continue
        if message.error():
            if message.error().code() == -191:  # _PARTITION_EOF
                pending.discard(message.partition())
                continue
            print(f"consumer error: {message.error()}", file=sys.stderr)
            return 2
        value = message.value()
        out = {
            "partition": message.partition(),
            "offset": message.offset(),
            "key": message.key().decode() if message.key() is not None else None,
            "headers": {k: v.decode() for k, v in (message.headers() or [])},
        }
        try:
            magic, schema_id = struct.unpack(">bI", value[:5])
            if magic != 0:
                raise ValueError(f"magic byte {magic}")
            known = registry[schema_id]
            datum = io.BytesIO(value[5:])
            decoded = fastavro.schemaless_reader(datum, known["schema"], return_record_name=True)
            if datum.read():
                raise ValueError("trailing bytes after the datum")
            out.update(
                schema_id=schema_id,
                subject=known["subject"],
                fingerprint=known["fingerprint"],
                value=tag_unions(decoded),
            )
        except Exception as e:  # report every undecodable value, keep going
            failures += 1
            out["error"] = repr(e)
        print(json.dumps(out, sort_keys=True))
    consumer.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
