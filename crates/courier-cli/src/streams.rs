//! `courier streams …`: the streams API's operations from the command line,
//! and the listing of streams with their groups (`courier streams list`).
//!
//! Each verb builds the same request body the HTTP API takes and sends it to
//! one [`StreamsTarget`]: a running daemon (`--url`, `--token`), or a stream
//! backend directly — the database's native streams (`--database-url`,
//! `--schema`, the default) or Redis (`--backend redis --redis-url …`). The
//! direct path runs the daemon's own operations
//! ([`courier_server::stream_api`]), so input is refused the same way, naming
//! the same field, and the JSON printed is the same either way.

use std::io::BufRead;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use courier::StreamKey;
use courier_api::{
    AckRequest, AppendEntry, AppendRequest, ClaimRequest, GroupRequest, PendingParams, RangeQuery,
    ReadRequest, TrimRequest,
};
use courier_server::stream_api;
use courier_server::{ApiError, ApiStreams};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::database::Database;
use crate::ops::{self, encode, Remote, RemoteArgs};

/// Entries per append when reading payloads from standard input (each
/// append is all or nothing).
pub const APPEND_BATCH: usize = 1000;

/// Which stream backend the direct path uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Native streams in the database (`--database-url`).
    Native,
    /// Redis Streams (`--redis-url`).
    Redis,
}

/// Where the verbs go: a daemon, the database, or Redis.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// `postgres://…`, or a SQLite file path (native streams).
    #[arg(long, env = "COURIER_DATABASE_URL", default_value = "courier.db")]
    pub database_url: String,
    /// PostgreSQL schema holding Courier's tables.
    #[arg(long, env = "COURIER_SCHEMA", default_value = courier::postgres::DEFAULT_SCHEMA)]
    pub schema: String,
    /// Native streams in the database, or Redis Streams (the daemon's
    /// `[streams] backend`).
    #[arg(long, env = "COURIER_STREAMS__BACKEND", value_enum, default_value_t = BackendArg::Native)]
    pub backend: BackendArg,
    /// The Redis server of `--backend redis` (the daemon's `[redis] url`).
    #[arg(long, env = "COURIER_REDIS__URL")]
    pub redis_url: Option<String>,
    /// The key prefix of `--backend redis` (the daemon's `[redis] key_prefix`).
    #[arg(long, env = "COURIER_REDIS__KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,
    /// `--url`, `--token`, `--timeout-ms`: a running daemon instead.
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// The stream a verb works on, and where it goes.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// The stream's tenant.
    #[arg(long)]
    pub tenant: String,
    /// The stream.
    #[arg(long)]
    pub stream: String,
    /// Where the verb goes.
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `courier streams …`.
#[derive(Debug, Subcommand)]
pub enum StreamsCommand {
    /// List streams (every tenant's, or --tenant's) with their consumer
    /// groups, by tenant then stream: one page, as `GET /v1/streams`
    /// answers it (pass its `next_cursor` as --cursor for the next).
    List {
        /// Only this tenant's streams.
        #[arg(long)]
        tenant: Option<String>,
        /// Streams per page (1-500) [default: 50].
        #[arg(long)]
        limit: Option<usize>,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
        /// Where the verb goes.
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Append entries, all or nothing: each `--payload`, or else one JSON
    /// payload per line of standard input (in appends of 1,000).
    Append {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// A JSON payload (repeatable).
        #[arg(long = "payload")]
        payloads: Vec<String>,
        /// A header `NAME=VALUE` for every entry (repeatable).
        #[arg(long = "header", value_parser = parse_header)]
        headers: Vec<(String, String)>,
    },
    /// Read entries: with `--group` and `--consumer`, new entries for that
    /// consumer (pending for it until acked); without, the stream's entries
    /// after `--after`, outside any group.
    Read {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// Read through this group.
        #[arg(long, requires = "consumer")]
        group: Option<String>,
        /// The group's consumer.
        #[arg(long, requires = "group")]
        consumer: Option<String>,
        /// At most this many (1-10000) [default: 100].
        #[arg(long)]
        count: Option<usize>,
        /// Without --group: entries above this id.
        #[arg(long, conflicts_with = "group")]
        after: Option<String>,
        /// With --group: wait up to this long for an entry (at most 30000).
        #[arg(long, requires = "group")]
        block_ms: Option<u64>,
    },
    /// Create a consumer group unless it exists.
    Group {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// The group.
        #[arg(long)]
        group: String,
        /// Where it starts: `end`, `beginning` or an entry id.
        #[arg(long, default_value = "end")]
        start: String,
    },
    /// Acknowledge entries of a group.
    Ack {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// The group.
        #[arg(long)]
        group: String,
        /// Entry ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Take over entries idle in a group for at least --min-idle-ms.
    Claim {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// The group.
        #[arg(long)]
        group: String,
        /// The consumer taking them over.
        #[arg(long)]
        consumer: String,
        /// Only entries idle at least this long.
        #[arg(long)]
        min_idle_ms: u64,
        /// Continue from this cursor (the previous claim's `next`).
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many (1-10000) [default: 100].
        #[arg(long)]
        count: Option<usize>,
    },
    /// A group's pending entries: the summary and a page.
    Pending {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// The group.
        #[arg(long)]
        group: String,
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// Only entries above this id.
        #[arg(long)]
        after: Option<String>,
        /// At most this many (1-10000) [default: 100].
        #[arg(long)]
        count: Option<usize>,
        /// Only entries idle at least this long.
        #[arg(long)]
        min_idle_ms: Option<u64>,
    },
    /// Remove the oldest entries: keep --max-len entries, or those at or
    /// above --min-id.
    Trim {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// Keep the newest this many.
        #[arg(long)]
        max_len: Option<u64>,
        /// Keep the entries at or above this id.
        #[arg(long)]
        min_id: Option<String>,
    },
    /// List a group's consumers, or delete one (refused while it has
    /// pending entries).
    Consumers {
        /// The stream and where the verb goes.
        #[command(flatten)]
        stream: StreamArgs,
        /// The group.
        #[arg(long)]
        group: String,
        /// Delete this consumer instead of listing.
        #[arg(long, value_name = "NAME")]
        delete: Option<String>,
    },
}

/// `NAME=VALUE`.
fn parse_header(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
}

/// Parses an entry id given on the command line, naming `field`.
fn entry_id(field: &'static str, text: &str) -> anyhow::Result<courier::StreamEntryId> {
    courier::StreamEntryId::parse(field, text)
        .map_err(|e| anyhow::anyhow!("invalid {}: {}", e.field, e.reason))
}

/// An API error as one line: `invalid ids[3]: …`, `not found: …`.
fn refused(error: ApiError) -> anyhow::Error {
    match (error.status.as_u16(), error.field) {
        (404, _) => anyhow::anyhow!("not found: {}", error.message),
        (409, _) => anyhow::anyhow!("refused: {}", error.message),
        (503, _) => anyhow::anyhow!("unavailable: {}", error.message),
        (_, Some(field)) => anyhow::anyhow!("invalid {field}: {}", error.message),
        (_, None) => anyhow::anyhow!("{}", error.message),
    }
}

/// Where a verb's request goes.
pub enum StreamsTarget {
    /// A running daemon's API.
    Remote(Remote),
    /// A stream backend, directly.
    Direct(Arc<dyn ApiStreams>),
}

impl StreamsTarget {
    /// The daemon of `--url`, else the backend `--backend` names.
    pub async fn open(args: &TargetArgs) -> anyhow::Result<Self> {
        if let Some(remote) = args.remote.remote()? {
            return Ok(Self::Remote(remote));
        }
        match args.backend {
            BackendArg::Redis => {
                let url = args.redis_url.as_deref().ok_or_else(|| {
                    anyhow::anyhow!("invalid arguments: --backend redis needs --redis-url")
                })?;
                let streams =
                    courier::redis::RedisStreamStore::connect(url, &args.redis_key_prefix)
                        .await
                        .context("connecting to Redis")?;
                Ok(Self::Direct(Arc::new(streams)))
            }
            BackendArg::Native => {
                let store =
                    ops::Store::open(&Database::parse(&args.database_url)?, &args.schema).await?;
                Ok(Self::Direct(store.streams()))
            }
        }
    }
}

/// The path of `key` under `/v1/streams`, with `rest` after it.
fn path(key: &StreamKey, rest: &str) -> String {
    format!(
        "/v1/streams/{}/{}{rest}",
        encode(key.tenant()),
        encode(key.stream())
    )
}

fn group_path(key: &StreamKey, group: &str, rest: &str) -> String {
    path(key, &format!("/groups/{}{rest}", encode(group)))
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let present: Vec<String> = pairs
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={}", encode(v))))
        .collect();
    if present.is_empty() {
        String::new()
    } else {
        format!("?{}", present.join("&"))
    }
}

fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(value)?)
}

/// Reads payloads: the `--payload`s, or else one JSON value per non-blank
/// line of `input`.
/// The payloads to append, each with where it came from (`payload[0]` for
/// the first `--payload`, `line 3` for standard input's third line).
fn payloads(given: &[String], input: impl BufRead) -> anyhow::Result<Vec<(String, Value)>> {
    if !given.is_empty() {
        return given
            .iter()
            .enumerate()
            .map(|(i, text)| {
                serde_json::from_str(text)
                    .map(|value| (format!("payload[{i}]"), value))
                    .map_err(|e| anyhow::anyhow!("invalid payload[{i}]: not JSON: {e}"))
            })
            .collect();
    }
    let mut values = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line.context("reading standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("line {}: invalid payload: not JSON: {e}", index + 1))?;
        values.push((format!("line {}", index + 1), value));
    }
    if values.is_empty() {
        anyhow::bail!("invalid arguments: no --payload given and nothing on standard input");
    }
    Ok(values)
}

/// Checks every entry of an append as the store will, before any is
/// appended: one bad payload anywhere in the input stores nothing.
fn check_entries(
    values: &[(String, Value)],
    headers: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<()> {
    for (index, (from, payload)) in values.iter().enumerate() {
        let entry = courier::NewStreamEntry {
            payload: payload.clone(),
            headers: headers.clone(),
            origin: None,
        };
        entry
            .validate(index, courier::MAX_PAYLOAD_BYTES)
            .map_err(|e| anyhow::anyhow!("{from}: invalid {}: {}", e.field, e.reason))?;
    }
    Ok(())
}

/// Runs one `courier streams` verb and prints its JSON answer.
pub async fn run(command: StreamsCommand) -> anyhow::Result<()> {
    let never = CancellationToken::new();
    let answer = match command {
        StreamsCommand::List {
            tenant,
            limit,
            cursor,
            target,
        } => match StreamsTarget::open(&target).await? {
            StreamsTarget::Remote(remote) => {
                let query = query(&[
                    ("tenant", tenant),
                    ("limit", limit.map(|l| l.to_string())),
                    ("cursor", cursor),
                ]);
                remote.get(&format!("/v1/streams{query}")).await?
            }
            StreamsTarget::Direct(streams) => {
                // No token on the direct path: every tenant is visible.
                if let Some(tenant) = &tenant {
                    courier::validate_name("tenant", tenant).map_err(|e| refused(e.into()))?;
                }
                let tenants = tenant.map(|tenant| vec![tenant]);
                let limit = stream_api::page_limit(limit).map_err(refused)?;
                let after = courier_server::cursor::decode_optional::<StreamKey>(cursor.as_deref())
                    .map_err(refused)?;
                json(
                    &stream_api::list(streams.as_ref(), tenants, after, limit)
                        .await
                        .map_err(refused)?,
                )?
            }
        },
        StreamsCommand::Append {
            stream,
            payloads: given,
            headers,
        } => {
            let (key, target) = open(&stream).await?;
            let headers: std::collections::BTreeMap<String, String> = headers.into_iter().collect();
            let values = payloads(&given, std::io::stdin().lock())?;
            check_entries(&values, &headers)?;
            let mut ids: Vec<Value> = Vec::with_capacity(values.len());
            for chunk in values.chunks(APPEND_BATCH) {
                let request = AppendRequest {
                    entries: chunk
                        .iter()
                        .map(|(_, payload)| AppendEntry {
                            payload: payload.clone(),
                            headers: headers.clone(),
                        })
                        .collect(),
                };
                // Each batch of APPEND_BATCH is all or nothing; one that
                // fails after others were stored (a daemon's
                // max_payload_bytes below the store's, a lost connection)
                // says what is stored, so a retry can skip it.
                let stored = |error: anyhow::Error| {
                    let id = |value: Option<&Value>| {
                        value.and_then(Value::as_str).unwrap_or("?").to_owned()
                    };
                    if ids.is_empty() {
                        return error;
                    }
                    error.context(format!(
                        "the batch starting at {} failed; the {} payloads before it were \
                         appended (ids {} to {}); the rest were not, unless this batch's \
                         request was carried out although its answer was lost",
                        chunk[0].0,
                        ids.len(),
                        id(ids.first()),
                        id(ids.last())
                    ))
                };
                let answer = match &target {
                    StreamsTarget::Remote(remote) => remote
                        .post(&path(&key, "/entries"), json(&request)?)
                        .await
                        .map_err(stored)?,
                    StreamsTarget::Direct(streams) => json(
                        &stream_api::append(
                            streams.as_ref(),
                            key.clone(),
                            request,
                            courier::MAX_PAYLOAD_BYTES,
                            None,
                        )
                        .await
                        .map_err(|e| stored(refused(e)))?,
                    )?,
                };
                if let Some(batch) = answer["ids"].as_array() {
                    ids.extend(batch.iter().cloned());
                }
            }
            serde_json::json!({ "ids": ids })
        }
        StreamsCommand::Read {
            stream,
            group: Some(group),
            consumer,
            count,
            block_ms,
            ..
        } => {
            let (key, target) = open(&stream).await?;
            let request = ReadRequest {
                consumer: consumer.unwrap_or_default(),
                count,
                block_ms,
            };
            match target {
                StreamsTarget::Remote(remote) => {
                    remote
                        .post(&group_path(&key, &group, "/read"), json(&request)?)
                        .await?
                }
                StreamsTarget::Direct(streams) => json(
                    &stream_api::read(
                        streams.as_ref(),
                        key,
                        group,
                        request,
                        courier::MAX_STREAM_BLOCK,
                        &never,
                    )
                    .await
                    .map_err(refused)?,
                )?,
            }
        }
        StreamsCommand::Read {
            stream,
            group: None,
            count,
            after,
            ..
        } => {
            let (key, target) = open(&stream).await?;
            match target {
                StreamsTarget::Remote(remote) => {
                    let path = path(
                        &key,
                        &format!(
                            "/entries{}",
                            query(&[("after", after), ("count", count.map(|c| c.to_string()))])
                        ),
                    );
                    remote.get(&path).await?
                }
                StreamsTarget::Direct(streams) => {
                    let query = RangeQuery {
                        after: after.map(|a| entry_id("after", &a)).transpose()?,
                        count,
                    };
                    json(
                        &stream_api::range(streams.as_ref(), key, query)
                            .await
                            .map_err(refused)?,
                    )?
                }
            }
        }
        StreamsCommand::Group {
            stream,
            group,
            start,
        } => {
            let (key, target) = open(&stream).await?;
            let request = GroupRequest { start: Some(start) };
            match target {
                StreamsTarget::Remote(remote) => {
                    remote
                        .put(&group_path(&key, &group, ""), json(&request)?)
                        .await?
                }
                StreamsTarget::Direct(streams) => json(
                    &stream_api::ensure_group(streams.as_ref(), key, group, request)
                        .await
                        .map_err(refused)?,
                )?,
            }
        }
        StreamsCommand::Ack { stream, group, ids } => {
            let (key, target) = open(&stream).await?;
            match target {
                StreamsTarget::Remote(remote) => {
                    remote
                        .post(
                            &group_path(&key, &group, "/ack"),
                            serde_json::json!({ "ids": ids }),
                        )
                        .await?
                }
                StreamsTarget::Direct(streams) => {
                    let mut parsed = Vec::with_capacity(ids.len());
                    for (i, id) in ids.iter().enumerate() {
                        parsed.push(
                            courier::StreamEntryId::parse("ids", id)
                                .map_err(|e| anyhow::anyhow!("invalid ids[{i}]: {}", e.reason))?,
                        );
                    }
                    let request = AckRequest { ids: parsed };
                    json(
                        &stream_api::ack(streams.as_ref(), key, group, request)
                            .await
                            .map_err(refused)?,
                    )?
                }
            }
        }
        StreamsCommand::Claim {
            stream,
            group,
            consumer,
            min_idle_ms,
            cursor,
            count,
        } => {
            let (key, target) = open(&stream).await?;
            let request = ClaimRequest {
                consumer,
                min_idle_ms,
                cursor: cursor.map(|c| entry_id("cursor", &c)).transpose()?,
                count,
            };
            match target {
                StreamsTarget::Remote(remote) => {
                    remote
                        .post(&group_path(&key, &group, "/claim"), json(&request)?)
                        .await?
                }
                StreamsTarget::Direct(streams) => json(
                    &stream_api::claim(streams.as_ref(), key, group, request)
                        .await
                        .map_err(refused)?,
                )?,
            }
        }
        StreamsCommand::Pending {
            stream,
            group,
            consumer,
            after,
            count,
            min_idle_ms,
        } => {
            let (key, target) = open(&stream).await?;
            match target {
                StreamsTarget::Remote(remote) => {
                    let query = query(&[
                        ("after", after),
                        ("count", count.map(|c| c.to_string())),
                        ("consumer", consumer),
                        ("min_idle_ms", min_idle_ms.map(|m| m.to_string())),
                    ]);
                    remote
                        .get(&group_path(&key, &group, &format!("/pending{query}")))
                        .await?
                }
                StreamsTarget::Direct(streams) => {
                    let params = PendingParams {
                        after: after.map(|a| entry_id("after", &a)).transpose()?,
                        count,
                        consumer,
                        min_idle_ms,
                    };
                    json(
                        &stream_api::pending(streams.as_ref(), key, group, params)
                            .await
                            .map_err(refused)?,
                    )?
                }
            }
        }
        StreamsCommand::Trim {
            stream,
            max_len,
            min_id,
        } => {
            let (key, target) = open(&stream).await?;
            let request = TrimRequest {
                max_len,
                min_id: min_id.map(|m| entry_id("min_id", &m)).transpose()?,
            };
            match target {
                StreamsTarget::Remote(remote) => {
                    remote.post(&path(&key, "/trim"), json(&request)?).await?
                }
                StreamsTarget::Direct(streams) => json(
                    &stream_api::trim(streams.as_ref(), key, request)
                        .await
                        .map_err(refused)?,
                )?,
            }
        }
        StreamsCommand::Consumers {
            stream,
            group,
            delete: Some(consumer),
        } => {
            let (key, target) = open(&stream).await?;
            match target {
                StreamsTarget::Remote(remote) => {
                    let path =
                        group_path(&key, &group, &format!("/consumers/{}", encode(&consumer)));
                    remote.delete(&path).await?;
                }
                StreamsTarget::Direct(streams) => {
                    stream_api::delete_consumer(streams.as_ref(), key, group, consumer.clone())
                        .await
                        .map_err(refused)?;
                }
            }
            serde_json::json!({ "deleted": consumer })
        }
        StreamsCommand::Consumers {
            stream,
            group,
            delete: None,
        } => {
            let (key, target) = open(&stream).await?;
            match target {
                StreamsTarget::Remote(remote) => {
                    remote.get(&group_path(&key, &group, "/consumers")).await?
                }
                StreamsTarget::Direct(streams) => json(
                    &stream_api::consumers(streams.as_ref(), key, group)
                        .await
                        .map_err(refused)?,
                )?,
            }
        }
    };
    ops::print_json(&answer)
}

/// The stream `args` names (checked) and where to send the verb.
async fn open(args: &StreamArgs) -> anyhow::Result<(StreamKey, StreamsTarget)> {
    let key = stream_api::stream_key(&args.tenant, &args.stream).map_err(refused)?;
    Ok((key, StreamsTarget::open(&args.target).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_come_from_flags_or_lines() {
        let given = vec!["{\"a\":1}".to_owned(), "2".to_owned()];
        assert_eq!(payloads(&given, &b""[..]).unwrap().len(), 2);
        let lines = b"{\"n\":1}\n\n[1,2]\n";
        let read = payloads(&[], &lines[..]).unwrap();
        assert_eq!(
            read,
            vec![
                ("line 1".to_owned(), serde_json::json!({"n": 1})),
                ("line 3".to_owned(), serde_json::json!([1, 2]))
            ]
        );
        let error = payloads(&[], &b"{\"n\":1}\nnope\n"[..]).unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        let error = payloads(&["{".to_owned()], &b""[..]).unwrap_err();
        assert!(error.to_string().contains("payload[0]"), "{error}");
        assert!(payloads(&[], &b"\n"[..]).is_err());
    }

    #[test]
    fn headers_are_name_equals_value() {
        assert_eq!(
            parse_header("trace=a=b").unwrap(),
            ("trace".to_owned(), "a=b".to_owned())
        );
        assert!(parse_header("trace").is_err());
    }
}
