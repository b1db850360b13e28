//! One way to run the store's SQL on either kind of connection: sqlx's `Any` connection
//! (PostgreSQL, and every read) and the SQLite writer's own connection ([`native`]), which
//! runs a batch's statements on its thread without a round trip to another thread per
//! statement.
//!
//! A [`Query`] is a statement with `$1`, `$2`… placeholders and its arguments, bound when
//! it runs; a [`Row`] is read by column name into any type both backends decode.
//!
//! [`native`]: super::native

use super::Backend;
use crate::StoreError;
use async_trait::async_trait;
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, AssertSqlSafe};
use std::borrow::Cow;
use std::sync::Arc;

/// A connection the store's SQL runs on.
#[async_trait]
pub(super) trait Conn: Send {
    fn backend(&self) -> Backend;
    /// Runs `query`; returns the rows it changed.
    async fn execute(&mut self, query: Query<'_>) -> Result<u64, StoreError>;
    /// Runs `query`; returns its rows.
    async fn fetch_all(&mut self, query: Query<'_>) -> Result<Vec<Row>, StoreError>;
    /// Runs `query`; returns its first row, if any.
    async fn fetch_optional(&mut self, query: Query<'_>) -> Result<Option<Row>, StoreError>;
    /// Its way to write a blob into a row in place, if it has one (the SQLite writer's).
    fn blob_writes(&mut self) -> Option<&mut dyn BlobWrites> {
        None
    }
}

/// Writing a large blob into its row in place, through the page cache (SQLite's
/// incremental blob I/O). Bound as an argument, SQLite copies a blob and then builds the
/// whole row around it, two copies of it at once: 209 MB for the Python runtime's module.
pub(super) trait BlobWrites {
    /// Writes `bytes` at the start of the blob in `column` of row `rowid` of `table`, a
    /// blob at least as long (made with `zeroblob(n)`), in this connection's transaction.
    fn write_blob(
        &mut self,
        table: &'static str,
        column: &'static str,
        rowid: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError>;
}

/// A statement's text.
enum Sql {
    Static(&'static str),
    /// Built at run time (only numbered placeholders are ever formatted into it).
    Built(String),
}

/// An argument of a statement. NULLs keep their type: PostgreSQL is told each
/// parameter's type.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Arg<'q> {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<Cow<'q, str>>),
    Blob(Option<Cow<'q, [u8]>>),
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(Some(value))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Arg::Int(value)
    }
}

impl From<f64> for Arg<'_> {
    fn from(value: f64) -> Self {
        Arg::Real(Some(value))
    }
}

impl<'q> From<&'q str> for Arg<'q> {
    fn from(value: &'q str) -> Self {
        Arg::Text(Some(Cow::Borrowed(value)))
    }
}

impl<'q> From<&'q String> for Arg<'q> {
    fn from(value: &'q String) -> Self {
        Arg::Text(Some(Cow::Borrowed(value)))
    }
}

impl From<String> for Arg<'_> {
    fn from(value: String) -> Self {
        Arg::Text(Some(Cow::Owned(value)))
    }
}

impl<'q> From<Option<&'q str>> for Arg<'q> {
    fn from(value: Option<&'q str>) -> Self {
        Arg::Text(value.map(Cow::Borrowed))
    }
}

impl From<Option<String>> for Arg<'_> {
    fn from(value: Option<String>) -> Self {
        Arg::Text(value.map(Cow::Owned))
    }
}

impl<'q> From<&'q [u8]> for Arg<'q> {
    fn from(value: &'q [u8]) -> Self {
        Arg::Blob(Some(Cow::Borrowed(value)))
    }
}

impl From<Vec<u8>> for Arg<'_> {
    fn from(value: Vec<u8>) -> Self {
        Arg::Blob(Some(Cow::Owned(value)))
    }
}

/// A statement and its arguments (`$1` is the first).
pub(super) struct Query<'q> {
    sql: Sql,
    args: Vec<Arg<'q>>,
}

/// A statement whose text is fixed.
pub(super) fn query<'q>(sql: &'static str) -> Query<'q> {
    Query {
        sql: Sql::Static(sql),
        args: Vec::new(),
    }
}

/// A statement whose text is built at run time: only numbered placeholders (and other text
/// of our own, never a caller's value) may be formatted into it.
pub(super) fn built_query<'q>(sql: String) -> Query<'q> {
    Query {
        sql: Sql::Built(sql),
        args: Vec::new(),
    }
}

impl<'q> Query<'q> {
    pub(super) fn bind(mut self, value: impl Into<Arg<'q>>) -> Self {
        self.args.push(value.into());
        self
    }

    pub(super) fn sql(&self) -> &str {
        match &self.sql {
            Sql::Static(sql) => sql,
            Sql::Built(sql) => sql,
        }
    }

    pub(super) fn args(&self) -> &[Arg<'q>] {
        &self.args
    }

    pub(super) async fn execute<C: Conn + ?Sized>(self, conn: &mut C) -> Result<u64, StoreError> {
        conn.execute(self).await
    }

    pub(super) async fn fetch_all<C: Conn + ?Sized>(
        self,
        conn: &mut C,
    ) -> Result<Vec<Row>, StoreError> {
        conn.fetch_all(self).await
    }

    pub(super) async fn fetch_optional<C: Conn + ?Sized>(
        self,
        conn: &mut C,
    ) -> Result<Option<Row>, StoreError> {
        conn.fetch_optional(self).await
    }

    /// Its first row; [`sqlx::Error::RowNotFound`] when it has none.
    pub(super) async fn fetch_one<C: Conn + ?Sized>(self, conn: &mut C) -> Result<Row, StoreError> {
        conn.fetch_optional(self)
            .await?
            .ok_or(StoreError::Database(sqlx::Error::RowNotFound))
    }

    /// The sqlx query for this statement, its arguments bound.
    fn to_sqlx<'a>(&'a self) -> sqlx::query::Query<'a, Any, sqlx::any::AnyArguments> {
        let mut query = match &self.sql {
            Sql::Static(sql) => sqlx::query(*sql),
            Sql::Built(sql) => sqlx::query(AssertSqlSafe(sql.as_str())),
        };
        for arg in &self.args {
            query = match arg {
                Arg::Int(value) => query.bind(*value),
                Arg::Real(value) => query.bind(*value),
                Arg::Text(value) => query.bind(value.as_deref()),
                Arg::Blob(value) => query.bind(value.as_deref()),
            };
        }
        query
    }
}

#[async_trait]
impl Conn for AnyConnection {
    fn backend(&self) -> Backend {
        if self.backend_name() == "PostgreSQL" {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }

    async fn execute(&mut self, query: Query<'_>) -> Result<u64, StoreError> {
        Ok(query.to_sqlx().execute(self).await?.rows_affected())
    }

    async fn fetch_all(&mut self, query: Query<'_>) -> Result<Vec<Row>, StoreError> {
        let rows = query.to_sqlx().fetch_all(self).await?;
        Ok(rows.into_iter().map(Row::Any).collect())
    }

    async fn fetch_optional(&mut self, query: Query<'_>) -> Result<Option<Row>, StoreError> {
        Ok(query.to_sqlx().fetch_optional(self).await?.map(Row::Any))
    }
}

/// A row of a result, from either kind of connection.
pub(super) enum Row {
    Any(AnyRow),
    Native(NativeRow),
}

/// A row read on the native SQLite connection: its values, owned.
pub(super) struct NativeRow {
    pub(super) columns: Arc<[String]>,
    pub(super) values: Vec<rusqlite::types::Value>,
}

/// A type a column is read into, on either backend.
pub(super) trait Column: Sized {
    fn from_any(row: &AnyRow, name: &str) -> Result<Self, sqlx::Error>;
    fn from_native(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self>;
}

impl<T> Column for T
where
    T: for<'r> sqlx::Decode<'r, Any> + sqlx::Type<Any> + rusqlite::types::FromSql,
{
    fn from_any(row: &AnyRow, name: &str) -> Result<Self, sqlx::Error> {
        sqlx::Row::try_get(row, name)
    }

    fn from_native(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        T::column_result(value)
    }
}

impl Row {
    /// The column `name`, read as a `T`.
    pub(super) fn try_get<T: Column>(&self, name: &str) -> Result<T, StoreError> {
        match self {
            Row::Any(row) => Ok(T::from_any(row, name)?),
            Row::Native(row) => {
                let index = row
                    .columns
                    .iter()
                    .position(|column| column == name)
                    .ok_or_else(|| sqlx::Error::ColumnNotFound(name.into()))?;
                T::from_native((&row.values[index]).into()).map_err(|error| {
                    StoreError::Database(sqlx::Error::ColumnDecode {
                        index: name.into(),
                        source: Box::new(error),
                    })
                })
            }
        }
    }
}
