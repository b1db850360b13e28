#!/usr/bin/env python3
"""Checks toolgrid's model tool schemas against the model APIs' published rules.

Usage: check_model_schemas.py FORMAT FILE  (FORMAT: openai, anthropic or json-schema; FILE:
the answer of `GET /v1/tools?format=FORMAT`). Prints one line per broken rule and exits 1
when there is any; exits 77 when the jsonschema module is missing.

Each rule names where it is published.
"""

import json
import re
import sys

try:
    from jsonschema import Draft202012Validator
except ImportError:  # pragma: no cover
    print("python3 module jsonschema is not installed", file=sys.stderr)
    sys.exit(77)

# OpenAI API reference, Chat Completions `tools[].function.name` (and the Responses API's
# function tools): "Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a
# maximum length of 64." Anthropic Messages API reference, `tools[].name`: it must match
# ^[a-zA-Z0-9_-]{1,64}$.
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

# OpenAI Structured Outputs guide, "Supported schemas" (which applies to function calling
# with `strict: true`): the supported types, `anyOf`, definitions (`$defs`/`$ref`), and
# these constraints: strings `pattern`, `format`; numbers `multipleOf`, `maximum`,
# `exclusiveMaximum`, `minimum`, `exclusiveMinimum`; arrays `minItems`, `maxItems`.
# Plus the annotations `description` and `title`, `enum` and `const`.
STRICT_KEYWORDS = {
    "type", "description", "title", "enum", "const", "anyOf", "$ref", "$defs",
    "properties", "required", "additionalProperties", "items",
    "pattern", "format",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "minItems", "maxItems",
}
# Same guide: the supported string formats.
STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
# Same guide: the supported types.
STRICT_TYPES = {"string", "number", "boolean", "integer", "object", "array", "null"}
# Same guide, "Objects have limitations on nesting depth and size": up to 5000 object
# properties in all, up to 10 levels of nesting; at most 120,000 characters of property
# names, definition names, enum values and const values in all; at most 1000 enum values
# across all enum properties.
MAX_PROPERTIES = 5000
MAX_DEPTH = 10
MAX_CHARS = 120_000
MAX_ENUM_VALUES = 1000


class Checker:
    def __init__(self):
        self.errors = []

    def fail(self, where, what):
        self.errors.append(f"{where}: {what}")

    def json_schema(self, where, schema):
        # Every schema is valid JSON Schema 2020-12 (the dialect MCP and the APIs take).
        try:
            Draft202012Validator.check_schema(schema)
        except Exception as error:  # jsonschema.SchemaError
            self.fail(where, f"not valid JSON Schema 2020-12: {error}")

    def strict(self, where, schema, depth, counts):
        """OpenAI strict mode, recursively."""
        if not isinstance(schema, dict):
            self.fail(where, "a strict schema must be an object")
            return
        for key in schema:
            if key not in STRICT_KEYWORDS:
                self.fail(where, f"keyword {key!r} is not supported in strict mode")
        types = schema.get("type")
        types = [types] if isinstance(types, str) else (types or [])
        for t in types:
            if t not in STRICT_TYPES:
                self.fail(where, f"type {t!r} is not supported in strict mode")
        if "format" in schema and schema["format"] not in STRICT_FORMATS:
            self.fail(where, f"format {schema['format']!r} is not supported in strict mode")
        if "enum" in schema:
            counts["enum"] += len(schema["enum"])
            counts["chars"] += sum(len(v) for v in schema["enum"] if isinstance(v, str))
            if None not in schema["enum"] and "null" in types:
                self.fail(where, "nullable type but null is not among the enum values")
        if isinstance(schema.get("const"), str):
            counts["chars"] += len(schema["const"])
        if not types and not any(k in schema for k in ("anyOf", "enum", "const", "$ref")):
            self.fail(where, "strict mode needs a type (a value of any type cannot be said)")
        if "object" in types or "properties" in schema:
            if depth > MAX_DEPTH:
                self.fail(where, f"nested deeper than {MAX_DEPTH} levels")
            # Structured Outputs guide: "additionalProperties: false must always be set
            # in objects".
            if schema.get("additionalProperties") is not False:
                self.fail(where, "an object without additionalProperties: false")
            properties = schema.get("properties")
            if not isinstance(properties, dict) or not properties:
                self.fail(where, "an object without properties")
                properties = {}
            # Structured Outputs guide: "All fields must be required" (optional ones are
            # emulated with a union with null).
            if sorted(schema.get("required", [])) != sorted(properties):
                self.fail(where, f"required {schema.get('required')} is not every property {sorted(properties)}")
            for name, sub in properties.items():
                counts["properties"] += 1
                counts["chars"] += len(name)
                self.strict(f"{where}/properties/{name}", sub, depth + 1, counts)
        if "items" in schema:
            self.strict(f"{where}/items", schema["items"], depth + 1, counts)
        for i, branch in enumerate(schema.get("anyOf", [])):
            self.strict(f"{where}/anyOf/{i}", branch, depth, counts)
        for name, sub in schema.get("$defs", {}).items():
            counts["chars"] += len(name)
            self.strict(f"{where}/$defs/{name}", sub, 1, counts)

    def openai(self, answer):
        notes = answer.get("notes", {})
        seen = set()
        for i, tool in enumerate(answer["tools"]):
            where = f"tools[{i}]"
            # OpenAI API reference, Chat Completions `tools[]`: {type: "function",
            # function: {name, description, parameters, strict}}.
            if tool.get("type") != "function" or set(tool) != {"type", "function"}:
                self.fail(where, "a Chat Completions tool is {type: 'function', function: {...}}")
                continue
            function = tool["function"]
            unknown = set(function) - {"name", "description", "parameters", "strict"}
            if unknown:
                self.fail(where, f"unknown function fields {sorted(unknown)}")
            name = function.get("name", "")
            where = f"{where} {name}"
            if not NAME.match(name):
                self.fail(where, "the name breaks ^[a-zA-Z0-9_-]{1,64}$")
            if name in seen:
                self.fail(where, "two tools have this name")
            seen.add(name)
            if not isinstance(function.get("description"), str):
                self.fail(where, "the description is not a string")
            parameters = function.get("parameters")
            self.json_schema(where, parameters)
            if function.get("strict") is True:
                # Structured Outputs guide: "the root level object must be an object,
                # and not use anyOf".
                if not isinstance(parameters, dict) or parameters.get("type") != "object" or "anyOf" in parameters:
                    self.fail(where, "the root of a strict schema must be an object without anyOf")
                counts = {"properties": 0, "chars": 0, "enum": 0}
                self.strict(f"{where} parameters", parameters, 1, counts)
                if counts["properties"] > MAX_PROPERTIES:
                    self.fail(where, f"{counts['properties']} properties, over {MAX_PROPERTIES}")
                if counts["chars"] > MAX_CHARS:
                    self.fail(where, f"{counts['chars']} characters, over {MAX_CHARS}")
                if counts["enum"] > MAX_ENUM_VALUES:
                    self.fail(where, f"{counts['enum']} enum values, over {MAX_ENUM_VALUES}")
            elif function.get("strict") is False:
                # toolgrid's own rule: a tool sent without strict mode says why.
                if not notes.get(name):
                    self.fail(where, "strict: false without a note saying why")
            else:
                self.fail(where, "strict must be true or false")

    def anthropic(self, answer):
        seen = set()
        for i, tool in enumerate(answer["tools"]):
            name = tool.get("name", "")
            where = f"tools[{i}] {name}"
            # Anthropic Messages API reference, `tools[]` (client tools): name,
            # description, input_schema.
            if set(tool) - {"name", "description", "input_schema"}:
                self.fail(where, f"unknown fields {sorted(set(tool) - {'name', 'description', 'input_schema'})}")
            if not NAME.match(name):
                self.fail(where, "the name breaks ^[a-zA-Z0-9_-]{1,64}$")
            if name in seen:
                self.fail(where, "two tools have this name")
            seen.add(name)
            schema = tool.get("input_schema")
            # Same reference: input_schema is a JSON Schema object whose type is "object".
            if not isinstance(schema, dict) or schema.get("type") != "object":
                self.fail(where, "input_schema must be an object schema (type: object)")
            self.json_schema(where, schema)

    def plain(self, answer):
        for i, tool in enumerate(answer["tools"]):
            where = f"tools[{i}] {tool.get('name')}"
            for key in ("name", "description", "inputSchema", "annotations"):
                if key not in tool:
                    self.fail(where, f"missing {key}")
            schema = tool.get("inputSchema")
            # MCP specification, Tool.inputSchema: a JSON Schema object with type "object".
            if not isinstance(schema, dict) or schema.get("type") != "object":
                self.fail(where, "inputSchema must be an object schema")
            self.json_schema(where, schema)
            if "outputSchema" in tool:
                self.json_schema(f"{where} outputSchema", tool["outputSchema"])


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    fmt, path = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        answer = json.load(f)
    checker = Checker()
    if answer.get("format") != fmt:
        checker.fail("format", f"{answer.get('format')!r} is not {fmt!r}")
    {"openai": checker.openai, "anthropic": checker.anthropic, "json-schema": checker.plain}[fmt](answer)
    for name in answer.get("names", {}):
        if fmt != "json-schema" and not NAME.match(name):
            checker.fail("names", f"{name!r} breaks the name pattern")
    for error in checker.errors:
        print(error)
    print(f"{fmt}: {len(answer['tools'])} tools, {len(checker.errors)} broken rules")
    return 1 if checker.errors else 0


if __name__ == "__main__":
    sys.exit(main())
