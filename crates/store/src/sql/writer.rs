//! The group-commit writer: one task owns the write connection and commits whatever writes
//! are queued in one transaction, so a burst of writes costs one commit (one fsync on
//! SQLite), not one each.
//!
//! Each kind of write is its own type implementing [`Write`]; [`SqlStore::write`] queues it
//! as a [`Job`] (the write, its answer once applied, and where to send that answer, its
//! output type erased) and waits for the answer, which is sent only after the commit.
//!
//! On PostgreSQL the writer is a task on sqlx's pool of one connection. On SQLite it is a
//! thread of its own with its own connection ([`NativeSqlite`]): a batch's statements are
//! direct calls into SQLite there, so applying a batch costs little beside its commit.

use super::conn::Conn;
use super::job::Job;
use super::native::NativeSqlite;
use super::run_delay::RunDelay;
use super::sync::Syncer;
use super::{RetryPolicy, SqlStore, retrying};
use crate::{Durable, StoreError, WriteCounters};
use async_trait::async_trait;
use sqlx::AnyPool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;

/// Writes queued for the writer at most, before a writer waits to queue one.
const QUEUE: usize = 4096;

/// One write operation, applied in the writer's transaction with the others of its batch.
#[async_trait]
pub(super) trait Write: Send + Sync + 'static {
    /// The write's answer.
    type Output: Send + 'static;

    /// Runs the write. With `again` the write may have committed in an earlier attempt
    /// whose outcome was unknown; the write then recognises its own commit instead of
    /// being applied twice (appends and completions always do). A database error aborts
    /// the batch; any other error is this write's own refusal and changes nothing.
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<Self::Output, StoreError>;
}

/// A [`Write`] with its answer and its reply channels.
struct Queued<W: Write> {
    /// The write, until its batch commits: then it is dropped, before any answer is sent,
    /// so that what it shares with its caller (an admitted call's `Arc`) is the caller's
    /// alone again when the answer arrives (no copy is made to build the answer's record).
    write: Mutex<Option<Arc<W>>>,
    answer: Mutex<Option<Result<W::Output, StoreError>>>,
    reply: Reply<W::Output>,
}

/// Where a write's answer goes.
enum Reply<T> {
    /// Answered once its batch is durable.
    Durable(oneshot::Sender<Result<T, StoreError>>),
    /// Answered once its batch is committed ([`Job::applied`]; taken then), and told again
    /// once the batch is durable.
    Applied {
        early: Mutex<Option<oneshot::Sender<Result<T, StoreError>>>>,
        durable: oneshot::Sender<Result<(), StoreError>>,
    },
}

impl<W: Write> Queued<W> {
    /// Takes the answer the last apply kept.
    fn take_answer(&self) -> Result<W::Output, StoreError> {
        kept(
            self.answer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        )
    }
}

/// The answer an apply kept: there is one, as a job is answered only after a commit of a
/// batch that applied it.
fn kept<T>(answer: Option<Result<T, StoreError>>) -> Result<T, StoreError> {
    answer.unwrap_or_else(|| Err(StoreError::Corrupt("unexpected writer reply".into())))
}

#[async_trait]
impl<W: Write> Job for Queued<W> {
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<(), sqlx::Error> {
        let write = self
            .write
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // A write is applied only until its batch commits; after that it is never again.
        let Some(write) = write else {
            return Err(sqlx::Error::Protocol(
                "a committed write was applied again".into(),
            ));
        };
        match write.apply(conn, again).await {
            Err(StoreError::Database(error)) => Err(error),
            answer => {
                *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
                Ok(())
            }
        }
    }

    fn applied(&self) {
        drop(
            self.write
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Reply::Applied { early, .. } = &self.reply
            && let Some(early) = early.lock().unwrap_or_else(PoisonError::into_inner).take()
        {
            let _ = early.send(self.take_answer());
        }
    }

    fn answer(self: Box<Self>) {
        self.applied();
        let Queued { answer, reply, .. } = *self;
        match reply {
            Reply::Durable(reply) => {
                let _ = reply.send(kept(
                    answer.into_inner().unwrap_or_else(PoisonError::into_inner),
                ));
            }
            Reply::Applied { durable, .. } => {
                let _ = durable.send(Ok(()));
            }
        }
    }

    fn fail(self: Box<Self>, error: StoreError) {
        match self.reply {
            Reply::Durable(reply) => {
                let _ = reply.send(Err(error));
            }
            Reply::Applied { early, durable } => {
                match early.into_inner().unwrap_or_else(PoisonError::into_inner) {
                    Some(early) => {
                        let _ = early.send(Err(error));
                    }
                    None => {
                        let _ = durable.send(Err(error));
                    }
                }
            }
        }
    }
}

impl SqlStore {
    /// Queues `write` for the writer and waits for its answer, sent once the batch that
    /// holds it is durable.
    pub(super) async fn write<W: Write>(&self, write: W) -> Result<W::Output, StoreError> {
        write_to(&self.writer, write).await
    }

    /// Queues `write` and waits for its answer, sent once the batch that holds it has
    /// committed (its sync may still be under way): the [`Durable`] answers after the sync.
    pub(super) async fn write_applied<W: Write>(
        &self,
        write: W,
    ) -> Result<(W::Output, Durable), StoreError> {
        write_applied_to(&self.writer, write).await
    }
}

/// The writer's queue.
pub(super) type Jobs = mpsc::Sender<Box<dyn Job>>;

async fn write_to<W: Write>(jobs: &Jobs, write: W) -> Result<W::Output, StoreError> {
    let (reply, answer) = oneshot::channel();
    queue(jobs, write, Reply::Durable(reply)).await?;
    answer.await.map_err(|_| StoreError::Closed)?
}

async fn write_applied_to<W: Write>(
    jobs: &Jobs,
    write: W,
) -> Result<(W::Output, Durable), StoreError> {
    let (early, answer) = oneshot::channel();
    let (durable, synced) = oneshot::channel();
    let reply = Reply::Applied {
        early: Mutex::new(Some(early)),
        durable,
    };
    queue(jobs, write, reply).await?;
    let output = answer.await.map_err(|_| StoreError::Closed)??;
    Ok((output, Durable::when(synced)))
}

async fn queue<W: Write>(jobs: &Jobs, write: W, reply: Reply<W::Output>) -> Result<(), StoreError> {
    let job = Queued {
        write: Mutex::new(Some(Arc::new(write))),
        answer: Mutex::new(None),
        reply,
    };
    jobs.send(Box::new(job))
        .await
        .map_err(|_| StoreError::Closed)
}

/// Where the writer's transactions go.
pub(super) enum Sink {
    /// sqlx's pool of one connection (PostgreSQL).
    Pool(AnyPool),
    /// The writer's own SQLite connection, used on the writer's thread only (the lock is
    /// never contended; it lets a batch borrow the connection across a retry's awaits).
    Native(tokio::sync::Mutex<NativeSqlite>),
}

/// Starts the writer on `sink`; returns the queue of its jobs. A native SQLite sink gets a
/// thread of its own.
pub(super) fn spawn(
    mut sink: Sink,
    retry: RetryPolicy,
    counters: WriteCounters,
    idle_poll: Duration,
) -> Result<Jobs, StoreError> {
    let (jobs, rx) = mpsc::channel(QUEUE);
    match &mut sink {
        // On the runtime's threads: looking for writes there would hold a thread of the
        // runtime.
        Sink::Pool(_) => {
            tokio::spawn(run(sink, rx, retry, counters, None, Duration::ZERO));
        }
        Sink::Native(conn) => {
            let (wal, failed) = conn.get_mut().wal();
            let syncer = Syncer::spawn(wal, failed, counters.clone())
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || {
                    runtime.block_on(run(sink, rx, retry, counters, Some(syncer), idle_poll))
                })
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        }
    }
    Ok(jobs)
}

async fn run(
    sink: Sink,
    mut rx: mpsc::Receiver<Box<dyn Job>>,
    retry: RetryPolicy,
    counters: WriteCounters,
    syncer: Option<Syncer>,
    idle_poll: Duration,
) {
    // Lone writes in a row; before the first batch, the writer looks as after a run of them.
    let mut lone = LONE_RUN;
    while let Some(first) = next_job(&mut rx, look_for(lone, idle_poll)).await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        lone = lone_after(lone, batch.len());
        // A retried batch may have committed already (the connection died during COMMIT):
        // every operation recognises its own earlier commit (see `Write::apply`).
        let result = retrying(retry, |tried| {
            commit_batch(&sink, &batch, tried > 0, &counters)
        })
        .await;
        match result {
            Ok(()) => committed(syncer.as_ref(), batch, !rx.is_empty()),
            Err(error) if batch.len() == 1 => batch.remove(0).fail(error),
            // The database stayed unreachable: retrying each write alone would not help.
            Err(StoreError::Unavailable { attempts, last }) => {
                for job in batch {
                    job.fail(StoreError::Unavailable {
                        attempts,
                        last: last.clone(),
                    });
                }
            }
            // One bad write must not fail its neighbours: retry each on its own.
            Err(_) => {
                for job in batch {
                    let single = std::slice::from_ref(&job);
                    match retrying(retry, |_| commit_batch(&sink, single, true, &counters)).await {
                        Ok(()) => committed(syncer.as_ref(), vec![job], true),
                        Err(error) => job.fail(error),
                    }
                }
            }
        }
    }
}

/// How long the writer looks for its next write, `lone` batches of one write in a row
/// after the last batch of more: its idle poll once [`LONE_RUN`] lone writes came in a row,
/// else not at all.
///
/// Lone writes in a row are calls going through on their own, whose next write (its end,
/// the next call's admission) comes within the poll; that is what the look is for. Writes
/// under load come in bursts: the calls a sync answered go on together, and their next
/// writes come together after a gap, which the look would spin through. Some of those
/// bursts are of one write, so one lone write does not tell: with sixteen clients, looking
/// only after four in a row rather than after every lone write lowered the writer's CPU per
/// call in 8 of 8 pairs, and after eight rather than four in 4 of 4 more. A call going
/// through on its own makes two lone writes, so the fifth such call in a row finds the writer
/// looking again (BENCHMARKS.md, "The writer looks after a run of lone writes").
fn look_for(lone: u32, idle_poll: Duration) -> Duration {
    if lone >= LONE_RUN {
        idle_poll
    } else {
        Duration::ZERO
    }
}

/// Lone writes in a row after which the writer looks for its next write ([`look_for`]).
const LONE_RUN: u32 = 8;

/// Lone writes in a row once a batch of `batch` writes followed `lone` of them.
fn lone_after(lone: u32, batch: usize) -> u32 {
    if batch == 1 {
        lone.saturating_add(1)
    } else {
        0
    }
}

/// The next write: looked for without sleeping for up to `idle_poll` while this thread's
/// core has little else to run (`sched_yield` gives it to any other thread that wants it,
/// and the thread's run delay says how long others had it: see [`keep_looking`] and
/// [`RunDelay`]), then waited for asleep.
///
/// A sleeping thread is woken by a futex; on a virtual machine a core that has gone idle
/// takes 30 to 150 µs to run it again, and a call's path went through this thread twice
/// (its admission, its end): measured with `bench calls`, a sequential call took about
/// 0.45 ms less with the writer looking for 1 ms. On cores that are busy the looking is
/// pure cost (the yields' context switches, up to `idle_poll` of CPU time a batch): with
/// sixteen clients, turning it off saved 0.04 to 0.18 ms of CPU a call, so it stops once
/// other threads have wanted the core for a while.
async fn next_job(
    rx: &mut mpsc::Receiver<Box<dyn Job>>,
    idle_poll: Duration,
) -> Option<Box<dyn Job>> {
    if !idle_poll.is_zero() {
        let start = Instant::now();
        // One clock read a look: it ends one yield's time and starts the next.
        let mut now = start;
        let mut given = Duration::ZERO;
        let mut delay = RunDelay::now();
        loop {
            match rx.try_recv() {
                Ok(job) => return Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty)
                    if keep_looking(now - start, given, idle_poll) =>
                {
                    std::thread::yield_now();
                    let after = Instant::now();
                    let took = after - now;
                    // A late return may have run other threads: how long they had the
                    // core is the thread's run delay (the hypervisor taking the vCPU is
                    // not; see [`RunDelay`]).
                    if took >= LATE {
                        given += delay.given_since(took);
                    }
                    now = after;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
    }
    rx.recv().await
}

/// A `sched_yield` that took at least this long may have run other threads meanwhile (or
/// the core was taken away; [`RunDelay`] tells which and for how long): one with nothing
/// else to run returns in a microsecond or two. Shorter ones are not worth the read that
/// tells.
const LATE: Duration = Duration::from_micros(20);

/// The time other threads may have had of the writer's core while it looks, at least: a
/// kernel thread's moment does not end the looking. Others sometimes take more first (the
/// threads the batch's answers woke, a kernel thread: 230 and 470 µs were seen on the
/// 2-core machine of BENCHMARKS.md), and then an idle writer's look ends at once. A floor
/// of 500 µs kept such looks, but with sixteen clients it cost the writer more CPU a call in
/// 7 of 8 pairs (about 0.03 ms).
const GIVEN_FLOOR: Duration = Duration::from_micros(100);

/// Whether the writer, out of writes, having looked for `looked` and given its core to
/// other threads for `given` of it (its run delay meanwhile), looks again: for at most
/// `idle_poll`, and while the others have had at most [`GIVEN_FLOOR`] or a quarter of the
/// time, whichever is more.
fn keep_looking(looked: Duration, given: Duration, idle_poll: Duration) -> bool {
    looked < idle_poll && given <= GIVEN_FLOOR.max(looked / 4)
}

/// Answers the writes of a committed batch: those that asked are answered now, the rest
/// once the batch is durable: on PostgreSQL at once (its commit synced it), on SQLite once
/// the log is synced (see [`Syncer`]; `others_waiting`: more writes are queued).
fn committed(syncer: Option<&Syncer>, batch: Vec<Box<dyn Job>>, others_waiting: bool) {
    for job in &batch {
        job.applied();
    }
    match syncer {
        Some(syncer) => syncer.sync(batch, others_waiting),
        None => {
            for job in batch {
                job.answer();
            }
        }
    }
}

/// Runs `jobs` in one transaction. A database error aborts the batch; refusals such as a
/// stale epoch are per job and change nothing. `again` says the batch (or a batch with
/// these jobs) was tried before and may have committed.
async fn commit_batch(
    sink: &Sink,
    jobs: &[Box<dyn Job>],
    again: bool,
    counters: &WriteCounters,
) -> Result<(), StoreError> {
    match sink {
        Sink::Pool(pool) => {
            let mut tx = pool.begin().await?;
            for job in jobs {
                job.apply(&mut *tx, again).await?;
            }
            tx.commit().await?;
            // The server synced it before it answered.
            counters.synced();
        }
        Sink::Native(conn) => {
            let mut conn = conn.lock().await;
            conn.begin()?;
            let mut applied = Ok(());
            for job in jobs {
                applied = job.apply(&mut *conn, again).await.map_err(StoreError::from);
                if applied.is_err() {
                    break;
                }
            }
            if let Err(error) = applied.and_then(|()| conn.commit()) {
                conn.rollback();
                return Err(error);
            }
        }
    }
    counters.committed();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::DEFAULT_IDLE_POLL;
    use crate::sql::conn::{Conn, query};

    /// Inserts its number into table `t`.
    struct Insert(i64);

    #[async_trait]
    impl Write for Insert {
        type Output = i64;

        async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<i64, StoreError> {
            query("INSERT INTO t (n) VALUES ($1)")
                .bind(self.0)
                .execute(conn)
                .await?;
            Ok(self.0)
        }
    }

    /// Inserts nothing; holds what it shares with its caller, and answers how many own it
    /// while it is applied.
    struct Holding(Arc<()>);

    #[async_trait]
    impl Write for Holding {
        type Output = usize;

        async fn apply(&self, _conn: &mut dyn Conn, _again: bool) -> Result<usize, StoreError> {
            Ok(Arc::strong_count(&self.0))
        }
    }

    #[test]
    fn the_writer_looks_for_the_next_write_only_after_a_run_of_lone_writes() {
        let poll = DEFAULT_IDLE_POLL;
        let looks_after = |lone: u32| !look_for(lone, poll).is_zero();
        // Before the first batch, and while lone writes go on.
        assert!(looks_after(LONE_RUN));
        assert!(looks_after(lone_after(LONE_RUN, 1)));
        // A batch of more stops the looking, until LONE_RUN lone writes came in a row.
        for batch in [2, 3, MAX_BATCH] {
            let mut lone = lone_after(LONE_RUN + 5, batch);
            assert!(!looks_after(lone), "after a batch of {batch}");
            for _ in 1..LONE_RUN {
                lone = lone_after(lone, 1);
                assert!(!looks_after(lone), "after {lone} lone writes");
            }
            lone = lone_after(lone, 1);
            assert_eq!(lone, LONE_RUN);
            assert!(looks_after(lone));
            assert!(!looks_after(lone_after(lone, 2)));
        }
        // A run never wraps round to none.
        assert_eq!(lone_after(u32::MAX, 1), u32::MAX);
        // Turned off stays off.
        assert_eq!(look_for(LONE_RUN, Duration::ZERO), Duration::ZERO);
        assert_eq!(look_for(u32::MAX, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_writer_looks_for_the_next_write_only_while_its_core_is_mostly_its_own() {
        let us = Duration::from_micros;
        let limit = DEFAULT_IDLE_POLL;
        // The first look, and looks whose yields came straight back: on.
        assert!(keep_looking(Duration::ZERO, Duration::ZERO, limit));
        assert!(keep_looking(us(999), Duration::ZERO, limit));
        // Others had the core for a moment (a kernel thread): still on.
        assert!(keep_looking(us(30), us(60), limit));
        assert!(keep_looking(us(50), GIVEN_FLOOR, limit));
        // Other threads had the core longer: the core is wanted, sleep.
        assert!(!keep_looking(us(50), GIVEN_FLOOR + us(1), limit));
        assert!(!keep_looking(us(400), us(300), limit));
        // Over a long look, a quarter of it may go to others.
        let long = Duration::from_millis(400);
        assert!(keep_looking(
            Duration::from_millis(200),
            Duration::from_millis(50),
            long
        ));
        assert!(!keep_looking(
            Duration::from_millis(200),
            Duration::from_millis(51),
            long
        ));
        // Out of time, however idle.
        assert!(!keep_looking(limit, Duration::ZERO, limit));
        // No looking at all.
        assert!(!keep_looking(
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO
        ));
    }

    #[tokio::test]
    async fn a_committed_write_is_dropped_before_it_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (jobs, _path) = writer(&dir, None);
        let shared = Arc::new(());
        // Answered early, at the commit, while the batch waits for its sync.
        let (owners, durable) = write_applied_to(&jobs, Holding(shared.clone()))
            .await
            .unwrap();
        assert_eq!(owners, 2, "shared while it was applied");
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "the early answer's write is gone"
        );
        durable.wait().await.unwrap();
        assert_eq!(write_to(&jobs, Holding(shared.clone())).await.unwrap(), 2);
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "the durable answer's write is gone"
        );
    }

    /// A writer on a new database with table `t`; `wal` replaces the log's path (a path
    /// that does not exist makes every sync fail).
    fn writer(dir: &tempfile::TempDir, wal: Option<&str>) -> (Jobs, std::path::PathBuf) {
        let path = dir.path().join("t.db");
        let setup = rusqlite::Connection::open(&path).unwrap();
        setup
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (n INTEGER)")
            .unwrap();
        let mut conn = NativeSqlite::open(&path, Duration::from_millis(100)).unwrap();
        if let Some(wal) = wal {
            conn.set_wal_path(dir.path().join(wal));
        }
        let sink = Sink::Native(tokio::sync::Mutex::new(conn));
        let retry = RetryPolicy {
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            give_up_after: Duration::from_millis(10),
        };
        (
            spawn(sink, retry, WriteCounters::default(), DEFAULT_IDLE_POLL).unwrap(),
            path,
        )
    }

    fn rows(path: &std::path::Path) -> Vec<i64> {
        let reader = rusqlite::Connection::open(path).unwrap();
        let mut statement = reader.prepare("SELECT n FROM t ORDER BY n").unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[tokio::test]
    async fn an_early_answer_is_committed_and_its_durable_answers_after_the_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (jobs, path) = writer(&dir, None);
        let (output, durable) = write_applied_to(&jobs, Insert(1)).await.unwrap();
        assert_eq!(output, 1);
        // Committed: another connection reads it.
        assert_eq!(rows(&path), vec![1]);
        durable.wait().await.unwrap();
        assert_eq!(write_to(&jobs, Insert(2)).await.unwrap(), 2);
        assert_eq!(rows(&path), vec![1, 2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_is_answered_whole_whichever_thread_syncs_it() {
        for wal in [None, Some("missing/t.db-wal")] {
            let dir = tempfile::tempdir().unwrap();
            let (jobs, path) = writer(&dir, wal);
            let mut writes = tokio::task::JoinSet::new();
            for n in 0..200 {
                let jobs = jobs.clone();
                writes.spawn(async move {
                    if n % 2 == 0 {
                        write_to(&jobs, Insert(n)).await
                    } else {
                        let (n, durable) = write_applied_to(&jobs, Insert(n)).await?;
                        durable.wait().await.map(|()| n)
                    }
                });
            }
            let mut answered = Vec::new();
            while let Some(answer) = writes.join_next().await {
                match (wal, answer.unwrap()) {
                    (None, Ok(n)) => answered.push(n),
                    (Some(_), Err(StoreError::NotDurable(_))) => {}
                    (wal, other) => panic!("{wal:?}: {other:?}"),
                }
            }
            answered.sort();
            if wal.is_none() {
                assert_eq!(answered, (0..200).collect::<Vec<_>>());
                assert_eq!(rows(&path), answered);
            }
        }
    }

    #[tokio::test]
    async fn a_failed_sync_fails_its_batch_and_every_later_write_as_not_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (jobs, path) = writer(&dir, Some("missing/t.db-wal"));
        // The early answer comes from the commit, before the sync.
        let (output, durable) = write_applied_to(&jobs, Insert(1)).await.unwrap();
        assert_eq!(output, 1);
        assert!(
            matches!(durable.wait().await, Err(StoreError::NotDurable(_))),
            "the sync failed"
        );
        // The log may have lost pages: every later write is refused, and not applied.
        assert!(matches!(
            write_to(&jobs, Insert(2)).await,
            Err(StoreError::NotDurable(_))
        ));
        assert_eq!(rows(&path), vec![1]);
    }
}
