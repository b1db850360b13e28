//! Command definitions, stored once per release and definition rather than in every call's
//! row.
//!
//! A call keeps the definition of its command as it was admitted (its spec's `command`), so
//! its result is judged by the same rules after a restart or a failover even if the Tool
//! has changed since. The definition is most of a call's spec (its descriptions, schemas
//! and errors: 1.6 KB of the example tool's 1.9 KB), and the same for every call of the
//! command. Kept in the row, it made the row larger than a 1 KiB page, so each call's row
//! took overflow pages, which its end rewrote, freed and took again. It is stored here
//! instead, keyed by the release's digest and the SHA-256 of its JSON, and the row
//! names it (`calls.command_digest`); reads bring it back (`command_json!`, among a call's
//! columns), so a record read from the store is the record admitted.
//!
//! A definition is the same for every call of a command, so neither its JSON and digest nor
//! its parsed form is made again for each call: both are remembered, by the shared
//! definition ([`split`]) and by digest ([`parsed`]), a bounded number of each.
//!
//! A definition no call names any more is deleted with the calls retention deletes
//! ([`purge_unused`]). On PostgreSQL, where replicas write at once, that deletion takes an
//! advisory lock every admission shares ([`store`]), so it never deletes a definition a
//! call being admitted names.

use super::codec::{is_postgres, json_text, parse_json};
use super::conn::{Conn, query};
use crate::StoreError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use toolgrid_core::call::CallSpec;
use toolgrid_core::spec::Command;

/// A command definition as stored: its key and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredCommand {
    /// SHA-256 of `definition`, hex.
    pub digest: String,
    pub definition: String,
}

/// The columns a call's reads select: the name of the definition its row names, and the
/// definition (both NULL for a row that names none: one written before definitions were
/// stored apart, whose spec holds it, or a spec built without one).
macro_rules! command_json {
    () => {
        "command_digest, (SELECT definition FROM call_commands WHERE call_commands.release_digest = calls.release_digest \
         AND call_commands.digest = calls.command_digest) AS command_json"
    };
}
pub(super) use command_json;

/// The advisory lock (PostgreSQL) admissions share and the deletion of unused definitions
/// takes alone.
const LOCK: i64 = 0x746f_6f6c_636d_6473; // "toolcmds"

/// Definitions remembered, of each kind, before the memory is emptied and begun again.
const REMEMBERED: usize = 256;

/// A bounded memory of values by key, shared by the process's stores.
struct Memory<K, V>(Mutex<Option<HashMap<K, V>>>);

impl<K: std::hash::Hash + Eq, V: Clone> Memory<K, V> {
    const fn new() -> Self {
        Memory(Mutex::new(None))
    }

    fn get<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        let memory = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        memory.as_ref().and_then(|m| m.get(key).cloned())
    }

    fn insert(&self, key: K, value: V) {
        let mut memory = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let memory = memory.get_or_insert_with(HashMap::new);
        if memory.len() >= REMEMBERED {
            memory.clear();
        }
        memory.insert(key, value);
    }
}

/// Stored forms of the shared definitions admitted, by the address of the definition
/// (kept alive here with it, so the address is not reused while it is remembered).
static STORED: Memory<usize, (Arc<Command>, StoredCommand)> = Memory::new();

/// Definitions parsed, by digest (a digest names one JSON text, so one definition).
static PARSED: Memory<String, Arc<Command>> = Memory::new();

/// The JSON of `spec` without its command's definition, and that definition as stored
/// (None when the spec holds none). `spec` is as it was when this returns.
pub(super) fn split(spec: &mut CallSpec) -> (String, Option<StoredCommand>) {
    let command = spec.command.take();
    let spec_json = json_text(spec);
    let stored = command.as_ref().map(stored);
    spec.command = command;
    (spec_json, stored)
}

/// `command` as stored: its JSON and digest, made once per shared definition.
fn stored(command: &Arc<Command>) -> StoredCommand {
    let key = Arc::as_ptr(command) as usize;
    if let Some((_, stored)) = STORED.get(&key) {
        return stored;
    }
    use sha2::{Digest as _, Sha256};
    let definition = json_text(command);
    let digest = Sha256::digest(definition.as_bytes());
    let stored = StoredCommand {
        digest: digest.iter().map(|b| format!("{b:02x}")).collect(),
        definition,
    };
    STORED.insert(key, (command.clone(), stored.clone()));
    stored
}

/// The definition named `digest` whose JSON is `definition`, parsed once per digest.
pub(super) fn parsed(digest: &str, definition: &str) -> Result<Arc<Command>, StoreError> {
    if let Some(command) = PARSED.get(digest) {
        return Ok(command);
    }
    let command: Arc<Command> = Arc::new(parse_json(definition, "call command")?);
    PARSED.insert(digest.to_string(), command.clone());
    Ok(command)
}

/// How a transaction holds [`LOCK`].
enum Hold {
    /// With the other admissions.
    Shared,
    /// Alone.
    Alone,
}

/// Takes [`LOCK`] until the transaction ends (PostgreSQL; on SQLite the single writer's
/// transactions never overlap).
async fn lock(conn: &mut dyn Conn, hold: Hold) -> Result<(), StoreError> {
    if !is_postgres(conn) {
        return Ok(());
    }
    let statement = match hold {
        Hold::Shared => "SELECT 1 FROM (SELECT pg_advisory_xact_lock_shared($1)) AS commands_lock",
        Hold::Alone => "SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS commands_lock",
    };
    query(statement).bind(LOCK).fetch_one(&mut *conn).await?;
    Ok(())
}

/// Stores `command` for calls of `release_digest` unless it is stored already. Runs in the
/// admission's transaction, before the call's row that names it.
pub(super) async fn store(
    conn: &mut dyn Conn,
    release_digest: &str,
    command: &StoredCommand,
) -> Result<(), StoreError> {
    lock(conn, Hold::Shared).await?;
    query(
        "INSERT INTO call_commands (release_digest, digest, definition) VALUES ($1, $2, $3) \
         ON CONFLICT (release_digest, digest) DO NOTHING",
    )
    .bind(release_digest)
    .bind(command.digest.as_str())
    .bind(command.definition.as_str())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Deletes the definitions no call names; returns how many went.
pub(super) async fn purge_unused(conn: &mut dyn Conn) -> Result<u64, StoreError> {
    lock(conn, Hold::Alone).await?;
    query(
        "DELETE FROM call_commands WHERE NOT EXISTS (SELECT 1 FROM calls \
         WHERE calls.release_digest = call_commands.release_digest \
         AND calls.command_digest = call_commands.digest)",
    )
    .execute(&mut *conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_holds_at_most_its_bound() {
        let memory: Memory<usize, usize> = Memory::new();
        for i in 0..REMEMBERED + 10 {
            memory.insert(i, i);
        }
        assert_eq!(memory.get(&(REMEMBERED + 9)), Some(REMEMBERED + 9));
        assert_eq!(memory.get(&0), None, "emptied when full");
        let held = memory.0.lock().unwrap().as_ref().map_or(0, HashMap::len);
        assert!(held <= REMEMBERED, "{held}");
    }

    #[test]
    fn the_spec_is_stored_without_its_command_which_is_keyed_by_its_json() {
        let mut spec = CallSpec {
            pool: "default/default".into(),
            ..CallSpec::default()
        };
        let command: toolgrid_core::spec::Command = serde_json::from_value(serde_json::json!({
            "name": "compare",
            "description": "Compares two versions.",
            "positional": [{"name": "a", "schema": {"type": "string"}, "required": true}],
        }))
        .unwrap();
        spec.command = Some(Arc::new(command.clone()));
        let (spec_json, stored) = split(&mut spec);
        assert_eq!(spec.command.as_deref(), Some(&command), "the spec keeps it");
        let json: serde_json::Value = serde_json::from_str(&spec_json).unwrap();
        assert_eq!(json["pool"], "default/default");
        assert!(json["command"].is_null(), "{json}");
        let stored = stored.unwrap();
        assert_eq!(
            serde_json::from_str::<toolgrid_core::spec::Command>(&stored.definition).unwrap(),
            command
        );
        assert_eq!(stored.digest.len(), 64);
        // The same definition, the same key, shared or not; another, another.
        let (_, again) = split(&mut spec);
        assert_eq!(again.as_ref(), Some(&stored));
        spec.command = Some(Arc::new(command.clone()));
        assert_eq!(split(&mut spec).1.as_ref(), Some(&stored));
        let mut other = command.clone();
        other.description = "Other.".into();
        spec.command = Some(Arc::new(other));
        assert_ne!(split(&mut spec).1.unwrap().digest, stored.digest);
        spec.command = None;
        assert_eq!(split(&mut spec).1, None);
        // Parsed once per digest: the same definition is shared by what reads it.
        let one = parsed(&stored.digest, &stored.definition).unwrap();
        assert_eq!(*one, command);
        let two = parsed(&stored.digest, &stored.definition).unwrap();
        assert!(Arc::ptr_eq(&one, &two));
        assert!(matches!(
            parsed("not-a-digest-seen", "{"),
            Err(StoreError::Corrupt(_))
        ));
    }
}
