//! A WorkerPool's Deployment of `toolgrid-worker` pods, and how many workers it wants: plain
//! functions, so every decision is tested without a cluster.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, ProjectedVolumeSource, SeccompProfile,
    SecurityContext, ServiceAccount, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use std::collections::BTreeMap;
use toolgrid_api::WorkerPool;

/// The worker pods' command: the image's `toolgrid-worker` (its `toolgrid` binary's
/// `worker` subcommand, in a binary of its own).
pub const WORKER_COMMAND: &str = "toolgrid-worker";

/// How worker pods are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Image of the worker pods (the controller's own, unless a pool names one).
    pub image: String,
    /// Address the workers dial (`http://toolgrid.toolgrid.svc:7070`).
    pub control_plane: String,
    /// The CA certificates (PEM) the workers trust for an `https://` control plane, given
    /// to them inline (`TOOLGRID_TLS_CA_PEM`; a certificate is public).
    pub tls_ca: WorkerCa,
    /// The OTLP/gRPC endpoint the workers export traces to (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp_endpoint: Option<String>,
}

/// The CA certificates workers trust, as they are now: fixed (`--worker-tls-ca`), or
/// rotated by the controller (`--tls-self-signed`, see [`crate::tls_secret`]); each pool's
/// Deployment takes the current one at its next reconcile.
#[derive(Clone, Debug, Default)]
pub struct WorkerCa(std::sync::Arc<std::sync::RwLock<Option<String>>>);

impl WorkerCa {
    pub fn new(pem: Option<String>) -> Self {
        WorkerCa(std::sync::Arc::new(std::sync::RwLock::new(pem)))
    }

    pub fn get(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, pem: String) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(pem);
    }
}

impl PartialEq for WorkerCa {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for WorkerCa {}

/// The label every worker pod of a pool carries.
pub const POOL_LABEL: &str = "toolgrid.dev/pool";
/// Where workers cache compiled releases.
const CACHE_DIR: &str = "/var/cache/toolgrid";
/// Where the worker's projected ServiceAccount token is mounted.
pub const TOKEN_DIR: &str = "/var/run/secrets/toolgrid";
/// The file, in [`TOKEN_DIR`], holding the token; kubelet replaces it before it expires.
pub const TOKEN_FILE: &str = "token";
/// How long a projected worker token lives (kubelet rotates it at 80% of this).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// The variable telling the worker where its token is.
pub const TOKEN_FILE_ENV: &str = "TOOLGRID_WORKER_TOKEN_FILE";

/// The labels of everything made for a pool's workers.
fn worker_labels(pool: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "toolgrid-worker"),
        ("app.kubernetes.io/instance", pool),
        ("app.kubernetes.io/component", "worker"),
        ("app.kubernetes.io/part-of", "toolgrid"),
        ("app.kubernetes.io/managed-by", "toolgrid-controller"),
        (POOL_LABEL, pool),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The annotation the ReplicaSet controller reads to choose which pods go first when a
/// Deployment scales in: the lowest cost first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The deletion cost each of a pool's pods should carry before it scales in, where it
/// differs from what it carries (`pods`: name and current annotation): the calls its worker
/// holds (the worker id is the pod's name), so the least busy worker is drained first;
/// a pod whose worker is not attached (starting, or lost) costs -1, less than any idle one.
pub fn deletion_costs(
    pods: &[(String, Option<String>)],
    workers: &[toolgrid_core::scheduler::WorkerInfo],
) -> Vec<(String, String)> {
    pods.iter()
        .filter_map(|(pod, current)| {
            let cost = workers
                .iter()
                .find(|w| w.id.as_str() == pod)
                .map_or(-1, |w| i64::from(w.busy))
                .to_string();
            (current.as_deref() != Some(cost.as_str())).then(|| (pod.clone(), cost))
        })
        .collect()
}

/// The ServiceAccount the controller makes for a pool's workers, owned by the pool: only
/// when the pool names none of its own (`spec.serviceAccount`) and none of that name
/// exists yet (`exists`), so that an account someone else made is never taken over (nor
/// deleted with the pool). It grants nothing: it only names the workers of this pool in
/// their tokens.
pub fn desired_service_account(pool: &WorkerPool, exists: bool) -> Option<ServiceAccount> {
    if pool.spec.service_account.is_some() || exists {
        return None;
    }
    let name = pool.metadata.name.clone().unwrap_or_default();
    Some(ServiceAccount {
        metadata: ObjectMeta {
            name: Some(pool.spec.service_account_name(&name)),
            namespace: pool.metadata.namespace.clone(),
            labels: Some(worker_labels(&name)),
            owner_references: pool.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    })
}

/// The name of a pool's Deployment.
pub fn deployment_name(pool: &str) -> String {
    format!("toolgrid-worker-{pool}")
}

/// Workers a pool wants: its replicas, or for autoscale enough to keep the queue at
/// `targetQueueDepth` calls a worker and to run what is busy now, within the bounds.
pub fn desired_workers(pool: &WorkerPool, busy_slots: u32, queued: u32) -> u32 {
    let spec = &pool.spec;
    match &spec.autoscale {
        None => spec.replicas.unwrap_or(1),
        Some(autoscale) => {
            let target = autoscale.target_queue_depth.unwrap_or(10).max(1);
            let for_queue = queued.div_ceil(target);
            let for_busy = busy_slots.div_ceil(spec.slots().max(1));
            (for_queue + for_busy).clamp(autoscale.min, autoscale.max.max(autoscale.min))
        }
    }
}

/// The worker container's environment: its id (the pod's name), and the CA to trust.
fn worker_env(settings: &WorkerSettings) -> Vec<EnvVar> {
    let mut env = vec![EnvVar {
        name: "TOOLGRID_WORKER_ID".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }];
    env.push(EnvVar {
        name: TOKEN_FILE_ENV.into(),
        value: Some(format!("{TOKEN_DIR}/{TOKEN_FILE}")),
        ..EnvVar::default()
    });
    if let Some(pem) = settings.tls_ca.get() {
        env.push(EnvVar {
            name: toolgrid_proto::tls::TLS_CA_PEM_ENV.into(),
            value: Some(pem),
            ..EnvVar::default()
        });
    }
    if let Some(endpoint) = &settings.otlp_endpoint {
        env.push(EnvVar {
            name: "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            value: Some(endpoint.clone()),
            ..EnvVar::default()
        });
    }
    env
}

/// The Deployment of a pool's workers, owned by the pool (deleted with it).
pub fn desired_deployment(
    pool: &WorkerPool,
    settings: &WorkerSettings,
    replicas: u32,
) -> Deployment {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let spec = &pool.spec;
    let labels = worker_labels(&name);
    let mut selector = BTreeMap::new();
    selector.insert(POOL_LABEL.to_string(), name.clone());
    selector.insert(
        "app.kubernetes.io/name".to_string(),
        "toolgrid-worker".to_string(),
    );

    let container = Container {
        name: "worker".into(),
        image: Some(spec.image.clone().unwrap_or_else(|| settings.image.clone())),
        // The image's binary of its own for workers (`toolgrid worker` alone), found on the
        // image's PATH: a worker maps and loads less than half of what `toolgrid` is.
        command: Some(vec![WORKER_COMMAND.into()]),
        args: Some(vec![
            "--control-plane".into(),
            settings.control_plane.clone(),
            "--pool".into(),
            format!("{namespace}/{name}"),
            "--slots".into(),
            spec.slots().to_string(),
            "--cache".into(),
            CACHE_DIR.into(),
        ]),
        env: Some(worker_env(settings)),
        resources: spec.resources.clone(),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "cache".into(),
                mount_path: CACHE_DIR.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "worker-token".into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    let pod = PodSpec {
        containers: vec![container],
        service_account_name: Some(spec.service_account_name(&name)),
        // No API token in the pod: only the projected token below, whose audience is the
        // control plane's worker link and which the API server refuses.
        automount_service_account_token: Some(false),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        termination_grace_period_seconds: Some(30),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            fs_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(vec![
            Volume {
                name: "cache".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
            Volume {
                name: "worker-token".into(),
                projected: Some(ProjectedVolumeSource {
                    sources: Some(vec![VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            audience: Some(toolgrid_control_plane::auth::WORKER_AUDIENCE.into()),
                            expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                            path: TOKEN_FILE.into(),
                            ..ServiceAccountTokenProjection::default()
                        }),
                        ..VolumeProjection::default()
                    }]),
                    ..ProjectedVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(&name)),
            namespace: Some(namespace),
            labels: Some(labels.clone()),
            owner_references: pool.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: DeploymentSpec {
            replicas: Some(i32::try_from(replicas).unwrap_or(i32::MAX)),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_api::{Autoscale, WorkerPoolSpec};

    fn pool(spec: WorkerPoolSpec) -> WorkerPool {
        let mut pool = WorkerPool::new("gpu", spec);
        pool.metadata.namespace = Some("team".into());
        pool.metadata.uid = Some("uid-1".into());
        pool
    }

    fn settings() -> WorkerSettings {
        WorkerSettings {
            image: "ghcr.io/toolgrid/toolgrid:0.1.0".into(),
            control_plane: "http://toolgrid.toolgrid.svc:7070".into(),
            tls_ca: WorkerCa::default(),
            otlp_endpoint: None,
        }
    }

    #[test]
    fn the_deployment_runs_workers_of_the_pool_and_is_owned_by_it() {
        let mut spec = WorkerPoolSpec {
            replicas: Some(3),
            autoscale: None,
            slots_per_worker: Some(32),
            resources: None,
            node_selector: BTreeMap::from([("pool".to_string(), "gpu".to_string())]),
            tolerations: vec![],
            image: None,
            service_account: None,
        };
        let deployment = desired_deployment(&pool(spec.clone()), &settings(), 3);
        assert_eq!(
            deployment.metadata.name.as_deref(),
            Some("toolgrid-worker-gpu")
        );
        assert_eq!(deployment.metadata.namespace.as_deref(), Some("team"));
        let owner = &deployment.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("WorkerPool", "gpu", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        let spec_out = deployment.spec;
        assert_eq!(spec_out.replicas, Some(3));
        let pod = spec_out.template.spec.unwrap();
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("ghcr.io/toolgrid/toolgrid:0.1.0")
        );
        assert_eq!(container.command.clone().unwrap(), ["toolgrid-worker"]);
        assert_eq!(
            container.args.clone().unwrap(),
            [
                "--control-plane",
                "http://toolgrid.toolgrid.svc:7070",
                "--pool",
                "team/gpu",
                "--slots",
                "32",
                "--cache",
                "/var/cache/toolgrid"
            ]
        );
        assert_eq!(pod.node_selector.unwrap()["pool"], "gpu");
        assert_eq!(pod.automount_service_account_token, Some(false));
        let selector = spec_out.selector.match_labels.unwrap();
        let labels = spec_out.template.metadata.unwrap().labels.unwrap();
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "the selector matches the pods"
        );

        let env = |deployment: &Deployment| {
            deployment.spec.template.spec.as_ref().unwrap().containers[0]
                .env
                .clone()
                .unwrap_or_default()
        };
        let plain = desired_deployment(&pool(spec.clone()), &settings(), 1);
        assert!(
            env(&plain)
                .iter()
                .all(|e| e.name != toolgrid_proto::tls::TLS_CA_PEM_ENV),
            "no CA without TLS"
        );
        let tls = WorkerSettings {
            control_plane: "https://toolgrid.toolgrid.svc:7070".into(),
            tls_ca: WorkerCa::new(Some("-----BEGIN CERTIFICATE-----".into())),
            ..settings()
        };
        let with_tls = desired_deployment(&pool(spec.clone()), &tls, 1);
        assert!(env(&with_tls).iter().any(|e| {
            e.name == toolgrid_proto::tls::TLS_CA_PEM_ENV
                && e.value.as_deref() == Some("-----BEGIN CERTIFICATE-----")
        }));

        assert!(
            env(&plain)
                .iter()
                .all(|e| e.name != "OTEL_EXPORTER_OTLP_ENDPOINT"),
            "no trace endpoint unless the controller has one"
        );
        let traced = WorkerSettings {
            otlp_endpoint: Some("http://collector.monitoring:4317".into()),
            ..settings()
        };
        assert!(
            env(&desired_deployment(&pool(spec.clone()), &traced, 1))
                .iter()
                .any(|e| e.name == "OTEL_EXPORTER_OTLP_ENDPOINT"
                    && e.value.as_deref() == Some("http://collector.monitoring:4317")),
            "the workers trace where the controller does"
        );

        spec.image = Some("registry.local/worker:dev".into());
        let deployment = desired_deployment(&pool(spec), &settings(), 1);
        let image = deployment.spec.template.spec.unwrap().containers[0]
            .image
            .clone();
        assert_eq!(
            image.as_deref(),
            Some("registry.local/worker:dev"),
            "a pool may name its image"
        );
    }

    fn plain_spec() -> WorkerPoolSpec {
        WorkerPoolSpec {
            replicas: Some(1),
            autoscale: None,
            slots_per_worker: None,
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            image: None,
            service_account: None,
        }
    }

    #[test]
    fn workers_run_as_the_pool_account_with_only_a_projected_worker_token() {
        let deployment = desired_deployment(&pool(plain_spec()), &settings(), 1);
        let pod = deployment.spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("gpu-worker"));
        assert_eq!(
            pod.automount_service_account_token,
            Some(false),
            "no API token in worker pods"
        );
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "worker-token")
            .expect("a token volume");
        let sources = volume.projected.unwrap().sources.unwrap();
        let token = sources[0].service_account_token.clone().unwrap();
        assert_eq!(token.audience.as_deref(), Some("toolgrid-worker"));
        assert_eq!(token.expiration_seconds, Some(3600));
        assert_eq!(token.path, "token");
        let container = &pod.containers[0];
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "worker-token")
            .expect("mounted");
        assert_eq!(mount.read_only, Some(true));
        let env = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "TOOLGRID_WORKER_TOKEN_FILE")
            .expect("the worker is told where its token is");
        assert_eq!(
            env.value.as_deref(),
            Some(format!("{}/token", mount.mount_path).as_str())
        );

        // A pool naming its own account runs as that one.
        let mut spec = plain_spec();
        spec.service_account = Some("gpu-runner".into());
        let deployment = desired_deployment(&pool(spec), &settings(), 1);
        let pod = deployment.spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("gpu-runner"));
    }

    #[test]
    fn the_controller_makes_the_default_worker_account_only_when_nobody_has() {
        let made = desired_service_account(&pool(plain_spec()), false).expect("made");
        assert_eq!(made.metadata.name.as_deref(), Some("gpu-worker"));
        assert_eq!(made.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(made.automount_service_account_token, Some(false));
        let owner = &made.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("WorkerPool", "gpu", "uid-1")
        );
        assert_eq!(
            made.metadata.labels.unwrap()[POOL_LABEL],
            "gpu",
            "labelled as the pool's"
        );
        // It exists already (made before, or by someone else): left alone.
        assert!(desired_service_account(&pool(plain_spec()), true).is_none());
        // The pool names its own: never made.
        let mut spec = plain_spec();
        spec.service_account = Some("gpu-runner".into());
        assert!(desired_service_account(&pool(spec), false).is_none());
    }

    #[test]
    fn scale_in_takes_the_least_busy_worker_first() {
        use toolgrid_core::ids::WorkerId;
        use toolgrid_core::scheduler::WorkerInfo;
        let worker = |id: &str, busy| WorkerInfo {
            id: WorkerId::from(id),
            pool: "team/default".into(),
            slots: 8,
            busy,
        };
        let workers = [
            worker("w-busy", 7),
            worker("w-idle", 0),
            worker("w-some", 2),
        ];
        let pods = [
            ("w-busy".to_string(), None),
            ("w-idle".to_string(), Some("0".to_string())),
            ("w-some".to_string(), Some("5".to_string())),
            ("w-starting".to_string(), None),
        ];
        assert_eq!(
            deletion_costs(&pods, &workers),
            vec![
                ("w-busy".to_string(), "7".to_string()),
                ("w-some".to_string(), "2".to_string()),
                ("w-starting".to_string(), "-1".to_string()),
            ],
            "only what differs is patched; the idle pod already says 0"
        );
    }

    #[test]
    fn autoscale_follows_the_queue_within_bounds() {
        let fixed = pool(WorkerPoolSpec {
            replicas: Some(4),
            autoscale: None,
            slots_per_worker: None,
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            image: None,
            service_account: None,
        });
        assert_eq!(desired_workers(&fixed, 1000, 1000), 4);
        let scaled = pool(WorkerPoolSpec {
            replicas: None,
            autoscale: Some(Autoscale {
                min: 1,
                max: 5,
                target_queue_depth: Some(10),
            }),
            slots_per_worker: Some(8),
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            image: None,
            service_account: None,
        });
        assert_eq!(desired_workers(&scaled, 0, 0), 1, "never below min");
        assert_eq!(desired_workers(&scaled, 8, 0), 1, "one full worker");
        assert_eq!(
            desired_workers(&scaled, 16, 25),
            5,
            "two busy and three for the queue"
        );
        assert_eq!(desired_workers(&scaled, 64, 500), 5, "never above max");
    }
}
