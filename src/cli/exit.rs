//! Exit codes of the client commands.

/// The call ran and failed (tool error, limit, trap, ...).
pub const CALL_FAILED: u8 = 1;
/// Bad usage or arguments.
pub const USAGE: u8 = 2;
/// The platform cannot take the call now (unreachable, no release, no worker).
pub const UNAVAILABLE: u8 = 3;
/// No such tool, command or call.
pub const NOT_FOUND: u8 = 4;
/// No valid token, or the caller may not do this.
pub const DENIED: u8 = 6;
/// Anything else.
pub const INTERNAL: u8 = 5;
/// The call was recorded and waits for approval (`toolgrid approve CALL_ID`).
pub const AWAITING_APPROVAL: u8 = 7;
