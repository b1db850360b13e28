//! Model tool schemas on a real `toolgrid up`: `GET /v1/tools?format=openai|anthropic|
//! json-schema`, gRPC `ListTools` with a format, `toolgrid schema`, and `toolgrid call TOOL
//! [COMMAND] --help`. Every example tool (and a hostile fixture Tool) is checked against the
//! model APIs' published rules by `tests/clients/check_model_schemas.py`.

use crate::common;

use common::{Platform, fixtures};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use toolgrid_core::error::ErrorKind;
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
        .eventually("every tool listed", Duration::from_secs(60), || async {
            let names = tool_names(&platform, None).await;
            ["semver", "textstats", "uuid", "fetch", HOSTILE_TOOL]
                .iter()
                .all(|t| names.iter().any(|n| n == t))
        })
        .await;
    platform
}

async fn tool_names(platform: &Platform, token: Option<&str>) -> Vec<String> {
    let mut client = match token {
        Some(t) => platform.client_with(Some(t), None).await,
        None => platform.client().await,
    };
    client
        .list_tools(proto::ListToolsRequest::default())
        .await
        .map(|r| r.into_inner().tools.into_iter().map(|t| t.name).collect())
        .unwrap_or_default()
}

async fn get(platform: &Platform, token: Option<&str>, query: &str) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().get(format!("http://{}/v1/tools{query}", platform.http));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET /v1/tools");
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.expect("a JSON body");
    (status, body)
}

fn envelope_kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

/// Runs the rule checker on one answer; panics with its report when a rule is broken.
fn check(root: &Path, format: &str, answer: &Value) -> bool {
    let file = root.join(format!("{format}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(answer).unwrap()).unwrap();
    let Some(run) = common::run_python_check(
        Command::new("python3")
            .arg(repo().join("tests/clients/check_model_schemas.py"))
            .arg(format)
            .arg(&file),
    ) else {
        return false;
    };
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{format} schemas break the published rules:\n{out}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    true
}

fn names(answer: &Value) -> Vec<String> {
    let mut names: Vec<String> = answer["names"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_schemas_follow_each_apis_rules_for_every_example_tool() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let admin = platform.admin_token();

    for format in ["openai", "anthropic", "json-schema"] {
        let (status, answer) = get(&platform, Some(&admin), &format!("?format={format}")).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["format"], json!(format));
        if !check(root.path(), format, &answer) {
            return;
        }
        // Every command of every tool: the operator sees them all.
        let names = names(&answer);
        for name in [
            "semver__compare",
            "semver__bump",
            "textstats",
            "uuid",
            "fetch",
        ] {
            assert!(
                names.contains(&name.to_string()),
                "{format}: {name} in {names:?}"
            );
        }
        // The long hostile name is shortened, deterministically, and maps back.
        let long = format!("{HOSTILE_TOOL}__command-with-a-long-name-too");
        let expected = if format == "json-schema" {
            long.clone()
        } else {
            toolgrid_catalog::model_formats::fit_name(&long)
        };
        assert!(
            names.contains(&expected),
            "{format}: {expected} in {names:?}"
        );
        assert_eq!(
            answer["names"][&expected],
            json!({"tool": HOSTILE_TOOL, "command": "command-with-a-long-name-too"})
        );
        if format != "json-schema" {
            assert!(expected.len() <= 64);
            assert!(
                answer["notes"][&expected][0]
                    .as_str()
                    .unwrap()
                    .contains("longer than 64"),
                "{answer}"
            );
        }
    }

    // OpenAI: every example tool is strict; the conversions did what the rules say.
    let (_, openai) = get(&platform, Some(&admin), "?format=openai").await;
    let function = |name: &str| -> Value {
        openai["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == json!(name))
            .unwrap_or_else(|| panic!("{name} in {openai}"))["function"]
            .clone()
    };
    for name in [
        "semver__compare",
        "semver__bump",
        "textstats",
        "uuid",
        "fetch",
    ] {
        assert_eq!(function(name)["strict"], json!(true), "{name}: {openai}");
    }
    let bump = function("semver__bump");
    let part = &bump["parameters"]["properties"]["part"];
    assert_eq!(bump["parameters"]["required"], json!(["part", "version"]));
    assert!(
        part["anyOf"]
            .as_array()
            .unwrap()
            .contains(&json!({"type": "null"})),
        "{part}"
    );
    assert!(
        part["description"]
            .as_str()
            .unwrap()
            .contains("Default: \"patch\""),
        "{part}"
    );
    let hostile = function(&toolgrid_catalog::model_formats::fit_name(&format!(
        "{HOSTILE_TOOL}__command-with-a-long-name-too"
    )));
    assert_eq!(hostile["strict"], json!(true), "{hostile}");
    let props = &hostile["parameters"]["properties"];
    assert_eq!(props["max-bytes"]["type"], json!(["integer", "null"]));
    assert!(
        props["max-bytes"]["description"]
            .as_str()
            .unwrap()
            .contains("Default: 1024")
    );
    let nested = &props["nested"]["anyOf"][0];
    assert_eq!(nested["required"], json!(["depth", "label"]));
    assert_eq!(
        nested["properties"]["label"]["type"],
        json!(["string", "null"])
    );
    assert!(
        props["stdin"]["anyOf"][0]["properties"]["items"].is_object(),
        "{props}"
    );
    // The free-form option has no strict form: strict false, and the note says why.
    let free = function(&format!("{HOSTILE_TOOL}__free-form"));
    assert_eq!(free["strict"], json!(false));
    assert!(
        openai["notes"][format!("{HOSTILE_TOOL}__free-form")][0]
            .as_str()
            .unwrap()
            .contains("/properties/anything"),
        "{openai}"
    );

    // Anthropic: input_schema is the input object schema as is.
    let (_, anthropic) = get(&platform, Some(&admin), "?format=anthropic&tool=semver").await;
    assert_eq!(names(&anthropic), ["semver__bump", "semver__compare"]);
    let compare = anthropic["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "semver__compare")
        .unwrap();
    assert_eq!(compare["input_schema"]["required"], json!(["a", "b"]));

    // json-schema: output schema and annotations from the effect.
    let (_, plain) = get(
        &platform,
        Some(&admin),
        &format!("?format=json-schema&tool=uuid,{HOSTILE_TOOL}"),
    )
    .await;
    let tools = plain["tools"].as_array().unwrap();
    let uuid = tools.iter().find(|t| t["name"] == "uuid").unwrap();
    assert_eq!(uuid["annotations"]["readOnlyHint"], json!(true));
    assert!(uuid["outputSchema"]["properties"]["uuids"].is_object());
    let hostile = tools
        .iter()
        .find(|t| t["command"] == "command-with-a-long-name-too")
        .unwrap();
    assert_eq!(hostile["effect"], json!("write"));
    assert_eq!(
        hostile["annotations"],
        json!({"title": format!("{HOSTILE_TOOL} command-with-a-long-name-too"),
               "readOnlyHint": false, "destructiveHint": true,
               "idempotentHint": false, "openWorldHint": false})
    );
    assert_eq!(hostile["errors"][0]["name"], json!("toolgrid"));

    // An agent sees only its bound commands, in every format.
    for format in ["openai", "anthropic", "json-schema"] {
        let (status, answer) =
            get(&platform, Some(AGENT_TOKEN), &format!("?format={format}")).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            names(&answer),
            ["platform__signing-keys", "semver__compare", "textstats"],
            "{format}"
        );
        if !check(root.path(), format, &answer) {
            return;
        }
    }
    // ...and a tool it is not bound to is unknown to it.
    let (status, answer) = get(&platform, Some(AGENT_TOKEN), "?format=openai&tool=uuid").await;
    assert_eq!(
        (status, envelope_kind(&answer)),
        (404, "unknown-tool"),
        "{answer}"
    );

    // gRPC answers the same document.
    let mut client = platform.client().await;
    let grpc = client
        .list_tools(proto::ListToolsRequest {
            format: "openai".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<Value>(&grpc.model_tools_json).unwrap(),
        openai
    );
    let refused = client
        .list_tools(proto::ListToolsRequest {
            format: "gemini".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        toolgrid_proto::status::error_of(&refused).kind,
        ErrorKind::InvalidArgument
    );
    let refused = client
        .list_tools(proto::ListToolsRequest {
            tools: vec!["no-such-tool".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        toolgrid_proto::status::error_of(&refused).kind,
        ErrorKind::UnknownTool
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_the_schema_front_doors_use_the_envelope() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let admin = platform.admin_token();

    let (status, body) = get(&platform, Some(&admin), "?format=gemini").await;
    assert_eq!(
        (status, envelope_kind(&body)),
        (400, "invalid-argument"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gemini")
    );
    let (status, body) = get(&platform, Some(&admin), "?format=openai&fromat=x").await;
    assert_eq!(
        (status, envelope_kind(&body)),
        (400, "invalid-argument"),
        "{body}"
    );
    let (status, body) = get(&platform, Some(&admin), "?tool=no-such-tool").await;
    assert_eq!(
        (status, envelope_kind(&body)),
        (404, "unknown-tool"),
        "{body}"
    );
    let (status, body) = get(&platform, None, "?format=openai").await;
    assert_eq!(
        (status, envelope_kind(&body)),
        (401, "unauthenticated"),
        "{body}"
    );
    let (status, body) = get(&platform, Some("not-a-token"), "?format=openai").await;
    assert_eq!(
        (status, envelope_kind(&body)),
        (401, "unauthenticated"),
        "{body}"
    );
    // No format: the plain JSON Schema view.
    let (status, body) = get(&platform, Some(&admin), "").await;
    assert_eq!(
        (status, body["format"].as_str()),
        (200, Some("json-schema"))
    );

    // The CLI: `toolgrid schema`.
    let out = platform.cli(
        &["schema", "--format", "anthropic", "--as", "reporter"],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        names(&answer),
        ["platform__signing-keys", "semver__compare", "textstats"]
    );
    let out = platform.cli(&["schema", "-f", "openai", "--tools-only", "semver"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tools.as_array().unwrap().len(), 2, "{tools}");
    let out = platform.cli(&["schema", "--format", "gemini"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid-argument"));
    let out = platform.cli(&["schema", "--format", "openai", "no-such-tool"], None);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown-tool"));
    let out = platform.cli(&["schema", "--format", "openai", "--token", "bad"], None);
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unauthenticated"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_help_is_generated_from_the_definition() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path()).await;
    let text = |args: &[&str]| {
        let out = platform.cli(args, None);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let tool = text(&["call", "semver", "--help"]);
    for expected in [
        "semver: Compare and bump semantic versions",
        "Usage: toolgrid call semver COMMAND [ARGS...]",
        "compare <a> <b>",
        "bump <version> [--part PART]",
        "Effect: read (no effect outside the call; safe to retry)",
    ] {
        assert!(tool.contains(expected), "{expected:?} in:\n{tool}");
    }

    let compare = text(&["call", "semver", "compare", "--help"]);
    for expected in [
        "Usage: toolgrid call semver compare <a> <b>",
        "<a>  string, required  The first version.",
        "<b>  string, required  The second version.",
        "Result: object {a, b, order}",
        "invalid-version (exit code 3)  An input is not a semantic version",
        "bad-arguments (exit code 2)",
        "Effect: read",
    ] {
        assert!(compare.contains(expected), "{expected:?} in:\n{compare}");
    }
    let bump = text(&["call", "semver", "bump", "--help"]);
    assert!(
        bump.contains("--part VALUE  one of: major, minor, patch, default: \"patch\"  Which part to increment."),
        "{bump}"
    );
    // Options may come before --help, and toolgrid's own options too.
    let textstats = text(&["call", "textstats", "--help", "-n", "default"]);
    assert!(
        textstats.contains(
            "Usage: toolgrid call textstats [count] [--top TOP] [--ignore-case] [--stdin FILE|-]"
        ),
        "{textstats}"
    );
    assert!(
        textstats.contains("--top VALUE  integer, >= 0, <= 100, default: 5"),
        "{textstats}"
    );
    assert!(textstats.contains("Stdin (text, optional)"), "{textstats}");
    let fetch = text(&["call", "fetch", "--help"]);
    assert!(
        fetch.contains("--max-bytes VALUE  integer, >= 1, <= 10485760, default: 20000"),
        "{fetch}"
    );
    let hostile = text(&["call", HOSTILE_TOOL, "--help"]);
    assert!(
        hostile.contains("Effect: write (changes the world"),
        "{hostile}"
    );
    assert!(
        hostile.contains("free-form [--anything ANYTHING]"),
        "{hostile}"
    );

    // The agent's help shows only what it may call.
    let mine = text(&["call", "semver", "--help", "--token", AGENT_TOKEN]);
    assert!(
        mine.contains("compare] <a> <b>") && !mine.contains("bump"),
        "{mine}"
    );

    // Unknown tool or command: their error kinds.
    let out = platform.cli(&["call", "no-such-tool", "--help"], None);
    assert_eq!(out.status.code(), Some(4));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown-tool"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = platform.cli(&["call", "semver", "nope", "--help"], None);
    assert_eq!(out.status.code(), Some(4));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown-command"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = platform.cli(&["call", "uuid", "--help", "--token", AGENT_TOKEN], None);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown-tool"));
    // After `--`, --help is the tool's argument: the call runs (and semver refuses it).
    let out = platform.cli(
        &["call", "semver", "compare", "--", "--help", "1.0.0"],
        None,
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Usage:"));
}
