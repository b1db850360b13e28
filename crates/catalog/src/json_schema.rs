//! Reading JSON Schemas: the few questions both the model-facing tools
//! ([`crate::model_tools`]) and their model API shapes ([`crate::model_formats`]) ask of a
//! schema.

use serde_json::{Map, Value};

/// The types a schema's `type` names (one, a list, or none).
pub(crate) fn types_of(schema: &Map<String, Value>) -> Vec<String> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `schema` admits `null` by its own `type` (or enum/const).
pub fn admits_null(schema: &Value) -> bool {
    let Some(obj) = schema.as_object() else {
        return schema == &Value::Bool(true);
    };
    if let Some(Value::Array(values)) = obj.get("enum") {
        return values.contains(&Value::Null);
    }
    if let Some(c) = obj.get("const") {
        return c.is_null();
    }
    if obj.contains_key("anyOf") || obj.contains_key("oneOf") {
        let branches = obj
            .get("anyOf")
            .or_else(|| obj.get("oneOf"))
            .and_then(Value::as_array);
        return branches.is_some_and(|b| b.iter().any(admits_null));
    }
    match obj.get("type") {
        None => !obj.contains_key("properties") && !obj.contains_key("items"),
        Some(_) => types_of(obj).iter().any(|t| t == "null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn admits_null_reads_types_enums_and_alternatives() {
        assert!(admits_null(&json!({"type": ["string", "null"]})));
        assert!(admits_null(&json!({})));
        assert!(!admits_null(&json!({"type": "string"})));
        assert!(!admits_null(&json!({"enum": ["a"]})));
        assert!(admits_null(
            &json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
        ));
    }
}
