//! The SQLite writer keeps looking for the next write when its core is taken from the
//! whole machine, as a hypervisor takes a vCPU to run another guest: only other threads of
//! this machine wanting the core end its look. Alone in its test binary: it stops and
//! continues its own process, and reads the CPU time of the process's one writer thread.

mod looks;

use looks::{longest_look, store_looking_for, three_looks};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Says it is ready, then stops and continues the process whose id is its argument: 3 ms
/// each, 450 times (longer than the test's three looks), and leaves it continued whatever
/// happens.
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
    let poll = Duration::from_millis(400);
    let store = store_looking_for(dir.path(), poll).await;
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
    let looks = three_looks(&*store, poll).await;
    assert!(stealer.wait().unwrap().success());
    // It looked for its poll (a little less than half of it on the core, the rest
    // stopped), where counting the stolen time as other threads' ended every look within
    // its first stop: under a clock tick of CPU.
    longest_look(&looks, poll);
}
