//! What every concern's SQL shares below the call row: the connection's backend, and JSON
//! columns written and read.

use super::Backend;
use super::conn::Conn;
use crate::StoreError;

pub(super) fn is_postgres(conn: &dyn Conn) -> bool {
    conn.backend() == Backend::Postgres
}

pub(super) fn json_text(value: &impl serde::Serialize) -> String {
    // Serializing our own plain data types cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}
