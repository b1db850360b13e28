//! JSON Schema as a type of the target language: one walker ([`type_of`]) for every
//! generator, each language saying only how it spells what the walker finds
//! ([`TypeSyntax`]). What the walker cannot read (a schema that is not an object, nesting
//! past [`MAX_DEPTH`], a type it does not know) is the language's "any" type.

use serde_json::{Map, Value};

/// Nesting past this depth is typed as "any".
pub const MAX_DEPTH: usize = 8;

/// How a target language spells the types the walker finds.
pub trait TypeSyntax {
    /// Any value.
    const ANY: &'static str;
    /// Whether a schema with `properties` and no `type` is typed as an object (rather than
    /// as any value).
    const UNTYPED_PROPERTIES_ARE_OBJECTS: bool;
    /// A JSON value as a literal type (`None`: the language has no literal for it).
    fn literal(value: &Value) -> Option<String>;
    /// One or more literal types as one type (an `enum` or a `const`).
    fn literals(literals: &[String]) -> String;
    /// Two or more distinct types as one.
    fn union(types: &[String]) -> String;
    /// The type of a scalar JSON Schema `type` (`string`, `integer`, `number`, `boolean`,
    /// `null`); `None` for any other.
    fn scalar(json_type: &str) -> Option<&'static str>;
    /// An array of `items`.
    fn array(items: &str) -> String;
    /// An object schema; `property` types the schema of one of its properties.
    fn object(schema: &Map<String, Value>, property: &dyn Fn(&Value) -> String) -> String;
}

/// The type of `schema` at nesting `depth`.
pub fn type_of<S: TypeSyntax>(schema: &Value, depth: usize) -> String {
    let Some(obj) = schema.as_object() else {
        return S::ANY.into();
    };
    if depth > MAX_DEPTH {
        return S::ANY.into();
    }
    let values = obj
        .get("enum")
        .and_then(Value::as_array)
        .cloned()
        .or_else(|| obj.get("const").map(|c| vec![c.clone()]));
    if let Some(values) = values {
        let literals: Option<Vec<String>> = values.iter().map(S::literal).collect();
        return match literals {
            Some(l) if !l.is_empty() => S::literals(&l),
            _ => S::ANY.into(),
        };
    }
    if let Some(branches) = obj
        .get("anyOf")
        .or_else(|| obj.get("oneOf"))
        .and_then(Value::as_array)
    {
        return union::<S>(
            branches
                .iter()
                .map(|b| type_of::<S>(b, depth + 1))
                .collect(),
        );
    }
    let object = || S::object(obj, &|property| type_of::<S>(property, depth + 1));
    let one = |t: &str| -> String {
        match t {
            "array" => S::array(
                &obj.get("items")
                    .map_or(S::ANY.into(), |i| type_of::<S>(i, depth + 1)),
            ),
            "object" => object(),
            scalar => S::scalar(scalar).unwrap_or(S::ANY).into(),
        }
    };
    match obj.get("type") {
        Some(Value::String(t)) => one(t),
        Some(Value::Array(ts)) => {
            union::<S>(ts.iter().filter_map(Value::as_str).map(one).collect())
        }
        None if S::UNTYPED_PROPERTIES_ARE_OBJECTS && obj.contains_key("properties") => object(),
        _ => S::ANY.into(),
    }
}

/// `types` as one type: itself when there is one, any when one of them is.
fn union<S: TypeSyntax>(mut types: Vec<String>) -> String {
    types.dedup();
    if types.iter().any(|t| t == S::ANY) || types.is_empty() {
        return S::ANY.into();
    }
    if types.len() == 1 {
        return types.remove(0);
    }
    S::union(&types)
}
