//! A command's typed interface, compiled once from its `Tool` definition: parse
//! command-line tokens, validate arguments and stdin against their schemas, build the
//! guest's argv, and judge its exit code and stdout.

use crate::call::CallError;
use crate::error::{ApiError, ErrorKind};
use crate::spec::{Command, DeclaredError};
use jsonschema::Validator;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The property of a model-facing input schema that carries stdin (so no argument of a
/// command that reads stdin may take its name).
pub const STDIN_PROPERTY: &str = "stdin";

/// A schema or definition problem, located by its field path in the resource.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Which names a command's arguments may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgumentNames {
    /// A Tool's own commands: kebab-case ([`is_kebab`]).
    Declared,
    /// An imported tool's (from an MCP server or an OpenAPI document): the upstream's
    /// names as they are, within what models accept
    /// ([`crate::source::valid_argument_name`]).
    Imported,
}

impl ArgumentNames {
    fn admits(self, name: &str) -> bool {
        match self {
            ArgumentNames::Declared => is_kebab(name),
            ArgumentNames::Imported => crate::source::valid_argument_name(name),
        }
    }

    fn rule(self) -> &'static str {
        match self {
            ArgumentNames::Declared => "lowercase letters, digits and dashes",
            ArgumentNames::Imported => "letters, digits, '-' and '_', at most 64",
        }
    }
}

/// True for names like `max-bytes`: lowercase letters, digits and inner dashes.
pub fn is_kebab(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn compile_schema(schema: &Value, field: &str) -> Result<Validator, FieldError> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(FieldError::new(field, "a JSON Schema must be an object"));
    }
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| FieldError::new(field, format!("not a valid JSON Schema: {e}")))
}

fn default_string_schema() -> Value {
    json!({"type": "string"})
}

/// Schema types a token may be read as, in order of preference.
fn declared_types(schema: &Value) -> Vec<String> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// Reads a command-line token as the JSON value the schema most likely wants; a token
/// that fits no declared type stays a string, so validation names the rule it breaks.
fn coerce(token: &str, schema: &Value) -> Value {
    for t in declared_types(schema) {
        match t.as_str() {
            "integer" => {
                if let Ok(i) = token.parse::<i64>() {
                    return json!(i);
                }
            }
            "number" => {
                if let Ok(i) = token.parse::<i64>() {
                    return json!(i);
                }
                if let Ok(f) = token.parse::<f64>()
                    && f.is_finite()
                {
                    return json!(f);
                }
            }
            "boolean" => match token {
                "true" => return Value::Bool(true),
                "false" => return Value::Bool(false),
                _ => {}
            },
            "null" if token == "null" => return Value::Null,
            "object" | "array" => {
                if let Ok(v) = serde_json::from_str::<Value>(token)
                    && (v.is_object() || v.is_array())
                {
                    return v;
                }
            }
            "string" => return Value::String(token.to_string()),
            _ => {}
        }
    }
    Value::String(token.to_string())
}

fn is_array_schema(schema: &Value) -> bool {
    declared_types(schema) == ["array"]
}

fn item_schema(schema: &Value) -> Value {
    schema.get("items").cloned().unwrap_or(Value::Bool(true))
}

fn invalid(message: String) -> ApiError {
    ApiError::new(ErrorKind::InvalidArgument, message)
}

struct PositionalRule {
    name: String,
    schema: Value,
    validator: Validator,
    required: bool,
    variadic: bool,
}

struct OptionRule {
    name: String,
    short: Option<char>,
    schema: Value,
    validator: Validator,
    default: Option<Value>,
    required: bool,
    repeated: bool,
}

struct FlagRule {
    name: String,
    short: Option<char>,
}

struct StdinRule {
    text: bool,
    validator: Validator,
    required: bool,
}

/// Arguments that passed validation, with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidArgs(pub Map<String, Value>);

/// One command of a tool, ready to check calls.
pub struct CommandInterface {
    pub name: String,
    pub description: String,
    positional: Vec<PositionalRule>,
    options: Vec<OptionRule>,
    flags: Vec<FlagRule>,
    stdin: Option<StdinRule>,
    stdin_schema: Option<Value>,
    result: Option<Validator>,
    result_schema: Option<Value>,
    errors: BTreeMap<i32, DeclaredError>,
    args_schema: Value,
    /// The definition compiled.
    definition: Arc<Command>,
}

impl std::fmt::Debug for CommandInterface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandInterface")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn short_of(short: &Option<String>, field: &str) -> Result<Option<char>, FieldError> {
    match short.as_deref() {
        None => Ok(None),
        Some(s) => {
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) if c.is_ascii_alphanumeric() => Ok(Some(c)),
                _ => Err(FieldError::new(
                    field,
                    format!("short name {s:?} must be one letter or digit"),
                )),
            }
        }
    }
}

impl CommandInterface {
    /// Checks a command definition (`field` is its path, e.g. `spec.commands[0]`) and
    /// compiles its schemas.
    pub fn compile(command: &Command, field: &str) -> Result<Self, FieldError> {
        CommandInterface::compile_with(command, field, ArgumentNames::Declared)
    }

    /// [`CommandInterface::compile`] with the argument-name rule `names`.
    pub fn compile_with(
        command: &Command,
        field: &str,
        argument_names: ArgumentNames,
    ) -> Result<Self, FieldError> {
        if !is_kebab(&command.name) {
            return Err(FieldError::new(
                format!("{field}.name"),
                format!(
                    "{:?} is not a valid command name (lowercase letters, digits and dashes)",
                    command.name
                ),
            ));
        }
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let mut shorts: BTreeMap<char, String> = BTreeMap::new();
        let mut claim = |name: &str, at: String| -> Result<(), FieldError> {
            if !argument_names.admits(name) {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!(
                        "{name:?} is not a valid argument name ({})",
                        argument_names.rule()
                    ),
                ));
            }
            if let Some(other) = names.insert(name.to_string(), at.clone()) {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!("argument name {name:?} is already used by {other}"),
                ));
            }
            // Model-facing front doors (MCP, model tool schemas) carry stdin as one more
            // property of the input object: an argument may not take its name.
            if command.stdin.is_some() && name == STDIN_PROPERTY {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!(
                        "argument name {name:?} is taken by the command's stdin in the input \
                         schema models and MCP clients see: rename the argument"
                    ),
                ));
            }
            Ok(())
        };

        let mut positional = Vec::new();
        let mut seen_optional = false;
        for (i, p) in command.positional.iter().enumerate() {
            let at = format!("{field}.positional[{i}]");
            claim(&p.name, at.clone())?;
            if p.variadic && i + 1 != command.positional.len() {
                return Err(FieldError::new(
                    format!("{at}.variadic"),
                    "only the last positional may be variadic",
                ));
            }
            if p.required && seen_optional {
                return Err(FieldError::new(
                    format!("{at}.required"),
                    "a required positional cannot follow an optional one",
                ));
            }
            seen_optional |= !p.required;
            let schema = p.schema.clone().unwrap_or_else(default_string_schema);
            let validator = compile_schema(&schema, &format!("{at}.schema"))?;
            positional.push(PositionalRule {
                name: p.name.clone(),
                schema,
                validator,
                required: p.required,
                variadic: p.variadic,
            });
        }

        let mut options = Vec::new();
        for (i, o) in command.options.iter().enumerate() {
            let at = format!("{field}.options[{i}]");
            claim(&o.name, at.clone())?;
            let short = short_of(&o.short, &format!("{at}.short"))?;
            if let Some(c) = short
                && let Some(other) = shorts.insert(c, at.clone())
            {
                return Err(FieldError::new(
                    format!("{at}.short"),
                    format!("-{c} is already used by {other}"),
                ));
            }
            let schema = o.schema.clone().unwrap_or_else(default_string_schema);
            let validator = compile_schema(&schema, &format!("{at}.schema"))?;
            if let Some(default) = &o.default
                && let Err(e) = validator.validate(default)
            {
                return Err(FieldError::new(
                    format!("{at}.default"),
                    format!("the default {default} breaks the option's schema: {e}"),
                ));
            }
            options.push(OptionRule {
                name: o.name.clone(),
                short,
                repeated: is_array_schema(&schema),
                schema,
                validator,
                default: o.default.clone(),
                required: o.required,
            });
        }

        let mut flags = Vec::new();
        for (i, f) in command.flags.iter().enumerate() {
            let at = format!("{field}.flags[{i}]");
            claim(&f.name, at.clone())?;
            let short = short_of(&f.short, &format!("{at}.short"))?;
            if let Some(c) = short
                && let Some(other) = shorts.insert(c, at.clone())
            {
                return Err(FieldError::new(
                    format!("{at}.short"),
                    format!("-{c} is already used by {other}"),
                ));
            }
            flags.push(FlagRule {
                name: f.name.clone(),
                short,
            });
        }

        let (stdin, stdin_schema) = match &command.stdin {
            None => (None, None),
            Some(spec) => {
                let schema = spec.schema.clone().unwrap_or_else(default_string_schema);
                let validator = compile_schema(&schema, &format!("{field}.stdin.schema"))?;
                let text = declared_types(&schema) == ["string"];
                (
                    Some(StdinRule {
                        text,
                        validator,
                        required: spec.required,
                    }),
                    Some(schema),
                )
            }
        };

        let result = command
            .result
            .as_ref()
            .map(|schema| compile_schema(schema, &format!("{field}.result")))
            .transpose()?;

        let mut errors = BTreeMap::new();
        let mut error_names = BTreeMap::new();
        for (i, e) in command.errors.iter().enumerate() {
            let at = format!("{field}.errors[{i}]");
            if !is_kebab(&e.name) {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!("{:?} is not a valid error name", e.name),
                ));
            }
            if !(1..=255).contains(&e.exit_code) {
                return Err(FieldError::new(
                    format!("{at}.exitCode"),
                    format!("exit code {} is outside 1..=255", e.exit_code),
                ));
            }
            if let Some(other) = errors.insert(e.exit_code, e.clone()) {
                return Err(FieldError::new(
                    format!("{at}.exitCode"),
                    format!(
                        "exit code {} is already declared by error {:?}",
                        e.exit_code, other.name
                    ),
                ));
            }
            if error_names.insert(e.name.clone(), i).is_some() {
                return Err(FieldError::new(
                    format!("{at}.name"),
                    format!("error {:?} is declared twice", e.name),
                ));
            }
        }

        let mut interface = CommandInterface {
            name: command.name.clone(),
            description: command.description.clone(),
            positional,
            options,
            flags,
            stdin,
            stdin_schema,
            result,
            result_schema: command.result.clone(),
            errors,
            args_schema: Value::Null,
            definition: Arc::new(command.clone()),
        };
        interface.args_schema = interface.compose_args_schema(command);
        Ok(interface)
    }

    /// The definition this interface was compiled from, shared with the calls that record
    /// it.
    pub fn definition(&self) -> &Arc<Command> {
        &self.definition
    }

    /// One JSON Schema for the whole arguments object, as agents (and MCP) see it.
    fn compose_args_schema(&self, command: &Command) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (rule, def) in self.positional.iter().zip(&command.positional) {
            let mut schema = rule.schema.clone();
            if rule.variadic {
                schema = json!({"type": "array", "items": schema});
            }
            if let Some(obj) = schema.as_object_mut()
                && !def.description.is_empty()
            {
                obj.entry("description").or_insert(json!(def.description));
            }
            properties.insert(rule.name.clone(), schema);
            if rule.required {
                required.push(json!(rule.name));
            }
        }
        for (rule, def) in self.options.iter().zip(&command.options) {
            let mut schema = rule.schema.clone();
            if let Some(obj) = schema.as_object_mut() {
                if !def.description.is_empty() {
                    obj.entry("description").or_insert(json!(def.description));
                }
                if let Some(default) = &rule.default {
                    obj.entry("default").or_insert(default.clone());
                }
            }
            properties.insert(rule.name.clone(), schema);
            if rule.required {
                required.push(json!(rule.name));
            }
        }
        for (rule, def) in self.flags.iter().zip(&command.flags) {
            let mut schema = json!({"type": "boolean", "default": false});
            if !def.description.is_empty() {
                schema["description"] = json!(def.description);
            }
            properties.insert(rule.name.clone(), schema);
        }
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }

    pub fn args_schema(&self) -> &Value {
        &self.args_schema
    }

    pub fn stdin_schema(&self) -> Option<&Value> {
        self.stdin_schema.as_ref()
    }

    pub fn result_schema(&self) -> Option<&Value> {
        self.result_schema.as_ref()
    }

    fn usage(&self) -> String {
        let mut parts = Vec::new();
        for p in &self.positional {
            let dots = if p.variadic { "..." } else { "" };
            if p.required {
                parts.push(format!("<{}>{dots}", p.name));
            } else {
                parts.push(format!("[{}]{dots}", p.name));
            }
        }
        for o in &self.options {
            parts.push(format!("[--{} VALUE]", o.name));
        }
        for f in &self.flags {
            parts.push(format!("[--{}]", f.name));
        }
        format!("{} {}", self.name, parts.join(" "))
    }

    fn option_named(&self, name: &str) -> Option<&OptionRule> {
        self.options.iter().find(|o| o.name == name)
    }

    fn flag_named(&self, name: &str) -> Option<&FlagRule> {
        self.flags.iter().find(|f| f.name == name)
    }

    /// Parses command-line tokens (`positional... --option value --flag`, also
    /// `--option=value`, `-s value` and `--` before positionals that start with a dash) into
    /// an arguments object.
    pub fn parse_argv(&self, tokens: &[String]) -> Result<Map<String, Value>, ApiError> {
        let mut args = Map::new();
        let mut positionals: Vec<&str> = Vec::new();
        let mut only_positionals = false;
        let mut i = 0;
        while i < tokens.len() {
            let token = tokens[i].as_str();
            i += 1;
            if only_positionals
                || token == "-"
                || !token.starts_with('-')
                || token.parse::<f64>().is_ok()
            {
                positionals.push(token);
                continue;
            }
            if token == "--" {
                only_positionals = true;
                continue;
            }
            let (name, inline) = if let Some(long) = token.strip_prefix("--") {
                match long.split_once('=') {
                    Some((n, v)) => (n.to_string(), Some(v.to_string())),
                    None => (long.to_string(), None),
                }
            } else {
                let mut chars = token[1..].chars();
                let c = chars.next().unwrap_or('-');
                let rest: String = chars.collect();
                let name = self
                    .options
                    .iter()
                    .find(|o| o.short == Some(c))
                    .map(|o| o.name.clone())
                    .or_else(|| {
                        self.flags
                            .iter()
                            .find(|f| f.short == Some(c))
                            .map(|f| f.name.clone())
                    })
                    .ok_or_else(|| {
                        invalid(format!(
                            "unknown option -{c} for `{}`; usage: {}",
                            self.name,
                            self.usage()
                        ))
                    })?;
                (name, if rest.is_empty() { None } else { Some(rest) })
            };
            if let Some(option) = self.option_named(&name) {
                let raw = match inline {
                    Some(v) => v,
                    None => {
                        let Some(v) = tokens.get(i) else {
                            return Err(invalid(format!("option --{name} needs a value")));
                        };
                        i += 1;
                        v.clone()
                    }
                };
                if option.repeated {
                    let item = coerce(&raw, &item_schema(&option.schema));
                    match args.entry(name).or_insert_with(|| Value::Array(Vec::new())) {
                        Value::Array(items) => items.push(item),
                        other => *other = Value::Array(vec![item]),
                    }
                } else {
                    if args.contains_key(&name) {
                        return Err(invalid(format!("option --{name} is given more than once")));
                    }
                    args.insert(name, coerce(&raw, &option.schema));
                }
            } else if self.flag_named(&name).is_some() {
                if inline.is_some() {
                    return Err(invalid(format!("flag --{name} takes no value")));
                }
                args.insert(name, Value::Bool(true));
            } else {
                return Err(invalid(format!(
                    "unknown option --{name} for `{}`; usage: {}",
                    self.name,
                    self.usage()
                )));
            }
        }

        let mut rest = positionals.into_iter();
        for rule in &self.positional {
            if rule.variadic {
                let items: Vec<Value> = rest.by_ref().map(|t| coerce(t, &rule.schema)).collect();
                if !items.is_empty() {
                    args.insert(rule.name.clone(), Value::Array(items));
                }
            } else if let Some(token) = rest.next() {
                args.insert(rule.name.clone(), coerce(token, &rule.schema));
            }
        }
        let extra: Vec<&str> = rest.collect();
        if !extra.is_empty() {
            return Err(invalid(format!(
                "unexpected argument {:?} for `{}`; usage: {}",
                extra.join(" "),
                self.name,
                self.usage()
            )));
        }
        Ok(args)
    }

    /// Validates an arguments object against every rule and applies defaults.
    pub fn validate(&self, mut args: Map<String, Value>) -> Result<ValidArgs, ApiError> {
        let mut valid = Map::new();
        for rule in &self.positional {
            match args.remove(&rule.name) {
                Some(Value::Null) | None if rule.required => {
                    return Err(invalid(format!(
                        "missing positional argument <{}>; usage: {}",
                        rule.name,
                        self.usage()
                    )));
                }
                Some(Value::Null) | None => {}
                Some(value) => {
                    if rule.variadic {
                        let Value::Array(items) = &value else {
                            return Err(invalid(format!(
                                "argument <{}>: expected a list of values",
                                rule.name
                            )));
                        };
                        if rule.required && items.is_empty() {
                            return Err(invalid(format!(
                                "missing positional argument <{}>",
                                rule.name
                            )));
                        }
                        for (n, item) in items.iter().enumerate() {
                            check(
                                &rule.validator,
                                item,
                                &format!("argument <{}> item {}", rule.name, n + 1),
                            )?;
                        }
                    } else {
                        check(
                            &rule.validator,
                            &value,
                            &format!("argument <{}>", rule.name),
                        )?;
                    }
                    valid.insert(rule.name.clone(), value);
                }
            }
        }
        for rule in &self.options {
            match args.remove(&rule.name).filter(|v| !v.is_null()) {
                Some(value) => {
                    check(&rule.validator, &value, &format!("option --{}", rule.name))?;
                    valid.insert(rule.name.clone(), value);
                }
                None => match &rule.default {
                    Some(default) => {
                        valid.insert(rule.name.clone(), default.clone());
                    }
                    None if rule.required => {
                        return Err(invalid(format!("missing required option --{}", rule.name)));
                    }
                    None => {}
                },
            }
        }
        for rule in &self.flags {
            match args.remove(&rule.name) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => {
                    valid.insert(rule.name.clone(), Value::Bool(true));
                }
                Some(other) => {
                    return Err(invalid(format!(
                        "flag --{} must be true or false, not {other}",
                        rule.name
                    )));
                }
            }
        }
        if let Some(unknown) = args.keys().next() {
            return Err(invalid(format!(
                "unknown argument {unknown:?} for `{}`; usage: {}",
                self.name,
                self.usage()
            )));
        }
        Ok(ValidArgs(valid))
    }

    /// The guest's argv: `[tool, command, positionals..., --option value, --flag]`.
    pub fn build_argv(&self, tool: &str, args: &ValidArgs) -> Vec<String> {
        let mut argv = vec![tool.to_string(), self.name.clone()];
        for rule in &self.positional {
            match args.0.get(&rule.name) {
                Some(Value::Array(items)) if rule.variadic => argv.extend(items.iter().map(render)),
                Some(value) => argv.push(render(value)),
                None => {}
            }
        }
        for rule in &self.options {
            match args.0.get(&rule.name) {
                Some(Value::Array(items)) if rule.repeated => {
                    for item in items {
                        argv.push(format!("--{}", rule.name));
                        argv.push(render(item));
                    }
                }
                Some(value) => {
                    argv.push(format!("--{}", rule.name));
                    argv.push(render(value));
                }
                None => {}
            }
        }
        for rule in &self.flags {
            if args.0.get(&rule.name) == Some(&Value::Bool(true)) {
                argv.push(format!("--{}", rule.name));
            }
        }
        argv
    }

    /// Checks stdin against the command's declaration.
    pub fn check_stdin(&self, stdin: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(rule) = &self.stdin else {
            return match stdin {
                Some(bytes) if !bytes.is_empty() => {
                    Err(invalid(format!("`{}` reads no stdin", self.name)))
                }
                _ => Ok(()),
            };
        };
        let Some(bytes) = stdin else {
            if rule.required {
                return Err(invalid(format!("`{}` requires stdin", self.name)));
            }
            return Ok(());
        };
        let text = std::str::from_utf8(bytes);
        let value = if rule.text {
            // Text stdin is a byte stream: constraints apply to it read as UTF-8, and bytes
            // that are not UTF-8 pass through to the tool as they are.
            Value::String(String::from_utf8_lossy(bytes).into_owned())
        } else {
            let text = text.map_err(|_| {
                invalid("stdin: expected a JSON document, not binary data".to_string())
            })?;
            serde_json::from_str(text)
                .map_err(|e| invalid(format!("stdin: not valid JSON: {e}")))?
        };
        check(&rule.validator, &value, "stdin")
    }

    /// The declared error with exit code `exit_code`, if the command declares one.
    pub fn declared_error(&self, exit_code: i32) -> Option<&DeclaredError> {
        self.errors.get(&exit_code)
    }

    /// Judges a finished run: a zero exit must print JSON that fits the result schema; a
    /// non-zero exit is the declared error with that code, or a generic tool error.
    pub fn judge(
        &self,
        exit_code: i32,
        stdout: &[u8],
        stderr_tail: &[u8],
    ) -> Result<Value, CallError> {
        let stderr = String::from_utf8_lossy(stderr_tail).trim_end().to_string();
        if exit_code != 0 {
            let last_line = stderr.lines().last().unwrap_or_default().to_string();
            return Err(match self.errors.get(&exit_code) {
                Some(declared) => CallError {
                    kind: ErrorKind::ToolError,
                    message: if last_line.is_empty() {
                        declared.description.clone()
                    } else {
                        last_line
                    },
                    name: declared.name.clone(),
                    exit_code,
                    stderr_tail: stderr,
                },
                None => CallError {
                    kind: ErrorKind::ToolError,
                    message: if last_line.is_empty() {
                        format!("the tool exited with code {exit_code}")
                    } else {
                        format!("the tool exited with code {exit_code}: {last_line}")
                    },
                    name: String::new(),
                    exit_code,
                    stderr_tail: stderr,
                },
            });
        }
        let invalid_result = |message: String| CallError {
            stderr_tail: stderr.clone(),
            ..CallError::new(ErrorKind::InvalidResult, message)
        };
        let parsed = std::str::from_utf8(stdout)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(text.trim()).ok());
        match (&self.result, parsed) {
            (Some(validator), Some(value)) => match validator.validate(&value) {
                Ok(()) => Ok(value),
                Err(e) => Err(invalid_result(format!(
                    "the result breaks its schema: {}",
                    describe(&e)
                ))),
            },
            (Some(_), None) => Err(invalid_result(format!(
                "stdout is not a JSON document ({} bytes: {:?})",
                stdout.len(),
                String::from_utf8_lossy(&stdout[..stdout.len().min(80)])
            ))),
            // Without a result schema, text that is not JSON is returned as a string.
            (None, Some(value)) => Ok(value),
            (None, None) => Ok(Value::String(String::from_utf8_lossy(stdout).into_owned())),
        }
    }
}

fn describe(error: &jsonschema::ValidationError<'_>) -> String {
    let path = error.instance_path().to_string();
    if path.is_empty() {
        error.to_string()
    } else {
        format!("at {path}: {error}")
    }
}

fn check(validator: &Validator, value: &Value, what: &str) -> Result<(), ApiError> {
    validator
        .validate(value)
        .map_err(|e| invalid(format!("{what}: {}", describe(&e))))
}

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch() -> CommandInterface {
        let command: Command = serde_yaml::from_str(
            r#"
name: get
positional: [{name: url, schema: {type: string, format: uri}}]
options:
  - {name: max-bytes, short: n, schema: {type: integer, minimum: 1}, default: 20000}
  - {name: header, schema: {type: array, items: {type: string}}}
  - {name: mode, schema: {type: string, enum: [text, html]}}
flags: [{name: follow-redirects, short: L}]
stdin: {schema: {type: string, maxLength: 10}}
result: {type: object, required: [status, body], properties: {status: {type: integer}}}
errors: [{name: not-found, exitCode: 4, description: The page does not exist.}]
"#,
        )
        .unwrap();
        CommandInterface::compile(&command, "spec.commands[0]").unwrap()
    }

    fn tokens(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn parse_and_validate(i: &CommandInterface, s: &str) -> Result<ValidArgs, ApiError> {
        i.validate(i.parse_argv(&tokens(s))?)
    }

    #[test]
    fn argv_is_built_in_declared_order_with_defaults() {
        let i = fetch();
        let args = parse_and_validate(
            &i,
            "--follow-redirects https://example.org --header a --header b",
        )
        .unwrap();
        assert_eq!(
            i.build_argv("fetch", &args),
            tokens(
                "fetch get https://example.org --max-bytes 20000 --header a --header b --follow-redirects"
            )
        );
        let args = parse_and_validate(&i, "-n 5 -L --mode=html https://example.org").unwrap();
        assert_eq!(
            i.build_argv("fetch", &args),
            tokens("fetch get https://example.org --max-bytes 5 --mode html --follow-redirects")
        );
    }

    #[test]
    fn json_arguments_validate_like_tokens() {
        let i = fetch();
        let args = json!({"url": "https://example.org", "max-bytes": 7, "follow-redirects": true});
        let valid = i.validate(args.as_object().unwrap().clone()).unwrap();
        assert_eq!(valid.0["max-bytes"], json!(7));
        assert_eq!(valid.0["follow-redirects"], json!(true));
    }

    #[test]
    fn each_bad_argument_names_the_argument_and_the_rule() {
        let i = fetch();
        let cases = [
            (
                "https://example.org --max-bytes 0",
                "option --max-bytes: 0 is less than the minimum of 1",
            ),
            (
                "https://example.org --max-bytes lots",
                "option --max-bytes: \"lots\" is not of type \"integer\"",
            ),
            ("https://example.org --mode pdf", "option --mode:"),
            ("https://example.org --verbose", "unknown option --verbose"),
            ("https://example.org -x", "unknown option -x"),
            ("", "missing positional argument <url>"),
            ("not a uri", "unexpected argument"),
            ("notauri", "argument <url>: \"notauri\" is not a \"uri\""),
            (
                "https://example.org --max-bytes",
                "option --max-bytes needs a value",
            ),
            (
                "https://example.org --follow-redirects=yes",
                "flag --follow-redirects takes no value",
            ),
            (
                "https://example.org --max-bytes 1 --max-bytes 2",
                "given more than once",
            ),
        ];
        for (input, expected) in cases {
            let err = parse_and_validate(&i, input).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument, "{input}");
            assert!(
                err.message.contains(expected),
                "{input:?}: {:?} lacks {expected:?}",
                err.message
            );
        }
        let err = i
            .validate(
                json!({"url": "https://x.org", "bogus": 1})
                    .as_object()
                    .unwrap()
                    .clone(),
            )
            .unwrap_err();
        assert!(
            err.message.contains("unknown argument \"bogus\""),
            "{}",
            err.message
        );
        let err = i
            .validate(
                json!({"url": "https://x.org", "follow-redirects": "yes"})
                    .as_object()
                    .unwrap()
                    .clone(),
            )
            .unwrap_err();
        assert!(
            err.message
                .contains("flag --follow-redirects must be true or false"),
            "{}",
            err.message
        );
    }

    #[test]
    fn stdin_is_checked_against_its_schema() {
        let i = fetch();
        assert!(i.check_stdin(Some(b"short")).is_ok());
        assert!(i.check_stdin(None).is_ok());
        let err = i.check_stdin(Some(b"far too long for it")).unwrap_err();
        assert!(err.message.starts_with("stdin:"), "{}", err.message);
        assert!(
            i.check_stdin(Some(&[0xff, 0xfe])).is_ok(),
            "text stdin may carry any bytes"
        );
    }

    #[test]
    fn results_and_exit_codes_are_judged() {
        let i = fetch();
        assert_eq!(
            i.judge(0, br#"{"status": 200, "body": "x"}"#, b"").unwrap()["status"],
            200
        );
        let e = i.judge(0, br#"{"status": "ok"}"#, b"").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidResult);
        let e = i.judge(0, b"hello", b"").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidResult);
        let e = i.judge(4, b"", b"warming up\nno such page\n").unwrap_err();
        assert_eq!(
            (e.kind.as_str(), e.name.as_str(), e.exit_code),
            ("tool-error", "not-found", 4)
        );
        assert_eq!(e.message, "no such page");
        let e = i.judge(9, b"", b"boom").unwrap_err();
        assert_eq!((e.kind.as_str(), e.name.as_str()), ("tool-error", ""));
        assert!(e.message.contains("code 9: boom"), "{}", e.message);
    }

    #[test]
    fn bad_definitions_are_located() {
        let bad = |yaml: &str| {
            let command: Command = serde_yaml::from_str(yaml).unwrap();
            CommandInterface::compile(&command, "spec.commands[0]").unwrap_err()
        };
        let e = bad("{name: get, options: [{name: n, schema: {type: integer}, default: x}]}");
        assert_eq!(e.field, "spec.commands[0].options[0].default");
        let e = bad("{name: get, options: [{name: n, schema: {type: 12}}]}");
        assert_eq!(e.field, "spec.commands[0].options[0].schema");
        let e = bad("{name: get, options: [{name: a}], flags: [{name: a}]}");
        assert_eq!(e.field, "spec.commands[0].flags[0].name");
        let e = bad("{name: get, errors: [{name: x, exitCode: 0}]}");
        assert_eq!(e.field, "spec.commands[0].errors[0].exitCode");
        let e = bad("{name: Get}");
        assert_eq!(e.field, "spec.commands[0].name");
        let e = bad("{name: get, positional: [{name: a, variadic: true}, {name: b}]}");
        assert_eq!(e.field, "spec.commands[0].positional[0].variadic");
        let e = bad("{name: get, options: [{name: stdin}], stdin: {schema: {type: string}}}");
        assert_eq!(e.field, "spec.commands[0].options[0].name");
        assert!(
            e.message.contains("taken by the command's stdin"),
            "{}",
            e.message
        );
        // Without stdin the name is free.
        let command: Command =
            serde_yaml::from_str("{name: get, options: [{name: stdin}]}").unwrap();
        assert!(CommandInterface::compile(&command, "spec.commands[0]").is_ok());
    }

    #[test]
    fn the_args_schema_describes_every_argument() {
        let i = fetch();
        let schema = i.args_schema();
        assert_eq!(schema["required"], json!(["url"]));
        assert_eq!(schema["properties"]["max-bytes"]["default"], json!(20000));
        assert_eq!(
            schema["properties"]["follow-redirects"]["type"],
            json!("boolean")
        );
        assert_eq!(schema["additionalProperties"], json!(false));
    }
}
