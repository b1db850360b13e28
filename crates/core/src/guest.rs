//! The guest's filesystem layout: the fixed places a sandbox mounts things at. Both the
//! workspace (read-write, the agent's) and a release's read-only files are laid out against
//! it, so it sits below both [`crate::workspace`] and [`crate::artifact`].

/// Where a call sees its workspace inside the sandbox.
pub const WORKSPACE_DIR: &str = "/workspace";
