//! Wasm middleware: a real `toolgrid up` whose bindings name wasm Middleware. The guard
//! example (built from C, examples/middleware/guard/) allows, denies and rewrites calls;
//! components that rewrite beyond the agent's permissions, trap, loop or grow their memory
//! refuse the call, while other calls keep being served; a core module is not a Middleware.

use crate::common;

use common::fixtures;
use common::{Platform, result_of};
use std::path::Path;
use toolgrid_core::artifact::middleware_component;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const GUARDED: &str = "guarded-token-value";
const WIDENER: &str = "widener-token-value";
const TRAPPER: &str = "trapper-token-value";
const LOOPER: &str = "looper-token-value";
const HOGGER: &str = "hogger-token-value";

/// Agents, each bound through one wasm Middleware: `guarded` to uuid through the guard
/// example, `widener` to semver through `to-bump` (rewrites compare into bump, which the
/// agent may not call) and to uuid through `too-many` (rewrites count beyond the schema), `trapper`, `looper` and `hogger` to uuid through components that
/// trap, spin and grow their memory.
const MORE: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: wasm-agent-tokens}
stringData:
  guarded: guarded-token-value
  widener: widener-token-value
  trapper: trapper-token-value
  looper: looper-token-value
  hogger: hogger-token-value
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: guarded}
spec:
  tokenSecretRef: {name: wasm-agent-tokens, key: guarded}
  permissions: [{tools: [uuid]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: guarded-uuid}
spec: {agents: [guarded], tool: uuid, middleware: [guard]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: widener}
spec:
  tokenSecretRef: {name: wasm-agent-tokens, key: widener}
  permissions: [{tools: [semver], commands: [compare]}, {tools: [uuid]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: widener-semver}
spec: {agents: [widener], tool: semver, middleware: [to-bump]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: to-bump}
spec: {wasm: {artifact: {file: to-bump.wasm}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: trapper}
spec:
  tokenSecretRef: {name: wasm-agent-tokens, key: trapper}
  permissions: [{tools: [uuid]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: trapper-uuid}
spec: {agents: [trapper], tool: uuid, middleware: [trap]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: trap}
spec: {wasm: {artifact: {file: trap.wasm}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: looper}
spec:
  tokenSecretRef: {name: wasm-agent-tokens, key: looper}
  permissions: [{tools: [uuid]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: looper-uuid}
spec: {agents: [looper], tool: uuid, middleware: [spin]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: spin}
spec: {wasm: {artifact: {file: spin.wasm}, timeout: 200ms}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: hogger}
spec:
  tokenSecretRef: {name: wasm-agent-tokens, key: hogger}
  permissions: [{tools: [uuid]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: hogger-uuid}
spec: {agents: [hogger], tool: uuid, middleware: [hog]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: hog}
spec: {wasm: {artifact: {file: hog.wasm}, memory: 1Mi}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: widener-uuid}
spec: {agents: [widener], tool: uuid, middleware: [too-many]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: too-many}
spec: {wasm: {artifact: {file: too-many.wasm}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: not-a-component}
spec: {wasm: {artifact: {file: core.wasm}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: wrong-digest}
spec:
  wasm:
    artifact:
      file: trap.wasm
      digest: sha256:0000000000000000000000000000000000000000000000000000000000000000
"#;

/// A core module implementing the world by hand: runs `body`, then answers with verdict
/// `tag` (0 allow, 1 deny, 2 rewrite) and `text`.
fn core_module(tag: u8, text: &str, body: &str) -> Vec<u8> {
    let escaped: String = text.bytes().map(|b| format!("\\{b:02x}")).collect();
    wat::parse_str(format!(
        r#"(module
  (memory (export "memory") 2)
  (global $next (mut i32) (i32.const 4096))
  (data (i32.const 16) "{escaped}")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
    (local.get $p))
  (func (export "toolgrid:middleware/decide@0.1.0#decide") (param i32 i32) (result i32)
    {body}
    (i32.store8 (i32.const 0) (i32.const {tag}))
    (i32.store (i32.const 4) (i32.const 16))
    (i32.store (i32.const 8) (i32.const {len}))
    (i32.const 0)))"#,
        len = text.len()
    ))
    .expect("valid WAT")
}

fn component(tag: u8, text: &str, body: &str) -> Vec<u8> {
    middleware_component(&core_module(tag, text, body)).expect("a middleware component")
}

fn write_middleware(manifests: &Path) {
    let guard = fixtures::repo().join("examples/middleware/guard");
    std::fs::copy(guard.join("guard.wasm"), manifests.join("guard.wasm")).unwrap();
    std::fs::copy(
        guard.join("middleware.yaml"),
        manifests.join("guard-middleware.yaml"),
    )
    .unwrap();
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(manifests.join(name), bytes).unwrap();
    write(
        "to-bump.wasm",
        component(
            2,
            r#"{"command":"bump","args":{"version":"1.2.0","part":"major"}}"#,
            "",
        ),
    );
    write(
        "too-many.wasm",
        component(2, r#"{"args":{"count":500}}"#, ""),
    );
    write("trap.wasm", component(0, "", "unreachable"));
    write("spin.wasm", component(0, "", "(loop $l (br $l))"));
    write(
        "hog.wasm",
        component(
            0,
            "",
            "(loop $l (drop (memory.grow (i32.const 16))) (br $l))",
        ),
    );
    write("core.wasm", core_module(0, "", ""));
    std::fs::write(manifests.join("wasm-agents.yaml"), MORE).unwrap();
}

async fn invoke(
    platform: &Platform,
    token: &str,
    tool: &str,
    argv: &[&str],
) -> Result<proto::Call, ApiError> {
    let mut client = platform.client_with(Some(token), None).await;
    client
        .invoke(proto::InvokeRequest {
            tool: tool.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| error_of(&s))
}

fn refused(result: Result<proto::Call, ApiError>, kind: ErrorKind, says: &str) {
    let error = match result {
        Err(error) => error,
        Ok(call) => panic!("refused, but the call was admitted: {call:?}"),
    };
    assert_eq!(error.kind, kind, "{}", error.message);
    assert!(
        error.message.contains(says),
        "{:?} should say {says:?}",
        error.message
    );
}

fn uuids(call: &proto::Call) -> usize {
    result_of(call)["uuids"].as_array().expect("uuids").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_middleware_allows_denies_rewrites_and_fails_closed() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    write_middleware(&manifests);
    let platform = Platform::start(root.path(), &manifests, &[]);

    // The guard example allows a small call.
    let call = invoke(&platform, GUARDED, "uuid", &["generate", "--count", "3"])
        .await
        .expect("allowed");
    assert_eq!(uuids(&call), 3);

    // It rewrites a larger count down to 10: the rewritten call ran.
    let call = invoke(&platform, GUARDED, "uuid", &["generate", "--count", "30"])
        .await
        .expect("rewritten");
    assert_eq!(uuids(&call), 10);

    // It denies a count above 50, with its own message.
    refused(
        invoke(&platform, GUARDED, "uuid", &["generate", "--count", "80"]).await,
        ErrorKind::Denied,
        "asks for 80 items; at most 50 per call",
    );

    // A rewrite into a command the agent may not call is refused as that call.
    refused(
        invoke(
            &platform,
            WIDENER,
            "semver",
            &["compare", "1.2.0", "1.10.0"],
        )
        .await,
        ErrorKind::PermissionDenied,
        "to-bump",
    );

    // ... and a rewrite into arguments the schema rejects, as those arguments.
    refused(
        invoke(&platform, WIDENER, "uuid", &["generate"]).await,
        ErrorKind::InvalidArgument,
        "too-many",
    );

    // A trap, a timeout and running out of memory refuse the call: the chain fails closed.
    refused(
        invoke(&platform, TRAPPER, "uuid", &["generate"]).await,
        ErrorKind::MiddlewareFailed,
        "trapped",
    );
    refused(
        invoke(&platform, LOOPER, "uuid", &["generate"]).await,
        ErrorKind::MiddlewareFailed,
        "ran out of time",
    );
    refused(
        invoke(&platform, HOGGER, "uuid", &["generate"]).await,
        ErrorKind::MiddlewareFailed,
        "ran out of memory",
    );
    // ... again (each decision is a fresh sandbox), while other calls are served.
    refused(
        invoke(&platform, LOOPER, "uuid", &["generate", "--count", "2"]).await,
        ErrorKind::MiddlewareFailed,
        "ran out of time",
    );
    let call = invoke(&platform, GUARDED, "uuid", &["generate", "--count", "4"])
        .await
        .expect("still served");
    assert_eq!(uuids(&call), 4);
    let call = platform
        .call("semver", &["compare", "1.2.0", "1.10.0"])
        .await
        .expect("the operator's call");
    result_of(&call);

    // A core module, or a component whose digest is not the pinned one, is no Middleware.
    let row = platform
        .resource("Middleware", "not-a-component")
        .await
        .expect("listed");
    assert_eq!(
        (row.ready.as_str(), row.reason.as_str()),
        ("False", "InvalidArtifact")
    );
    assert!(row.message.contains("not a component"), "{}", row.message);
    let row = platform
        .resource("Middleware", "wrong-digest")
        .await
        .expect("listed");
    assert_eq!(
        (row.ready.as_str(), row.reason.as_str()),
        ("False", "DigestMismatch")
    );
    let row = platform
        .resource("Middleware", "guard")
        .await
        .expect("listed");
    assert_eq!(row.ready, "True", "{}", row.message);
}
