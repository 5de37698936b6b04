//! Reading RESP2 replies (the only protocol the store speaks) without
//! trusting their shape: anything unexpected is a [`StoreError::Corrupt`],
//! never a panic.

use courier_core::{StoreError, StreamEntryId};
use redis::Value;

use crate::error::corrupt;

/// The elements of an array reply; `nil` reads as no elements.
pub(crate) fn array(value: Value, what: &str) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(corrupt(format_args!("{what} is {other:?}, not an array"))),
    }
}

/// The bytes of a string reply.
pub(crate) fn bytes(value: Value, what: &str) -> Result<Vec<u8>, StoreError> {
    match value {
        Value::BulkString(data) => Ok(data),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        Value::VerbatimString { text, .. } => Ok(text.into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        other => Err(corrupt(format_args!("{what} is {other:?}, not a string"))),
    }
}

/// A string reply as text (invalid UTF-8 replaced).
pub(crate) fn text(value: Value, what: &str) -> Result<String, StoreError> {
    bytes(value, what).map(|data| String::from_utf8_lossy(&data).into_owned())
}

/// An integer reply (or a string holding one, as Redis sometimes sends).
pub(crate) fn int(value: Value, what: &str) -> Result<i64, StoreError> {
    match value {
        Value::Int(n) => Ok(n),
        Value::BulkString(data) => std::str::from_utf8(&data)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| corrupt(format_args!("{what} is not an integer"))),
        other => Err(corrupt(format_args!("{what} is {other:?}, not an integer"))),
    }
}

/// A count or duration reply: a non-negative integer (negatives read as 0).
pub(crate) fn count(value: Value, what: &str) -> Result<u64, StoreError> {
    int(value, what).map(|n| u64::try_from(n).unwrap_or(0))
}

/// An entry id reply (`1700000000000-0`).
pub(crate) fn id(value: Value, what: &str) -> Result<StreamEntryId, StoreError> {
    let text = text(value, what)?;
    StreamEntryId::parse("id", &text).map_err(|e| corrupt(format_args!("{what}: {e}")))
}

/// An array reply of exactly `N` elements.
pub(crate) fn tuple<const N: usize>(value: Value, what: &str) -> Result<[Value; N], StoreError> {
    let items = array(value, what)?;
    let len = items.len();
    items
        .try_into()
        .map_err(|_| corrupt(format_args!("{what} has {len} elements, not {N}")))
}

/// A flat `name value name value ...` reply (XINFO in RESP2) as pairs.
pub(crate) fn pairs(value: Value, what: &str) -> Result<Vec<(String, Value)>, StoreError> {
    if let Value::Map(entries) = value {
        return entries
            .into_iter()
            .map(|(name, value)| Ok((text(name, what)?, value)))
            .collect();
    }
    let items = array(value, what)?;
    if items.len() % 2 != 0 {
        return Err(corrupt(format_args!(
            "{what} has an odd number of elements"
        )));
    }
    let mut pairs = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        pairs.push((text(name, what)?, value));
    }
    Ok(pairs)
}
