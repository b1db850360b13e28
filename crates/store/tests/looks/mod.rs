//! What the writer-look tests share: a store whose writer looks for `poll`, the CPU time of
//! its thread, and three writes each followed by a look. Each test binary that uses it
//! runs alone in its process, so the process has one writer thread.

// Each test binary uses its part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use toolgrid_store::{OpenOptions, SqlStore, Store};

/// CPU time (user and system) of this process's threads named `store-writer`.
pub fn writer_cpu() -> Duration {
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

/// A SQLite store in `dir` whose writer looks for its next write for `poll`, with one write
/// already done (the first look is after it).
pub async fn store_looking_for(dir: &std::path::Path, poll: Duration) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.join("looks.db").display());
    let store: Arc<dyn Store> = Arc::new(
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
    store
        .put_artifact("sha256:one", b"one".to_vec())
        .await
        .unwrap();
    store
}

/// Three writes, each followed by twice `poll` of waiting: the writer's CPU time from just
/// before each write to the end of its wait, in order. The last write is `sha256:four`.
pub async fn three_looks(store: &dyn Store, poll: Duration) -> Vec<Duration> {
    let mut looks = Vec::new();
    for name in ["two", "three", "four"] {
        // Read before the write, not after: the reading is this thread's work, which
        // would run on the writer's core just as it starts to look.
        let looking = writer_cpu();
        store
            .put_artifact(&format!("sha256:{name}"), name.as_bytes().to_vec())
            .await
            .unwrap();
        tokio::time::sleep(poll * 2).await;
        looks.push(writer_cpu() - looking);
    }
    assert_eq!(
        store.get_artifact("sha256:four").await.unwrap().as_deref(),
        Some(&b"four"[..])
    );
    looks
}

/// Checks that the longest of `looks` was a look (at least 20 ms of CPU) that lasted at
/// most its poll (with the write's commit, and a clock tick's rounding each way).
pub fn longest_look(looks: &[Duration], poll: Duration) {
    let longest = looks.iter().max().copied().unwrap_or_default();
    assert!(longest >= Duration::from_millis(20), "looked {looks:?}");
    assert!(
        longest <= poll + Duration::from_millis(40),
        "looked {looks:?}"
    );
}
