//! Schema helpers for fields that hold free-form JSON, so the generated CRDs stay
//! structural (Kubernetes rejects schemas without types unless unknown fields are kept).

use schemars::{Schema, SchemaGenerator, json_schema};

/// A JSON Schema document embedded in a resource (argument, stdin and result schemas).
pub fn json_schema_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// An optional embedded JSON Schema document.
pub fn optional_json_schema_object(generator: &mut SchemaGenerator) -> Schema {
    json_schema_object(generator)
}

/// Any JSON value (a default value of an option).
pub fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A size given as a number of bytes or a Kubernetes quantity string (`64Mi`).
pub fn int_or_string(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
    })
}

/// A duration in Go's format (`30s`, `1h30m`, `200ms`).
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
    })
}
