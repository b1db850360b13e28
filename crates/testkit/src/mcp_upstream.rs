//! The MCP server written with the official Python SDK (`tests/fixtures/mcp/upstream_server.py`,
//! PyPI `mcp` 2.x, both protocol eras), started on a free loopback port for a test; its
//! `record` tool counts calls by idempotency key into a JSON file.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running fixture server; killed when dropped.
pub struct McpUpstream {
    child: Child,
    pub port: u16,
    /// The `record` tool's counts by idempotency key (JSON; absent until a call).
    pub counts: PathBuf,
    dir: PathBuf,
}

impl Drop for McpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl McpUpstream {
    /// Starts the server, or `None` (after [`crate::require`]: a failure under CI=true)
    /// when python3 with `mcp` is missing.
    pub fn start() -> Option<McpUpstream> {
        let have = Command::new("python3")
            .args(["-c", "import mcp.server.mcpserver"])
            .status()
            .is_ok_and(|s| s.success());
        if !crate::require(
            "python3 with the `mcp` package (pip install mcp==2.3.0)",
            have,
        ) {
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "toolgrid-mcp-upstream-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let counts = dir.join("counts.json");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/mcp/upstream_server.py");
        let child = Command::new("python3")
            .arg(script)
            .args(["--port", &port.to_string(), "--counts"])
            .arg(&counts)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let upstream = McpUpstream {
            child,
            port,
            counts,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the MCP upstream did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(upstream)
    }

    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}
