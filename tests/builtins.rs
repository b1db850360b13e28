//! The built-in tools (builtins/), served by `toolgrid up` and called end to end through
//! `/mcp` with the official Python SDK (PyPI `mcp` 2.x) as an agent bound to them.
//!
//! - `files`: write, edit (refused `not-unique` when the text occurs twice), grep, read,
//!   glob on the agent's workspace; each successful call is the next workspace version, a
//!   failed one none; a path out of the workspace is `invalid-path`; an agent
//!   whose binding is read-only gets `read-only`; nothing is bound by default.
//!
//! - `web-fetch`: a page on a loopback server (allowed by the test's own release of the
//!   built-in artifact) as text without scripts or markup, a redirect followed (and one to a
//!   destination the egress does not allow refused), a long
//!   page read on by offset, a PDF saved into the workspace; the built-in release refuses
//!   a private address and a port other than 443 (`egress-denied`).
//!
//! - `js`: a program reads a CSV the agent wrote with `files` and computes over it, writes
//!   a file `files` then reads; hostile programs (an infinite loop, a memory bomb, deep
//!   recursion, an exception) each end with their own kind and the next call is served.
//!
//! Without python3 and `mcp` the tests skip with the reason, except under `CI=true`.

use crate::common;

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

/// Writes a pool and agent `name` (token `<name>-token`) bound to each of `tools` with its
/// workspace read-write.
fn write_agent(dir: &Path, name: &str, tools: &[&str]) {
    let mut text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\nspec: {{replicas: 1, slotsPerWorker: 4}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-token}}\nstringData: {{token: {name}-token}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\n\
         spec:\n  tokenSecretRef: {{name: {name}-token, key: token}}\n  permissions: [{{tools: [{}]}}]\n",
        tools.join(", ")
    );
    for tool in tools {
        text.push_str(&format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: {name}-{tool}}}\n\
             spec: {{agents: [{name}], tool: {tool}, filesystemAccess: readWrite}}\n"
        ));
    }
    std::fs::write(dir.join("agents.yaml"), text).unwrap();
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

/// A page with what a reader drops (a script, a style, a comment, markup) and keeps (the
/// title, paragraphs, list items, a link's target, entities).
const PAGE: &str = r#"<!doctype html><html><head><title>Tide &amp; Time</title>
<style>body { color: red }</style><script>var secret = "do not show";</script></head>
<body><h1>Tides</h1><!-- a comment --><p>The moon pulls
   the sea.</p><ul><li>High tide</li><li>Low&nbsp;tide &#8212; twice a day</li></ul>
<p>See <a href="/more">more</a>.</p></body></html>"#;

/// The platform's built-in release of web-fetch: its artifact's path and digest.
fn builtin_web_fetch() -> (std::path::PathBuf, String) {
    let repo = common::fixtures::repo();
    let manifest = std::fs::read_to_string(repo.join("builtins/manifests/web-fetch.yaml")).unwrap();
    let digest = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("digest: "))
        .unwrap()
        .to_string();
    (repo.join("builtins/tools/web-fetch/web-fetch.wasm"), digest)
}

async fn serve_pages() -> std::net::SocketAddr {
    use axum::http::header::{CONTENT_TYPE, LOCATION};
    use axum::routing::get;
    let long: String = (0..300)
        .map(|i| format!("<p>line {i:03} of the long page</p>"))
        .collect();
    let app = axum::Router::new()
        .route(
            "/page",
            get(|| async { ([(CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
        )
        .route(
            "/moved",
            get(|| async { (axum::http::StatusCode::FOUND, [(LOCATION, "/page")]) }),
        )
        .route(
            "/escape",
            get(|| async {
                (
                    axum::http::StatusCode::FOUND,
                    [(LOCATION, "http://127.0.0.2:9/secret")],
                )
            }),
        )
        .route(
            "/long",
            get(move || {
                let long = long.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "text/html")],
                        format!("<html><body>{long}</body></html>"),
                    )
                }
            }),
        )
        .route(
            "/papers/tides.pdf",
            get(|| async {
                (
                    [(CONTENT_TYPE, "application/pdf")],
                    &b"%PDF-1.4\n%\xe2\xe3\n1 0 obj\n"[..],
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn web_fetch_reads_pages_as_text_and_saves_documents_within_its_egress() {
    if !toolgrid_testkit::require("python3 with mcp 2.x", python_sdk_present()) {
        return;
    }
    let server = serve_pages().await;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let (wasm, digest) = builtin_web_fetch();
    let port = server.port();
    std::fs::write(
        dir.join("agents.yaml"),
        format!(
            r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 4}}
---
# The built-in artifact, released with the test's egress: its loopback server.
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: web-fetch-loopback}}
spec:
  tool: web-fetch
  version: 1.0.1-loopback
  artifact: {{file: {wasm}, digest: "{digest}"}}
  pool: default
  network:
    egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]
---
apiVersion: v1
kind: Secret
metadata: {{name: browser-token}}
stringData: {{token: browser-token}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: browser}}
spec:
  tokenSecretRef: {{name: browser-token, key: token}}
  permissions: [{{tools: [web-fetch]}}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: browser-web}}
spec:
  agents: [browser]
  tool: web-fetch
  release: {{name: web-fetch-loopback}}
  filesystemAccess: readWrite
---
apiVersion: v1
kind: Secret
metadata: {{name: plain-token}}
stringData: {{token: plain-token}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: plain}}
spec:
  tokenSecretRef: {{name: plain-token, key: token}}
  permissions: [{{tools: [web-fetch]}}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: plain-web}}
spec: {{agents: [plain], tool: web-fetch, release: {{name: web-fetch-1.0.0}}}}
"#,
            wasm = wasm.display()
        ),
    )
    .unwrap();
    let platform = Platform::start(root.path(), &dir, &[]);
    let base = format!("http://{server}");

    let (tools, outcomes) = mcp_calls(
        &platform,
        root.path(),
        "browser-token",
        json!([
            ["web-fetch", {"url": format!("{base}/page")}],
            ["web-fetch", {"url": format!("{base}/moved")}],
            ["web-fetch", {"url": format!("{base}/long"), "max-chars": 100}],
            ["web-fetch", {"url": format!("{base}/long"), "max-chars": 100, "offset": 100}],
            ["web-fetch", {"url": format!("{base}/papers/tides.pdf")}],
            ["web-fetch", {"url": format!("{base}/escape")}],
        ]),
    );
    assert_eq!(tools, ["web-fetch"]);
    let [page, moved, first, second, pdf, escape] = outcomes.try_into().unwrap();
    // A redirect is a new request, checked against the egress rules like the first.
    assert_eq!(error_name(&escape), "egress-denied", "{escape}");
    assert!(
        escape["text"].as_str().unwrap().contains("127.0.0.2"),
        "{escape}"
    );
    let page = &page["structured"];
    assert_eq!(page["title"], "Tide & Time", "{page}");
    assert_eq!(
        page["text"],
        "Tides\nThe moon pulls the sea.\n- High tide\n- Low tide \u{2014} twice a day\nSee more (/more).",
        "{page}"
    );
    assert_eq!(page["truncated"], false);
    assert_eq!(
        moved["structured"]["url"],
        format!("{base}/page"),
        "{moved}"
    );
    assert_eq!(moved["structured"]["text"], page["text"]);
    let (first, second) = (&first["structured"], &second["structured"]);
    assert_eq!(first["truncated"], true, "{first}");
    assert_eq!(first["nextOffset"], 100);
    assert_eq!(first["text"].as_str().unwrap().chars().count(), 100);
    assert_eq!(second["offset"], 100);
    let whole = format!(
        "{}{}",
        first["text"].as_str().unwrap(),
        second["text"].as_str().unwrap()
    );
    assert!(
        whole.starts_with("line 000 of the long page\nline 001"),
        "{whole}"
    );
    assert_eq!(pdf["structured"]["savedTo"], "downloads/tides.pdf", "{pdf}");
    let cat = platform.cli(
        &["workspace", "cat", "browser", "downloads/tides.pdf"],
        None,
    );
    assert!(cat.status.success(), "{cat:?}");
    assert!(cat.stdout.starts_with(b"%PDF-1.4"));

    // The built-in release: public addresses on port 443 only.
    let (_, refused) = mcp_calls(
        &platform,
        root.path(),
        "plain-token",
        json!([
            ["web-fetch", {"url": "https://127.0.0.1/"}],
            ["web-fetch", {"url": "https://localhost/admin"}],
            ["web-fetch", {"url": format!("{base}/page")}],
        ]),
    );
    for outcome in &refused {
        assert_eq!(error_name(outcome), "egress-denied", "{outcome}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn js_runs_programs_over_the_workspace_and_hostile_ones_end_named() {
    if !toolgrid_testkit::require("python3 with mcp 2.x", python_sdk_present()) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    write_agent(&dir, "scripter", &["files", "js"]);
    let platform = Platform::start(root.path(), &dir, &[]);
    let mean = "const rows = fs.readFile('data.csv').trim().split('\\n').slice(1).map(l => l.split(','));\n\
                console.log(rows.length + ' rows');\n\
                ({mean: rows.reduce((s, r) => s + Number(r[1]), 0) / rows.length})";
    let (tools, outcomes) = mcp_calls(
        &platform,
        root.path(),
        "scripter-token",
        json!([
            ["files__write", {"path": "data.csv", "content": "city,temp\nOslo,3\nRome,17\nCairo,28\n"}],
            ["js", {"code": mean}],
            ["js", {"code": "fs.writeFile('out/report.txt', 'done'); (async () => fs.readdir('out'))()"}],
            ["files__read", {"path": "out/report.txt"}],
            ["js", {"code": "throw new Error('boom')"}],
            ["js", {"code": "let a = []; while (true) a.push('x'.repeat(1 << 20))"}],
            ["js", {"code": "function deep(n) { return deep(n + 1) + 1 } deep(0)"}],
            ["js", {"code": "for (;;) {}"}],
            ["js", {"code": "for (let i = 0; i < 200000; i++) console.log('flood '.repeat(20)); 7"}],
            ["js", {"code": "[1, 2, 3].map(x => x * x)"}],
        ]),
    );
    assert!(tools.contains(&"js".to_string()), "{tools:?}");
    let [_, mean, wrote, read, thrown, bomb, deep, spin, flood, after] =
        outcomes.try_into().unwrap();
    assert_eq!(
        mean["structured"],
        json!({"result": {"mean": 16}, "output": "3 rows\n", "outputTruncated": false}),
        "{mean}"
    );
    assert_eq!(
        wrote["structured"]["result"],
        json!(["report.txt"]),
        "{wrote}"
    );
    assert_eq!(read["structured"]["content"], "done", "{read}");
    assert_eq!(error_name(&thrown), "js-error");
    assert!(
        thrown["text"].as_str().unwrap().contains("boom"),
        "{thrown}"
    );
    assert_eq!(error_name(&bomb), "js-error");
    assert!(
        bomb["text"].as_str().unwrap().contains("out of memory"),
        "{bomb}"
    );
    // Platform limits end the others, each with its kind.
    let kind = |o: &Value| o["error"]["kind"].as_str().unwrap_or_default().to_string();
    assert_eq!(kind(&deep), "trap", "{deep}");
    assert_eq!(kind(&spin), "cpu-limit", "{spin}");
    // 24 MB of output: the first 64 KiB is kept, the program's value still comes back.
    let flood = &flood["structured"];
    assert_eq!(flood["outputTruncated"], true, "{flood}");
    assert_eq!(flood["result"], 7, "{flood}");
    assert!(flood["output"].as_str().unwrap().len() <= 64 * 1024);
    assert_eq!(after["structured"]["result"], json!([1, 4, 9]), "{after}");
}

#[tokio::test(flavor = "multi_thread")]
async fn python_computes_with_pandas_over_the_workspace_and_errors_end_named() {
    if !toolgrid_testkit::require("python3 with mcp 2.x", python_sdk_present())
        || !toolgrid_testkit::require(
            "the python built-in's runtime (builtins/fetch-python.sh)",
            common::python_runtime_present(),
        )
    {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    write_agent(&dir, "analyst", &["files", "python"]);
    // The 100 MB interpreter compiles once per machine (minutes), into a cache every run
    // of this test shares.
    let platform = common::python_platform(root.path(), &dir);
    // Until it is compiled a call ends `timeout` (the compile goes on, and is cached).
    common::warm_python(&platform, &["call", "python", "run", "--code", "1"]);
    let analysis = "import pandas as pd\n\
                    df = pd.read_csv('sales.csv')\n\
                    print(len(df), 'rows')\n\
                    by_region = df.groupby('region')['amount'].sum().sort_index()\n\
                    by_region.to_json('out/by_region.json')\n\
                    {'total': int(df['amount'].sum()), 'by_region': by_region, 'mean': df['amount'].mean()}";
    let (tools, outcomes) = mcp_calls(
        &platform,
        root.path(),
        "analyst-token",
        json!([
            ["files__write", {"path": "sales.csv", "content": "region,amount\nnorth,10\nsouth,25\nnorth,5\neast,40\n"}],
            ["files__write", {"path": "out/.keep", "content": ""}],
            ["python", {"code": analysis}],
            ["files__read", {"path": "out/by_region.json"}],
            ["files__write", {"path": "stats.py", "content": "import numpy as np\nx = np.array([1.0, 2.0, 3.0, 4.0])\nprint('std', round(float(x.std()), 4))\nx.reshape(2, 2)\n"}],
            ["python", {"file": "stats.py"}],
            ["python", {"code": "1 / 0"}],
            ["python", {"file": "missing.py"}],
            ["python", {"code": "print('a'); object()"}],
            ["python", {"code": "x = [bytearray(64 << 20) for _ in range(40)]"}],
            ["python", {}],
            ["python", {"code": "import socket; socket.create_connection(('example.com', 80))"}],
            ["python", {"code": "for _ in range(100_000): print('flood ' * 40)\n7"}],
            ["python", {"code": "sum(range(10))"}],
        ]),
    );
    assert!(tools.contains(&"python".to_string()), "{tools:?}");
    let [
        _,
        _,
        analysis,
        read,
        _,
        stats,
        thrown,
        missing,
        opaque,
        bomb,
        none,
        network,
        flood,
        after,
    ] = outcomes.try_into().unwrap();
    assert_eq!(
        analysis["structured"],
        json!({
            "result": {"total": 80, "by_region": {"east": 40, "north": 15, "south": 25}, "mean": 20.0},
            "output": "4 rows\n",
            "outputTruncated": false
        }),
        "{analysis}"
    );
    // Its file is the call's: committed with it, read by the other tool.
    let written: Value =
        serde_json::from_str(read["structured"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        written,
        json!({"east": 40, "north": 15, "south": 25}),
        "{read}"
    );
    assert_eq!(
        stats["structured"],
        json!({"result": [[1.0, 2.0], [3.0, 4.0]], "output": "std 1.118\n", "outputTruncated": false}),
        "{stats}"
    );
    assert_eq!(error_name(&thrown), "python-error");
    assert!(
        thrown["text"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{thrown}"
    );
    assert_eq!(error_name(&missing), "not-found");
    assert_eq!(error_name(&opaque), "invalid-result-value");
    // The platform's memory limit ends it, with its kind.
    assert_eq!(bomb["isError"], true, "{bomb}");
    assert_eq!(bomb["error"]["kind"], "memory-limit", "{bomb}");
    assert_eq!(error_name(&none), "bad-arguments");
    // No network in the sandbox: the program sees an OSError.
    assert_eq!(error_name(&network), "python-error");
    // 24 MB printed: the first 64 Ki characters are kept, the value still comes back.
    let flood = &flood["structured"];
    assert_eq!(flood["outputTruncated"], true, "{flood}");
    assert_eq!(flood["result"], 7, "{flood}");
    assert_eq!(flood["output"].as_str().unwrap().chars().count(), 64 * 1024);
    assert_eq!(after["structured"]["result"], json!(45), "{after}");
}
