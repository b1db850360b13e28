//! The TypeScript client of one tool: no dependencies (the platform's `fetch`), a type per
//! result, one async method per command (positionals as parameters; options, flags and
//! stdin in one options object), declared errors as classes under
//! `<Tool>Error extends ToolgridError` (check them with `instanceof`).

use crate::defs::ToolDef;
use crate::names::{Idents, Lang, camel, comment_text, pascal, quoted};
use crate::types::{TypeSyntax, type_of};
use serde_json::{Map, Value};
use std::fmt::Write as _;
use toolgrid_api::Command;

/// TypeScript's reserved and strict-mode words, and the names the generated code uses.
pub static TYPESCRIPT: Lang = Lang {
    keywords: &[
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "enum",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "import",
        "in",
        "instanceof",
        "new",
        "null",
        "return",
        "super",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "typeof",
        "var",
        "void",
        "while",
        "with",
        "as",
        "implements",
        "interface",
        "let",
        "package",
        "private",
        "protected",
        "public",
        "static",
        "yield",
        "await",
        "async",
        "any",
        "boolean",
        "number",
        "string",
        "symbol",
        "type",
        "from",
        "of",
        "arguments",
        "eval",
        "undefined",
        "unknown",
        "never",
        "object",
        "declare",
        "module",
        "namespace",
        "require",
        "get",
        "set",
        "constructor",
        "fetch",
        "globalThis",
        "Error",
        "Promise",
        "JSON",
        "Record",
        "Array",
    ],
};

/// A TypeScript string literal (ASCII only, every other character escaped).
pub fn ts_str(text: &str) -> String {
    quoted(text, |c| format!("\\u{{{c:x}}}"))
}

/// `semver.ts`.
pub fn file_name(tool: &ToolDef) -> String {
    format!("{}.ts", crate::names::snake(&tool.name).replace('_', "-"))
}

fn literal(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(ts_str(s)),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("null".into()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// TypeScript's spelling of types.
struct TypeScript;

impl TypeSyntax for TypeScript {
    const ANY: &'static str = "unknown";
    const UNTYPED_PROPERTIES_ARE_OBJECTS: bool = true;

    fn literal(value: &Value) -> Option<String> {
        literal(value)
    }

    fn literals(literals: &[String]) -> String {
        format!("({})", literals.join(" | "))
    }

    fn union(types: &[String]) -> String {
        format!("({})", types.join(" | "))
    }

    fn scalar(json_type: &str) -> Option<&'static str> {
        Some(match json_type {
            "string" => "string",
            "integer" | "number" => "number",
            "boolean" => "boolean",
            "null" => "null",
            _ => return None,
        })
    }

    fn array(items: &str) -> String {
        format!("Array<{items}>")
    }

    fn object(obj: &Map<String, Value>, property: &dyn Fn(&Value) -> String) -> String {
        let Some(properties) = obj.get("properties").and_then(Value::as_object) else {
            return "{ [key: string]: unknown }".into();
        };
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut fields: Vec<String> = properties
            .iter()
            .map(|(k, v)| {
                let optional = if required.contains(&k.as_str()) {
                    ""
                } else {
                    "?"
                };
                format!("{}{optional}: {}", ts_str(k), property(v))
            })
            .collect();
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            fields.push("[key: string]: unknown".into());
        }
        format!("{{ {} }}", fields.join("; "))
    }
}

/// The TypeScript type of a JSON Schema (`unknown` where it cannot say more).
pub fn ts_type(schema: &Value, depth: usize) -> String {
    type_of::<TypeScript>(schema, depth)
}

fn value_type(schema: Option<&Value>) -> String {
    schema.map_or("string".into(), |s| ts_type(s, 0))
}

/// The source of the client module.
pub fn generate(tool: &ToolDef) -> String {
    let mut types = Idents::new(
        &TYPESCRIPT,
        &[
            "ToolgridError",
            "AwaitingApproval",
            "ClientOptions",
            "CallOptions",
            "DECLARED",
            "outcome",
        ],
    );
    let base_error = types.claim(&format!("{}Error", pascal(&tool.name)));
    let client = types.claim(&format!("{}Client", pascal(&tool.name)));
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"// Generated by `toolgrid gen client --lang typescript`. Do not edit: generate it again
// when the Tool changes. No dependencies: it uses the platform's fetch (Node 18+, browsers).
// Tool: {name} (effect: {effect}). {description}

/** A call that did not succeed: `kind` is toolgrid's error kind (tool-error, invalid-argument, unauthenticated, ...), `errorName` the declared error's name, `call` the call record when there is one. */
export class ToolgridError extends Error {{
  readonly kind: string;
  readonly errorName: string;
  readonly status: number;
  readonly call: Record<string, unknown> | undefined;
  constructor(kind: string, message: string, errorName = "", status = 0, call?: Record<string, unknown>) {{
    super(kind + ": " + message);
    this.name = new.target.name;
    this.kind = kind;
    this.errorName = errorName;
    this.status = status;
    this.call = call;
  }}
}}

/** The call waits for a person's approval; `callId` names it (GET /v1/calls/ID?wait=true). */
export class AwaitingApproval extends ToolgridError {{
  get callId(): string {{
    return String(this.call?.["id"] ?? "");
  }}
}}

/** A declared error of this tool. */
export class {base_error} extends ToolgridError {{}}
"#,
        name = comment_text(&tool.name),
        effect = comment_text(&tool.effect),
        description = comment_text(&tool.description),
    );
    let mut declared = Vec::new();
    for error in tool.errors() {
        let class = types.claim(&format!("{}Error", pascal(&error.name)));
        let _ = writeln!(
            out,
            "/** {} (exit code {}): {} */\nexport class {class} extends {base_error} {{\n  static readonly errorName = {};\n}}\n",
            comment_text(&error.name),
            error.exit_code,
            comment_text(&error.description),
            ts_str(&error.name),
        );
        declared.push((error.name.clone(), class));
    }
    let _ = writeln!(
        out,
        r#"type ErrorClass = new (kind: string, message: string, errorName: string, status: number, call?: Record<string, unknown>) => ToolgridError;
const DECLARED: Record<string, ErrorClass> = {{ {declared} }};

export interface ClientOptions {{
  /** Default: $TOOLGRID_URL, else http://127.0.0.1:7071. */
  baseUrl?: string;
  /** Default: $TOOLGRID_TOKEN. */
  token?: string;
  /** Default: $TOOLGRID_NAMESPACE, else "default". */
  namespace?: string;
  fetch?: typeof fetch;
}}

export interface CallOptions {{
  idempotencyKey?: string;
  signal?: AbortSignal;
}}

function outcome(status: number, payload: unknown): unknown {{
  if (typeof payload !== "object" || payload === null || Array.isArray(payload)) {{
    throw new ToolgridError("internal", "the answer is not a JSON object", "", status);
  }}
  const body = payload as Record<string, unknown>;
  const error = body["error"];
  if (typeof error === "object" && error !== null) {{
    const e = error as Record<string, unknown>;
    const kind = String(e["kind"] ?? "internal");
    const name = String(e["name"] ?? "");
    const call = "id" in body ? body : undefined;
    const Class: ErrorClass = Object.prototype.hasOwnProperty.call(DECLARED, name) ? DECLARED[name]! : ToolgridError;
    throw new Class(kind, String(e["message"] ?? ""), name, status, call);
  }}
  if (status === 202 || body["state"] === "awaiting-approval") {{
    throw new AwaitingApproval("awaiting-approval", "the call waits for approval", "", status, body);
  }}
  return body["result"];
}}
"#,
        declared = declared
            .iter()
            .map(|(name, class)| format!("{}: {class}", ts_str(name)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let mut commands = Vec::new();
    for command in &tool.commands {
        commands.push(command_types(&mut out, &mut types, command));
    }
    let _ = writeln!(
        out,
        r#"/** Calls the tool {name} through toolgrid's HTTP API. */
export class {client} {{
  private readonly baseUrl: string;
  private readonly token: string | undefined;
  private readonly namespace: string;
  private readonly fetcher: typeof fetch;

  constructor(options: ClientOptions = {{}}) {{
    const env = (globalThis as {{ process?: {{ env?: Record<string, string | undefined> }} }}).process?.env ?? {{}};
    this.baseUrl = (options.baseUrl ?? env["TOOLGRID_URL"] ?? "http://127.0.0.1:7071").replace(/\/+$/, "");
    this.token = options.token ?? env["TOOLGRID_TOKEN"];
    this.namespace = options.namespace ?? env["TOOLGRID_NAMESPACE"] ?? "default";
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }}

  private async send(command: string, args: Record<string, unknown>, stdin: string | undefined, call: CallOptions): Promise<unknown> {{
    const body: Record<string, unknown> = {{ args }};
    if (stdin !== undefined) body["stdin"] = stdin;
    if (call.idempotencyKey !== undefined) body["idempotencyKey"] = call.idempotencyKey;
    const headers: Record<string, string> = {{ "content-type": "application/json", accept: "application/json" }};
    if (this.token) headers["authorization"] = "Bearer " + this.token;
    const url = this.baseUrl + "/v1/namespaces/" + encodeURIComponent(this.namespace) + "/tools/" + encodeURIComponent({tool}) + "/" + encodeURIComponent(command) + ":call";
    const init: RequestInit = {{ method: "POST", headers, body: JSON.stringify(body) }};
    if (call.signal) init.signal = call.signal;
    const response = await this.fetcher(url, init);
    const text = await response.text();
    let payload: unknown;
    try {{
      payload = text ? JSON.parse(text) : null;
    }} catch {{
      throw new ToolgridError("internal", text, "", response.status);
    }}
    return outcome(response.status, payload);
  }}
"#,
        name = comment_text(&tool.name),
        tool = ts_str(&tool.name),
    );
    let mut methods = Idents::new(
        &TYPESCRIPT,
        &["baseUrl", "token", "namespace", "fetcher", "send"],
    );
    for (command, types) in tool.commands.iter().zip(&commands) {
        method(&mut out, &mut methods, tool, command, types);
    }
    out.push_str("}\n");
    out
}

/// The names of a command's result and options types.
struct CommandTypes {
    result: String,
    options: Option<(String, bool)>,
    /// (wire name, key in the options object) for options, flags and stdin.
    keys: Vec<(String, String, Kind)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Option,
    Flag,
    StdinText,
    StdinJson,
}

fn command_types(out: &mut String, types: &mut Idents, command: &Command) -> CommandTypes {
    let result = types.claim(&format!("{}Result", pascal(&command.name)));
    let _ = writeln!(
        out,
        "/** The result of {}. */\nexport type {result} = {};\n",
        comment_text(&command.name),
        command
            .result
            .as_ref()
            .map_or("unknown".into(), |s| ts_type(s, 0))
    );
    let mut keys_taken = Idents::new(&NO_KEYWORDS, &[]);
    let mut fields = Vec::new();
    let mut keys = Vec::new();
    let mut any_required = false;
    for o in &command.options {
        let key = keys_taken.claim(&camel(&o.name));
        let required = o.required && o.default.is_none();
        any_required |= required;
        let default = o
            .default
            .as_ref()
            .map(|d| format!(" Default: {}.", comment_text(&d.to_string())))
            .unwrap_or_default();
        fields.push(format!(
            "  /** --{}: {}{default} */\n  {}{}: {};",
            comment_text(&o.name),
            comment_text(&o.description),
            ts_str(&key),
            if required { "" } else { "?" },
            value_type(o.schema.as_ref())
        ));
        keys.push((o.name.clone(), key, Kind::Option));
    }
    for f in &command.flags {
        let key = keys_taken.claim(&camel(&f.name));
        fields.push(format!(
            "  /** --{}: {} */\n  {}?: boolean;",
            comment_text(&f.name),
            comment_text(&f.description),
            ts_str(&key)
        ));
        keys.push((f.name.clone(), key, Kind::Flag));
    }
    if let Some(stdin) = &command.stdin {
        let key = keys_taken.claim("stdin");
        let text = stdin
            .schema
            .as_ref()
            .is_none_or(|s| s.get("type") == Some(&Value::String("string".into())));
        any_required |= stdin.required;
        fields.push(format!(
            "  /** stdin ({}): {} */\n  {}{}: {};",
            if text { "text" } else { "a JSON document" },
            comment_text(&stdin.description),
            ts_str(&key),
            if stdin.required { "" } else { "?" },
            if text {
                "string".into()
            } else {
                value_type(stdin.schema.as_ref())
            }
        ));
        keys.push((
            String::new(),
            key,
            if text {
                Kind::StdinText
            } else {
                Kind::StdinJson
            },
        ));
    }
    let options = if fields.is_empty() {
        None
    } else {
        let name = types.claim(&format!("{}Options", pascal(&command.name)));
        let _ = writeln!(
            out,
            "/** Options of {}. */\nexport interface {name} {{\n{}\n}}\n",
            comment_text(&command.name),
            fields.join("\n")
        );
        Some((name, any_required))
    };
    CommandTypes {
        result,
        options,
        keys,
    }
}

/// For object keys: any identifier-like spelling, no keywords to avoid.
pub static NO_KEYWORDS: Lang = Lang { keywords: &[] };

fn method(
    out: &mut String,
    methods: &mut Idents,
    tool: &ToolDef,
    command: &Command,
    types: &CommandTypes,
) {
    let name = methods.claim(&camel(&command.name));
    let mut params = Idents::new(&TYPESCRIPT, &["options", "call", "args", "stdin"]);
    let mut signature = Vec::new();
    let mut body = vec!["const args: Record<string, unknown> = {};".to_string()];
    for p in &command.positional {
        let ident = params.claim(&camel(&p.name));
        let mut ty = value_type(p.schema.as_ref());
        if p.variadic {
            ty = format!("Array<{ty}>");
        }
        if p.required {
            signature.push(format!("{ident}: {ty}"));
            body.push(format!("args[{}] = {ident};", ts_str(&p.name)));
        } else {
            signature.push(format!("{ident}: {ty} | undefined = undefined"));
            body.push(format!(
                "if ({ident} !== undefined) args[{}] = {ident};",
                ts_str(&p.name)
            ));
        }
    }
    let mut stdin = "undefined".to_string();
    if let Some((options, required)) = &types.options {
        if *required {
            signature.push(format!("options: {options}"));
        } else {
            signature.push(format!("options: {options} = {{}}"));
        }
        for (wire, key, kind) in &types.keys {
            let read = format!("options[{}]", ts_str(key));
            match kind {
                Kind::Option => body.push(format!(
                    "if ({read} !== undefined) args[{}] = {read};",
                    ts_str(wire)
                )),
                Kind::Flag => body.push(format!("if ({read}) args[{}] = true;", ts_str(wire))),
                Kind::StdinText => stdin = read,
                Kind::StdinJson => {
                    stdin = format!("{read} === undefined ? undefined : JSON.stringify({read})")
                }
            }
        }
    }
    signature.push("call: CallOptions = {}".into());
    let errors = command
        .errors
        .iter()
        .map(|e| format!("{}Error ({})", pascal(&e.name), e.name))
        .collect::<Vec<_>>()
        .join(", ");
    let description = if command.description.is_empty() {
        &tool.description
    } else {
        &command.description
    };
    let _ = writeln!(
        out,
        "  /** {}{} Effect: {}. */\n  async {name}({}): Promise<{}> {{\n    {}\n    return (await this.send({}, args, {stdin}, call)) as {};\n  }}\n",
        comment_text(description),
        if errors.is_empty() {
            String::new()
        } else {
            format!(" Throws: {}.", comment_text(&errors))
        },
        comment_text(&tool.effect),
        signature.join(", "),
        types.result,
        body.join("\n    "),
        ts_str(&command.name),
        types.result,
    );
}

/// One command as a code-mode program calls it.
pub struct StubCommand<'a> {
    pub name: &'a str,
    pub description: &'a str,
    /// The JSON Schema of the arguments by name (an object).
    pub args: &'a Value,
    pub result: Option<&'a Value>,
}

/// One tool as a code-mode program calls it.
pub struct StubTool<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub commands: Vec<StubCommand<'a>>,
}

/// The TypeScript declaration of `tools` a code-mode program calls:
/// `await tools.<tool>.<command>(args)`, each command with its arguments and result typed
/// from their schemas and the first sentence of its description. A name is written in
/// camelCase when the program's camelCase-to-kebab-case mapping gives it back, else quoted
/// (`tools["a--b"]`).
pub fn stubs(tools: &[StubTool]) -> String {
    let key = member;
    let mut out = String::from("declare const tools: {\n");
    for tool in tools {
        if !tool.description.is_empty() {
            let _ = writeln!(
                out,
                "  /** {} */",
                comment_text(&first_sentence(tool.description))
            );
        }
        let _ = writeln!(out, "  {}: {{", key(tool.name));
        for command in &tool.commands {
            if !command.description.is_empty() {
                let _ = writeln!(
                    out,
                    "    /** {} */",
                    comment_text(&first_sentence(command.description))
                );
            }
            let _ = writeln!(
                out,
                "    {}(args: {}): Promise<{}>;",
                key(command.name),
                ts_type(command.args, 1),
                command.result.map_or("unknown".into(), |r| ts_type(r, 1)),
            );
        }
        out.push_str("  };\n");
    }
    out.push_str("};\n");
    out
}

/// One command's call as a program writes it:
/// `tools.webFetch.get(args: {...}): Promise<{...}>`.
pub fn signature(tool: &str, command: &StubCommand) -> String {
    let path = |name: &str| {
        let key = member(name);
        if key.starts_with('"') {
            format!("[{key}]")
        } else {
            format!(".{key}")
        }
    };
    format!(
        "tools{}{}(args: {}): Promise<{}>",
        path(tool),
        path(command.name),
        ts_type(command.args, 1),
        command.result.map_or("unknown".into(), |r| ts_type(r, 1)),
    )
}

/// A tool's or command's name as a member of `tools`: camelCase when the program's
/// camelCase-to-kebab-case mapping gives it back, else a quoted key.
fn member(name: &str) -> String {
    let ident = camel(name);
    if !ident.is_empty()
        && kebab(&ident) == name
        && !ident.starts_with(|c: char| c.is_ascii_digit())
    {
        ident
    } else {
        ts_str(name)
    }
}

/// `webFetch` -> `web-fetch`, as the code tool's `tools` object reads a name.
fn kebab(ident: &str) -> String {
    let mut out = String::with_capacity(ident.len() + 4);
    for c in ident.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The first sentence of a description (at most 200 characters).
fn first_sentence(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = text.find(". ").map(|i| i + 1).unwrap_or(text.len());
    text.chars().take(end.min(200)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_follow_schemas() {
        assert_eq!(ts_type(&json!({"type": "integer"}), 0), "number");
        assert_eq!(
            ts_type(&json!({"enum": [-1, 0, "x"]}), 0),
            r#"(-1 | 0 | "x")"#
        );
        assert_eq!(
            ts_type(
                &json!({"type": "object", "properties": {"a-b": {"type": "string"}},
                        "required": ["a-b"], "additionalProperties": false}),
                0
            ),
            r#"{ "a-b": string }"#
        );
        assert_eq!(
            ts_type(&json!({"type": "object"}), 0),
            "{ [key: string]: unknown }"
        );
        assert_eq!(ts_str("\u{1f600}"), r#""\u{1f600}""#);
    }

    #[test]
    fn stubs_type_each_command_a_program_may_call() {
        let args = serde_json::json!({"type": "object", "properties": {"url": {"type": "string"}, "offset": {"type": "integer"}}, "required": ["url"]});
        let result =
            serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}});
        let text = stubs(&[
            StubTool {
                name: "web-fetch",
                description: "Fetch a page. Then more words.",
                commands: vec![StubCommand {
                    name: "get",
                    description: "Get it */ now",
                    args: &args,
                    result: Some(&result),
                }],
            },
            StubTool {
                name: "a--b",
                description: "",
                commands: vec![],
            },
        ]);
        assert!(text.contains("  webFetch: {"), "{text}");
        assert!(text.contains("/** Fetch a page. */"), "{text}");
        assert!(text.contains("get(args: "), "{text}");
        assert!(text.contains("\"url\": string"), "{text}");
        assert!(text.contains("\"offset\"?: number"), "{text}");
        assert!(text.contains("Promise<"), "{text}");
        assert!(
            !text.contains("*/ now"),
            "a description cannot close the comment: {text}"
        );
        assert!(text.contains("\"a--b\": {"), "{text}");
        let command = StubCommand {
            name: "get",
            description: "",
            args: &args,
            result: None,
        };
        assert!(
            signature("web-fetch", &command).starts_with("tools.webFetch.get(args: {"),
            "{}",
            signature("web-fetch", &command)
        );
        assert!(signature("a--b", &command).starts_with("tools[\"a--b\"].get("));
    }
}
