//! Migrations as both backends ship, check and report them.
//!
//! A backend ships its migrations as a list of [`Migration`]s, oldest first,
//! numbered 1, 2, 3… Each has a checksum: the SHA-256 of its SQL text as
//! shipped (for PostgreSQL the template, before the schema name is put in,
//! so it is the same for every schema), in lowercase hex. Applying a
//! migration records its checksum beside its version, name and time.
//!
//! Before applying anything, a backend reads what was recorded and hands it
//! to [`check_applied`]: a recorded checksum that differs from the binary's
//! means someone edited a migration after it was applied (this binary's
//! queries may not match the tables), and a version the binary does not ship
//! means a newer build migrated the database. Either is refused and nothing
//! is applied.
//!
//! Rows written by a build from before checksums were recorded have none.
//! The first migration run of a build that records checksums records its own
//! for them (trust on first use): from then on they are checked like the
//! others. [`migration_status`] reports such a row as applied, with no
//! recorded checksum.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::StoreError;

/// One migration a backend ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its version: 1 for the first, each next one one more.
    pub version: i64,
    /// Its name, as recorded in the database (`outbox`, `idle_workers`, …).
    pub name: &'static str,
    /// Its SQL text as shipped (PostgreSQL's with `{schema}` placeholders).
    pub sql: &'static str,
}

impl Migration {
    /// The SHA-256 of [`Migration::sql`], lowercase hex (64 characters).
    pub fn checksum(&self) -> String {
        migration_checksum(self.sql)
    }
}

/// The SHA-256 of a migration's SQL text as shipped, lowercase hex.
pub fn migration_checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

/// A migration as the database recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    /// The version recorded.
    pub version: i64,
    /// The name recorded.
    pub name: String,
    /// The checksum recorded; `None` for a row an older build wrote.
    pub checksum: Option<String>,
    /// When it was applied, on the database clock.
    pub applied_at: DateTime<Utc>,
}

/// Where one migration stands in a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    /// Applied, with this binary's checksum (or none recorded yet: see the
    /// module documentation on trust on first use).
    Applied,
    /// Not applied yet: the next migration run applies it.
    Pending,
    /// Applied, but the recorded checksum differs from this binary's: the
    /// next migration run refuses the database.
    Changed,
    /// Applied by a build newer than this one (a version this binary does
    /// not ship): the next migration run refuses the database.
    Unknown,
}

impl MigrationState {
    /// The state's name as printed: `applied`, `pending`, `changed`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Pending => "pending",
            Self::Changed => "changed",
            Self::Unknown => "unknown",
        }
    }
}

/// One line of a database's migration status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrationStatus {
    /// The migration's version.
    pub version: i64,
    /// Its name: this binary's, or the recorded one for a version this
    /// binary does not ship.
    pub name: String,
    /// This binary's checksum of it; `None` for a version it does not ship.
    pub checksum: Option<String>,
    /// The checksum the database recorded; `None` when not applied, or
    /// applied by a build that did not record checksums.
    pub recorded_checksum: Option<String>,
    /// When it was applied; `None` when pending.
    pub applied_at: Option<DateTime<Utc>>,
    /// Where it stands.
    pub state: MigrationState,
}

/// Every migration `shipped` and every one `recorded`, by version, with its
/// state: what `courier migrate status` prints. Reads nothing; a database
/// never migrated (`recorded` empty) has every shipped migration pending.
pub fn migration_status(
    shipped: &[Migration],
    recorded: &[AppliedMigration],
) -> Vec<MigrationStatus> {
    let mut statuses: Vec<MigrationStatus> = shipped
        .iter()
        .map(|migration| {
            let checksum = migration.checksum();
            let applied = recorded.iter().find(|r| r.version == migration.version);
            let state = match applied {
                None => MigrationState::Pending,
                Some(AppliedMigration {
                    checksum: Some(recorded),
                    ..
                }) if *recorded != checksum => MigrationState::Changed,
                Some(_) => MigrationState::Applied,
            };
            MigrationStatus {
                version: migration.version,
                name: migration.name.to_owned(),
                checksum: Some(checksum),
                recorded_checksum: applied.and_then(|r| r.checksum.clone()),
                applied_at: applied.map(|r| r.applied_at),
                state,
            }
        })
        .collect();
    statuses.extend(
        recorded
            .iter()
            .filter(|r| !shipped.iter().any(|m| m.version == r.version))
            .map(|r| MigrationStatus {
                version: r.version,
                name: r.name.clone(),
                checksum: None,
                recorded_checksum: r.checksum.clone(),
                applied_at: Some(r.applied_at),
                state: MigrationState::Unknown,
            }),
    );
    statuses.sort_by_key(|status| status.version);
    statuses
}

/// Whether a migration run may go on over what the database `recorded`
/// (see [`migration_refusal`]); a row with no checksum passes: the run
/// records the binary's (trust on first use).
pub fn check_applied(
    shipped: &[Migration],
    recorded: &[AppliedMigration],
) -> Result<(), StoreError> {
    match migration_refusal(&migration_status(shipped, recorded)) {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// Why a migration run refuses a database with this status, or `None` when
/// it would apply what is pending: a version newer than every one this
/// binary ships ([`StoreError::SchemaTooNew`] naming the newest recorded
/// version), any other version it does not ship ([`StoreError::Corrupt`]),
/// or a recorded checksum that differs from the binary's
/// ([`StoreError::MigrationChanged`], the oldest such migration). What
/// `courier migrate status` reports and what the runners refuse with.
pub fn migration_refusal(statuses: &[MigrationStatus]) -> Option<StoreError> {
    let known = statuses
        .iter()
        .filter(|s| s.state != MigrationState::Unknown)
        .map(|s| s.version)
        .max()
        .unwrap_or(0);
    let newest = statuses
        .iter()
        .filter(|s| s.applied_at.is_some())
        .map(|s| s.version)
        .max()
        .unwrap_or(0);
    if newest > known {
        return Some(StoreError::SchemaTooNew {
            found: newest,
            known,
        });
    }
    if let Some(stranger) = statuses.iter().find(|s| s.state == MigrationState::Unknown) {
        return Some(StoreError::Corrupt(format!(
            "the database records migration {:04} {}, which this binary does not ship",
            stranger.version, stranger.name
        )));
    }
    statuses
        .iter()
        .find(|s| s.state == MigrationState::Changed)
        .map(|changed| StoreError::MigrationChanged {
            version: changed.version,
            name: changed.name.clone(),
            recorded: changed.recorded_checksum.clone().unwrap_or_default(),
            expected: changed.checksum.clone().unwrap_or_default(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &[Migration] = &[
        Migration {
            version: 1,
            name: "one",
            sql: "CREATE TABLE one ()",
        },
        Migration {
            version: 2,
            name: "two",
            sql: "CREATE TABLE two ()",
        },
    ];

    fn recorded(version: i64, checksum: Option<&str>) -> AppliedMigration {
        AppliedMigration {
            version,
            name: format!("v{version}"),
            checksum: checksum.map(str::to_owned),
            applied_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_checksum_is_the_sha256_of_the_text_in_hex() {
        assert_eq!(
            migration_checksum(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            migration_checksum("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_different_recorded_checksum_is_refused_naming_the_migration() {
        let good = SHIPPED[0].checksum();
        let error = check_applied(
            SHIPPED,
            &[recorded(1, Some(&good)), recorded(2, Some("f00"))],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            error.starts_with("migration 0002 two was changed after it was applied: recorded checksum f00, this binary has "),
            "{error}"
        );
    }

    #[test]
    fn rows_without_a_checksum_pass_and_read_applied() {
        let rows = [recorded(1, None)];
        assert!(check_applied(SHIPPED, &rows).is_ok());
        let status = migration_status(SHIPPED, &rows);
        assert_eq!(status[0].state, MigrationState::Applied);
        assert_eq!(status[0].recorded_checksum, None);
        assert_eq!(status[1].state, MigrationState::Pending);
    }

    #[test]
    fn a_version_this_binary_does_not_ship_is_refused_as_too_new() {
        let rows = [recorded(1, None), recorded(2, None), recorded(3, None)];
        assert!(matches!(
            check_applied(SHIPPED, &rows),
            Err(StoreError::SchemaTooNew { found: 3, known: 2 })
        ));
        let status = migration_status(SHIPPED, &rows);
        assert_eq!(status.len(), 3);
        assert_eq!(status[2].state, MigrationState::Unknown);
        assert_eq!(status[2].name, "v3");
    }
}
