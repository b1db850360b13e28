//! The writer's SQLite VFS: the platform's own (`unix`), except that a commit's frames go
//! to the write-ahead log in one `pwrite` instead of two per frame.
//!
//! SQLite writes each frame of a commit with two calls (its 24-byte header, then the page:
//! `walWriteOneFrame`), so a commit of twenty pages makes forty system calls. This VFS keeps
//! the log's writes that follow one another in memory and writes them at once:
//!
//! - when the **commit frame** is complete: the frame header whose "database size after
//!   commit" field (bytes 4..8, the WAL file format's commit marker) is not zero, and the
//!   page written after it. The write that completes it returns the result of writing the
//!   whole commit, so a failed write fails the commit as it would have, before SQLite
//!   publishes the commit to readers (the wal-index header, written after the frames);
//! - a commit frame's header that does not extend kept frames is not kept: a commit of one
//!   frame, or SQLite rewriting the headers of frames it overwrote in place during the
//!   transaction (`walRewriteChecksums`, which reads each frame and then writes its header,
//!   the commit's last, and then publishes the commit without another call on the log);
//! - before any other use of the log file (a read, a sync, a size, a truncate, a lock, a
//!   file control, its close; not its sector size or device characteristics, which read
//!   nothing), and before a write that does not follow the kept ones;
//! - when the kept bytes pass [`LIMIT`] (a transaction larger than that), in writes of at
//!   most [`WRITE_MAX`] bytes.
//!
//! So readers (other connections, with the default VFS) never find a published frame that
//! is not in the file, and the log in the file is at every moment what SQLite would have
//! written, minus the frames of a commit not yet complete, which a crash loses either way.
//! Every other file (the database, temporary files) and every other call goes straight to
//! the platform's VFS. Only the store's writer connection opens its database with it.

use rusqlite::ffi;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// The name this VFS is registered under.
pub(super) const NAME: &str = "toolgrid-wal";
const NAME_C: &CStr = c"toolgrid-wal";

/// The most bytes kept before they are written even if the commit is not complete.
const LIMIT: usize = 64 * 1024;

/// The most bytes the platform's VFS writes in one call (`seekAndWriteFd` masks a larger
/// count to 17 bits: it never gets one from SQLite).
const WRITE_MAX: usize = 0x1_0000;

/// A WAL frame header's size (the WAL file format).
const FRAME_HEADER: usize = 24;

/// Registers the VFS (once per process); its name for `open_with_flags_and_vfs`.
pub(super) fn register() -> Result<&'static str, String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            // SAFETY: `sqlite3_vfs_find(NULL)` returns the default VFS, which SQLite keeps
            // for the life of the process. The registered struct is leaked for the same
            // reason: SQLite keeps the pointer.
            unsafe {
                let real = ffi::sqlite3_vfs_find(std::ptr::null());
                if real.is_null() {
                    return Err("SQLite has no default VFS".into());
                }
                let size = file_size() + (*real).szOsFile as usize;
                let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
                    iVersion: (*real).iVersion.min(3),
                    szOsFile: c_int::try_from(size).map_err(|e| e.to_string())?,
                    mxPathname: (*real).mxPathname,
                    pNext: std::ptr::null_mut(),
                    zName: NAME_C.as_ptr(),
                    pAppData: real.cast(),
                    xOpen: Some(open),
                    xDelete: Some(delete),
                    xAccess: Some(access),
                    xFullPathname: Some(full_pathname),
                    xDlOpen: (*real).xDlOpen,
                    xDlError: (*real).xDlError,
                    xDlSym: (*real).xDlSym,
                    xDlClose: (*real).xDlClose,
                    xRandomness: Some(randomness),
                    xSleep: Some(sleep),
                    xCurrentTime: Some(current_time),
                    xGetLastError: Some(get_last_error),
                    xCurrentTimeInt64: Some(current_time_int64),
                    xSetSystemCall: None,
                    xGetSystemCall: None,
                    xNextSystemCall: None,
                }));
                let rc = ffi::sqlite3_vfs_register(vfs, 0);
                if rc != ffi::SQLITE_OK {
                    return Err(format!("registering the VFS failed ({rc})"));
                }
                Ok(())
            }
        })
        .clone()
        .map(|()| NAME)
}

/// A file opened through this VFS: SQLite's base struct first (its methods are ours), then
/// the platform VFS's own file, in the same allocation (`szOsFile` covers both).
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    /// The platform VFS's file, just after this struct.
    real: *mut ffi::sqlite3_file,
    /// The log's kept writes (null for any other file).
    kept: *mut Kept,
}

/// The log's writes not yet passed on: `bytes` go at `offset`.
struct Kept {
    offset: i64,
    bytes: Vec<u8>,
    /// The last write was a commit frame's header: the next one completes the commit.
    commit_header: bool,
}

/// `File`'s size rounded up to 8 bytes, where the platform's file starts.
const fn file_size() -> usize {
    std::mem::size_of::<File>().next_multiple_of(8)
}

/// The platform's VFS (this VFS's `pAppData`).
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: `register` set `pAppData` to the default VFS.
    unsafe { (*vfs).pAppData.cast() }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives `szOsFile` bytes at `file`, 8-byte aligned; the platform's file
    // takes the part after `File`.
    unsafe {
        let real_vfs = real_vfs(vfs);
        let ours = file.cast::<File>();
        let real = file
            .cast::<u8>()
            .add(file_size())
            .cast::<ffi::sqlite3_file>();
        (*ours).base.pMethods = std::ptr::null();
        (*ours).real = real;
        (*ours).kept = std::ptr::null_mut();
        let Some(real_open) = (*real_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = real_open(real_vfs, name, real, flags, out_flags);
        if (*real).pMethods.is_null() {
            // SQLite calls no method of a file whose open failed (`pMethods` null).
            return if rc == ffi::SQLITE_OK {
                ffi::SQLITE_CANTOPEN
            } else {
                rc
            };
        }
        // From here SQLite closes the file through us even if the open failed.
        (*ours).base.pMethods = methods((*(*real).pMethods).iVersion);
        if rc == ffi::SQLITE_OK && flags & ffi::SQLITE_OPEN_WAL != 0 {
            (*ours).kept = Box::into_raw(Box::new(Kept {
                offset: 0,
                bytes: Vec::new(),
                commit_header: false,
            }));
        }
        rc
    }
}

/// This VFS's file methods, of the platform's file's version (1 to 3).
fn methods(version: c_int) -> *const ffi::sqlite3_io_methods {
    static METHODS: OnceLock<[ffi::sqlite3_io_methods; 3]> = OnceLock::new();
    let all = METHODS.get_or_init(|| {
        let of = |version| ffi::sqlite3_io_methods {
            iVersion: version,
            xClose: Some(close),
            xRead: Some(read),
            xWrite: Some(write),
            xTruncate: Some(truncate),
            xSync: Some(sync),
            xFileSize: Some(file_size_of),
            xLock: Some(lock),
            xUnlock: Some(unlock),
            xCheckReservedLock: Some(check_reserved_lock),
            xFileControl: Some(file_control),
            xSectorSize: Some(sector_size),
            xDeviceCharacteristics: Some(device_characteristics),
            xShmMap: (version >= 2).then_some(shm_map as _),
            xShmLock: (version >= 2).then_some(shm_lock as _),
            xShmBarrier: (version >= 2).then_some(shm_barrier as _),
            xShmUnmap: (version >= 2).then_some(shm_unmap as _),
            xFetch: (version >= 3).then_some(fetch as _),
            xUnfetch: (version >= 3).then_some(unfetch as _),
        };
        [of(1), of(2), of(3)]
    });
    &all[(version.clamp(1, 3) - 1) as usize]
}

/// The platform's file under `file`, and its methods.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: `open` set `real` and its methods (SQLite calls methods only on an open file);
    // a VFS's methods are static for the life of the process.
    unsafe {
        let real = (*file.cast::<File>()).real;
        (real, &*(*real).pMethods)
    }
}

/// Writes the log's kept bytes, if any (where every method that uses the file's contents
/// starts, but `write`).
unsafe fn pass_on(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `kept` is null or the `Kept` that `open` made for this file, which only this
    // file's methods touch (SQLite calls a file's methods one at a time).
    unsafe {
        let kept = (*file.cast::<File>()).kept;
        if kept.is_null() {
            return ffi::SQLITE_OK;
        }
        let (real, methods) = real(file);
        write_kept(&mut *kept, real, methods.xWrite)
    }
}

type Write = unsafe extern "C" fn(*mut ffi::sqlite3_file, *const c_void, c_int, i64) -> c_int;

/// Writes `kept` with the platform's `write`, and forgets it.
unsafe fn write_kept(kept: &mut Kept, real: *mut ffi::sqlite3_file, write: Option<Write>) -> c_int {
    kept.commit_header = false;
    if kept.bytes.is_empty() {
        return ffi::SQLITE_OK;
    }
    #[cfg(test)]
    tests::WRITES.with(|writes| writes.set(writes.get() + 1));
    let mut rc = ffi::SQLITE_OK;
    let mut offset = kept.offset;
    // The platform's VFS writes at most `WRITE_MAX` bytes a call.
    for chunk in kept.bytes.chunks(WRITE_MAX) {
        rc = match write {
            // SAFETY: `real` is the platform's open file; the bytes are ours, alive
            // meanwhile; a chunk's length fits a `c_int`.
            Some(write) => unsafe {
                write(real, chunk.as_ptr().cast(), chunk.len() as c_int, offset)
            },
            None => ffi::SQLITE_IOERR_WRITE,
        };
        if rc != ffi::SQLITE_OK {
            break;
        }
        offset += chunk.len() as i64;
    }
    // Written or not, the bytes go: on a failure SQLite fails the transaction, and writes
    // its frames again from its own pages at the next try.
    kept.bytes.clear();
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: SQLite passes `amount` readable bytes at `buf`; `kept` as in `pass_on`.
    unsafe {
        let kept = (*file.cast::<File>()).kept;
        let (real, methods) = real(file);
        let Some(real_write) = methods.xWrite else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        if kept.is_null() {
            return real_write(real, buf, amount, offset);
        }
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let kept = &mut *kept;
        let follows = !kept.bytes.is_empty() && kept.offset + kept.bytes.len() as i64 == offset;
        // A frame header is written alone; its bytes 4..8 are the database's size after a
        // commit, zero in every other frame. The page after a commit's header ends it.
        let completes_commit = kept.commit_header && len != FRAME_HEADER;
        if !follows {
            let rc = write_kept(kept, real, Some(real_write));
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        let commit_header = len == FRAME_HEADER && bytes[4..8] != [0; 4];
        if commit_header && !follows {
            // A commit frame's header that does not extend the frames before it: a commit
            // of one frame, or SQLite rewriting the headers of frames already in the log
            // (`walRewriteChecksums`), after which nothing is written before the commit is
            // published. Written now; a page that follows it is written at once too.
            kept.commit_header = true;
            return real_write(real, buf, amount, offset);
        }
        if kept.bytes.is_empty() {
            kept.offset = offset;
        }
        kept.bytes.extend_from_slice(bytes);
        kept.commit_header = commit_header;
        if completes_commit || kept.bytes.len() >= LIMIT {
            return write_kept(kept, real, Some(real_write));
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as in `pass_on`; the `Kept` is freed once, here, and the pointer cleared.
    unsafe {
        let written = pass_on(file);
        let ours = file.cast::<File>();
        if !(*ours).kept.is_null() {
            drop(Box::from_raw((*ours).kept));
            (*ours).kept = std::ptr::null_mut();
        }
        let (real, methods) = real(file);
        let closed = match methods.xClose {
            Some(close) => close(real),
            None => ffi::SQLITE_OK,
        };
        if written != ffi::SQLITE_OK {
            written
        } else {
            closed
        }
    }
}

/// The file methods that write the kept bytes and then call the platform's; a failed write
/// is their answer.
macro_rules! passing_on {
    ($($name:ident => $field:ident ($($arg:ident: $ty:ty),*);)*) => {
        $(
            unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
                // SAFETY: as in `pass_on` and `real`; the arguments are SQLite's, passed on.
                unsafe {
                    let rc = pass_on(file);
                    if rc != ffi::SQLITE_OK {
                        return rc;
                    }
                    let (real, methods) = real(file);
                    match methods.$field {
                        Some(method) => method(real $(, $arg)*),
                        None => ffi::SQLITE_IOERR,
                    }
                }
            }
        )*
    };
}

passing_on! {
    read => xRead(buf: *mut c_void, amount: c_int, offset: i64);
    truncate => xTruncate(size: i64);
    sync => xSync(flags: c_int);
    file_size_of => xFileSize(size: *mut i64);
    lock => xLock(level: c_int);
    unlock => xUnlock(level: c_int);
    check_reserved_lock => xCheckReservedLock(out: *mut c_int);
    file_control => xFileControl(op: c_int, arg: *mut c_void);
    shm_map => xShmMap(region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void);
    shm_lock => xShmLock(offset: c_int, n: c_int, flags: c_int);
    shm_unmap => xShmUnmap(delete: c_int);
    fetch => xFetch(offset: i64, amount: c_int, out: *mut *mut c_void);
    unfetch => xUnfetch(offset: i64, page: *mut c_void);
}

/// The file methods that only describe the file: called on the platform's file with
/// nothing written first (they cannot report a failed write).
macro_rules! describing {
    ($($name:ident => $field:ident -> $missing:expr;)*) => {
        $(
            unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file) -> c_int {
                // SAFETY: as in `real`.
                unsafe {
                    let (real, methods) = real(file);
                    match methods.$field {
                        Some(method) => method(real),
                        None => $missing,
                    }
                }
            }
        )*
    };
}

describing! {
    sector_size => xSectorSize -> 4096;
    device_characteristics => xDeviceCharacteristics -> 0;
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as in `pass_on` and `real`. Only a database file has shared memory; a log's
    // kept bytes are written at the end of their commit, before SQLite gets here.
    unsafe {
        let (real, methods) = real(file);
        if let Some(barrier) = methods.xShmBarrier {
            barrier(real)
        }
    }
}

/// The VFS methods: the platform's, called with the platform's VFS.
macro_rules! platform {
    ($($name:ident => $field:ident ($($arg:ident: $ty:ty),*) -> $ret:ty, $missing:expr;)*) => {
        $(
            unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs $(, $arg: $ty)*) -> $ret {
                // SAFETY: `real_vfs` is the default VFS; the arguments are SQLite's.
                unsafe {
                    let real = real_vfs(vfs);
                    match (*real).$field {
                        Some(method) => method(real $(, $arg)*),
                        None => $missing,
                    }
                }
            }
        )*
    };
}

platform! {
    delete => xDelete(name: *const c_char, sync_dir: c_int) -> c_int, ffi::SQLITE_IOERR_DELETE;
    access => xAccess(name: *const c_char, flags: c_int, out: *mut c_int) -> c_int, ffi::SQLITE_IOERR_ACCESS;
    full_pathname => xFullPathname(name: *const c_char, n: c_int, out: *mut c_char) -> c_int, ffi::SQLITE_CANTOPEN;
    randomness => xRandomness(n: c_int, out: *mut c_char) -> c_int, 0;
    sleep => xSleep(micros: c_int) -> c_int, 0;
    current_time => xCurrentTime(out: *mut f64) -> c_int, ffi::SQLITE_ERROR;
    get_last_error => xGetLastError(n: c_int, out: *mut c_char) -> c_int, 0;
    current_time_int64 => xCurrentTimeInt64(out: *mut i64) -> c_int, ffi::SQLITE_ERROR;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::cell::Cell;

    thread_local! {
        /// Writes of kept log bytes on this thread.
        pub(super) static WRITES: Cell<u64> = const { Cell::new(0) };
    }

    fn writes() -> u64 {
        WRITES.with(Cell::get)
    }

    fn writer(path: &std::path::Path) -> Connection {
        let conn = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            register().unwrap(),
        )
        .unwrap();
        conn.execute_batch(
            "PRAGMA page_size=1024; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; \
             PRAGMA wal_autocheckpoint=0; CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)",
        )
        .unwrap();
        conn
    }

    fn count(conn: &Connection) -> (i64, i64) {
        conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(v)), 0) FROM t",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    #[test]
    fn a_commit_reaches_the_log_in_one_write_and_readers_see_it_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let writer = writer(&path);
        // A reader through SQLite's own VFS, as the store's read pool.
        let reader = Connection::open(&path).unwrap();
        let mut rows = 0;
        let mut bytes = 0;
        for i in 0..50_i64 {
            // Five rows of 1.5 KiB: a dozen pages, so a dozen frames and their headers.
            let before = writes();
            let tx = writer.unchecked_transaction().unwrap();
            for j in 0..5 {
                tx.execute(
                    "INSERT INTO t (k, v) VALUES (?1, zeroblob(1536))",
                    [i * 10 + j],
                )
                .unwrap();
            }
            tx.commit().unwrap();
            rows += 5;
            bytes += 5 * 1536;
            assert_eq!(writes() - before, 1, "commit {i}: one write of its frames");
            assert_eq!(count(&reader), (rows, bytes), "commit {i}");
        }
        // The log in the file holds every commit (a process that died now recovers them).
        assert_eq!(recovered(&path, &dir.path().join("copy")), (rows, bytes));
        // A checkpoint reads the log back through the VFS.
        writer
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        assert_eq!(count(&reader), (rows, bytes));
        drop(writer);
        assert_eq!(count(&Connection::open(&path).unwrap()), (rows, bytes));
    }

    /// Copies the database and its log as they are in the files now, opens the copy (which
    /// recovers the log, checking every frame's checksum) and counts its rows.
    fn recovered(path: &std::path::Path, copy: &std::path::Path) -> (i64, i64) {
        let wal = |p: &std::path::Path| {
            let mut wal = p.as_os_str().to_owned();
            wal.push("-wal");
            std::path::PathBuf::from(wal)
        };
        std::fs::copy(path, copy).unwrap();
        std::fs::copy(wal(path), wal(copy)).unwrap();
        let conn = Connection::open(copy).unwrap();
        let counted = count(&conn);
        drop(conn);
        std::fs::remove_file(copy).unwrap();
        counted
    }

    #[test]
    fn a_commit_whose_frames_were_rewritten_or_that_is_one_frame_is_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let copy = dir.path().join("copy");
        let writer = writer(&path);
        // A page cache of a few pages: a transaction spills frames to the log before its
        // commit and writes some pages again, so SQLite rewrites the frames' checksums
        // at the commit (reading each frame, then writing its header, the commit's last).
        writer.execute_batch("PRAGMA cache_size=4").unwrap();
        for k in 0..60_i64 {
            writer
                .execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(700))", [k])
                .unwrap();
        }
        let rows = 60;
        let mut bytes = 60 * 700;
        for round in 0..5_i64 {
            // Every row's page changes, most go out of the cache (to the log), and all
            // change again: their frames are overwritten in place.
            let tx = writer.unchecked_transaction().unwrap();
            tx.execute("UPDATE t SET v = zeroblob(690)", []).unwrap();
            tx.execute("UPDATE t SET v = zeroblob(?1)", [680 + round])
                .unwrap();
            tx.commit().unwrap();
            bytes = 60 * (680 + round);
            assert_eq!(recovered(&path, &copy), (rows, bytes), "round {round}");
        }
        // A commit of one page: its header, then its page.
        writer.execute_batch("PRAGMA cache_size=2000").unwrap();
        for k in 0..5_i64 {
            writer
                .execute("UPDATE t SET v = zeroblob(10) WHERE k = ?1", [k])
                .unwrap();
            bytes -= 684 - 10;
            assert_eq!(recovered(&path, &copy), (rows, bytes), "update {k}");
        }
    }

    #[test]
    fn a_transaction_larger_than_the_limit_is_written_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let writer = writer(&path);
        let reader = Connection::open(&path).unwrap();
        let before = writes();
        let tx = writer.unchecked_transaction().unwrap();
        // 3 MiB of rows: many times over the limit, whatever the page cache spills.
        for k in 0..96_i64 {
            tx.execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(32768))", [k])
                .unwrap();
        }
        tx.commit().unwrap();
        assert!(writes() - before >= 40, "{} writes", writes() - before);
        assert_eq!(count(&reader), (96, 96 * 32768));
        // A rolled-back transaction leaves the committed rows as they were.
        let tx = writer.unchecked_transaction().unwrap();
        tx.execute("DELETE FROM t", []).unwrap();
        tx.rollback().unwrap();
        assert_eq!(count(&reader), (96, 96 * 32768));
        assert_eq!(count(&writer), (96, 96 * 32768));
    }
}
