//! A WorkerPool's Deployment of `toolgrid worker` pods, and how many workers it wants: plain
//! functions, so every decision is tested without a cluster.

use crate::api::WorkerPool;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use std::collections::BTreeMap;

/// How worker pods are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Image of the worker pods (the controller's own, unless a pool names one).
    pub image: String,
    /// Address the workers dial (`http://toolgrid.toolgrid.svc:7070`).
    pub control_plane: String,
    /// The CA certificate (PEM) the workers trust for an `https://` control plane, given to
    /// them inline (`TOOLGRID_TLS_CA_PEM`; a certificate is public).
    pub tls_ca_pem: Option<String>,
}

/// The label every worker pod of a pool carries.
pub const POOL_LABEL: &str = "toolgrid.dev/pool";
/// Where workers cache compiled releases.
const CACHE_DIR: &str = "/var/cache/toolgrid";

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
    if let Some(pem) = &settings.tls_ca_pem {
        env.push(EnvVar {
            name: crate::platform::tls::TLS_CA_PEM_ENV.into(),
            value: Some(pem.clone()),
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
    let mut labels = BTreeMap::new();
    labels.insert(
        "app.kubernetes.io/name".to_string(),
        "toolgrid-worker".to_string(),
    );
    labels.insert("app.kubernetes.io/instance".to_string(), name.clone());
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        "worker".to_string(),
    );
    labels.insert(
        "app.kubernetes.io/part-of".to_string(),
        "toolgrid".to_string(),
    );
    labels.insert(
        "app.kubernetes.io/managed-by".to_string(),
        "toolgrid-controller".to_string(),
    );
    labels.insert(POOL_LABEL.to_string(), name.clone());
    let mut selector = BTreeMap::new();
    selector.insert(POOL_LABEL.to_string(), name.clone());
    selector.insert(
        "app.kubernetes.io/name".to_string(),
        "toolgrid-worker".to_string(),
    );

    let container = Container {
        name: "worker".into(),
        image: Some(spec.image.clone().unwrap_or_else(|| settings.image.clone())),
        args: Some(vec![
            "worker".into(),
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
        volume_mounts: Some(vec![VolumeMount {
            name: "cache".into(),
            mount_path: CACHE_DIR.into(),
            ..VolumeMount::default()
        }]),
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
        volumes: Some(vec![Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }]),
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
    use crate::api::{Autoscale, WorkerPoolSpec};

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
            tls_ca_pem: None,
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
        assert_eq!(
            container.args.clone().unwrap(),
            [
                "worker",
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
                .all(|e| e.name != crate::platform::tls::TLS_CA_PEM_ENV),
            "no CA without TLS"
        );
        let tls = WorkerSettings {
            control_plane: "https://toolgrid.toolgrid.svc:7070".into(),
            tls_ca_pem: Some("-----BEGIN CERTIFICATE-----".into()),
            ..settings()
        };
        let with_tls = desired_deployment(&pool(spec.clone()), &tls, 1);
        assert!(env(&with_tls).iter().any(|e| {
            e.name == crate::platform::tls::TLS_CA_PEM_ENV
                && e.value.as_deref() == Some("-----BEGIN CERTIFICATE-----")
        }));

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
