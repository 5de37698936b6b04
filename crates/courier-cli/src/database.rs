//! Which database a `--database-url` names, and `courier migrate`.

use anyhow::Context;
use courier::Courier;

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
