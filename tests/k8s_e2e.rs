//! End to end on a real cluster: install the chart, apply the examples, call a tool, kill
//! a worker pod mid-call and check the call still finishes; and the controller's token and
//! operator reviews against the real API server. Runs when `KUBECONFIG` names a
//! cluster (and `kubectl` is on the PATH); otherwise it says why it skips.
//!
//! - `TOOLGRID_E2E_IMAGE`: the toolgrid image the cluster can pull (default
//!   `ghcr.io/toolgrid/toolgrid:0.1.0`); build it from the `Dockerfile`.
//! - `TOOLGRID_E2E_NAMESPACE`: where to install (default `toolgrid-e2e`, deleted after).

use crate::common;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::{ApiResource, Discovery};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toolgrid_proto as proto;

fn skip_reason() -> Option<String> {
    let Ok(path) = std::env::var("KUBECONFIG") else {
        return Some("KUBECONFIG is not set: no cluster to test against".into());
    };
    if !std::path::Path::new(path.split(':').next().unwrap_or_default()).exists() {
        return Some(format!("KUBECONFIG names {path}, which does not exist"));
    }
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        return Some("kubectl is not on the PATH (needed to port-forward)".into());
    }
    if Command::new("python3")
        .args(["-c", "import helm_sdkpy"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return Some(
            "helm_sdkpy is not installed (pip install --ignore-requires-python helm-sdkpy)".into(),
        );
    }
    None
}

fn run(program: &str, args: &[&str]) -> std::process::Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A tool that computes for a while (no host calls), to be killed mid-call.
const SPIN: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "{\"done\": true}")
  (func (export "_start") (local $i i64)
    (loop (local.set $i (i64.add (local.get $i) (i64.const 1)))
          (br_if 0 (i64.lt_u (local.get $i) (i64.const 3000000000))))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 14))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))"#;

fn spin_manifests(namespace: &str) -> String {
    use base64::Engine as _;
    let wasm = wat::parse_str(SPIN).unwrap();
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm))
    );
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: spin-wasm, namespace: {namespace}}}
binaryData: {{spin.wasm: {}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: spin, namespace: {namespace}}}
spec: {{effect: read, timeout: 300s, commands: [{{name: default, result: {{type: object}}}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: spin-1.0.0, namespace: {namespace}}}
spec:
  tool: spin
  version: 1.0.0
  artifact: {{configMap: {{name: spin-wasm, key: spin.wasm}}, digest: "{digest}"}}
  limits: {{cpuTime: 240s}}
"#,
        base64::engine::general_purpose::STANDARD.encode(&wasm)
    )
}

async fn apply_yaml(client: &kube::Client, discovery: &Discovery, namespace: &str, text: &str) {
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document).unwrap();
        if value.is_null() {
            continue;
        }
        let mut object: DynamicObject = serde_yaml::from_value(value).unwrap();
        let types = object.types.clone().unwrap();
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let (resource, _) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the cluster does not know {gvk:?}"));
        object.metadata.namespace = Some(namespace.into());
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let name = object.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("toolgrid-e2e").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", gvk.kind));
    }
}

async fn wait_ready(
    client: &kube::Client,
    namespace: &str,
    plural: &str,
    name: &str,
    limit: Duration,
) {
    let resource = ApiResource {
        group: "toolgrid.dev".into(),
        version: "v1alpha1".into(),
        api_version: "toolgrid.dev/v1alpha1".into(),
        kind: String::new(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let start = Instant::now();
    loop {
        if let Ok(object) = api.get(name).await {
            let ready = object.data["status"]["conditions"]
                .as_array()
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            if ready {
                return;
            }
        }
        assert!(
            start.elapsed() < limit,
            "{plural}/{name} did not become Ready"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A token (audience `toolgrid`) of a ServiceAccount that RBAC lets update tools in the
/// controller's namespace: an operator, who may call every tool.
async fn operator_token(client: &kube::Client, namespace: &str) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    let params = PatchParams::apply("toolgrid-e2e").force();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "e2e-operator"}})).unwrap();
    accounts
        .patch("e2e-operator", &params, &Patch::Apply(&account))
        .await
        .unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e2e-operator"},
        "rules": [{"apiGroups": ["toolgrid.dev"], "resources": ["tools"], "verbs": ["update"]}]
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), namespace)
        .patch("e2e-operator", &params, &Patch::Apply(&role))
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e2e-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "e2e-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "e2e-operator", "namespace": namespace}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch("e2e-operator", &params, &Patch::Apply(&binding))
        .await
        .unwrap();
    let request = serde_json::from_value(serde_json::json!({
        "spec": {"audiences": [toolgrid_control_plane::auth::CALLER_AUDIENCE], "expirationSeconds": 3600}
    }))
    .unwrap();
    accounts
        .create_token_request("e2e-operator", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_tools_and_survives_a_killed_worker_pod() {
    if let Some(reason) = skip_reason() {
        eprintln!("skipping the Kubernetes end-to-end test: {reason}");
        return;
    }
    common::install_tls();
    let namespace =
        std::env::var("TOOLGRID_E2E_NAMESPACE").unwrap_or_else(|_| "toolgrid-e2e".into());
    let image = std::env::var("TOOLGRID_E2E_IMAGE")
        .unwrap_or_else(|_| "ghcr.io/toolgrid/toolgrid:0.1.0".into());
    let (repository, tag) = image.rsplit_once(':').unwrap_or((&image, "0.1.0"));
    // Plaintext: this test dials the controller through a port-forward without the CA the
    // controller makes at start (the chart's default is TLS).
    let values = serde_json::json!({
        "image": {"repository": repository, "tag": tag},
        "tls": {"enabled": false}
    })
    .to_string();
    let chart = common::fixtures::repo().join("charts/toolgrid");
    let install = format!(
        "import asyncio, json, helm_sdkpy as h\n\
         c = h.Configuration(namespace={namespace:?})\n\
         asyncio.run(h.Install(c).run('toolgrid', {chart:?}, values=json.loads({values:?}), create_namespace=True, wait=True, timeout=600))",
        chart = chart.display().to_string()
    );
    run("python3", &["-c", &install]);

    let client = kube::Client::try_default().await.unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    // Every example, the artifacts (ConfigMaps) first.
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(common::fixtures::repo().join("examples/k8s"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
    files.sort_by_key(|p| !p.ends_with("artifacts.yaml"));
    for path in files {
        apply_yaml(
            &client,
            &discovery,
            &namespace,
            &std::fs::read_to_string(&path).unwrap(),
        )
        .await;
    }
    apply_yaml(&client, &discovery, &namespace, &spin_manifests(&namespace)).await;
    wait_ready(
        &client,
        &namespace,
        "tools",
        "spin",
        Duration::from_secs(300),
    )
    .await;

    let mut forward = Command::new("kubectl")
        .args([
            "-n",
            &namespace,
            "port-forward",
            "svc/toolgrid",
            "17070:7070",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let token = operator_token(&client, &namespace).await;
    let channel = tonic::transport::Channel::from_static("http://127.0.0.1:17070")
        .connect()
        .await
        .unwrap();
    let mut tools = toolgrid::cli::client::client_of(
        channel,
        toolgrid::cli::client::Credentials::new(Some(&token), None).unwrap(),
    );

    // An example tool answers.
    if let Ok(call) = tools
        .invoke(proto::InvokeRequest {
            tool: "semver".into(),
            namespace: namespace.clone(),
            argv: vec!["compare".into(), "1.0.0".into(), "2.0.0".into()],
            ..Default::default()
        })
        .await
    {
        assert_eq!(call.into_inner().state, proto::CallState::Succeeded as i32);
    }

    // A long call; its worker pod is killed mid-call; the call finishes elsewhere.
    let mut stream = tools
        .invoke_stream(proto::InvokeRequest {
            tool: "spin".into(),
            namespace: namespace.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut call_id = String::new();
    let worker = loop {
        let event = stream.message().await.unwrap().expect("news of the call");
        match event.event {
            Some(proto::invoke_event::Event::Progress(p)) if p.stage == "accepted" => {
                call_id = p.call_id
            }
            Some(proto::invoke_event::Event::Progress(p)) if p.stage == "running" => {
                break p.worker;
            }
            _ => {}
        }
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    pods.delete(
        &worker,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let call = tools
        .get_call(proto::GetCallRequest {
            id: call_id.clone(),
            wait: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        call.state,
        proto::CallState::Succeeded as i32,
        "{:?}",
        call.error
    );
    assert_ne!(call.worker, worker, "another worker pod finished it");

    let _ = forward.kill();
    let _ = forward.wait();
    let uninstall = format!(
        "import asyncio, helm_sdkpy as h\nc = h.Configuration(namespace={namespace:?})\nasyncio.run(h.Uninstall(c).run('toolgrid'))"
    );
    let _ = Command::new("python3").args(["-c", &uninstall]).output();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let _ = namespaces
        .delete(&namespace, &DeleteParams::default())
        .await;
}

/// The controller's [`KubeReviewer`](toolgrid_controller::review::KubeReviewer) against a
/// real API server: a ServiceAccount token requested for audience `toolgrid` names its
/// account for `toolgrid` and no one for `toolgrid-worker`; a made-up token is no one; the
/// account is no operator until a Role lets it update tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_api_server_reviews_service_account_tokens_and_operators() {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    use toolgrid_control_plane::auth::{CALLER_AUDIENCE, TokenReviewer, WORKER_AUDIENCE};
    use toolgrid_controller::review::KubeReviewer;
    if let Some(reason) = skip_reason() {
        eprintln!("skipping the Kubernetes review test: {reason}");
        return;
    }
    common::install_tls();
    let namespace = format!(
        "{}-review",
        std::env::var("TOOLGRID_E2E_NAMESPACE").unwrap_or_else(|_| "toolgrid-e2e".into())
    );
    let client = kube::Client::try_default().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let _ = accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "reporter"}})).unwrap(),
        )
        .await;
    let request = serde_json::from_value(serde_json::json!({
        "spec": {"audiences": [CALLER_AUDIENCE], "expirationSeconds": 600}
    }))
    .unwrap();
    let issued = accounts
        .create_token_request("reporter", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token.expect("a token");

    // Short-lived answers, so that the RoleBinding below is seen at once.
    let reviewer = KubeReviewer::with_cache(client.clone(), Duration::from_millis(1), 16);
    let user = reviewer
        .review(&token, CALLER_AUDIENCE)
        .await
        .unwrap()
        .expect("the token is accepted for its audience");
    assert_eq!(
        user.username,
        format!("system:serviceaccount:{namespace}:reporter")
    );
    assert_eq!(
        reviewer.review(&token, WORKER_AUDIENCE).await.unwrap(),
        None,
        "not for another audience"
    );
    assert_eq!(
        reviewer
            .review("not-a-token", CALLER_AUDIENCE)
            .await
            .unwrap(),
        None
    );
    assert!(!reviewer.is_operator(&user, &namespace).await.unwrap());

    let roles: Api<Role> = Api::namespaced(client.clone(), &namespace);
    let _ = roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "toolgrid-operator"},
                "rules": [{"apiGroups": ["toolgrid.dev"], "resources": ["tools"], "verbs": ["update"]}]
            }))
            .unwrap(),
        )
        .await;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &namespace);
    let _ = bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "reporter-operates"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "toolgrid-operator"},
                "subjects": [{"kind": "ServiceAccount", "name": "reporter", "namespace": namespace}]
            }))
            .unwrap(),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reviewer.is_operator(&user, &namespace).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "RBAC never allowed the bound account"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = namespaces
        .delete(&namespace, &DeleteParams::default())
        .await;
}
