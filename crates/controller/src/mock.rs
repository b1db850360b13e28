//! Tests of the controller's requests against kube's mock service: each expected request is
//! asserted (method, path, body) and answered, as kube-rs's controller-rs does.

use super::deployment::WorkerSettings;
use super::leader::{LeaderElector, LeaseSettings};
use super::reconcile::{self, Context, RELEASE_FINALIZER};
use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use toolgrid_api::{Tool, ToolRelease, ToolSource, WorkerPool};
use toolgrid_catalog::artifacts::ArtifactOutcome;
use toolgrid_catalog::manifest::{ResourceSet, load_text};
use toolgrid_catalog::resolve::{ResolveInput, resolve};
use toolgrid_catalog::{Catalog, Identities};
use toolgrid_control_plane::scheduler::{CallWatch, Scheduler, SchedulerConfig};
use toolgrid_core::ids::ObjectKey;

pub(super) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

pub(super) fn mock_client() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// Waits for the next request, asserts its method and path (query included, by fragments),
/// answers `status` with `answer(body)`, and returns the request's JSON body.
pub(super) async fn expect(
    handle: &mut Handle,
    method: Method,
    path: &str,
    query: &[&str],
    status: StatusCode,
    answer: impl FnOnce(&Value) -> Value,
) -> Value {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no {method} {path} request came"))
        .expect("the mock service was dropped");
    assert_eq!(request.method(), method, "{}", request.uri());
    assert_eq!(request.uri().path(), path);
    let full = request.uri().query().unwrap_or_default().to_string();
    for fragment in query {
        assert!(
            full.contains(fragment),
            "{method} {path}: query {full:?} lacks {fragment}"
        );
    }
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .expect("request body");
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("a JSON body")
    };
    let reply = answer(&body);
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    body
}

/// Asserts nothing more is asked of the API for a while.
/// Expects the status patch of WorkerPool `default/default` and answers with `pool` as it
/// stands under the patched status.
async fn expect_pool_status(handle: &mut Handle, pool: &WorkerPool, query: &[&str]) -> Value {
    expect(
        handle,
        Method::PATCH,
        "/apis/toolgrid.dev/v1alpha1/namespaces/default/workerpools/default/status",
        query,
        StatusCode::OK,
        |body| {
            let mut object = serde_json::to_value(pool).unwrap();
            object["status"] = body["status"].clone();
            object
        },
    )
    .await
}

pub(super) async fn expect_nothing(handle: &mut Handle) {
    if let Ok(Some((request, _))) =
        tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
    {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

const MANIFESTS: &str = r#"
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default, namespace: default, uid: pool-uid, generation: 1}
spec: {replicas: 2, slotsPerWorker: 8}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: echo, namespace: default, generation: 1}
spec: {effect: read, commands: [{name: default}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {name: echo-1.0.0, namespace: default, generation: 1}
spec: {tool: echo, version: 1.0.0, artifact: {configMap: {name: echo-wasm, key: echo.wasm}}}
"#;

struct Fixture {
    ctx: Arc<Context>,
    set: ResourceSet,
    handle: Handle,
    /// Feeds the context's cache of existing ServiceAccounts.
    accounts: kube::runtime::reflector::store::Writer<
        kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ServiceAccount>,
    >,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    fixture_with(MANIFESTS, HashMap::new()).await
}

async fn fixture_with(
    manifests: &str,
    source_reads: HashMap<ObjectKey, toolgrid_catalog::resolve::SourceRead>,
) -> Fixture {
    let mut set = ResourceSet::default();
    load_text(std::path::Path::new("cluster"), manifests, &mut set);
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    let artifacts: HashMap<ObjectKey, ArtifactOutcome> = [(
        ObjectKey::new("default", "echo-1.0.0"),
        ArtifactOutcome::Ready {
            digest: "sha256:aa".into(),
            size: 8,
            kind: "module",
            files: Vec::new(),
            commands: Vec::new(),
        },
    )]
    .into();
    let snapshot = resolve(&ResolveInput {
        set: &set,
        artifacts: &artifacts,
        wasm: &HashMap::new(),
        previous: &HashMap::new(),
        now: "2026-01-01T00:00:00Z".parse().unwrap(),
        identities: Some(&Identities::default()),
        source_reads: &source_reads,
        rollouts: &Default::default(),
        reuse: None,
    });
    let catalog = Catalog::new();
    catalog.publish(snapshot);
    let dir = tempfile::tempdir().unwrap();
    let store = toolgrid_store::open(&format!("sqlite://{}", dir.path().join("s.db").display()))
        .await
        .unwrap();
    let scheduler = Scheduler::new(
        store,
        Arc::new(CallWatch::default()),
        SchedulerConfig::default(),
    );
    let (client, handle) = mock_client();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "toolgrid-controller".into(),
            instance: Some("test".into()),
        },
    );
    let (service_accounts, accounts) = kube::runtime::reflector::store();
    let ctx = Arc::new(Context {
        client,
        catalog,
        scheduler,
        recorder,
        workers: WorkerSettings {
            image: "ghcr.io/toolgrid/toolgrid:0.1.0".into(),
            control_plane: "http://toolgrid.toolgrid.svc:7070".into(),
            tls_ca: Default::default(),
            otlp_endpoint: None,
        },
        namespace: None,
        service_accounts,
    });
    Fixture {
        ctx,
        set,
        handle,
        accounts,
        _dir: dir,
    }
}

fn echo_event(body: &Value) -> Value {
    body.clone()
}

#[tokio::test]
async fn a_tool_source_keeps_its_snapshot_in_status_and_a_refresh_only_annotates() {
    let manifests = format!(
        "{MANIFESTS}---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolSource\nmetadata: {{name: shop, namespace: default, generation: 2}}\nspec: {{mcp: {{url: 'https://mcp.example.com/mcp'}}}}\n"
    );
    let snapshot: toolgrid_core::source::SourceSnapshot = serde_json::from_value(json!({
        "tools": [{"name": "add", "effect": "read",
                   "command": {"name": "default"}, "target": {"kind": "mcp", "tool": "add"}}],
        "era": "modern"
    }))
    .unwrap();
    let reads = HashMap::from([(
        ObjectKey::new("default", "shop"),
        toolgrid_catalog::resolve::SourceRead {
            refreshed: Some("r1".into()),
            read_at: "2026-01-01T00:00:00Z".into(),
            outcome: Ok(snapshot),
            refresh_failure: None,
        },
    )]);
    let Fixture {
        ctx,
        set,
        mut handle,
        _dir,
        ..
    } = fixture_with(&manifests, reads).await;
    let source: ToolSource = set.tool_sources[0].object.clone();
    let task = tokio::spawn(reconcile::reconcile_resolved(
        Arc::new(source.clone()),
        ctx.clone(),
    ));
    let patch = expect(
        &mut handle,
        Method::PATCH,
        "/apis/toolgrid.dev/v1alpha1/namespaces/default/toolsources/shop/status",
        &["fieldManager=toolgrid-controller", "force=true"],
        StatusCode::OK,
        |body| {
            let mut object = serde_json::to_value(&source).unwrap();
            object["status"] = body["status"].clone();
            object
        },
    )
    .await;
    assert_eq!(patch["kind"], "ToolSource");
    assert!(patch.get("spec").is_none());
    let status = &patch["status"];
    assert_eq!(status["observedGeneration"], 2);
    assert_eq!(status["readGeneration"], 2);
    assert_eq!(status["refreshed"], "r1");
    assert_eq!(status["toolCount"], 1);
    assert_eq!(status["kind"], "mcp");
    assert_eq!(status["snapshot"]["tools"][0]["name"], "add");
    assert_eq!(status["conditions"][0]["reason"], "SourceRead");
    let event = expect(
        &mut handle,
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        &[],
        StatusCode::CREATED,
        echo_event,
    )
    .await;
    assert_eq!(event["reason"], "SourceRead");
    task.await.unwrap().expect("reconciled");
    // What the status holds answers the same generation and refresh: it is served as is
    // (the controller reads the upstream again only for a new generation or refresh).
    let written: toolgrid_api::ToolSourceStatus = serde_json::from_value(status.clone()).unwrap();
    assert!(
        toolgrid_catalog::resolve::tool_source::status_is_current(&written, 2, Some("r1"))
            .is_some()
    );

    // `toolgrid refresh` in a cluster: a merge patch of the annotation, nothing else.
    let refresher = crate::refresh::AnnotationRefresher {
        client: ctx.client.clone(),
    };
    let asked = tokio::spawn(async move {
        toolgrid_control_plane::gateway::SourceRefresher::request(
            &refresher,
            &ObjectKey::new("default", "shop"),
        )
        .await
    });
    let body = expect(
        &mut handle,
        Method::PATCH,
        "/apis/toolgrid.dev/v1alpha1/namespaces/default/toolsources/shop",
        &[],
        StatusCode::OK,
        |body| {
            let mut object = serde_json::to_value(&source).unwrap();
            object["metadata"]["annotations"] = body["metadata"]["annotations"].clone();
            object
        },
    )
    .await;
    let nonce = asked.await.unwrap().expect("annotated");
    assert_eq!(
        body,
        json!({"metadata": {"annotations": {"toolgrid.dev/refresh": nonce}}})
    );
}

#[tokio::test]
async fn statuses_are_applied_through_the_status_subresource_once() {
    let Fixture {
        ctx,
        set,
        mut handle,
        _dir,
        ..
    } = fixture().await;
    let tool: Tool = set.tools[0].object.clone();
    let task = tokio::spawn(reconcile::reconcile_resolved(
        Arc::new(tool.clone()),
        ctx.clone(),
    ));
    let patch = expect(
        &mut handle,
        Method::PATCH,
        "/apis/toolgrid.dev/v1alpha1/namespaces/default/tools/echo/status",
        &["fieldManager=toolgrid-controller", "force=true"],
        StatusCode::OK,
        |body| {
            let mut object = serde_json::to_value(&tool).unwrap();
            object["status"] = body["status"].clone();
            object
        },
    )
    .await;
    assert_eq!(patch["apiVersion"], "toolgrid.dev/v1alpha1");
    assert_eq!(patch["kind"], "Tool");
    assert!(
        patch.get("spec").is_none(),
        "the controller never writes a spec"
    );
    assert_eq!(patch["status"]["observedGeneration"], 1);
    assert_eq!(patch["status"]["release"], "echo-1.0.0");
    let ready = &patch["status"]["conditions"][0];
    assert_eq!(
        (ready["type"].as_str(), ready["status"].as_str()),
        (Some("Ready"), Some("True"))
    );
    assert_eq!(ready["observedGeneration"], 1);
    // Ready went from nothing to True: an event tells of it.
    let event = expect(
        &mut handle,
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        &[],
        StatusCode::CREATED,
        echo_event,
    )
    .await;
    assert_eq!(event["reason"], "Released");
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["regarding"]["name"], "echo");
    task.await.unwrap().expect("reconciled");

    // With the status in place, a reconcile writes nothing.
    let mut current = tool;
    current.status = serde_json::from_value(patch["status"].clone()).unwrap();
    let again = tokio::spawn(reconcile::reconcile_resolved(Arc::new(current), ctx));
    expect_nothing(&mut handle).await;
    again.await.unwrap().expect("reconciled");
}

#[tokio::test]
async fn a_pool_gets_its_deployment_by_server_side_apply_and_a_live_status() {
    let Fixture {
        ctx,
        set,
        mut handle,
        mut accounts,
        _dir,
    } = fixture().await;
    let pool: WorkerPool = set.pools[0].object.clone();
    let task = tokio::spawn(reconcile::reconcile_pool(
        Arc::new(pool.clone()),
        ctx.clone(),
    ));
    // First the workers' ServiceAccount, which their pods need to exist.
    let account = expect(
        &mut handle,
        Method::PATCH,
        "/api/v1/namespaces/default/serviceaccounts/default-worker",
        &["fieldManager=toolgrid-controller", "force=true"],
        StatusCode::OK,
        |body| body.clone(),
    )
    .await;
    assert_eq!(account["kind"], "ServiceAccount");
    assert_eq!(account["automountServiceAccountToken"], false);
    let owner = &account["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("WorkerPool"), Some("pool-uid"))
    );
    let deployment = expect(
        &mut handle,
        Method::PATCH,
        "/apis/apps/v1/namespaces/default/deployments/toolgrid-worker-default",
        &["fieldManager=toolgrid-controller", "force=true"],
        StatusCode::OK,
        |body| body.clone(),
    )
    .await;
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let owner = &deployment["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["name"].as_str(),
            owner["uid"].as_str()
        ),
        (Some("WorkerPool"), Some("default"), Some("pool-uid"))
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["command"], json!(["toolgrid-worker"]));
    assert_eq!(container["args"][2], "--pool");
    assert_eq!(container["args"][3], "default/default");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "default-worker");
    let token = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["projected"]["sources"][0].get("serviceAccountToken"))
        .expect("a projected token");
    assert_eq!(token["audience"], "toolgrid-worker");
    let status =
        expect_pool_status(&mut handle, &pool, &["fieldManager=toolgrid-controller"]).await;
    assert_eq!(status["status"]["desiredWorkers"], 2);
    assert_eq!(status["status"]["attachedWorkers"], 0);
    assert_eq!(status["status"]["conditions"][0]["reason"], "NoWorkers");
    let event = expect(
        &mut handle,
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        &[],
        StatusCode::CREATED,
        echo_event,
    )
    .await;
    assert_eq!(event["type"], "Warning");
    task.await.unwrap().expect("reconciled");

    // More replicas: the same apply updates the Deployment; the ServiceAccount, now seen
    // by the watch, is left alone.
    let seen: kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::ServiceAccount> =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": account["metadata"].clone()}))
        .unwrap();
    accounts.apply_watcher_event(&kube::runtime::watcher::Event::Apply(seen));
    let mut bigger = pool.clone();
    bigger.spec.replicas = Some(3);
    bigger.status = serde_json::from_value(status["status"].clone()).unwrap();
    let task = tokio::spawn(reconcile::reconcile_pool(Arc::new(bigger), ctx.clone()));
    let deployment = expect(
        &mut handle,
        Method::PATCH,
        "/apis/apps/v1/namespaces/default/deployments/toolgrid-worker-default",
        &["fieldManager=toolgrid-controller"],
        StatusCode::OK,
        |body| {
            let mut applied = body.clone();
            applied["status"] = json!({"readyReplicas": 3, "replicas": 3});
            applied
        },
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 3);
    let status = expect_pool_status(&mut handle, &pool, &[]).await;
    assert_eq!(
        status["status"]["readyWorkers"], 3,
        "the Deployment's ready pods"
    );
    expect_nothing(&mut handle).await;
    task.await.unwrap().expect("reconciled");

    // Scale-in to 1: before the Deployment shrinks, each pod is given its deletion cost
    // (its worker's calls; -1 for one not attached), so the least busy go first.
    let mut smaller = pool.clone();
    smaller.spec.replicas = Some(1);
    smaller.status = serde_json::from_value(status["status"].clone()).unwrap();
    let task = tokio::spawn(reconcile::reconcile_pool(Arc::new(smaller), ctx));
    expect(
        &mut handle,
        Method::GET,
        "/api/v1/namespaces/default/pods",
        &["labelSelector=toolgrid.dev%2Fpool%3Ddefault"],
        StatusCode::OK,
        |_| {
            let pod = |name: &str, cost: Option<&str>| {
                let mut pod = json!({"metadata": {"name": name, "namespace": "default"}});
                if let Some(cost) = cost {
                    pod["metadata"]["annotations"] =
                        json!({"controller.kubernetes.io/pod-deletion-cost": cost});
                }
                pod
            };
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                "items": [pod("w-a", None), pod("w-b", Some("-1")), pod("w-c", Some("3"))]})
        },
    )
    .await;
    for name in ["w-a", "w-c"] {
        let patch = expect(
            &mut handle,
            Method::PATCH,
            &format!("/api/v1/namespaces/default/pods/{name}"),
            &[],
            StatusCode::OK,
            |body| body.clone(),
        )
        .await;
        assert_eq!(
            patch["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"], "-1",
            "{name}: not attached"
        );
    }
    let deployment = expect(
        &mut handle,
        Method::PATCH,
        "/apis/apps/v1/namespaces/default/deployments/toolgrid-worker-default",
        &["fieldManager=toolgrid-controller"],
        StatusCode::OK,
        |body| body.clone(),
    )
    .await;
    assert_eq!(deployment["spec"]["replicas"], 1);
    expect_pool_status(&mut handle, &pool, &[]).await;
    task.await.unwrap().expect("reconciled");
}

#[tokio::test]
async fn a_release_keeps_its_finalizer_while_calls_are_in_flight() {
    let Fixture {
        ctx,
        set,
        mut handle,
        _dir,
        ..
    } = fixture().await;
    let release: ToolRelease = set.releases[0].object.clone();
    let path = "/apis/toolgrid.dev/v1alpha1/namespaces/default/toolreleases/echo-1.0.0";

    // A new release gets the finalizer.
    let task = tokio::spawn(reconcile::reconcile_release(
        Arc::new(release.clone()),
        ctx.clone(),
    ));
    let patch = expect(
        &mut handle,
        Method::PATCH,
        path,
        &[],
        StatusCode::OK,
        |_| {
            let mut object = serde_json::to_value(&release).unwrap();
            object["metadata"]["finalizers"] = json!([RELEASE_FINALIZER]);
            object
        },
    )
    .await;
    let added = patch
        .as_array()
        .expect("a JSON patch")
        .iter()
        .find(|op| op["op"] == "add")
        .expect("an add");
    assert_eq!(added["path"], "/metadata/finalizers");
    assert_eq!(added["value"], json!([RELEASE_FINALIZER]));
    task.await.unwrap().expect("reconciled");

    // Deleted while a call of it is queued: the finalizer stays.
    let mut deleted = release.clone();
    deleted.metadata.finalizers = Some(vec![RELEASE_FINALIZER.into()]);
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    let interface = toolgrid_core::interface::CommandInterface::compile(
        &serde_yaml::from_str("{name: default}").unwrap(),
        "command",
    )
    .unwrap();
    let record = toolgrid_store::CallRecord {
        id: "c1".into(),
        namespace: "default".into(),
        tool: "echo".into(),
        command: "default".into(),
        release: "echo-1.0.0".into(),
        release_digest: "sha256:aa".into(),
        state: toolgrid_store::CallState::Pending,
        args: json!({}),
        spec: toolgrid_store::CallSpec::default(),
        stdin: Vec::new(),
        idempotency_key: None,
        request_hash: String::new(),
        epoch: 0,
        worker: None,
        result: None,
        error: None,
        created_at_ms: 0,
        finished_at_ms: None,
    };
    ctx.scheduler.submit(record, Arc::new(interface));
    let task = tokio::spawn(reconcile::reconcile_release(
        Arc::new(deleted.clone()),
        ctx.clone(),
    ));
    expect_nothing(&mut handle).await;
    let error = task.await.unwrap().expect_err("calls are in flight");
    assert!(error.to_string().contains("finalizer"), "{error}");

    // Once they have ended, it goes.
    let fresh = fixture().await;
    let (ctx, mut handle) = (fresh.ctx, fresh.handle);
    let task = tokio::spawn(reconcile::reconcile_release(Arc::new(deleted.clone()), ctx));
    let patch = expect(
        &mut handle,
        Method::PATCH,
        path,
        &[],
        StatusCode::OK,
        |_| {
            let mut object = serde_json::to_value(&deleted).unwrap();
            object["metadata"]["finalizers"] = json!([]);
            object
        },
    )
    .await;
    assert!(
        patch
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["op"] == "remove"),
        "{patch}"
    );
    task.await.unwrap().expect("cleaned up");
}

fn lease_settings() -> LeaseSettings {
    LeaseSettings {
        name: "toolgrid-controller".into(),
        namespace: "toolgrid".into(),
        identity: "pod-a".into(),
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        renew_every: Duration::from_secs(5),
    }
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404})
}

/// Expects a GET of `path` (answered 404) and then a POST to `collection` (answered 201 with
/// what was sent); returns the object sent.
async fn expect_made_when_missing(handle: &mut Handle, path: &str, collection: &str) -> Value {
    expect(
        handle,
        Method::GET,
        path,
        &[],
        StatusCode::NOT_FOUND,
        |_| not_found(),
    )
    .await;
    expect(
        handle,
        Method::POST,
        collection,
        &[],
        StatusCode::CREATED,
        |b| b.clone(),
    )
    .await
}

fn conflict() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Conflict", "code": 409, "message": "conflict"})
}

fn lease_held_by(holder: &str, renewed: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "toolgrid-controller", "namespace": "toolgrid", "resourceVersion": "41"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed, "leaseTransitions": 1}
    })
}

#[tokio::test]
async fn leader_election_creates_renews_follows_and_takes_over() {
    let path = "/apis/coordination.k8s.io/v1/namespaces/toolgrid/leases/toolgrid-controller";
    let (client, mut handle) = mock_client();
    let elector = Arc::new(LeaderElector::new(
        kube::Api::namespaced(client, "toolgrid"),
        lease_settings(),
    ));

    // Nobody holds it: create it.
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.try_lead().await }
    });
    let created = expect_made_when_missing(
        &mut handle,
        path,
        "/apis/coordination.k8s.io/v1/namespaces/toolgrid/leases",
    )
    .await;
    assert_eq!(created["spec"]["holderIdentity"], "pod-a");
    assert!(task.await.unwrap().unwrap(), "it leads");

    // Another replica renewed it just now: follow, write nothing.
    let fresh = k8s_openapi::jiff::Timestamp::now().to_string();
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.try_lead().await }
    });
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        lease_held_by("pod-b", &fresh)
    })
    .await;
    expect_nothing(&mut handle).await;
    assert!(!task.await.unwrap().unwrap(), "it follows");

    // The other replica stopped renewing: take it over, with optimistic concurrency.
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.try_lead().await }
    });
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        lease_held_by("pod-b", "2020-01-01T00:00:00.000000Z")
    })
    .await;
    let replaced = expect(&mut handle, Method::PUT, path, &[], StatusCode::OK, |b| {
        b.clone()
    })
    .await;
    assert_eq!(replaced["metadata"]["resourceVersion"], "41");
    assert_eq!(replaced["spec"]["holderIdentity"], "pod-a");
    assert_eq!(replaced["spec"]["leaseTransitions"], 2);
    assert!(task.await.unwrap().unwrap(), "it took over");

    // Losing the race for it (409) means following.
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.try_lead().await }
    });
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        lease_held_by("pod-b", "2020-01-01T00:00:00.000000Z")
    })
    .await;
    expect(
        &mut handle,
        Method::PUT,
        path,
        &[],
        StatusCode::CONFLICT,
        |_| conflict(),
    )
    .await;
    assert!(!task.await.unwrap().unwrap(), "another replica won");

    // On shutdown the leader gives the lease up.
    let task = tokio::spawn({
        let elector = elector.clone();
        async move { elector.release().await }
    });
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        lease_held_by("pod-a", &now)
    })
    .await;
    let released = expect(&mut handle, Method::PUT, path, &[], StatusCode::OK, |b| {
        b.clone()
    })
    .await;
    assert!(
        released["spec"]
            .get("holderIdentity")
            .is_none_or(|h| h.is_null()),
        "{released}"
    );
    task.await.unwrap().expect("released");
}

/// Lease timing short enough for a test in real time: the lease lasts 3 s, the leader steps
/// down 1.5 s after its last renewal started, and tries every 0.3 s.
fn quick_lease_settings() -> LeaseSettings {
    LeaseSettings {
        duration: Duration::from_secs(3),
        renew_deadline: Duration::from_millis(1500),
        renew_every: Duration::from_millis(300),
        ..lease_settings()
    }
}

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/toolgrid/leases/toolgrid-controller";

/// Starts campaigning against a mock API and lets it create the lease; returns the mock,
/// the watch, and when the lease expires for the other replicas (its renewTime plus its
/// duration, as a standby computes it).
async fn elected(
    settings: LeaseSettings,
) -> (
    Handle,
    tokio::sync::watch::Receiver<bool>,
    k8s_openapi::jiff::Timestamp,
) {
    let (client, mut handle) = mock_client();
    let elector = Arc::new(LeaderElector::new(
        kube::Api::namespaced(client, "toolgrid"),
        settings,
    ));
    let mut leading = elector.run();
    expect(
        &mut handle,
        Method::GET,
        LEASE_PATH,
        &[],
        StatusCode::NOT_FOUND,
        |_| not_found(),
    )
    .await;
    let created = expect(
        &mut handle,
        Method::POST,
        "/apis/coordination.k8s.io/v1/namespaces/toolgrid/leases",
        &[],
        StatusCode::CREATED,
        |b| b.clone(),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| *l))
        .await
        .expect("it leads")
        .unwrap();
    let renewed: k8s_openapi::jiff::Timestamp = created["spec"]["renewTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let seconds = created["spec"]["leaseDurationSeconds"].as_i64().unwrap();
    (
        handle,
        leading,
        renewed + k8s_openapi::jiff::SignedDuration::from_secs(seconds),
    )
}

/// Waits until the leader steps down; panics if it still leads when its lease expires.
async fn steps_down_before(
    leading: &mut tokio::sync::watch::Receiver<bool>,
    expiry: k8s_openapi::jiff::Timestamp,
) -> k8s_openapi::jiff::Timestamp {
    let left = expiry.duration_since(k8s_openapi::jiff::Timestamp::now());
    let left = Duration::try_from(left).unwrap_or_default();
    tokio::time::timeout(left, leading.wait_for(|l| !*l))
        .await
        .expect("the leader still leads when its lease expires: two leaders could act at once")
        .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    assert!(
        now < expiry,
        "stepped down at {now}, the lease expired at {expiry}"
    );
    now
}

#[tokio::test]
async fn a_leader_whose_lease_renewal_hangs_steps_down_before_the_lease_expires() {
    let settings = quick_lease_settings();
    let (mut handle, mut leading, expiry) = elected(settings.clone()).await;
    // The renewal's GET reaches the API server and is never answered.
    let (request, _never_answered) =
        tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("it renews")
            .expect("the mock service");
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), LEASE_PATH);
    assert!(
        *leading.borrow(),
        "still leading while the renewal is pending"
    );
    let stepped_down = steps_down_before(&mut leading, expiry).await;
    // Not sooner than it must: at its renew deadline, a margin before the expiry.
    let margin = expiry.duration_since(stepped_down);
    assert!(
        margin
            <= k8s_openapi::jiff::SignedDuration::try_from(
                settings.duration - settings.renew_deadline
            )
            .unwrap()
                + k8s_openapi::jiff::SignedDuration::from_millis(100),
        "stepped down {margin:?} before the expiry"
    );
}

#[tokio::test]
async fn a_leader_whose_lease_renewals_keep_failing_steps_down_before_the_lease_expires() {
    let (mut handle, mut leading, expiry) = elected(quick_lease_settings()).await;
    // Every renewal fails at once (the API server is unavailable); the leader keeps trying.
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failing = tokio::spawn({
        let tries = tries.clone();
        async move {
            while let Some((request, respond)) = handle.next_request().await {
                assert_eq!(request.uri().path(), LEASE_PATH);
                tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "ServiceUnavailable", "code": 503, "message": "unavailable"});
                respond.send_response(
                    Response::builder()
                        .status(StatusCode::SERVICE_UNAVAILABLE)
                        .body(Body::from(serde_json::to_vec(&status).unwrap()))
                        .unwrap(),
                );
            }
        }
    });
    steps_down_before(&mut leading, expiry).await;
    assert!(
        tries.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "it tried to renew more than once"
    );
    failing.abort();
}

/// `--tls-self-signed` keeps its CA in a Secret: made when absent, read back unchanged by
/// the next controller, rotated with optimistic concurrency, a lost race answered by what
/// the winner wrote, and a Secret it did not make left alone.
#[tokio::test]
async fn the_self_signed_ca_lives_in_a_secret_every_controller_shares() {
    use super::tls_secret::{self, TlsSecretError};
    use k8s_openapi::api::core::v1::Secret;
    const DAY: i64 = 24 * 3600;
    let now: i64 = 1_800_000_000;
    let (client, mut handle) = mock_client();
    let api: kube::Api<Secret> = kube::Api::namespaced(client, "toolgrid");
    let path = "/api/v1/namespaces/toolgrid/secrets/toolgrid-self-signed-tls";
    let names = vec!["toolgrid.toolgrid.svc".to_string(), "toolgrid".to_string()];
    let ensure = |api: &kube::Api<Secret>, at: i64| {
        let (api, names) = (api.clone(), names.clone());
        tokio::spawn(async move {
            tls_secret::ensure(&api, "toolgrid-self-signed-tls", &names, at).await
        })
    };
    let stored = |secret: &Value, version: &str| {
        let mut secret = secret.clone();
        secret["metadata"]["resourceVersion"] = json!(version);
        secret
    };

    // None yet: made, labelled, of type kubernetes.io/tls, with the trust for workers.
    let task = ensure(&api, now);
    let created =
        expect_made_when_missing(&mut handle, path, "/api/v1/namespaces/toolgrid/secrets").await;
    let first = task.await.unwrap().unwrap();
    assert_eq!(created["type"], "kubernetes.io/tls");
    assert_eq!(
        created["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "toolgrid-controller"
    );
    for key in [
        "tls.crt",
        "tls.key",
        "ca.crt",
        "ca-signing.crt",
        "ca-signing.key",
        "bundle.json",
    ] {
        assert!(created["data"][key].is_string(), "{key} missing: {created}");
    }
    let read: Secret = serde_json::from_value(stored(&created, "1")).unwrap();
    assert_eq!(tls_secret::from_secret(&read).as_ref(), Some(&first));

    // The next controller (a restart, another replica) reads the same bundle, writes nothing.
    let task = ensure(&api, now + DAY);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    expect_nothing(&mut handle).await;
    assert_eq!(task.await.unwrap().unwrap(), first);

    // Two months on the certificate is renewed by the same CA, at the version read.
    let later = now + 61 * DAY;
    let task = ensure(&api, later);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    let replaced = expect(&mut handle, Method::PUT, path, &[], StatusCode::OK, |b| {
        b.clone()
    })
    .await;
    let renewed = task.await.unwrap().unwrap();
    assert_eq!(replaced["metadata"]["resourceVersion"], "1");
    assert_eq!(renewed.ca, first.ca);
    assert_ne!(renewed.cert_pem, first.cert_pem);
    assert_eq!(
        renewed.trust_pem(),
        first.trust_pem(),
        "workers need nothing new"
    );

    // Losing that race (409): what the winner wrote is read and served.
    let task = ensure(&api, later);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    expect(
        &mut handle,
        Method::PUT,
        path,
        &[],
        StatusCode::CONFLICT,
        |_| conflict(),
    )
    .await;
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&replaced, "2")
    })
    .await;
    expect_nothing(&mut handle).await;
    assert_eq!(task.await.unwrap().unwrap(), renewed);

    // A Secret of that name someone else made is not overwritten.
    let task = ensure(&api, now);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "toolgrid-self-signed-tls", "resourceVersion": "9"}, "data": {"tls.crt": "eA=="}})
    })
    .await;
    expect_nothing(&mut handle).await;
    assert!(matches!(
        task.await.unwrap(),
        Err(TlsSecretError::NotOurs(_))
    ));
}

/// The identity signing keys live in a Secret too: made when absent (Opaque, labelled),
/// read back unchanged by the next controller, rotated at the resourceVersion read, a lost
/// race answered by what the winner wrote, and a Secret it did not make left alone.
#[tokio::test]
async fn the_identity_keys_live_in_a_secret_every_controller_shares() {
    use super::identity_secret::{self, IdentitySecretError};
    use k8s_openapi::api::core::v1::Secret;
    const DAY: i64 = 24 * 3600;
    let now: i64 = 1_800_000_000;
    let (client, mut handle) = mock_client();
    let api: kube::Api<Secret> = kube::Api::namespaced(client, "toolgrid");
    let path = "/api/v1/namespaces/toolgrid/secrets/toolgrid-identity-keys";
    let ensure = |api: &kube::Api<Secret>, at: i64| {
        let api = api.clone();
        tokio::spawn(
            async move { identity_secret::ensure(&api, "toolgrid-identity-keys", at).await },
        )
    };
    let stored = |secret: &Value, version: &str| {
        let mut secret = secret.clone();
        secret["metadata"]["resourceVersion"] = json!(version);
        secret
    };
    let kids = |keys: &toolgrid_control_plane::identity::SigningKeys| -> Vec<String> {
        keys.published()
            .iter()
            .map(|(k, _)| k.to_string())
            .collect()
    };

    // None yet: made, labelled, Opaque, one data key.
    let task = ensure(&api, now);
    let created =
        expect_made_when_missing(&mut handle, path, "/api/v1/namespaces/toolgrid/secrets").await;
    let first = task.await.unwrap().unwrap();
    assert_eq!(created["type"], "Opaque");
    assert_eq!(created["metadata"]["name"], "toolgrid-identity-keys");
    assert_eq!(
        created["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "toolgrid-controller"
    );
    let data = created["data"].as_object().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), [identity_secret::DATA_KEY]);
    let read: Secret = serde_json::from_value(stored(&created, "1")).unwrap();
    assert_eq!(identity_secret::from_secret(&read).as_ref(), Some(&first));

    // The next controller (a restart, another replica) reads the same keys, writes nothing.
    let task = ensure(&api, now + DAY);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    expect_nothing(&mut handle).await;
    let again = task.await.unwrap().unwrap();
    assert_eq!(again, first);
    assert_eq!(kids(&again), kids(&first));

    // 31 days on the signing key is replaced (the old one still published), at the version
    // read.
    let later = now + 31 * DAY;
    let task = ensure(&api, later);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    let replaced = expect(&mut handle, Method::PUT, path, &[], StatusCode::OK, |b| {
        b.clone()
    })
    .await;
    let rotated = task.await.unwrap().unwrap();
    assert_eq!(replaced["metadata"]["resourceVersion"], "1");
    assert_eq!(replaced["type"], "Opaque");
    assert_ne!(rotated.current.kid, first.current.kid);
    assert_eq!(rotated.previous[0].kid, first.current.kid);
    let read: Secret = serde_json::from_value(stored(&replaced, "2")).unwrap();
    assert_eq!(identity_secret::from_secret(&read).as_ref(), Some(&rotated));

    // Losing that race (409): what the winner wrote is read and signed with.
    let task = ensure(&api, later);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&created, "1")
    })
    .await;
    expect(
        &mut handle,
        Method::PUT,
        path,
        &[],
        StatusCode::CONFLICT,
        |_| conflict(),
    )
    .await;
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        stored(&replaced, "2")
    })
    .await;
    expect_nothing(&mut handle).await;
    let won = task.await.unwrap().unwrap();
    assert_eq!(won, rotated);
    assert_eq!(kids(&won), kids(&rotated));

    // A Secret of that name someone else made is not overwritten.
    let task = ensure(&api, now);
    expect(&mut handle, Method::GET, path, &[], StatusCode::OK, |_| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "toolgrid-identity-keys", "resourceVersion": "9"}, "data": {"keys.json": "e30="}})
    })
    .await;
    expect_nothing(&mut handle).await;
    let error = task.await.unwrap().unwrap_err();
    assert!(
        matches!(&error, IdentitySecretError::NotOurs(name) if name == "toolgrid-identity-keys"),
        "{error}"
    );
    assert!(error.to_string().contains("--identity-secret"), "{error}");
}
