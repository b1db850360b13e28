//! Local worker processes for `toolgrid up`: as many `toolgrid worker` processes as each
//! WorkerPool wants, restarted when they die.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use toolgrid_catalog::Catalog;

/// The most workers one pool runs on one machine.
pub const MAX_LOCAL_WORKERS: u32 = 32;

struct Worker {
    child: Option<Child>,
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
        }
    }

    /// Keeps the processes in line with the catalog until the task is dropped (which kills
    /// them: children are killed on drop).
    pub async fn run(mut self, catalog: Arc<Catalog>) {
        let mut changes = catalog.subscribe();
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
            self.reconcile(&wanted).await;
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    async fn reconcile(&mut self, wanted: &BTreeMap<(String, u32), u32>) {
        let unwanted: Vec<_> = self
            .workers
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in unwanted {
            if let Some(mut worker) = self.workers.remove(&key)
                && let Some(child) = worker.child.as_mut()
            {
                tracing::info!(pool = %key.0, index = key.1, "stopping worker");
                let _ = child.kill().await;
            }
        }
        for (key, slots) in wanted {
            let worker = self.workers.entry(key.clone()).or_insert(Worker {
                child: None,
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
                        tracing::warn!(pool = %key.0, index = key.1, %status, restarts = worker.restarts, "worker exited; restarting in {backoff:?}");
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
            let id = format!("{}-{}", key.0.replace('/', "-"), key.1);
            let mut command = Command::new(&self.exe);
            command
                .arg("worker")
                .arg("--control-plane")
                .arg(&self.control_plane)
                .arg("--id")
                .arg(&id)
                .arg("--pool")
                .arg(&key.0)
                .arg("--slots")
                .arg(slots.to_string())
                .arg("--cache")
                .arg(&self.cache_dir)
                .arg("--parent-pid")
                .arg(std::process::id().to_string())
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
            match command.spawn() {
                Ok(child) => {
                    tracing::info!(worker = %id, pid = child.id().unwrap_or_default(), "started worker");
                    worker.child = Some(child);
                }
                Err(error) => {
                    tracing::error!(worker = %id, %error, "cannot start worker");
                    worker.next_start = Instant::now() + Duration::from_secs(2);
                }
            }
        }
    }
}
