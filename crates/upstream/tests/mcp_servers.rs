//! The MCP client against a real server written with the official Python SDK (PyPI `mcp`
//! 2.x, `tests/fixtures/mcp/upstream_server.py`), which serves both eras on one endpoint:
//! listing and calling in the stateless 2026-07-28 revision (what `Era::Auto` picks) and in
//! a 2025-11-25 session, structured results, an upstream error, the idempotency key in
//! `_meta` reaching the server, and the egress refusals. Without python3 and `mcp` the test
//! skips with the reason, except under `CI=true`, where it fails.

use serde_json::{Value, json};
use std::time::Duration;
use toolgrid_testkit::mcp_upstream::McpUpstream;
use toolgrid_upstream::egress::{EgressError, EgressPolicy};
use toolgrid_upstream::mcp::{Era, McpError, McpLimits, McpServer, ToolOutcomeError, outcome_of};

fn server(port: u16, era: Era) -> McpServer {
    McpServer {
        url: format!("http://127.0.0.1:{port}/mcp"),
        headers: Vec::new(),
        // The test's upstream is on loopback, over plain HTTP.
        egress: EgressPolicy {
            allow_http: true,
            allow_private: true,
        },
        era,
        limits: McpLimits::default(),
    }
}

#[tokio::test]
async fn lists_and_calls_in_both_eras() {
    let Some(upstream) = McpUpstream::start() else {
        return;
    };
    for (era, expect) in [
        (Era::Auto, Era::Modern),
        (Era::Modern, Era::Modern),
        (Era::Legacy, Era::Legacy),
    ] {
        let server = server(upstream.port, era);
        let listing = server
            .list_tools()
            .await
            .unwrap_or_else(|e| panic!("{era:?}: {e}"));
        assert_eq!(listing.era, expect);
        let names: Vec<&str> = listing
            .tools
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["add", "set_value", "record", "slow_record", "grow", "fail"],
            "{era:?}"
        );
        assert_eq!(listing.tools[0]["annotations"]["readOnlyHint"], true);

        let sum = server
            .call_tool("add", json!({"a": 2, "b": 3}), Default::default())
            .await
            .unwrap();
        assert_eq!(
            sum["structuredContent"],
            json!({"sum": 5.0}),
            "{era:?}: {sum}"
        );
        assert_ne!(sum["isError"], true);
        assert_eq!(outcome_of(&sum), Ok(json!({"sum": 5.0})));

        let failed = server
            .call_tool("fail", json!({"reason": "nope"}), Default::default())
            .await
            .unwrap();
        assert_eq!(failed["isError"], true, "{era:?}: {failed}");
        assert!(
            matches!(outcome_of(&failed), Err(ToolOutcomeError::Failed(m)) if m.contains("upstream refused: nope")),
            "{failed}"
        );
    }
}

#[tokio::test]
async fn the_idempotency_key_reaches_the_upstream_in_meta() {
    let Some(upstream) = McpUpstream::start() else {
        return;
    };
    let server = server(upstream.port, Era::Auto);
    for key in ["call-1", "call-2", "call-1"] {
        let meta =
            serde_json::Map::from_iter([("toolgrid/idempotencyKey".to_string(), Value::from(key))]);
        let answer = server
            .call_tool("record", json!({"event": "e"}), meta)
            .await
            .unwrap();
        assert_ne!(answer["isError"], true, "{answer}");
    }
    let counts: Value = serde_json::from_slice(&std::fs::read(&upstream.counts).unwrap()).unwrap();
    assert_eq!(counts, json!({"call-1": 2, "call-2": 1}));
}

#[tokio::test]
async fn loopback_and_plain_http_are_refused_by_default() {
    let Some(upstream) = McpUpstream::start() else {
        return;
    };
    let mut refused = server(upstream.port, Era::Auto);
    refused.egress = EgressPolicy::default();
    assert!(matches!(
        refused.list_tools().await,
        Err(McpError::Egress(EgressError::Scheme { .. }))
    ));
    refused.egress.allow_http = true;
    assert!(matches!(
        refused.list_tools().await,
        Err(McpError::Egress(EgressError::Restricted {
            range: "loopback",
            ..
        }))
    ));
    // Nothing reached the server.
    assert!(!upstream.counts.exists());
}

#[tokio::test]
async fn garbage_and_silence_are_named_errors() {
    // A server that answers HTML, one that answers a huge body, one that never answers.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn serve(answer: Vec<u8>, delay: Duration) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 65536];
                    let _ = stream.read(&mut buffer).await;
                    tokio::time::sleep(delay).await;
                    let _ = stream.write_all(&answer).await;
                });
            }
        });
        port
    }
    let http = |body: &[u8]| {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let garbage = serve(http(b"<html>not json</html>"), Duration::ZERO).await;
    let mut huge = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[],\"x\":\"".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2 << 20));
    huge.extend_from_slice(b"\"}}");
    let huge = serve(http(&huge), Duration::ZERO).await;
    let silent = serve(Vec::new(), Duration::from_secs(60)).await;
    let with_limits = |port, limits| {
        let mut s = server(port, Era::Modern);
        s.limits = limits;
        s
    };
    let limits = McpLimits {
        max_response_bytes: 1 << 20,
        max_pages: 3,
        timeout: Duration::from_secs(2),
    };
    assert!(matches!(
        with_limits(garbage, limits).list_tools().await,
        Err(McpError::Garbage { .. })
    ));
    assert!(matches!(
        with_limits(huge, limits).list_tools().await,
        Err(McpError::TooLarge { .. })
    ));
    assert!(matches!(
        with_limits(silent, limits).list_tools().await,
        Err(McpError::Timeout { .. })
    ));
}
