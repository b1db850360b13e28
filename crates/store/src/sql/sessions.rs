//! Console sessions: the SHA-256 of each session id, who it is and when it lapses; shared by
//! every replica on the store.

use super::SqlStore;
use super::conn::{Conn, Row, query};
use super::writer::Write;
use crate::{ConsoleSessions, StoreError};
use async_trait::async_trait;
use toolgrid_core::auth::{ConsoleSession, Principal};
use toolgrid_core::ids::ObjectKey;

/// How a principal is stored: `(kind, namespace, name)`.
fn principal_parts(principal: &Principal) -> (&'static str, &str, &str) {
    match principal {
        Principal::Operator { subject } => ("operator", "", subject),
        Principal::Agent { agent } => ("agent", &agent.namespace, &agent.name),
    }
}

fn principal_from_parts(
    kind: &str,
    namespace: String,
    name: String,
) -> Result<Principal, StoreError> {
    match kind {
        "operator" => Ok(Principal::Operator { subject: name }),
        "agent" => Ok(Principal::Agent {
            agent: ObjectKey::new(namespace, name),
        }),
        other => Err(StoreError::Corrupt(format!(
            "console session of unknown principal kind {other:?}"
        ))),
    }
}

fn session_from_row(row: &Row) -> Result<ConsoleSession, StoreError> {
    let id: String = row.try_get("id_hash")?;
    let id_hash = decode_hash(&id)
        .ok_or_else(|| StoreError::Corrupt(format!("console session id hash {id:?}")))?;
    let kind: String = row.try_get("principal_kind")?;
    Ok(ConsoleSession {
        id_hash,
        principal: principal_from_parts(
            &kind,
            row.try_get("principal_namespace")?,
            row.try_get("principal_name")?,
        )?,
        created_at_ms: row.try_get("created_at_ms")?,
        last_seen_ms: row.try_get("last_seen_ms")?,
        idle_timeout_ms: row.try_get("idle_timeout_ms")?,
        expires_at_ms: row.try_get("expires_at_ms")?,
    })
}

fn encode_hash(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
}

struct CreateSession(ConsoleSession);

#[async_trait]
impl Write for CreateSession {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        let s = &self.0;
        let (kind, namespace, name) = principal_parts(&s.principal);
        // A repeat of a committed insert (same random id) changes nothing.
        query(
            "INSERT INTO console_sessions (id_hash, principal_kind, principal_namespace, \
             principal_name, created_at_ms, last_seen_ms, idle_timeout_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id_hash) DO NOTHING",
        )
        .bind(encode_hash(&s.id_hash))
        .bind(kind)
        .bind(namespace)
        .bind(name)
        .bind(s.created_at_ms)
        .bind(s.last_seen_ms)
        .bind(s.idle_timeout_ms)
        .bind(s.expires_at_ms)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

struct TouchSession {
    id_hash: [u8; 32],
    now_ms: i64,
}

#[async_trait]
impl Write for TouchSession {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        // Never backwards: another replica may have recorded a later use.
        query(
            "UPDATE console_sessions SET last_seen_ms = $2 WHERE id_hash = $1 AND last_seen_ms < $2",
        )
        .bind(encode_hash(&self.id_hash))
        .bind(self.now_ms)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

struct DeleteSession([u8; 32]);

#[async_trait]
impl Write for DeleteSession {
    type Output = bool;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<bool, StoreError> {
        let done = query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(encode_hash(&self.0))
            .execute(&mut *conn)
            .await?;
        Ok(done > 0)
    }
}

struct PurgeSessions(i64);

#[async_trait]
impl Write for PurgeSessions {
    type Output = u64;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<u64, StoreError> {
        let done = query(
            "DELETE FROM console_sessions WHERE expires_at_ms <= $1 \
             OR last_seen_ms + idle_timeout_ms <= $1",
        )
        .bind(self.0)
        .execute(&mut *conn)
        .await?;
        Ok(done)
    }
}

#[async_trait]
impl ConsoleSessions for SqlStore {
    async fn create_console_session(&self, session: ConsoleSession) -> Result<(), StoreError> {
        self.write(CreateSession(session)).await
    }

    async fn console_session(
        &self,
        id_hash: &[u8; 32],
    ) -> Result<Option<ConsoleSession>, StoreError> {
        let row = query(
            "SELECT id_hash, principal_kind, principal_namespace, principal_name, created_at_ms, \
             last_seen_ms, idle_timeout_ms, expires_at_ms FROM console_sessions WHERE id_hash = $1",
        )
        .bind(encode_hash(id_hash))
        .fetch_optional(&mut *self.reads.acquire().await?)
        .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn touch_console_session(
        &self,
        id_hash: &[u8; 32],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.write(TouchSession {
            id_hash: *id_hash,
            now_ms,
        })
        .await
    }

    async fn delete_console_session(&self, id_hash: &[u8; 32]) -> Result<bool, StoreError> {
        self.write(DeleteSession(*id_hash)).await
    }

    async fn purge_console_sessions(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.write(PurgeSessions(now_ms)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_as_hex() {
        let hash = [0xab; 32];
        assert_eq!(decode_hash(&encode_hash(&hash)), Some(hash));
        assert_eq!(decode_hash("ab"), None);
        assert_eq!(decode_hash(&"zz".repeat(32)), None);
        assert!(principal_from_parts("robot", String::new(), String::new()).is_err());
    }
}
