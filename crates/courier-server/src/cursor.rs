//! Opaque page cursors: what every list's `next_cursor` holds and its
//! `cursor` parameter takes back.
//!
//! Every list of the API pages the same way: it answers `{"items": [...],
//! "next_cursor": "<opaque>" | null}` in a stable order, and the next page is
//! the same request with `cursor` set to that value. A cursor is the base64url
//! (unpadded) text of a versioned key naming the last item shown and the kind
//! of list it belongs to (`m1:` messages, `d1:` dead letters, `s1:`
//! subscriptions, `t1:` stats rows, `st1:` streams). Clients must not build
//! or read them: the encoding may change with the version tag. A cursor that
//! does not decode, or that belongs to another list, is refused with 400
//! naming `cursor`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use courier::{DeadLetterKey, MessageKey, StatsKey, StreamKey};
use uuid::Uuid;

use crate::error::ApiError;

/// A list's position key that a cursor carries.
pub trait PageKey: Sized {
    /// The kind and version tag the encoded key starts with (`m1`).
    const TAG: &'static str;

    /// The key as text after the tag.
    fn write(&self) -> String;

    /// The key read back from [`PageKey::write`]'s text; `None` if it is not one.
    fn read(text: &str) -> Option<Self>;
}

/// The cursor naming `key`.
pub fn encode<K: PageKey>(key: &K) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", K::TAG, key.write()))
}

/// The key a cursor of this list names; 400 naming `cursor` when the text
/// is not a cursor, or is one of another list or version.
pub fn decode<K: PageKey>(cursor: &str) -> Result<K, ApiError> {
    let refused = || {
        ApiError::bad_cursor(
            "not a cursor of this list: pass the `next_cursor` of the previous page unchanged",
        )
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor.as_bytes())
        .map_err(|_| refused())?;
    let text = String::from_utf8(bytes).map_err(|_| refused())?;
    let key = text
        .strip_prefix(K::TAG)
        .and_then(|rest| rest.strip_prefix(':'))
        .ok_or_else(refused)?;
    K::read(key).ok_or_else(refused)
}

/// A cursor parameter decoded, if given.
pub fn decode_optional<K: PageKey>(cursor: Option<&str>) -> Result<Option<K>, ApiError> {
    cursor.map(decode).transpose()
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(text: &str) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(text.parse().ok()?)
}

impl PageKey for MessageKey {
    const TAG: &'static str = "m1";

    fn write(&self) -> String {
        format!("{}:{}", micros(self.enqueued_at), self.id)
    }

    fn read(text: &str) -> Option<Self> {
        let (at, id) = text.split_once(':')?;
        Some(MessageKey {
            enqueued_at: from_micros(at)?,
            id: Uuid::parse_str(id).ok()?,
        })
    }
}

impl PageKey for DeadLetterKey {
    const TAG: &'static str = "d1";

    fn write(&self) -> String {
        format!("{}:{}", micros(self.dead_at), self.delivery_id)
    }

    fn read(text: &str) -> Option<Self> {
        let (at, id) = text.split_once(':')?;
        Some(DeadLetterKey {
            dead_at: from_micros(at)?,
            delivery_id: id.parse().ok()?,
        })
    }
}

/// The position in the subscription list: the last name shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionKey(pub String);

impl PageKey for SubscriptionKey {
    const TAG: &'static str = "s1";

    fn write(&self) -> String {
        self.0.clone()
    }

    fn read(text: &str) -> Option<Self> {
        courier::validate_name("cursor", text).ok()?;
        Some(SubscriptionKey(text.to_owned()))
    }
}

impl PageKey for StatsKey {
    const TAG: &'static str = "t1";

    fn write(&self) -> String {
        // Names never hold `:`, so it separates them.
        format!("{}:{}", self.subscription, self.topic)
    }

    fn read(text: &str) -> Option<Self> {
        let (subscription, topic) = text.split_once(':')?;
        courier::validate_name("cursor", subscription).ok()?;
        courier::validate_name("cursor", topic).ok()?;
        Some(StatsKey {
            subscription: subscription.to_owned(),
            topic: topic.to_owned(),
        })
    }
}

impl PageKey for StreamKey {
    const TAG: &'static str = "st1";

    fn write(&self) -> String {
        // Names never hold `:`, so it separates them.
        format!("{}:{}", self.tenant(), self.stream())
    }

    fn read(text: &str) -> Option<Self> {
        let (tenant, stream) = text.split_once(':')?;
        StreamKey::new(tenant, stream).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_from_their_cursor_and_no_other_list_s() {
        let message = MessageKey {
            enqueued_at: DateTime::from_timestamp_micros(1_764_625_200_123_456).unwrap_or_default(),
            id: Uuid::now_v7(),
        };
        assert_eq!(decode::<MessageKey>(&encode(&message)), Ok(message));
        let dead = DeadLetterKey {
            dead_at: message.enqueued_at,
            delivery_id: 42,
        };
        assert_eq!(decode::<DeadLetterKey>(&encode(&dead)), Ok(dead));
        let stats = StatsKey {
            subscription: "billing".into(),
            topic: "invoice.paid".into(),
        };
        assert_eq!(decode::<StatsKey>(&encode(&stats)), Ok(stats.clone()));
        let name = SubscriptionKey("billing".into());
        assert_eq!(decode::<SubscriptionKey>(&encode(&name)), Ok(name.clone()));
        let stream = StreamKey::new("acme", "orders.dead").unwrap();
        assert_eq!(decode::<StreamKey>(&encode(&stream)), Ok(stream.clone()));
        assert!(decode::<SubscriptionKey>(&encode(&stream)).is_err());
        assert!(decode::<StreamKey>(&encode(&name)).is_err());
        assert!(decode::<StreamKey>(&URL_SAFE_NO_PAD.encode("st1:acme:a:b")).is_err());

        let field = |result: Result<MessageKey, ApiError>| result.err().and_then(|e| e.field);
        assert_eq!(field(decode(&encode(&dead))), Some("cursor".to_owned()));
        assert_eq!(field(decode(&encode(&stats))), Some("cursor".to_owned()));
        for bad in [
            "",
            "!!",
            "bTE6",
            "m1:1:2",
            &URL_SAFE_NO_PAD.encode("m2:1:x"),
        ] {
            assert_eq!(field(decode(bad)), Some("cursor".to_owned()), "{bad:?}");
        }
    }
}
