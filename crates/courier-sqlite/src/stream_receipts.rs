//! [`StreamReceipts`] for SQLite: the `stream_receipts` table beside the
//! outbox. Writes take this process's write turn and SQLite's write lock
//! like every other write of the store.

use courier_core::{ReceiptOutcome, StoreError, StreamReceipts, TxWork};
use sqlx::SqliteConnection;

use crate::error::map;
use crate::{queries, SqliteStore};

fn json_array(ids: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(ids).map_err(|e| StoreError::Corrupt(format!("correlation ids: {e}")))
}

impl StreamReceipts for SqliteStore {
    type Connection = SqliteConnection;

    async fn find_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> Result<Vec<String>, StoreError> {
        if correlation_ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(queries::STREAM_RECEIPTS_FIND)
            .bind(subscription)
            .bind(json_array(correlation_ids)?)
            .fetch_all(self.pool())
            .await
            .map_err(map)
    }

    async fn record_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> Result<u64, StoreError> {
        if correlation_ids.is_empty() {
            return Ok(0);
        }
        let _turn = self.write_turn().await?;
        Ok(sqlx::query(queries::STREAM_RECEIPTS_INSERT)
            .bind(subscription)
            .bind(json_array(correlation_ids)?)
            .execute(self.pool())
            .await
            .map_err(map)?
            .rows_affected())
    }

    async fn run_with_stream_receipt<'c>(
        &'c self,
        subscription: &'c str,
        correlation_id: &'c str,
        work: TxWork<SqliteConnection>,
    ) -> Result<ReceiptOutcome, StoreError> {
        let _turn = self.write_turn().await?;
        let mut tx = self.begin().await?;
        let fresh = sqlx::query(queries::STREAM_RECEIPTS_INSERT)
            .bind(subscription)
            .bind(json_array(&[correlation_id.to_owned()])?)
            .execute(&mut *tx)
            .await
            .map_err(map)?
            .rows_affected()
            == 1;
        if !fresh {
            tx.rollback().await.map_err(map)?;
            return Ok(ReceiptOutcome::AlreadyApplied);
        }
        match work(&mut tx).await {
            Ok(()) => {
                tx.commit().await.map_err(map)?;
                Ok(ReceiptOutcome::Applied)
            }
            Err(error) => {
                tx.rollback().await.map_err(map)?;
                Ok(ReceiptOutcome::Failed(error))
            }
        }
    }
}
