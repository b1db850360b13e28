//! Admission's third step: the request itself, checked against the command before anything
//! is recorded: arguments (argv parsed by the command's definition, `args` by name merged
//! over them) validated against their schemas, stdin against its, the idempotency key
//! bounded; and the request's fingerprint.

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::interface::{CommandInterface, ValidArgs};

/// The longest idempotency key taken.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// A request that passed its command's checks.
#[derive(Clone, Debug)]
pub(super) struct Request {
    pub args: ValidArgs,
    /// The caller's key, when it gave a non-empty one.
    pub idempotency_key: Option<String>,
}

/// Checks a request against `command`.
pub(super) fn validate(
    command: &CommandInterface,
    argv: &[String],
    args: Option<Value>,
    stdin: Option<&[u8]>,
    idempotency_key: Option<String>,
) -> Result<Request, ApiError> {
    let mut parsed = command.parse_argv(argv)?;
    match args {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => parsed.extend(map),
        Some(other) => {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                format!("args must be a JSON object of arguments by name, not {other}"),
            ));
        }
    }
    let args = command.validate(parsed)?;
    command.check_stdin(stdin)?;
    let idempotency_key = idempotency_key.filter(|k| !k.is_empty());
    if let Some(key) = &idempotency_key
        && key.len() > MAX_IDEMPOTENCY_KEY_BYTES
    {
        return Err(ApiError::new(
            ErrorKind::InvalidArgument,
            format!("the idempotency key is longer than {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
        ));
    }
    Ok(Request {
        args,
        idempotency_key,
    })
}

/// Fingerprint of a request: the same key with a different request is a conflict, and an
/// agent's request with the same fingerprint within the repeat window is a repeat. A dry
/// run is a different request from the real call (so a dry run never makes the real call
/// a repeat, and its idempotency key never answers the real call with the dry run's
/// result); other fingerprints are as before dry runs existed.
pub(super) fn request_hash(
    namespace: &str,
    tool: &str,
    command: &str,
    args: &Value,
    stdin: &[u8],
    dry_run: bool,
) -> String {
    // The compact JSON of an object of these fields with its keys in order (as serde_json
    // writes a `Map`: sorted), written straight into the hash: stored fingerprints stay
    // comparable, and the arguments are neither copied nor written out to a string first.
    #[derive(serde::Serialize)]
    struct Fingerprinted<'a> {
        args: &'a Value,
        command: &'a str,
        #[serde(rename = "dryRun", skip_serializing_if = "std::ops::Not::not")]
        dry_run: bool,
        namespace: &'a str,
        stdin: String,
        tool: &'a str,
    }
    let fingerprinted = Fingerprinted {
        args,
        command,
        dry_run,
        namespace,
        stdin: hex::encode(Sha256::digest(stdin)),
        tool,
    };
    // The hasher is a `Write` that cannot fail, and a `Value` and strings serialize.
    let mut hasher = Sha256::new();
    if serde_json::to_writer(&mut hasher, &fingerprinted).is_err() {
        unreachable!("serializing JSON values and strings into a hash cannot fail");
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, json};

    fn command() -> CommandInterface {
        let command = serde_json::from_value(json!({
            "name": "count",
            "options": [{"name": "top", "schema": {"type": "integer", "minimum": 0}}],
        }))
        .unwrap();
        CommandInterface::compile(&command, "command").unwrap()
    }

    #[test]
    fn arguments_by_name_merge_over_argv_and_are_validated() {
        let argv = ["--top".to_string(), "1".to_string()];
        let request = validate(&command(), &argv, Some(json!({"top": 3})), None, None).unwrap();
        assert_eq!(request.args.0["top"], json!(3));
        let error = validate(&command(), &[], Some(json!({"top": -1})), None, None).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        let error = validate(&command(), &[], Some(json!([1])), None, None).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn an_empty_key_is_none_and_a_long_one_is_refused() {
        let empty = validate(&command(), &[], None, None, Some(String::new())).unwrap();
        assert_eq!(empty.idempotency_key, None);
        let longest = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES);
        assert!(validate(&command(), &[], None, None, Some(longest)).is_ok());
        let error = validate(&command(), &[], None, None, Some("k".repeat(256))).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
    }

    /// The fingerprint as it was first made (an object of the fields, written out, then
    /// hashed): fingerprints stored by earlier versions must still match.
    fn fingerprint_as_first_made(
        namespace: &str,
        tool: &str,
        command: &str,
        args: &Value,
        stdin: &[u8],
        dry_run: bool,
    ) -> String {
        let mut map = Map::new();
        if dry_run {
            map.insert("dryRun".into(), json!(true));
        }
        map.insert("namespace".into(), json!(namespace));
        map.insert("tool".into(), json!(tool));
        map.insert("command".into(), json!(command));
        map.insert("args".into(), args.clone());
        map.insert("stdin".into(), json!(hex::encode(Sha256::digest(stdin))));
        hex::encode(Sha256::digest(Value::Object(map).to_string().as_bytes()))
    }

    #[test]
    fn the_fingerprint_is_the_one_earlier_versions_stored() {
        let cases = [
            ("default", "semver", "compare", json!({}), &b""[..], false),
            ("default", "semver", "compare", json!({}), &b""[..], true),
            (
                "team-a",
                "t\u{e9}l\u{e9}",
                "c\"md",
                json!({"z": [1, 2.5, null, "x\ny"], "a": {"nested": true, "b": -3}, "\u{1F600}": ""}),
                &b"\x00\xffstdin"[..],
                false,
            ),
            ("ns", "tool", "run", json!({"k": "v"}), &b"in"[..], true),
        ];
        for (namespace, tool, command, args, stdin, dry_run) in cases {
            assert_eq!(
                request_hash(namespace, tool, command, &args, stdin, dry_run),
                fingerprint_as_first_made(namespace, tool, command, &args, stdin, dry_run),
                "{namespace} {tool} {command} {args} dry_run={dry_run}"
            );
        }
    }

    #[test]
    fn a_dry_run_is_a_different_request() {
        let hash = |dry_run| request_hash("default", "t", "c", &json!({}), b"", dry_run);
        assert_ne!(hash(true), hash(false));
        assert_eq!(hash(false), hash(false));
        assert_ne!(
            request_hash("default", "t", "c", &json!({}), b"a", false),
            hash(false)
        );
    }
}
