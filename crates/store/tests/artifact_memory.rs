//! Storing a large artifact on SQLite, first and again, holds no copy of its bytes in
//! SQLite's memory. Alone in its test binary: it reads SQLite's high-water mark of memory
//! in use, which every connection in the process moves.

use rusqlite::ffi;
use toolgrid_store::Artifacts;

/// An artifact this large makes any copy of it stand out of everything else SQLite holds
/// (each connection's page cache is at most 2 MB).
const SIZE: usize = 48 << 20;

/// SQLite's memory in use now, and resets its high-water mark to it.
fn sqlite_memory_reset() -> i64 {
    let (mut current, mut highwater) = (0i64, 0i64);
    // SAFETY: both pointers are to live locals; SQLite writes one i64 through each.
    let rc = unsafe {
        ffi::sqlite3_status64(ffi::SQLITE_STATUS_MEMORY_USED, &mut current, &mut highwater, 1)
    };
    assert_eq!(rc, ffi::SQLITE_OK);
    current
}

/// SQLite's most memory in use since the last reset.
fn sqlite_memory_highwater() -> i64 {
    let (mut current, mut highwater) = (0i64, 0i64);
    // SAFETY: as above.
    let rc = unsafe {
        ffi::sqlite3_status64(ffi::SQLITE_STATUS_MEMORY_USED, &mut current, &mut highwater, 0)
    };
    assert_eq!(rc, ffi::SQLITE_OK);
    highwater
}

#[tokio::test]
async fn sqlite_stores_a_large_artifact_without_a_copy_of_its_bytes_first_or_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let store = toolgrid_store::open(&url).await.unwrap();
    let bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();

    for attempt in ["first", "again"] {
        let before = sqlite_memory_reset();
        store
            .put_artifact("sha256:large", bytes.clone())
            .await
            .unwrap();
        let grew = sqlite_memory_highwater() - before;
        // Bound as an argument, the bytes were copied (the binding), and copied again into
        // the row SQLite builds; stored again, the old row's blob was read back too.
        assert!(
            grew < (SIZE / 4) as i64,
            "{attempt}: SQLite's memory grew by {grew} bytes storing {SIZE}"
        );
    }
    let stored = store.get_artifact("sha256:large").await.unwrap();
    assert!(stored.as_deref() == Some(bytes.as_slice()), "the bytes read back differ");
}
