//! The built-in tools (builtins/), served by `toolgrid up` and called end to end through
//! `/mcp` with the official Python SDK (PyPI `mcp` 2.x) as an agent bound to them.
//!
//! - `files`: write, edit (refused `not-unique` when the text occurs twice), grep, read,
//!   glob on the agent's workspace; each successful call is the next workspace version, a
//!   failed one none; a path out of the workspace is `invalid-path`; an agent
//!   whose binding is read-only gets `read-only`; nothing is bound by default.
//!
//! Without python3 and `mcp` the test skips with the reason, except under `CI=true`.

mod common;

use common::Platform;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

const CODER: &str = "coder-token";
const READER: &str = "reader-token";
/// The plan written, after its one edit.
const EDITED: &str = "step one\nstep 2\nstep one again\n";

fn manifests(root: &Path) -> std::path::PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let agent = |name: &str, token: &str, access: &str| {
        format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-token}}
stringData: {{token: {token}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: {name}}}
spec:
  tokenSecretRef: {{name: {name}-token, key: token}}
  permissions: [{{tools: [files]}}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: {name}-files}}
spec: {{agents: [{name}], tool: files, filesystemAccess: {access}}}
---
"#
        )
    };
    let text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\nspec: {{replicas: 1, slotsPerWorker: 4}}\n---\n{}{}\
apiVersion: v1\nkind: Secret\nmetadata: {{name: idle-token}}\nstringData: {{token: idle-token}}\n---\n\
apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: idle}}\nspec: {{tokenSecretRef: {{name: idle-token, key: token}}}}\n",
        agent("coder", CODER, "readWrite"),
        agent("reader", READER, "readOnly"),
    );
    std::fs::write(dir.join("agents.yaml"), text).unwrap();
    dir
}

/// Runs `calls` as the agent of `token` through the Python SDK: what it lists, and each
/// call's outcome.
fn mcp_calls(
    platform: &Platform,
    root: &Path,
    token: &str,
    calls: Value,
) -> (Vec<String>, Vec<Value>) {
    let file = root.join(format!("calls-{token}.json"));
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = Command::new("python3")
        .arg(common::fixtures::repo().join("tests/builtins/mcp_calls.py"))
        .arg(format!("http://{}/mcp", platform.http))
        .arg(token)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        platform.logs()
    );
    let mut lines = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Value>(l).unwrap());
    let tools = lines.next().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    (tools, lines.collect())
}

fn error_name(outcome: &Value) -> &str {
    assert_eq!(outcome["isError"], true, "{outcome}");
    outcome["error"]["name"].as_str().unwrap_or_default()
}

fn python_sdk_present() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn files_edits_and_searches_the_agents_workspace_through_mcp() {
    if !toolgrid_testkit::require("python3 with mcp 2.x", python_sdk_present()) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = manifests(root.path());
    let platform = Platform::start(root.path(), &dir, &[]);

    let plan = "step one\nstep two\nstep one again\n";
    let (tools, outcomes) = mcp_calls(
        &platform,
        root.path(),
        CODER,
        json!([
            ["files__write", {"path": "notes/plan.md", "content": plan}],
            ["files__edit", {"path": "notes/plan.md", "old": "step two", "new": "step 2"}],
            ["files__edit", {"path": "notes/plan.md", "old": "step one", "new": "step 1"}],
            ["files__grep", {"pattern": "step [0-9]|again"}],
            ["files__read", {"path": "/workspace/notes/plan.md", "offset": 2, "limit": 1}],
            ["files__glob", {"pattern": "**/*.md"}],
            ["files__read", {"path": "../../etc/passwd"}],
            ["files__ls", {"recursive": true}],
        ]),
    );
    let commands = ["edit", "glob", "grep", "ls", "mv", "read", "rm", "write"];
    assert_eq!(
        tools,
        commands.map(|c| format!("files__{c}")),
        "a bound built-in, all its commands"
    );
    let [write, edit, not_unique, grep, read, glob, escape, ls] = outcomes.try_into().unwrap();
    assert_eq!(
        write["structured"],
        json!({"path": "notes/plan.md", "bytes": plan.len(), "created": true})
    );
    assert_eq!(edit["structured"]["replacements"], 1, "{edit}");
    assert_eq!(error_name(&not_unique), "not-unique");
    assert!(
        not_unique["text"]
            .as_str()
            .unwrap()
            .contains("occurs 2 times"),
        "{not_unique}"
    );
    assert_eq!(
        grep["structured"]["matches"],
        json!([
            {"path": "notes/plan.md", "line": 2, "text": "step 2"},
            {"path": "notes/plan.md", "line": 3, "text": "step one again"},
        ])
    );
    assert_eq!(read["structured"]["content"], "step 2\n", "{read}");
    assert_eq!(read["structured"]["totalLines"], 3);
    assert_eq!(read["structured"]["nextOffset"], 3);
    assert_eq!(glob["structured"]["paths"], json!(["notes/plan.md"]));
    assert_eq!(error_name(&escape), "invalid-path");
    assert_eq!(
        ls["structured"]["entries"],
        json!([
            {"path": "notes", "type": "dir"},
            {"path": "notes/plan.md", "type": "file", "size": EDITED.len()},
        ])
    );

    // The workspace as an operator reads it: each of the six calls that succeeded is a
    // version (a read-write call commits its tree even when unchanged), the refused edit
    // and the refused path none.
    let cat = platform.cli(&["workspace", "cat", "coder", "notes/plan.md"], None);
    assert!(cat.status.success(), "{cat:?}");
    assert_eq!(String::from_utf8_lossy(&cat.stdout), EDITED);
    let history = platform.cli(&["workspace", "history", "coder"], None);
    assert!(history.status.success(), "{history:?}");
    let versions = String::from_utf8_lossy(&history.stdout)
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    assert_eq!(versions, 6, "{}", String::from_utf8_lossy(&history.stdout));

    // Read-only access: reading works, a change is refused by the sandbox, named.
    let (_, outcomes) = mcp_calls(
        &platform,
        root.path(),
        READER,
        json!([
            ["files__ls", {}],
            ["files__write", {"path": "x.txt", "content": "x"}],
        ]),
    );
    assert_eq!(outcomes[0]["structured"]["entries"], json!([]));
    assert_eq!(error_name(&outcomes[1]), "read-only", "{}", outcomes[1]);

    // Nothing is bound by default: an agent without a binding sees no built-in.
    let (tools, _) = mcp_calls(&platform, root.path(), "idle-token", json!([]));
    assert!(tools.is_empty(), "{tools:?}");
}
