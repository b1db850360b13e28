//! `toolgrid bench calls`: the platform's CPU time per call by thread, so that a change is
//! judged by the thread it touches. Read from /proc (Linux) before and after a run: each
//! thread's time on a core (`schedstat`, in nanoseconds, unlike `stat`'s 10 ms ticks),
//! summed by process role and thread name.

use std::collections::BTreeMap;
use std::time::Duration;

/// Which process a thread belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// `toolgrid up` itself: the control plane.
    ControlPlane,
    /// A worker process it started.
    Worker,
    /// The bench itself: its clients.
    Bench,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::ControlPlane => "control plane",
            Role::Worker => "workers",
            Role::Bench => "the bench",
        }
    }
}

/// One thread as read at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct Thread {
    pub role: Role,
    pub name: String,
    pub ran: Duration,
}

/// The threads of a process tree by thread id.
pub type Snapshot = BTreeMap<u32, Thread>;

/// The CPU time per call of the threads of one name in one process role.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub role: Role,
    pub thread: String,
    /// Milliseconds of CPU per call.
    pub ms: f64,
}

/// Reads the threads of `pid` (the control plane) and of its child processes (workers).
pub fn snapshot(pid: u32) -> Snapshot {
    let mut threads = Snapshot::new();
    read_process(pid, Role::ControlPlane, &mut threads);
    for child in super::cpu::children(pid) {
        read_process(child, Role::Worker, &mut threads);
    }
    threads
}

/// Reads the threads of this process (the bench's clients).
pub fn own() -> Snapshot {
    let mut threads = Snapshot::new();
    read_process(std::process::id(), Role::Bench, &mut threads);
    threads
}

/// The CPU time per call of all the threads of [`per_call`]'s rows together.
pub fn total_ms(rows: &[Row]) -> f64 {
    rows.iter().map(|row| row.ms).sum()
}

fn read_process(pid: u32, role: Role, into: &mut Snapshot) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let path = task.path();
        let (Ok(name), Ok(schedstat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("schedstat")),
        ) else {
            continue;
        };
        let Some(ns) = schedstat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        into.insert(
            tid,
            Thread {
                role,
                name: name.trim().to_string(),
                ran: Duration::from_nanos(ns),
            },
        );
    }
}

/// CPU time per call (ms) by role and thread name between two snapshots, over `calls`,
/// most first: a thread present in both counts its difference, a thread started between
/// them all its time; a thread that ended between them is lost (its time left /proc with
/// it: tokio's blocking threads end after ten idle seconds).
pub fn per_call(before: &Snapshot, after: &Snapshot, calls: usize) -> Vec<Row> {
    let mut by_name: BTreeMap<(Role, &str), Duration> = BTreeMap::new();
    for (tid, thread) in after {
        let earlier = before
            .get(tid)
            .filter(|b| b.name == thread.name)
            .map_or(Duration::ZERO, |b| b.ran);
        *by_name.entry((thread.role, &thread.name)).or_default() +=
            thread.ran.saturating_sub(earlier);
    }
    let mut rows: Vec<Row> = by_name
        .into_iter()
        .map(|((role, name), ran)| Row {
            role,
            thread: name.to_string(),
            ms: ran.as_nanos() as f64 / 1e6 / calls.max(1) as f64,
        })
        .collect();
    rows.sort_by(|a, b| a.role.cmp(&b.role).then(b.ms.total_cmp(&a.ms)));
    rows
}

/// The rows of [`per_call`] worth printing (at least a microsecond per call), one line per
/// role: `control plane: store-writer 0.290, tokio-rt-worker 0.250`.
pub fn lines(rows: &[Row]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut current = None;
    for row in rows.iter().filter(|row| row.ms >= 0.001) {
        if current != Some(row.role) {
            current = Some(row.role);
            lines.push(format!("{}:", row.role.label()));
        } else if let Some(line) = lines.last_mut() {
            line.push(',');
        }
        if let Some(line) = lines.last_mut() {
            line.push_str(&format!(" {} {:.3}", row.thread, row.ms));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(role: Role, name: &str, ms: u64) -> Thread {
        Thread {
            role,
            name: name.into(),
            ran: Duration::from_millis(ms),
        }
    }

    #[test]
    fn a_run_counts_each_threads_time_since_the_first_snapshot_by_role_and_name() {
        let before = Snapshot::from([
            (1, thread(Role::ControlPlane, "store-writer", 500)),
            (2, thread(Role::ControlPlane, "tokio-rt-worker", 100)),
            (3, thread(Role::ControlPlane, "tokio-rt-worker", 100)),
            (9, thread(Role::ControlPlane, "ended", 100)),
            (20, thread(Role::Worker, "guest", 10)),
        ]);
        let after = Snapshot::from([
            (1, thread(Role::ControlPlane, "store-writer", 800)),
            (2, thread(Role::ControlPlane, "tokio-rt-worker", 300)),
            (3, thread(Role::ControlPlane, "tokio-rt-worker", 150)),
            // Started during the run: all its time is the run's.
            (4, thread(Role::ControlPlane, "tokio-rt-worker", 50)),
            (20, thread(Role::Worker, "guest", 110)),
            // A thread id reused by another thread counts from zero.
            (21, thread(Role::Worker, "epoch-ticker", 1)),
        ]);
        let rows = per_call(&before, &after, 1000);
        let ms = |role, name: &str| {
            rows.iter()
                .find(|row| row.role == role && row.thread == name)
                .map(|row| row.ms)
        };
        assert_eq!(ms(Role::ControlPlane, "store-writer"), Some(0.3));
        assert_eq!(ms(Role::ControlPlane, "tokio-rt-worker"), Some(0.3));
        assert_eq!(ms(Role::Worker, "guest"), Some(0.1));
        assert_eq!(ms(Role::Worker, "epoch-ticker"), Some(0.001));
        assert_eq!(ms(Role::ControlPlane, "ended"), None);
        assert_eq!(
            lines(&rows),
            vec![
                "control plane: store-writer 0.300, tokio-rt-worker 0.300".to_string(),
                "workers: guest 0.100, epoch-ticker 0.001".to_string(),
            ]
        );
    }

    #[test]
    fn a_reused_thread_id_counts_from_zero() {
        let before = Snapshot::from([(7, thread(Role::Worker, "guest", 900))]);
        let after = Snapshot::from([(7, thread(Role::Worker, "epoch-ticker", 20))]);
        assert_eq!(
            per_call(&before, &after, 10),
            vec![Row {
                role: Role::Worker,
                thread: "epoch-ticker".into(),
                ms: 2.0
            }]
        );
    }

    #[test]
    fn this_process_own_time_is_summed_under_the_bench() {
        let before = own();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let rows = per_call(&before, &own(), 1);
        assert!(rows.iter().all(|row| row.role == Role::Bench), "{rows:?}");
        assert!(total_ms(&rows) > 0.0, "{rows:?}");
    }

    #[test]
    fn this_process_threads_are_read() {
        let threads = snapshot(std::process::id());
        assert!(
            threads
                .values()
                .any(|t| t.role == Role::ControlPlane && t.ran > Duration::ZERO),
            "{threads:?}"
        );
    }
}
