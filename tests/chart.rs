//! The Helm chart, rendered by real Helm (`tests/helm/check_chart.py`: Helm's library from
//! the PyPI package helm-sdkpy, installing into a fake API server), and the plain manifests
//! in `deploy/`: every object parses as the Kubernetes type it claims to be, and the
//! controller's arguments are ones `toolgrid controller` accepts. Without python3, PyYAML or
//! helm-sdkpy the Helm test skips with the reason, except under `CI=true`, where it fails
//! (`common::require`).

use crate::common;

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Parses an object as the type its kind names; returns the kind.
fn parse_typed(object: &Value) -> String {
    let kind = object["kind"]
        .as_str()
        .expect("every object has a kind")
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let value = object.clone();
    let parsed = match kind.as_str() {
        "Deployment" => serde_json::from_value::<Deployment>(value).map(|_| ()),
        "Service" => serde_json::from_value::<Service>(value).map(|_| ()),
        "ServiceAccount" => serde_json::from_value::<ServiceAccount>(value).map(|_| ()),
        "PersistentVolumeClaim" => {
            serde_json::from_value::<PersistentVolumeClaim>(value).map(|_| ())
        }
        "Namespace" => serde_json::from_value::<Namespace>(value).map(|_| ()),
        "ClusterRole" => serde_json::from_value::<ClusterRole>(value).map(|_| ()),
        "ClusterRoleBinding" => serde_json::from_value::<ClusterRoleBinding>(value).map(|_| ()),
        "Role" => serde_json::from_value::<Role>(value).map(|_| ()),
        "RoleBinding" => serde_json::from_value::<RoleBinding>(value).map(|_| ()),
        "CustomResourceDefinition" => {
            serde_json::from_value::<CustomResourceDefinition>(value).map(|_| ())
        }
        "WorkerPool" => serde_json::from_value::<toolgrid_api::WorkerPool>(value).map(|_| ()),
        // cert-manager's kinds (no Rust types here): checked by tests/helm/check_chart.py.
        "Kustomization" | "Issuer" | "Certificate" => Ok(()),
        other => panic!("{other} {name}: an object of a kind this test does not know"),
    };
    if let Err(error) = parsed {
        panic!("{kind} {name} does not parse as a {kind}: {error}");
    }
    kind
}

/// The controller container's arguments parse as `toolgrid controller`.
fn check_controller_args(deployment: &Value) {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let mut argv = vec!["toolgrid".to_string()];
    argv.extend(args);
    if let Err(error) = toolgrid::cli::Cli::try_parse_from(&argv) {
        panic!(
            "the chart runs `{}`, which toolgrid rejects: {error}",
            argv.join(" ")
        );
    }
    let probes = |probe: &str| {
        container[probe]["httpGet"]["path"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(probes("livenessProbe"), "/health");
    assert_eq!(probes("readinessProbe"), "/ready");
}

/// Renders the chart with `values` (JSON; `None`: every check of check_chart.py on the
/// defaults) into a fake cluster, with or without cert-manager: the objects, or `None` when
/// the tools are missing outside CI.
fn render(values: Option<&str>, cert_manager: bool) -> Option<Vec<Value>> {
    let output = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new("python3");
    command
        .arg(repo().join("tests/helm/check_chart.py"))
        .args(["--format", "json", "--output"])
        .arg(output.path());
    if let Some(values) = values {
        command.args(["--values", values]);
    }
    if cert_manager {
        command.arg("--cert-manager");
    }
    let run = common::run_python_check(&mut command)?;
    assert!(
        run.status.success(),
        "the chart checks failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let objects: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(output.path()).unwrap()).unwrap();
    objects.iter().for_each(|o| {
        parse_typed(o);
    });
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    check_controller_args(deployment);
    Some(objects)
}

/// The controller container's arguments.
fn controller_args(objects: &[Value]) -> Vec<String> {
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The Secret volume mounted at /etc/toolgrid/tls, if any.
fn tls_volume(objects: &[Value]) -> Option<String> {
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"] == "/etc/toolgrid/tls")?["name"]
        .clone();
    pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount)
        .and_then(|v| v["secret"]["secretName"].as_str())
        .map(str::to_string)
}

#[test]
fn the_default_install_serves_tls_made_by_the_controller() {
    let Some(objects) = render(Some("{}"), false) else {
        return;
    };
    let args = controller_args(&objects);
    assert!(
        args.contains(&"--tls-self-signed=true".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--control-plane-address=https://toolgrid.toolgrid.svc:7070".to_string()),
        "workers dial https: {args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--tls-cert")),
        "{args:?}"
    );
    assert!(!objects.iter().any(|o| o["kind"] == "Certificate"));
    // The CA and certificate live in one Secret, which the controller alone may write.
    assert!(
        args.contains(&"--tls-self-signed-secret=toolgrid-self-signed-tls".to_string()),
        "{args:?}"
    );
    // The built-in tools of the image, served in the default pool's namespace.
    for want in [
        "--builtins=/usr/share/toolgrid/builtins/manifests,/usr/share/toolgrid/builtins/python",
        "--builtins-namespace=toolgrid",
    ] {
        assert!(args.contains(&want.to_string()), "{want}: {args:?}");
    }
    let role = objects
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "toolgrid-self-signed-tls")
        .expect("a Role for the self-signed Secret");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["toolgrid-self-signed-tls"], "verbs": ["get", "update"]},
        ])
    );
    assert!(objects.iter().any(|o| o["kind"] == "RoleBinding"
        && o["roleRef"]["name"] == "toolgrid-self-signed-tls"
        && o["subjects"][0]["name"] == "toolgrid"));
}

#[test]
fn with_cert_manager_the_default_install_serves_its_certificate() {
    let Some(objects) = render(Some("{}"), true) else {
        return;
    };
    let args = controller_args(&objects);
    for want in [
        "--tls-cert=/etc/toolgrid/tls/tls.crt",
        "--tls-key=/etc/toolgrid/tls/tls.key",
        "--worker-tls-ca=/etc/toolgrid/tls/ca.crt",
        "--control-plane-address=https://toolgrid.toolgrid.svc:7070",
    ] {
        assert!(args.contains(&want.to_string()), "{want}: {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--tls-self-signed")));
    assert!(
        !objects
            .iter()
            .any(|o| o["metadata"]["name"] == "toolgrid-self-signed-tls"),
        "no Role for a Secret not used"
    );
    let certificate = objects
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["metadata"]["name"] == "toolgrid-tls")
        .expect("a serving Certificate");
    assert_eq!(certificate["spec"]["secretName"], "toolgrid-tls");
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&Value::from("toolgrid.toolgrid.svc"))
    );
    assert_eq!(tls_volume(&objects).as_deref(), Some("toolgrid-tls"));
    assert!(
        objects
            .iter()
            .any(|o| o["kind"] == "Issuer" && o["spec"]["ca"]["secretName"] == "toolgrid-ca")
    );
}

#[test]
fn plaintext_needs_tls_enabled_false() {
    let Some(objects) = render(
        Some(r#"{"tls": {"enabled": false}, "builtins": {"enabled": false}}"#),
        true,
    ) else {
        return;
    };
    let args = controller_args(&objects);
    assert!(
        !args.iter().any(|a| a.starts_with("--builtins")),
        "{args:?}"
    );
    assert!(
        args.contains(&"--control-plane-address=http://toolgrid.toolgrid.svc:7070".to_string()),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a.starts_with("--tls")), "{args:?}");
    assert_eq!(tls_volume(&objects), None);
    assert!(!objects.iter().any(|o| o["kind"] == "Certificate"));
}

/// Whatever the TLS mode, the controller keeps its identity signing keys (the JWKS) in one
/// Secret of its namespace, which it alone may write.
#[test]
fn every_install_lets_the_controller_keep_its_identity_keys_in_a_secret() {
    let Some(objects) = render(Some(r#"{"tls": {"enabled": false}}"#), false) else {
        return;
    };
    let args = controller_args(&objects);
    assert!(
        args.contains(&"--identity-secret=toolgrid-identity-keys".to_string()),
        "{args:?}"
    );
    let role = objects
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "toolgrid-identity-keys")
        .expect("a Role for the identity keys Secret");
    assert_eq!(role["metadata"]["namespace"], "toolgrid");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["toolgrid-identity-keys"], "verbs": ["get", "update"]},
        ])
    );
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "RoleBinding" && o["metadata"]["name"] == "toolgrid-identity-keys")
        .expect("a RoleBinding for the identity keys Role");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "toolgrid-identity-keys");
    assert_eq!(binding["subjects"][0]["name"], "toolgrid");
    assert!(
        !objects
            .iter()
            .any(|o| o["metadata"]["name"] == "toolgrid-self-signed-tls"),
        "plaintext: no self-signed TLS Role"
    );
}

#[test]
fn the_chart_renders_with_real_helm_into_valid_kubernetes_objects() {
    let Some(objects) = render(None, false) else {
        return;
    };
    let kinds: Vec<String> = objects.iter().map(parse_typed).collect();
    for expected in [
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "PersistentVolumeClaim",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "the chart installs a {expected}: {kinds:?}"
        );
    }
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "CustomResourceDefinition")
            .count(),
        toolgrid_api::all_crds().len()
    );
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    check_controller_args(deployment);
}

#[test]
fn the_plain_manifests_are_valid_kubernetes_objects() {
    let mut kinds = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(repo().join("deploy/crds/toolgrid.yaml"));
    for path in files {
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for document in serde_yaml::Deserializer::from_str(&text) {
                let value: Value = serde_yaml::from_value(
                    <serde_yaml::Value as serde::Deserialize>::deserialize(document).unwrap(),
                )
                .unwrap();
                if value.is_null() {
                    continue;
                }
                let kind = parse_typed(&value);
                if kind == "Deployment" {
                    check_controller_args(&value);
                }
                kinds.push(kind);
            }
        }
    }
    for expected in [
        "Namespace",
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "CustomResourceDefinition",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "deploy/ has a {expected}: {kinds:?}"
        );
    }
}

#[test]
fn the_kubernetes_examples_load_and_resolve_with_configmap_artifacts() {
    use toolgrid_catalog::manifest::load_dir;
    let dir = repo().join("examples/k8s");
    let set = load_dir(&dir).unwrap();
    assert!(set.invalid.is_empty(), "{:?}", set.invalid);
    assert!(
        set.config_maps.len() >= 4,
        "the artifacts ship as ConfigMaps"
    );
    let mut artifacts = std::collections::HashMap::new();
    for release in &set.releases {
        let loaded = toolgrid_catalog::artifacts::load_local(release, &set.config_maps);
        artifacts.insert(
            toolgrid_core::ids::ObjectKey::new(
                release
                    .object
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_default(),
                release.object.metadata.name.clone().unwrap_or_default(),
            ),
            loaded.outcome,
        );
    }
    let snapshot = toolgrid_catalog::resolve::resolve(&toolgrid_catalog::resolve::ResolveInput {
        set: &set,
        artifacts: &artifacts,
        wasm: &Default::default(),
        previous: &Default::default(),
        now: k8s_openapi::jiff::Timestamp::now(),
        identities: None,
        source_reads: &Default::default(),
        rollouts: &Default::default(),
        reuse: None,
    });
    let not_ready: Vec<String> = snapshot
        .resources
        .values()
        .filter(|r| !r.ready.status)
        .map(|r| {
            format!(
                "{} {}: {} {}",
                r.id.kind, r.id.key, r.ready.reason, r.ready.message
            )
        })
        .collect();
    assert!(
        not_ready.is_empty(),
        "every example resource is Ready: {not_ready:#?}"
    );
    for tool in ["semver", "textstats", "uuid", "fetch"] {
        assert!(snapshot.tools.keys().any(|k| k.name == tool), "{tool}");
    }
}

/// The image holds what `--builtins /usr/share/toolgrid/builtins/{manifests,python}` serves:
/// the Dockerfile copies the manifests and every file they name, at the same relative place
/// (the python runtime from the stage that fetches it).
#[test]
fn the_image_holds_every_file_the_builtin_manifests_name() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let copies: Vec<(&str, &str)> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .map(|l| l.strip_prefix("--from=python-runtime /src/").unwrap_or(l))
        .filter(|l| !l.starts_with("--"))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let copied = |from: &str| {
        copies
            .iter()
            .any(|(f, to)| *f == from && *to == format!("/usr/share/toolgrid/{from}"))
    };
    assert!(copied("builtins/manifests"), "{copies:?}");
    assert!(copied("builtins/python"), "{copies:?}");
    let mut named = 0;
    let manifests = ["builtins/manifests", "builtins/python"]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(repo().join(dir)).unwrap());
    for entry in manifests {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let Some(file) = line.trim().strip_prefix("file: ") else {
                continue;
            };
            let path = format!("builtins/{}", file.trim().trim_start_matches("../"));
            // the runtime is fetched (builtins/fetch-python.sh), not committed
            assert!(
                path.starts_with("builtins/runtimes/") || repo().join(&path).is_file(),
                "{path}"
            );
            assert!(
                copied(&path),
                "the Dockerfile does not copy {path}: {copies:?}"
            );
            named += 1;
        }
    }
    assert!(named >= 4, "{named}");
}

/// The worker pods run the image's `toolgrid-worker` (the controller's Deployments name it
/// on the PATH): the package builds a binary of that name, and the Dockerfile installs it in
/// `/usr/local/bin` beside `toolgrid`.
#[test]
fn the_image_holds_the_worker_pods_command() {
    let command = toolgrid_controller::deployment::WORKER_COMMAND;
    assert_eq!(
        std::path::Path::new(common::TOOLGRID_WORKER)
            .file_name()
            .and_then(|n| n.to_str()),
        Some(command)
    );
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!(
            "\nCOPY --from=build /out/{command} /usr/local/bin/{command}\n"
        )),
        "the image does not install {command}"
    );
    assert!(
        dockerfile.contains(&format!(
            "install -D -m 0755 target/release/{command} /out/{command}"
        )),
        "the build stage does not keep {command}"
    );
}

/// The image's binaries are built with the repository's build settings (SQLite's
/// `fdatasync`, mimalloc's commit on use, in `.cargo/config.toml`; the link settings in
/// `build.rs`): the Dockerfile copies them before its first `cargo build`, and the build
/// context keeps them.
#[test]
fn the_image_is_built_with_the_repository_build_settings() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let config = std::fs::read_to_string(repo().join(".cargo/config.toml")).unwrap();
    assert!(config.contains("LIBSQLITE3_FLAGS"), "{config}");
    assert!(config.contains("MI_DEFAULT_ARENA_EAGER_COMMIT"), "{config}");
    let copy = dockerfile
        .find("\nCOPY .cargo ./.cargo\n")
        .expect("the Dockerfile copies .cargo");
    let build = dockerfile
        .find("cargo build")
        .expect("the Dockerfile builds");
    assert!(
        copy < build,
        "the settings are copied before the first build"
    );
    let link = dockerfile
        .find("\nCOPY build.rs ./build.rs\n")
        .expect("the Dockerfile copies build.rs");
    assert!(link < build, "build.rs is copied before the first build");
    // The symbol order build.rs hands the linker (link/symbol-order.txt).
    let order = dockerfile
        .find("\nCOPY link ./link\n")
        .expect("the Dockerfile copies link/");
    assert!(order < build, "link/ is copied before the first build");
    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(
        !ignored.lines().any(|l| [
            "/.cargo",
            ".cargo",
            "build.rs",
            "/build.rs",
            "link",
            "/link"
        ]
        .contains(&l.trim().trim_end_matches('/'))),
        "{ignored}"
    );
}
