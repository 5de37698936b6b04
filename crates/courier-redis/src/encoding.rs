//! How entries are laid out as Redis stream fields, and how any entry, ours
//! or another program's, reads back.
//!
//! A Courier entry has the fields `payload` (compact JSON), `headers` (a
//! JSON object of strings, left out when there are none) and, when it relays
//! an outbox message, `message_id`, `tenant`, `topic` and `schema_version`.
//! An entry is read as Courier's only when it has a `payload` that parses as
//! JSON, no field outside that set, no field twice, headers that parse, and
//! either all four origin fields (well formed) or none. Every other entry is
//! foreign: its payload is a JSON object of its fields as strings (invalid
//! UTF-8 replaced, a repeated field keeping its last value), with no headers
//! and no origin. Decoding never fails.

use std::collections::BTreeMap;

use courier_core::{EntryOrigin, NewStreamEntry, StreamEntry, StreamEntryId};
use uuid::Uuid;

/// An entry's fields as stored: (name, value) pairs in order, binary.
pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

const PAYLOAD: &str = "payload";
const HEADERS: &str = "headers";
const MESSAGE_ID: &str = "message_id";
const TENANT: &str = "tenant";
const TOPIC: &str = "topic";
const SCHEMA_VERSION: &str = "schema_version";
const KNOWN: [&str; 6] = [PAYLOAD, HEADERS, MESSAGE_ID, TENANT, TOPIC, SCHEMA_VERSION];

/// The field/value arguments of `entry` for XADD, `payload` being its
/// already validated compact JSON.
pub(crate) fn encode(entry: &NewStreamEntry, payload: String) -> Vec<String> {
    let mut fields = vec![PAYLOAD.to_owned(), payload];
    if !entry.headers.is_empty() {
        fields.push(HEADERS.to_owned());
        fields.push(serde_json::Value::from_iter(entry.headers.clone()).to_string());
    }
    if let Some(origin) = &entry.origin {
        fields.extend([
            MESSAGE_ID.to_owned(),
            origin.message_id.to_string(),
            TENANT.to_owned(),
            origin.tenant.clone(),
            TOPIC.to_owned(),
            origin.topic.clone(),
            SCHEMA_VERSION.to_owned(),
            origin.schema_version.to_string(),
        ]);
    }
    fields
}

/// The entry `id` with `fields` as stored, Courier's or foreign.
pub(crate) fn decode(id: StreamEntryId, fields: Fields) -> StreamEntry {
    match decode_courier(&fields) {
        Some((payload, headers, origin)) => StreamEntry {
            id,
            payload,
            headers,
            origin,
        },
        None => {
            let object: serde_json::Map<String, serde_json::Value> = fields
                .into_iter()
                .map(|(name, value)| (lossy(name), serde_json::Value::String(lossy(value))))
                .collect();
            StreamEntry {
                id,
                payload: serde_json::Value::Object(object),
                headers: BTreeMap::new(),
                origin: None,
            }
        }
    }
}

type Decoded = (
    serde_json::Value,
    BTreeMap<String, String>,
    Option<EntryOrigin>,
);

/// The entry as Courier wrote it, or `None` when it is not one of ours.
fn decode_courier(fields: &[(Vec<u8>, Vec<u8>)]) -> Option<Decoded> {
    let mut known: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (name, value) in fields {
        let name = KNOWN.iter().find(|k| k.as_bytes() == name.as_slice())?;
        if known.insert(name, value.as_slice()).is_some() {
            return None;
        }
    }
    let payload = serde_json::from_slice(known.get(PAYLOAD)?).ok()?;
    let headers = match known.get(HEADERS) {
        Some(text) => serde_json::from_slice(text).ok()?,
        None => BTreeMap::new(),
    };
    let origin_fields = [MESSAGE_ID, TENANT, TOPIC, SCHEMA_VERSION].map(|name| known.get(name));
    let origin = match origin_fields {
        [None, None, None, None] => None,
        [Some(message_id), Some(tenant), Some(topic), Some(schema_version)] => Some(EntryOrigin {
            message_id: Uuid::try_parse_ascii(message_id).ok()?,
            tenant: String::from_utf8(tenant.to_vec()).ok()?,
            topic: String::from_utf8(topic.to_vec()).ok()?,
            schema_version: std::str::from_utf8(schema_version).ok()?.parse().ok()?,
        }),
        _ => return None,
    };
    Some((payload, headers, origin))
}

fn lossy(data: Vec<u8>) -> String {
    String::from_utf8(data).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn round_trip(entry: &NewStreamEntry) -> StreamEntry {
        let payload = serde_json::to_string(&entry.payload).unwrap();
        let encoded = encode(entry, payload);
        let pairs = encoded
            .chunks(2)
            .map(|pair| (pair[0].clone().into_bytes(), pair[1].clone().into_bytes()))
            .collect();
        decode(StreamEntryId::new(1, 0), pairs)
    }

    #[test]
    fn courier_entries_round_trip() {
        let mut entry = NewStreamEntry::new(json!({"a": [1, 2, {"b": null}]}));
        assert_eq!(round_trip(&entry).payload, entry.payload);
        assert!(round_trip(&entry).headers.is_empty());
        entry.headers.insert("k".into(), "v \"quoted\"".into());
        entry.origin = Some(EntryOrigin {
            message_id: Uuid::new_v4(),
            tenant: "acme".into(),
            topic: "invoice.paid".into(),
            schema_version: -3,
        });
        let back = round_trip(&entry);
        assert_eq!(
            (back.payload, back.headers, back.origin),
            (entry.payload, entry.headers, entry.origin)
        );
    }

    #[test]
    fn empty_headers_are_left_out() {
        let encoded = encode(&NewStreamEntry::new(json!(1)), "1".into());
        assert_eq!(encoded, ["payload", "1"]);
    }

    #[test]
    fn anything_else_reads_as_an_object_of_fields() {
        let cases = [
            fields(&[("payload", "not json")]),
            fields(&[("payload", "1"), ("extra", "x")]),
            fields(&[("payload", "1"), ("payload", "2")]),
            fields(&[("payload", "1"), ("headers", "[1]")]),
            fields(&[("payload", "1"), ("headers", "{\"a\": 1}")]),
            fields(&[("payload", "1"), ("tenant", "acme")]),
            fields(&[
                ("payload", "1"),
                ("message_id", "nope"),
                ("tenant", "a"),
                ("topic", "t"),
                ("schema_version", "1"),
            ]),
            fields(&[("headers", "{}")]),
        ];
        for case in cases {
            let expected: serde_json::Map<String, serde_json::Value> = case
                .iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8(n.clone()).unwrap(),
                        json!(String::from_utf8(v.clone()).unwrap()),
                    )
                })
                .collect();
            let entry = decode(StreamEntryId::new(1, 0), case);
            assert_eq!(entry.payload, serde_json::Value::Object(expected));
            assert!(entry.headers.is_empty() && entry.origin.is_none());
        }
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let entry = decode(
            StreamEntryId::new(1, 0),
            vec![(b"f\xff".to_vec(), b"\xfe\x00v".to_vec())],
        );
        assert_eq!(entry.payload, json!({"f\u{fffd}": "\u{fffd}\u{0}v"}));
    }
}
