//! Storing a large artifact, first and again, and reading it in pieces, holds no copy of
//! its bytes: on SQLite neither in SQLite's memory nor in the process's own allocations,
//! on PostgreSQL not in the process's. Alone in its test binary: it reads SQLite's
//! high-water mark of memory in use and this binary's allocations, which everything in the
//! process moves.

use rusqlite::ffi;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use toolgrid_store::Store;

/// The system allocator, counting the bytes allocated now and at most since a reset.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator as it came; the counters are only read.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as allocated above.
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The process's allocations now; resets their peak to it.
fn allocated_reset() -> usize {
    let now = NOW.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// An artifact this large makes any copy of it stand out of everything else SQLite holds
/// (each connection's page cache is at most 2 MB).
const SIZE: usize = 48 << 20;

/// SQLite's memory in use now and its most since the last reset (`reset`: resets it to now).
fn sqlite_memory(reset: bool) -> (i64, i64) {
    let (mut current, mut highwater) = (0i64, 0i64);
    // SAFETY: both pointers are to live locals; SQLite writes one i64 through each.
    let rc = unsafe {
        ffi::sqlite3_status64(
            ffi::SQLITE_STATUS_MEMORY_USED,
            &mut current,
            &mut highwater,
            i32::from(reset),
        )
    };
    assert_eq!(rc, ffi::SQLITE_OK);
    (current, highwater)
}

/// SQLite's memory in use now, and resets its high-water mark to it.
fn sqlite_memory_reset() -> i64 {
    sqlite_memory(true).0
}

/// SQLite's most memory in use since the last reset.
fn sqlite_memory_highwater() -> i64 {
    sqlite_memory(false).1
}

#[tokio::test]
async fn a_large_artifact_is_stored_and_read_without_a_copy_of_its_bytes() {
    let bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let store = toolgrid_store::open(&url).await.unwrap();
    for attempt in ["first", "again"] {
        let given = bytes.clone();
        let before = sqlite_memory_reset();
        store.put_artifact("sha256:large", given).await.unwrap();
        let grew = sqlite_memory_highwater() - before;
        // Bound as an argument, the bytes were copied (the binding), and copied again into
        // the row SQLite builds; stored again, the old row's blob was read back too.
        assert!(
            grew < (SIZE / 4) as i64,
            "{attempt}: SQLite's memory grew by {grew} bytes storing {SIZE}"
        );
    }
    let sqlite_before = sqlite_memory_reset();
    read_in_pieces(store.as_ref(), &bytes, "sqlite").await;
    let grew = sqlite_memory_highwater() - sqlite_before;
    assert!(
        grew < (SIZE / 4) as i64,
        "SQLite's memory grew by {grew} bytes reading {SIZE}"
    );

    // On PostgreSQL the bytes are sent a piece at a time into a large object that the
    // server turns into the row; storing again sends nothing, and reading takes a slice of
    // the value a piece at a time.
    let Some(url) = toolgrid_testkit::postgres::fresh_test_database().await else {
        return;
    };
    let store = toolgrid_store::open(&url).await.unwrap();
    for attempt in ["first", "again"] {
        let given = bytes.clone();
        let before = allocated_reset();
        store.put_artifact("sha256:large", given).await.unwrap();
        let allocated = PEAK.load(Ordering::Relaxed) - before;
        // Bound whole, sqlx encoded the bytes into its buffers twice.
        assert!(
            allocated < SIZE / 4,
            "postgres, {attempt}: the process allocated {allocated} bytes more at most storing {SIZE}"
        );
    }
    read_in_pieces(store.as_ref(), &bytes, "postgres").await;
    // The large object the bytes went through is gone with its transaction's end.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let objects: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_largeobject_metadata")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(objects, 0, "large objects left behind");
}

/// Reads `sha256:large` in pieces of 1 MiB and checks they are `bytes`, and that the
/// process never held a quarter of them more meanwhile.
async fn read_in_pieces(store: &dyn Store, bytes: &[u8], backend: &str) {
    let before = allocated_reset();
    let mut pieces = store
        .read_artifact("sha256:large", 1 << 20)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(pieces.size(), SIZE as u64, "{backend}");
    let (mut read, mut same) = (0, true);
    while let Some(piece) = pieces.next().await {
        let piece = piece.unwrap();
        assert!(piece.len() <= 1 << 20, "{backend}");
        same &= bytes.get(read..read + piece.len()) == Some(piece.as_slice());
        read += piece.len();
    }
    let allocated = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        same && read == SIZE,
        "{backend}: read {read} bytes, the same: {same}"
    );
    assert!(
        allocated < SIZE / 4,
        "{backend}: the process allocated {allocated} bytes more at most reading {SIZE}"
    );
    assert!(
        store
            .read_artifact("sha256:none", 1 << 20)
            .await
            .unwrap()
            .is_none(),
        "{backend}"
    );
}
