//! The SQLite writer, out of writes, looks for the next one for its idle poll and then
//! sleeps. Alone in its test binary: it reads the CPU time of the process's one writer
//! thread.

mod looks;

use looks::{longest_look, store_looking_for, three_looks, writer_cpu};
use std::time::Duration;

#[tokio::test]
async fn an_idle_writer_looks_for_writes_for_its_idle_poll_then_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let poll = Duration::from_millis(400);
    let store = store_looking_for(dir.path(), poll).await;
    // Three writes, each followed by a look. A look ends early when other threads want the
    // writer's core (a kernel thread, the ones its answers woke), which an idle machine
    // still has now and then: at least one of three looks lasts, yielding (so its share
    // depends on what else runs) and for at most its poll...
    let looks = three_looks(&*store, poll).await;
    longest_look(&looks, poll);
    // ...then it sleeps: a second without writes costs it nothing.
    let asleep = writer_cpu();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slept = writer_cpu() - asleep;
    assert!(slept <= Duration::from_millis(20), "slept {slept:?}");
}
