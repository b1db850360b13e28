//! Generated clients on a real `toolgrid up`: `toolgrid gen client --lang python|typescript`
//! writes a client per tool (for the operator: every tool; `--as reporter`: the agent's
//! bound tools and commands only); the Python clients run under python3
//! (`tests/clients/python_client_test.py`), the TypeScript ones are type-checked with `tsc
//! --strict` from tests/js and run with Node 22 (`tests/clients/ts_client_test.ts`), calling
//! the example tools, declared errors included. A hostile fixture Tool's clients must
//! compile and load without running anything its descriptions smuggle in.

use crate::common;

use common::{Platform, fixtures};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use toolgrid_proto as proto;

const HOSTILE: &str = include_str!("clients/hostile.yaml");
const HOSTILE_TOOL: &str = "hostile-edge-case-tool-with-a-rather-long-name";
const AGENT_TOKEN: &str = "reporter-example-token";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

async fn start(root: &Path) -> Platform {
    let manifests = fixtures::examples(root);
    std::fs::write(manifests.join("hostile.yaml"), HOSTILE).unwrap();
    let platform = Platform::start(root, &manifests, &[]);
    platform
        .eventually(
            "every tool listed and semver callable",
            Duration::from_secs(60),
            || async {
                let mut client = platform.client().await;
                let listed = client
                    .list_tools(proto::ListToolsRequest::default())
                    .await
                    .map(|r| r.into_inner().tools)
                    .unwrap_or_default();
                let all = ["semver", "textstats", "uuid", "fetch", HOSTILE_TOOL]
                    .iter()
                    .all(|t| listed.iter().any(|l| &l.name == t));
                all && platform
                    .call("semver", &["compare", "1.0.0", "1.0.1"])
                    .await
                    .is_ok_and(|c| c.state == proto::CallState::Succeeded as i32)
            },
        )
        .await;
    platform
}

fn generate(platform: &Platform, lang: &str, dir: &Path, extra: &[&str]) {
    let dir = dir.to_str().unwrap();
    let mut args = vec!["gen", "client", "--lang", lang, "-o", dir];
    args.extend_from_slice(extra);
    let out = platform.cli(&args, None);
    assert!(
        out.status.success(),
        "gen client {lang} {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_python_clients_call_the_example_tools() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let admin_dir = root.path().join("py");
    let agent_dir = root.path().join("py-agent");
    generate(&platform, "python", &admin_dir, &[]);
    generate(&platform, "python", &agent_dir, &["--as", "reporter"]);
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).unwrap();

    // Every module compiles (the hostile one included) before any is imported.
    let Some(compiled) = common::run_python_check(
        Command::new("python3").args(["-m", "py_compile"]).args(
            std::fs::read_dir(&admin_dir)
                .unwrap()
                .map(|e| e.unwrap().path()),
        ),
    ) else {
        return;
    };
    assert!(compiled.status.success(), "{}", output_text(&compiled));

    let Some(run) = common::run_python_check(
        Command::new("python3")
            .arg(repo().join("tests/clients/python_client_test.py"))
            .arg(&admin_dir)
            .arg(&agent_dir)
            .env("TOOLGRID_URL", format!("http://{}", platform.http))
            .env("ADMIN_TOKEN", platform.admin_token())
            .env("AGENT_TOKEN", AGENT_TOKEN)
            .env("WORK", &work)
            .env_remove("TOOLGRID_TOKEN")
            .current_dir(&work),
    ) else {
        return;
    };
    let text = output_text(&run);
    assert!(run.status.success(), "python client checks failed:\n{text}");
    assert!(text.contains("all python client checks passed"), "{text}");
    // Nothing a description smuggled in ran (it would have exited with 7).
    assert_ne!(run.status.code(), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_typescript_clients_type_check_and_call_the_example_tools() {
    let Some(node) = common::node() else {
        return;
    };
    let Some(mut tsc) = common::js_command("tsc") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let src = root.path().join("ts");
    generate(&platform, "typescript", &src, &[]);
    generate(
        &platform,
        "typescript",
        &src.join("agent"),
        &["--as", "reporter"],
    );
    let agent_files: Vec<String> = std::fs::read_dir(src.join("agent"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = agent_files.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["platform-signing-keys.ts", "semver.ts", "textstats.ts"],
        "the agent's tools only"
    );
    std::fs::copy(
        repo().join("tests/clients/ts_client_test.ts"),
        src.join("main.ts"),
    )
    .unwrap();
    let out_dir = root.path().join("js");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ts"))
        .collect();
    files.extend(agent_files.iter().map(|f| src.join("agent").join(f)));
    let compiled = tsc
        .args([
            "--strict",
            "--noUncheckedIndexedAccess",
            "--exactOptionalPropertyTypes",
            "--target",
            "es2022",
            "--module",
            "es2022",
            "--moduleResolution",
            "bundler",
            "--lib",
            "es2022,dom",
            "--rootDir",
        ])
        .arg(&src)
        .arg("--outDir")
        .arg(&out_dir)
        .args(&files)
        .output()
        .expect("run tsc");
    assert!(
        compiled.status.success(),
        "tsc refused the generated clients:\n{}",
        output_text(&compiled)
    );
    std::fs::write(out_dir.join("package.json"), r#"{"type": "module"}"#).unwrap();
    let run = Command::new(&node)
        .arg(out_dir.join("main.js"))
        .env("TOOLGRID_URL", format!("http://{}", platform.http))
        .env("ADMIN_TOKEN", platform.admin_token())
        .env("AGENT_TOKEN", AGENT_TOKEN)
        .env_remove("TOOLGRID_TOKEN")
        .output()
        .expect("run node");
    let text = output_text(&run);
    assert!(
        run.status.success(),
        "typescript client checks failed:\n{text}"
    );
    assert!(
        text.contains("all typescript client checks passed"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_client_refusals_name_their_kind() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let dir = root.path().join("out");
    let out = platform.cli(
        &[
            "gen",
            "client",
            "--lang",
            "cobol",
            "-o",
            dir.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(output_text(&out).contains("invalid-argument"));
    let out = platform.cli(
        &[
            "gen",
            "client",
            "--lang",
            "python",
            "-o",
            dir.to_str().unwrap(),
            "uuid",
            "--as",
            "reporter",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(4), "{}", output_text(&out));
    assert!(output_text(&out).contains("unknown-tool"));
    let out = platform.cli(
        &[
            "gen",
            "client",
            "--lang",
            "python",
            "-o",
            dir.to_str().unwrap(),
            "--token",
            "bad",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(6));
    assert!(output_text(&out).contains("unauthenticated"));
}
