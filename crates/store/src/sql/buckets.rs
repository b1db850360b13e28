//! Rate-limit token buckets, shared by every connection, process and replica.

use super::SqlStore;
use super::codec::is_postgres;
use super::conn::{Conn, query};
use super::writer::Write;
use crate::{RateBuckets, StoreError};
use async_trait::async_trait;

/// Takes a token from a rate-limit bucket (see [`RateBuckets::take_token`]).
struct TakeToken {
    key: String,
    burst: u32,
    per_second: f64,
    now_ms: i64,
}

#[async_trait]
impl Write for TakeToken {
    type Output = Option<u64>;

    // A batch run again may take a second token for one request: the bucket errs on the
    // side of refusing.
    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<Option<u64>, StoreError> {
        take_token(conn, &self.key, self.burst, self.per_second, self.now_ms).await
    }
}

/// Takes a token from bucket `key` (created full), atomically: PostgreSQL locks the row
/// (`FOR UPDATE`) until the transaction ends, so replicas take turns; SQLite's write lock,
/// taken by the insert, serialises every writer of the database file.
async fn take_token(
    conn: &mut dyn Conn,
    key: &str,
    burst: u32,
    per_second: f64,
    now: i64,
) -> Result<Option<u64>, StoreError> {
    query(
        "INSERT INTO rate_buckets (key, tokens, updated_at_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .bind(f64::from(burst.max(1)))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let select = if is_postgres(conn) {
        "SELECT tokens, updated_at_ms FROM rate_buckets WHERE key = $1 FOR UPDATE"
    } else {
        "SELECT tokens, updated_at_ms FROM rate_buckets WHERE key = $1"
    };
    let row = query(select).bind(key).fetch_one(&mut *conn).await?;
    let taken = toolgrid_core::middleware::bucket::take(
        row.try_get("tokens")?,
        row.try_get("updated_at_ms")?,
        burst,
        per_second,
        now,
    );
    query("UPDATE rate_buckets SET tokens = $2, updated_at_ms = $3 WHERE key = $1")
        .bind(key)
        .bind(taken.tokens)
        .bind(taken.updated_at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(taken.retry_after_ms)
}

#[async_trait]
impl RateBuckets for SqlStore {
    async fn take_token(
        &self,
        key: &str,
        burst: u32,
        per_second: f64,
        now_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        self.write(TakeToken {
            key: key.into(),
            burst,
            per_second,
            now_ms,
        })
        .await
    }
}
