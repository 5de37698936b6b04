//! Which database a `--database-url` names, `courier migrate` and
//! `courier migrate status`.

use anyhow::Context;
use courier::{Courier, MigrationState, MigrationStatus};

/// A database Courier can run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// A PostgreSQL server (`postgres://` or `postgresql://`).
    Postgres {
        /// The connection URL.
        url: String,
    },
    /// A SQLite file (`sqlite:path`, `sqlite://path`, or a plain path).
    Sqlite {
        /// The file's path.
        path: String,
    },
}

impl Database {
    /// Reads a URL or path: PostgreSQL for `postgres://`/`postgresql://`, SQLite otherwise.
    pub fn parse(url_or_path: &str) -> anyhow::Result<Self> {
        let text = url_or_path.trim();
        if text.is_empty() {
            anyhow::bail!("invalid database-url: it is empty");
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres {
                url: text.to_owned(),
            });
        }
        let path = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
            .unwrap_or(text);
        if path.is_empty() || path == ":memory:" {
            anyhow::bail!("invalid database-url: {text:?} names no SQLite file");
        }
        Ok(Self::Sqlite {
            path: path.to_owned(),
        })
    }

    /// `postgres` or `sqlite`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Self::Postgres { .. } => "postgres",
            Self::Sqlite { .. } => "sqlite",
        }
    }
}

/// Checks a PostgreSQL schema name, naming the `schema` field when it is refused.
pub fn validate_schema(schema: &str) -> anyhow::Result<()> {
    courier::postgres::validate_schema(schema)?;
    Ok(())
}

/// Creates or upgrades Courier's tables; returns a line saying what was done.
pub async fn migrate(database: &Database, schema: &str) -> anyhow::Result<String> {
    match database {
        Database::Postgres { url } => {
            validate_schema(schema)?;
            let pool = courier::postgres::connect(url, 2)
                .await
                .context("connecting to PostgreSQL")?;
            let courier = Courier::postgres_with_schema(pool.clone(), schema)?;
            courier.migrate().await.context("migrating")?;
            let version = courier.store().schema_version().await?;
            pool.close().await;
            Ok(format!(
                "PostgreSQL schema {schema} is at Courier schema version {version}"
            ))
        }
        Database::Sqlite { path } => {
            let courier = Courier::connect_sqlite(path)
                .await
                .with_context(|| format!("opening SQLite file {path}"))?;
            courier.migrate().await.context("migrating")?;
            let version = courier.store().schema_version().await?;
            courier.store().pool().close().await;
            Ok(format!(
                "SQLite file {path} is at Courier schema version {version}"
            ))
        }
    }
}

/// How many hex digits of a checksum the status table shows (JSON has all 64).
pub const SHORT_CHECKSUM: usize = 12;

/// Every migration this binary ships and every one the database records,
/// with its state (see [`MigrationStatus`]). Reads only: nothing is created
/// or applied, no lock is taken, and a database never migrated (a missing
/// PostgreSQL schema, a missing SQLite file, which is not created) lists
/// every migration pending.
pub async fn migration_status(
    database: &Database,
    schema: &str,
) -> anyhow::Result<Vec<MigrationStatus>> {
    match database {
        Database::Postgres { url } => {
            validate_schema(schema)?;
            let pool = courier::postgres::connect(url, 1)
                .await
                .context("connecting to PostgreSQL")?;
            let store = courier::postgres::PgStore::with_schema(pool.clone(), schema)?;
            let status = store.migration_status().await;
            pool.close().await;
            status.context("reading the migration status")
        }
        Database::Sqlite { path } => {
            if !std::path::Path::new(path).exists() {
                return Ok(courier::migration_status(courier::sqlite::MIGRATIONS, &[]));
            }
            let pool = courier::sqlite::connect(path, 1)
                .await
                .with_context(|| format!("opening SQLite file {path}"))?;
            let store = courier::sqlite::SqliteStore::new(pool.clone());
            let status = store.migration_status().await;
            pool.close().await;
            status.context("reading the migration status")
        }
    }
}

fn short(checksum: &str) -> &str {
    checksum.get(..SHORT_CHECKSUM).unwrap_or(checksum)
}

/// The status as a table for people: version, name, state, when applied
/// (UTC, to the second) and the checksum shortened to [`SHORT_CHECKSUM`]
/// hex digits (this binary's; for a changed migration the recorded one
/// beside it), then a line of totals.
pub fn migration_status_table(statuses: &[MigrationStatus]) -> String {
    let mut unrecorded = false;
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|status| {
            let checksum = match (&status.checksum, &status.recorded_checksum, status.state) {
                (Some(ours), Some(recorded), MigrationState::Changed) => {
                    format!("{} (recorded {})", short(ours), short(recorded))
                }
                (Some(ours), None, MigrationState::Applied) => {
                    unrecorded = true;
                    format!("{} (not recorded yet)", short(ours))
                }
                (Some(ours), _, _) => short(ours).to_owned(),
                (None, Some(recorded), _) => format!("(recorded {})", short(recorded)),
                (None, None, _) => "-".to_owned(),
            };
            vec![
                format!("{:04}", status.version),
                status.name.clone(),
                status.state.as_str().to_owned(),
                status.applied_at.map_or_else(
                    || "-".to_owned(),
                    |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                ),
                checksum,
            ]
        })
        .collect();
    let mut out = crate::ops::table(
        &["VERSION", "NAME", "STATE", "APPLIED AT", "CHECKSUM"],
        &rows,
    );
    let count = |state| statuses.iter().filter(|s| s.state == state).count();
    out.push_str(&format!(
        "{} applied, {} pending, {} changed, {} unknown to this binary\n",
        count(MigrationState::Applied),
        count(MigrationState::Pending),
        count(MigrationState::Changed),
        count(MigrationState::Unknown),
    ));
    if unrecorded {
        out.push_str(
            "(not recorded yet: applied by an older courier; the next `courier migrate` \
             records this binary's checksum for it)\n",
        );
    }
    out
}

/// The status as JSON: `{"backend", "schema" (PostgreSQL only), "migrations":
/// [{"version", "name", "state", "applied_at", "checksum",
/// "recorded_checksum"}]}`, checksums in full.
pub fn migration_status_json(
    database: &Database,
    schema: &str,
    statuses: &[MigrationStatus],
) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::json!({
        "backend": database.backend_name(),
        "schema": match database {
            Database::Postgres { .. } => Some(schema),
            Database::Sqlite { .. } => None,
        },
        "migrations": serde_json::to_value(statuses)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_and_sqlite_paths_are_told_apart() {
        assert_eq!(
            Database::parse("postgres://u@h/db").unwrap().backend_name(),
            "postgres"
        );
        assert_eq!(
            Database::parse("sqlite://x.db").unwrap(),
            Database::Sqlite {
                path: "x.db".into()
            }
        );
        assert_eq!(
            Database::parse("./a.db").unwrap(),
            Database::Sqlite {
                path: "./a.db".into()
            }
        );
        assert!(Database::parse("sqlite::memory:").is_err());
        assert!(Database::parse("  ").is_err());
    }

    #[test]
    fn a_schema_name_with_capitals_is_refused_by_field() {
        let error = validate_schema("Bad-Name").unwrap_err().to_string();
        assert!(error.contains("schema"), "{error}");
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    fn line(version: i64, state: MigrationState, recorded: Option<&str>) -> MigrationStatus {
        MigrationStatus {
            version,
            name: format!("m{version}"),
            checksum: (state != MigrationState::Unknown).then(|| "a".repeat(64)),
            recorded_checksum: recorded.map(str::to_owned),
            applied_at: None,
            state,
        }
    }

    #[test]
    fn the_table_shortens_checksums_to_twelve_digits() {
        let table = migration_status_table(&[line(3, MigrationState::Pending, None)]);
        let row = table.lines().nth(1).unwrap_or_default();
        assert!(row.starts_with("0003 "), "{table}");
        assert!(row.ends_with(&format!(" {}", "a".repeat(12))), "{table}");
        assert!(!table.contains(&"a".repeat(13)), "{table}");
    }
}
