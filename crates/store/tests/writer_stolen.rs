//! The SQLite writer keeps looking for the next write when its core is taken from the
//! whole machine, as a hypervisor takes a vCPU to run another guest: only other threads of
//! this machine wanting the core end its look. Alone in its test binary: it stops and
//! continues its own process, and reads the CPU time of the process's one writer thread.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
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
        // After the command's closing parenthesis: utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(total * 1000 / ticks)
}

/// Says it is ready, then stops and continues the process whose id is its argument: 3 ms
/// each, 450 times (longer than the test's three looks), and leaves it continued whatever happens.
const STEALER: &str = "
import os, signal, sys, time
pid = int(sys.argv[1])
print('ready', flush=True)
try:
    for _ in range(450):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.003)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.003)
finally:
    os.kill(pid, signal.SIGCONT)
";

#[tokio::test]
async fn a_writer_keeps_looking_while_the_machine_loses_its_cores_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("stolen.db").display());
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
    // From the outside, stop and continue this whole process, half the time, for longer
    // than the writer looks: to the writer, like a host whose other guests take half of
    // its vCPU. Every thread of the process stops, so no thread of its own takes the core;
    // the writer's yields return late without another thread having run. It always ends
    // continued, and this test waits for it. (Python, not a shell: a shell's `sleep`
    // processes would run on the writer's core each round, which is a machine's thread
    // wanting it.)
    let pid = std::process::id();
    let mut stealer = Command::new("python3")
        .arg("-c")
        .arg(STEALER)
        .arg(pid.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Started (its interpreter's start is CPU work that is not stealing).
    let mut ready = String::new();
    BufReader::new(stealer.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    // Three writes, each followed by a look: at least one lasts (as on an idle machine,
    // `writer_idle`, a look ends early now and then when the machine's own threads want
    // the core).
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
    assert!(stealer.wait().unwrap().success());
    // It looked for its poll (a little less than half of it on the core, the rest
    // stopped), where counting the stolen time as other threads' ended every look within
    // its first stop: under a clock tick of CPU.
    let longest = looks.iter().max().copied().unwrap_or_default();
    assert!(longest >= Duration::from_millis(20), "looked {looks:?}");
    assert!(
        longest <= poll + Duration::from_millis(40),
        "looked {looks:?}"
    );
    assert_eq!(
        store.get_artifact("sha256:four").await.unwrap().as_deref(),
        Some(&b"four"[..])
    );
}
