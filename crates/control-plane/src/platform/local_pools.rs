//! Local worker processes for `toolgrid up`: as many `toolgrid worker` processes as each
//! WorkerPool wants, restarted when they die, and replaced one by one (a rolling update)
//! when their pool's settings change or `toolgrid up` gets SIGHUP.
//!
//! A worker leaves by draining, never by SIGKILL: it is sent SIGTERM, takes no new call,
//! finishes those it holds within its grace period and exits (docs/rollout.md). In a roll,
//! the replacement is started first (a surge of one) and attached before the old one is
//! told to go, so the pool never has fewer workers than it wants.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use toolgrid_catalog::Catalog;

/// The most workers one pool runs on one machine.
pub const MAX_LOCAL_WORKERS: u32 = 32;

/// How long a leaving worker may take to drain and exit before it is killed: its grace
/// period (25 s by default) and some.
const LEAVE_DEADLINE: Duration = Duration::from_secs(40);

/// How long a roll waits for a replacement to attach before going on without it.
const ATTACH_DEADLINE: Duration = Duration::from_secs(60);

/// The ids of the workers attached to the control plane now.
pub type Attached = Arc<dyn Fn() -> BTreeSet<String> + Send + Sync>;

struct Worker {
    child: Option<Child>,
    /// The id it attached with (a replacement gets a new one: the old drains meanwhile).
    id: String,
    /// The slots it was started with.
    slots: u32,
    restarts: u32,
    next_start: Instant,
}

/// Supervises local worker processes.
pub struct LocalPools {
    exe: PathBuf,
    control_plane: String,
    cache_dir: PathBuf,
    /// The join token, handed to each worker in its environment (never its arguments,
    /// which every user of the machine can read).
    join_token: String,
    /// CA certificate the workers trust, when the control plane speaks TLS.
    tls_ca: Option<PathBuf>,
    workers: BTreeMap<(String, u32), Worker>,
    /// Who is attached, for a roll to wait on a replacement.
    attached: Option<Attached>,
    /// Woken to replace every worker one by one (SIGHUP).
    restart: Arc<Notify>,
    /// Replacements made so far, for their ids.
    rolled: u64,
}

impl LocalPools {
    pub fn new(
        exe: PathBuf,
        control_plane: String,
        cache_dir: PathBuf,
        join_token: String,
        tls_ca: Option<PathBuf>,
    ) -> Self {
        LocalPools {
            exe,
            control_plane,
            cache_dir,
            join_token,
            tls_ca,
            workers: BTreeMap::new(),
            attached: None,
            restart: Arc::new(Notify::new()),
            rolled: 0,
        }
    }

    /// Lets a roll wait until each replacement has attached (else it waits a second).
    pub fn with_attached(mut self, attached: Attached) -> Self {
        self.attached = Some(attached);
        self
    }

    /// Notified, replaces every worker one by one (`toolgrid up` on SIGHUP).
    pub fn restart_handle(&self) -> Arc<Notify> {
        self.restart.clone()
    }

    /// Keeps the processes in line with the catalog until the task is dropped (which kills
    /// them: children are killed on drop).
    pub async fn run(mut self, catalog: Arc<Catalog>) {
        let mut changes = catalog.subscribe();
        let restart = self.restart.clone();
        loop {
            let wanted: BTreeMap<(String, u32), u32> = {
                let snapshot = changes.borrow_and_update().clone();
                snapshot
                    .pools
                    .values()
                    .flat_map(|p| {
                        let pool = p.key.to_string();
                        let count = p.desired_workers.min(MAX_LOCAL_WORKERS);
                        (0..count).map(move |i| ((pool.clone(), i), p.slots_per_worker))
                    })
                    .collect()
            };
            // A pool whose workers' settings changed is rolled, one worker at a time.
            let stale: Vec<_> = self
                .workers
                .iter()
                .filter(|(key, w)| {
                    w.child.is_some() && wanted.get(*key).is_some_and(|&slots| slots != w.slots)
                })
                .map(|(key, _)| key.clone())
                .collect();
            if !stale.is_empty() {
                self.roll(&stale, &wanted).await;
            }
            self.reconcile(&wanted).await;
            tokio::select! {
                _ = changes.changed() => {}
                _ = restart.notified() => {
                    let all: Vec<_> = self.workers.keys().filter(|k| wanted.contains_key(*k)).cloned().collect();
                    tracing::info!(workers = all.len(), "replacing every local worker, one by one");
                    self.roll(&all, &wanted).await;
                }
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    /// Replaces the workers at `keys` one by one: the replacement starts and attaches, then
    /// the old one drains and exits.
    async fn roll(&mut self, keys: &[(String, u32)], wanted: &BTreeMap<(String, u32), u32>) {
        for key in keys {
            let Some(&slots) = wanted.get(key) else {
                continue;
            };
            self.rolled += 1;
            let id = format!("{}-{}-r{}", key.0.replace('/', "-"), key.1, self.rolled);
            let Some(child) = self.spawn(&key.0, &id, slots) else {
                continue;
            };
            self.wait_attached(&id).await;
            let replacement = Worker {
                child: Some(child),
                id: id.clone(),
                slots,
                restarts: 0,
                next_start: Instant::now(),
            };
            if let Some(old) = self.workers.insert(key.clone(), replacement) {
                tracing::info!(pool = %key.0, old = %old.id, new = %id, "worker replaced; the old one drains");
                leave(old).await;
            }
        }
    }

    async fn wait_attached(&self, id: &str) {
        let Some(attached) = &self.attached else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        };
        let start = Instant::now();
        while start.elapsed() < ATTACH_DEADLINE {
            if attached().contains(id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::warn!(
            worker = id,
            "the replacement did not attach in time; rolling on"
        );
    }

    async fn reconcile(&mut self, wanted: &BTreeMap<(String, u32), u32>) {
        let unwanted: Vec<_> = self
            .workers
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in unwanted {
            if let Some(worker) = self.workers.remove(&key) {
                tracing::info!(pool = %key.0, worker = %worker.id, "stopping worker (it drains)");
                tokio::spawn(leave(worker));
            }
        }
        for (key, &slots) in wanted {
            let worker = self.workers.entry(key.clone()).or_insert(Worker {
                child: None,
                id: format!("{}-{}", key.0.replace('/', "-"), key.1),
                slots,
                restarts: 0,
                next_start: Instant::now(),
            });
            if let Some(child) = worker.child.as_mut() {
                match child.try_wait() {
                    Ok(None) => continue,
                    Ok(Some(status)) => {
                        worker.restarts += 1;
                        let backoff =
                            Duration::from_millis(200 * u64::from(worker.restarts.min(10)));
                        tracing::warn!(pool = %key.0, worker = %worker.id, %status, restarts = worker.restarts, "worker exited; restarting in {backoff:?}");
                        worker.child = None;
                        worker.next_start = Instant::now() + backoff;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot check a worker process");
                        continue;
                    }
                }
            }
            if Instant::now() < worker.next_start {
                continue;
            }
            let (pool, id) = (key.0.clone(), worker.id.clone());
            match self.spawn(&pool, &id, slots) {
                Some(child) => {
                    if let Some(worker) = self.workers.get_mut(key) {
                        worker.child = Some(child);
                        worker.slots = slots;
                    }
                }
                None => {
                    if let Some(worker) = self.workers.get_mut(key) {
                        worker.next_start = Instant::now() + Duration::from_secs(2);
                    }
                }
            }
        }
    }

    fn spawn(&self, pool: &str, id: &str, slots: u32) -> Option<Child> {
        let mut command = self.command(pool, id, slots);
        match command.spawn() {
            Ok(child) => {
                tracing::info!(worker = %id, pid = child.id().unwrap_or_default(), "started worker");
                Some(child)
            }
            Err(error) => {
                tracing::error!(worker = %id, %error, "cannot start worker");
                None
            }
        }
    }

    /// The command that starts worker `id` of `pool` with `slots` slots.
    fn command(&self, pool: &str, id: &str, slots: u32) -> Command {
        let mut command = Command::new(&self.exe);
        command
            .arg("worker")
            .arg("--control-plane")
            .arg(&self.control_plane)
            .arg("--id")
            .arg(id)
            .arg("--pool")
            .arg(pool)
            .arg("--slots")
            .arg(slots.to_string())
            .arg("--cache")
            .arg(&self.cache_dir)
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
            // Its calls run on a runtime of their own; the link needs one thread, and on a
            // machine it shares with the control plane fewer threads wait for its cores.
            .arg("--runtime-threads")
            .arg("1")
            .env(crate::auth::worker::JOIN_TOKEN_ENV, &self.join_token)
            .env_remove("TOOLGRID_JOIN_TOKEN_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        match &self.tls_ca {
            Some(ca) => command.env(toolgrid_proto::tls::TLS_CA_ENV, ca),
            None => command.env_remove(toolgrid_proto::tls::TLS_CA_ENV),
        };
        command
    }
}

/// Tells a worker to go (SIGTERM: it drains) and waits for it to exit; one that takes
/// longer than [`LEAVE_DEADLINE`] is killed.
async fn leave(mut worker: Worker) {
    let Some(mut child) = worker.child.take() else {
        return;
    };
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        // SAFETY: kill(2) on our own child's pid, which we have not reaped (`child` holds it).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    match tokio::time::timeout(LEAVE_DEADLINE, child.wait()).await {
        Ok(Ok(status)) => tracing::info!(worker = %worker.id, %status, "worker left"),
        Ok(Err(error)) => tracing::warn!(worker = %worker.id, %error, "cannot wait for a worker"),
        Err(_) => {
            tracing::warn!(worker = %worker.id, "worker did not leave in time; killing it");
            let _ = child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_worker_serves_its_link_on_one_thread_and_gets_its_token_in_its_environment() {
        let pools = LocalPools::new(
            PathBuf::from("/bin/toolgrid"),
            "http://127.0.0.1:7070".into(),
            PathBuf::from("/tmp/cache"),
            "join-secret".into(),
            None,
        );
        let command = pools.command("default/default", "default-default-0", 4);
        let command = command.as_std();
        let args: Vec<_> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag)?;
            args.get(at + 1).cloned()
        };
        assert_eq!(args.first().map(String::as_str), Some("worker"));
        assert_eq!(after("--runtime-threads").as_deref(), Some("1"));
        assert_eq!(after("--slots").as_deref(), Some("4"));
        assert!(!args.iter().any(|a| a.contains("join-secret")), "{args:?}");
        let token = command
            .get_envs()
            .find(|(k, _)| *k == crate::auth::worker::JOIN_TOKEN_ENV)
            .and_then(|(_, v)| v);
        assert_eq!(token.and_then(|v| v.to_str()), Some("join-secret"));
    }
}
