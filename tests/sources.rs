//! Tools from elsewhere, read from real third-party MCP servers: the reference
//! `@modelcontextprotocol/server-everything` (TypeScript SDK 1.x, `streamableHttp`, sessions
//! of the legacy era) and a server written with the official Python SDK (PyPI `mcp` 2.x,
//! `tests/fixtures/mcp/upstream_server.py`, the 2026-07-28 era): each listed by
//! `toolgrid_upstream::mcp` and imported by `toolgrid_catalog::sources::mcp` into the tools
//! a ToolSource offers, with effects from the servers' annotations; a call and an upstream
//! error through the same client. Without Node 22 or python3 with `mcp` the test skips
//! with the reason, except under `CI=true`, where it fails.

use crate::common;

use common::{ChildGuard, free_port, wait_for_port};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::Stdio;
use toolgrid_catalog::sources::mcp::read_mcp_tools;
use toolgrid_core::source::{LeftOutReason, SourceLimits, ToolFilter, UpstreamTarget};
use toolgrid_core::spec::Effect;
use toolgrid_upstream::egress::EgressPolicy;
use toolgrid_upstream::mcp::{Era, McpLimits, McpServer, ToolOutcomeError, outcome_of};

/// The test's upstreams are on loopback, over plain HTTP: a ToolSource says so explicitly.
fn loopback(url: String, era: Era) -> McpServer {
    McpServer {
        url,
        headers: Vec::new(),
        egress: EgressPolicy {
            allow_http: true,
            allow_private: true,
        },
        era,
        limits: McpLimits::default(),
    }
}

#[tokio::test]
async fn the_reference_server_is_listed_imported_and_called_in_a_legacy_session() {
    let Some(mut command) = common::js_command("mcp-server-everything") else {
        return;
    };
    let port = free_port();
    let _upstream = ChildGuard(
        command
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server-everything"),
    );
    wait_for_port(port);
    let server = loopback(format!("http://127.0.0.1:{port}/mcp"), Era::Auto);
    let listing = server.list_tools().await.expect("tools/list");
    assert_eq!(listing.era, Era::Legacy, "the 1.x SDK holds sessions only");
    let snapshot = read_mcp_tools(
        &listing.tools,
        "everything",
        &ToolFilter::default(),
        &BTreeMap::new(),
        &SourceLimits::default(),
    );
    let names: Vec<&str> = snapshot.tools.iter().map(|t| t.name.as_str()).collect();
    for expected in ["echo", "get-sum"] {
        assert!(
            names.contains(&expected),
            "{expected} in {names:?} (left out: {:?})",
            snapshot.left_out
        );
    }
    let echo = snapshot.tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(
        echo.target,
        UpstreamTarget::Mcp {
            tool: "echo".into()
        }
    );
    assert!(
        echo.command
            .options
            .iter()
            .any(|o| o.name == "message" && o.required),
        "{:?}",
        echo.command.options
    );
    // Every listed tool is either imported or left out with a reason.
    assert_eq!(
        snapshot.tools.len() + snapshot.left_out.len(),
        listing.tools.len()
    );
    for tool in &snapshot.tools {
        let read_only = listing
            .tools
            .iter()
            .find(|t| t["name"] == tool.name.as_str())
            .and_then(|t| t["annotations"]["readOnlyHint"].as_bool())
            == Some(true);
        assert_eq!(tool.effect == Effect::Read, read_only, "{}", tool.name);
    }

    let echoed = server
        .call_tool(
            "echo",
            json!({"message": "hello upstream"}),
            Default::default(),
        )
        .await
        .expect("tools/call");
    let value = outcome_of(&echoed).expect("a value");
    assert!(value.to_string().contains("hello upstream"), "{value}");
}

#[tokio::test]
async fn a_python_server_of_the_2026_era_is_imported_with_effects_from_its_annotations() {
    let Some(upstream) = toolgrid_testkit::mcp_upstream::McpUpstream::start() else {
        return;
    };
    let server = loopback(upstream.url(), Era::Auto);
    let listing = server.list_tools().await.expect("tools/list");
    assert_eq!(listing.era, Era::Modern);
    let overrides = BTreeMap::from([("fail".to_string(), Effect::Read)]);
    let filter = ToolFilter {
        allow: vec![],
        deny: vec!["*record".into(), "grow".into()],
    };
    let snapshot = read_mcp_tools(
        &listing.tools,
        "py",
        &filter,
        &overrides,
        &SourceLimits::default(),
    );
    let effects: Vec<(&str, Effect)> = snapshot
        .tools
        .iter()
        .map(|t| (t.name.as_str(), t.effect))
        .collect();
    assert_eq!(
        effects,
        [
            ("add", Effect::Read),
            ("set_value", Effect::Idempotent),
            ("fail", Effect::Read)
        ]
    );
    let left_out: Vec<(&str, LeftOutReason)> = snapshot
        .left_out
        .iter()
        .map(|l| (l.name.as_str(), l.reason))
        .collect();
    assert_eq!(
        left_out,
        [
            ("record", LeftOutReason::NotAllowed),
            ("slow_record", LeftOutReason::NotAllowed),
            ("grow", LeftOutReason::NotAllowed)
        ]
    );
    // The output schema is the command's result schema.
    let add = &snapshot.tools[0];
    assert_eq!(
        add.command.result.as_ref().unwrap()["properties"]["sum"]["type"],
        "number"
    );

    let failed = server
        .call_tool("fail", json!({"reason": "quota"}), Default::default())
        .await
        .expect("tools/call");
    assert!(matches!(outcome_of(&failed), Err(ToolOutcomeError::Failed(m)) if m.contains("quota")));
}
