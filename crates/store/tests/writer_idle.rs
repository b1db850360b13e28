//! The SQLite writer, out of writes, looks for the next one for its idle poll and then
//! sleeps. Alone in its test binary: it reads the CPU time of the process's one writer
//! thread.

use std::time::Duration;
use toolgrid_store::{OpenOptions, SqlStore, Store};

/// CPU time (user and system) of this process's threads named `store-writer`.
fn writer_cpu() -> Duration {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
            continue;
        };
        if comm.trim() != "store-writer" {
            continue;
        }
        let stat = std::fs::read_to_string(task.join("stat")).unwrap();
        // After the command's closing parenthesis: state is field 3; utime and stime 14, 15.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(total * 1000 / ticks)
}

#[tokio::test]
async fn an_idle_writer_looks_for_writes_for_its_idle_poll_then_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idle.db").display());
    let poll = Duration::from_millis(400);
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
        SqlStore::open_with(
            &url,
            OpenOptions {
                idle_poll: poll,
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    store.put_artifact("sha256:one", b"one").await.unwrap();
    // Three writes, each followed by a look. A look ends early when other threads want the
    // writer's core (a kernel thread, the ones its answers woke), which an idle machine
    // still has now and then: at least one of three looks lasts.
    let mut looks = Vec::new();
    for name in ["two", "three", "four"] {
        // Read before the write, not after: the reading is this thread's work, which
        // would run on the writer's core just as it starts to look.
        let looking = writer_cpu();
        store
            .put_artifact(&format!("sha256:{name}"), name.as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(poll * 2).await;
        looks.push(writer_cpu() - looking);
    }
    let asleep = writer_cpu();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slept = writer_cpu() - asleep;
    // It looked (yielding, so its share depends on what else runs), each time at most for
    // its poll (with the write's commit, and a clock tick's rounding each way)...
    let longest = looks.iter().max().copied().unwrap_or_default();
    assert!(longest >= Duration::from_millis(20), "looked {looks:?}");
    assert!(
        longest <= poll + Duration::from_millis(40),
        "looked {looks:?}"
    );
    // ...then slept: a second without writes costs it nothing.
    assert!(slept <= Duration::from_millis(20), "slept {slept:?}");
    assert_eq!(
        store.get_artifact("sha256:four").await.unwrap().as_deref(),
        Some(&b"four"[..])
    );
}
