//! OpenAPI documents as imported tools ([`read_openapi`]), against real documents: the
//! OpenAPI 3.0 petstore of the npm package `@readme/oas-examples` (in `tests/js`, installed
//! by `npm ci --prefix tests/js`), the OpenAPI 3.1 document FastAPI makes for
//! `tests/fixtures/openapi/fastapi_app.py`, and hostile documents.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command as Process;
use toolgrid_catalog::sources::openapi::{MAX_DOCUMENT_BYTES, OpenApiError, read_openapi};
use toolgrid_core::source::{
    HttpBody, HttpMethod, HttpParameter, ImportedTool, LeftOutReason, ParameterLocation,
    SourceLimits, SourceSnapshot, ToolFilter, UpstreamTarget,
};
use toolgrid_core::spec::{Effect, OptionArg};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// True when `present`; otherwise a failure under CI (`CI=true`), else a skip with its
/// reason (the rule of `toolgrid_testkit::require`).
#[track_caller]
fn require(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1") {
        panic!("{what}: missing, and under CI=true a test must not skip (see .ci/run)");
    }
    eprintln!("skipping: {what} (under CI=true this is a failure)");
    false
}

fn read(document: &[u8]) -> SourceSnapshot {
    read_with(
        document,
        &ToolFilter::default(),
        &BTreeMap::new(),
        &SourceLimits::default(),
    )
}

fn read_with(
    document: &[u8],
    filter: &ToolFilter,
    overrides: &BTreeMap<String, Effect>,
    limits: &SourceLimits,
) -> SourceSnapshot {
    read_openapi(document, "shop", filter, overrides, limits).expect("the document reads")
}

fn tool<'a>(snapshot: &'a SourceSnapshot, name: &str) -> &'a ImportedTool {
    snapshot
        .tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tool {name}: {snapshot:#?}"))
}

fn option<'a>(tool: &'a ImportedTool, name: &str) -> &'a OptionArg {
    tool.command
        .options
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("{} has no option {name}: {tool:#?}", tool.name))
}

fn left_out(snapshot: &SourceSnapshot, name: &str) -> LeftOutReason {
    snapshot
        .left_out
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("{name} is not left out: {snapshot:#?}"))
        .reason
}

fn http(tool: &ImportedTool) -> &toolgrid_core::source::HttpOperation {
    match &tool.target {
        UpstreamTarget::Http(operation) => operation,
        other => panic!("{} is not HTTP: {other:?}", tool.name),
    }
}

/// Whether `value` has a `$ref` anywhere.
fn has_ref(value: &Value) -> bool {
    match value {
        Value::Object(object) => object.contains_key("$ref") || object.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

fn no_refs(snapshot: &SourceSnapshot) {
    for tool in &snapshot.tools {
        let command = serde_json::to_value(&tool.command).expect("serializes");
        assert!(
            !has_ref(&command),
            "{} keeps a $ref: {command:#}",
            tool.name
        );
    }
}

/// The petstore of `@readme/oas-examples` in `format` (`json` or `yaml`), if installed.
fn petstore(format: &str) -> Option<Vec<u8>> {
    let path = root().join(format!(
        "tests/js/node_modules/@readme/oas-examples/3.0/{format}/petstore.{format}"
    ));
    require(
        "@readme/oas-examples in tests/js (npm ci --prefix tests/js)",
        path.is_file(),
    )
    .then(|| std::fs::read(&path).expect("the petstore reads"))
}

#[test]
fn petstore_operations_become_tools() {
    let Some(document) = petstore("json") else {
        return;
    };
    let snapshot = read(&document);
    no_refs(&snapshot);

    let get = tool(&snapshot, "getPetById");
    assert_eq!(get.effect, Effect::Read);
    assert!(
        get.description.starts_with("Find pet by ID"),
        "{}",
        get.description
    );
    assert_eq!(get.command.name, "default");
    let pet_id = option(get, "petId");
    assert!(pet_id.required);
    assert_eq!(
        pet_id.schema,
        Some(json!({"type": "integer", "format": "int64"}))
    );
    let operation = http(get);
    assert_eq!(operation.method, HttpMethod::Get);
    assert_eq!(operation.path, "/pet/{petId}");
    assert_eq!(
        operation.parameters,
        vec![HttpParameter {
            name: "petId".into(),
            option: "petId".into(),
            location: ParameterLocation::Path,
            required: true,
        }]
    );
    assert_eq!(operation.body, None);
    // the 200 response's JSON schema, `Pet` with its `Category` and `Tag` inlined
    let result = get
        .command
        .result
        .as_ref()
        .expect("getPetById has a result");
    assert_eq!(result["required"], json!(["name", "photoUrls"]));
    assert_eq!(
        result["properties"]["category"]["properties"]["name"]["type"],
        "string"
    );
    assert_eq!(
        result["properties"]["tags"]["items"]["properties"]["id"]["format"],
        "int64"
    );

    let find = tool(&snapshot, "findPetsByStatus");
    assert_eq!(find.effect, Effect::Read);
    let status = option(find, "status");
    assert!(status.required);
    assert_eq!(status.schema.as_ref().expect("a schema")["type"], "array");
    assert_eq!(http(find).parameters[0].location, ParameterLocation::Query);
    assert_eq!(
        find.command.result.as_ref().expect("a result")["type"],
        "array"
    );

    // a body by `$ref` into components/requestBodies, JSON chosen over XML
    let add = tool(&snapshot, "addPet");
    assert_eq!(add.effect, Effect::Write);
    assert_eq!(http(add).method, HttpMethod::Post);
    let body = option(add, "body");
    assert!(body.required);
    assert_eq!(
        body.schema.as_ref().expect("a body schema")["required"],
        json!(["name", "photoUrls"])
    );
    assert_eq!(
        http(add).body,
        Some(HttpBody {
            option: "body".into(),
            content_type: "application/json".into(),
            required: true,
        })
    );

    let update = tool(&snapshot, "updatePet");
    assert_eq!(update.effect, Effect::Idempotent);
    assert_eq!(http(update).method, HttpMethod::Put);

    let delete = tool(&snapshot, "deletePet");
    assert_eq!(delete.effect, Effect::Idempotent);
    assert_eq!(http(delete).method, HttpMethod::Delete);
    let api_key = option(delete, "api_key");
    assert!(!api_key.required);
    assert!(http(delete).parameters.contains(&HttpParameter {
        name: "api_key".into(),
        option: "api_key".into(),
        location: ParameterLocation::Header,
        required: false,
    }));
    assert_eq!(delete.command.result, None);

    // multipart and form bodies cannot be sent as one JSON argument
    assert_eq!(
        left_out(&snapshot, "uploadFile"),
        LeftOutReason::UnsupportedRequest
    );
    assert_eq!(
        left_out(&snapshot, "updatePetWithForm"),
        LeftOutReason::UnsupportedRequest
    );
    assert_eq!(snapshot.tools.len() + snapshot.left_out.len(), 20);
    // in the document's order of paths, each path's methods in a fixed order
    assert_eq!(snapshot.tools[0].name, "updatePet");
    assert_eq!(snapshot.tools[1].name, "addPet");
}

#[test]
fn petstore_in_yaml_reads_the_same() {
    let (Some(json), Some(yaml)) = (petstore("json"), petstore("yaml")) else {
        return;
    };
    assert_eq!(read(&yaml), read(&json));
}

#[test]
fn petstore_filters_overrides_and_limits() {
    let Some(document) = petstore("json") else {
        return;
    };
    let filter = ToolFilter {
        allow: vec!["get*".into(), "deletePet".into()],
        deny: vec!["getInventory".into()],
    };
    let overrides = BTreeMap::from([
        ("deletePet".to_string(), Effect::Write),
        ("getPetById".to_string(), Effect::External),
    ]);
    let snapshot = read_with(&document, &filter, &overrides, &SourceLimits::default());
    let names: Vec<&str> = snapshot.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["getPetById", "deletePet", "getOrderById", "getUserByName"]
    );
    assert_eq!(
        left_out(&snapshot, "getInventory"),
        LeftOutReason::NotAllowed
    );
    assert_eq!(left_out(&snapshot, "addPet"), LeftOutReason::NotAllowed);
    assert_eq!(tool(&snapshot, "deletePet").effect, Effect::Write);
    assert_eq!(tool(&snapshot, "getPetById").effect, Effect::External);
    assert_eq!(tool(&snapshot, "getOrderById").effect, Effect::Read);

    let limits = SourceLimits {
        max_tools: 3,
        max_description_bytes: 8,
        ..SourceLimits::default()
    };
    let snapshot = read_with(&document, &ToolFilter::default(), &BTreeMap::new(), &limits);
    assert_eq!(snapshot.tools.len(), 3);
    assert!(snapshot.tools.iter().all(|t| t.description.len() <= 8));
    assert_eq!(tool(&snapshot, "updatePet").description, "Update a");
    let beyond = snapshot
        .left_out
        .iter()
        .filter(|l| l.reason == LeftOutReason::TooLarge)
        .count();
    // once the limit is reached, every later operation is beyond it, unread
    assert_eq!(beyond, 20 - 3, "{snapshot:#?}");

    // a schema limit the Pet schema does not fit in
    let limits = SourceLimits {
        max_schema_bytes: 200,
        ..SourceLimits::default()
    };
    let snapshot = read_with(&document, &ToolFilter::default(), &BTreeMap::new(), &limits);
    assert_eq!(left_out(&snapshot, "getPetById"), LeftOutReason::TooLarge);
    assert_eq!(left_out(&snapshot, "addPet"), LeftOutReason::TooLarge);
    assert!(tool(&snapshot, "deletePet").command.options.len() == 2);
}

/// FastAPI's OpenAPI 3.1 document for `tests/fixtures/openapi/fastapi_app.py`.
fn fastapi_document() -> Option<Vec<u8>> {
    let script = root().join("tests/fixtures/openapi/fastapi_app.py");
    let run = Process::new("python3").arg(&script).arg("--dump").output();
    let run = match run {
        Ok(run) => run,
        Err(error) => {
            require(&format!("python3 cannot run: {error}"), false);
            return None;
        }
    };
    if run.status.code() == Some(77) {
        require(String::from_utf8_lossy(&run.stderr).trim(), false);
        return None;
    }
    assert!(
        run.status.success(),
        "{} --dump failed: {}",
        script.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    Some(run.stdout)
}

#[test]
fn fastapi_document_31_becomes_tools() {
    let Some(document) = fastapi_document() else {
        return;
    };
    let raw: Value = serde_json::from_slice(&document).expect("JSON");
    assert!(
        raw["openapi"]
            .as_str()
            .expect("a version")
            .starts_with("3.1")
    );
    let snapshot = read(&document);
    no_refs(&snapshot);
    assert!(snapshot.left_out.is_empty(), "{snapshot:#?}");
    let names: Vec<&str> = snapshot.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "get_order",
            "replace_order",
            "delete_order",
            "patch_order",
            "list_orders",
            "create_order"
        ]
    );

    let get = tool(&snapshot, "get_order");
    assert_eq!(get.effect, Effect::Read);
    assert_eq!(get.description, "Get Order\n\nLook up one order.");
    let order_id = option(get, "order_id");
    assert!(order_id.required);
    assert_eq!(
        order_id.schema.as_ref().expect("a schema")["type"],
        "integer"
    );
    let verbose = option(get, "verbose");
    assert!(!verbose.required);
    assert_eq!(
        verbose.schema,
        Some(json!({"type": "boolean", "default": false, "title": "Verbose"}))
    );
    // 3.1's null type stays as written
    let trace = option(get, "x-trace-id");
    assert_eq!(
        trace.schema.as_ref().expect("a schema")["anyOf"],
        json!([{"type": "string"}, {"type": "null"}])
    );
    let locations: Vec<ParameterLocation> =
        http(get).parameters.iter().map(|p| p.location).collect();
    assert_eq!(
        locations,
        [
            ParameterLocation::Path,
            ParameterLocation::Query,
            ParameterLocation::Header
        ]
    );
    let order = get.command.result.as_ref().expect("a result");
    assert_eq!(order["title"], "Order");
    assert_eq!(order["properties"]["ship_to"]["title"], "Address");
    assert_eq!(
        order["properties"]["ship_to"]["required"],
        json!(["street", "city"])
    );

    let create = tool(&snapshot, "create_order");
    assert_eq!(create.effect, Effect::Write);
    let body = option(create, "body");
    assert!(body.required);
    let body = body.schema.as_ref().expect("a body schema");
    assert_eq!(body["title"], "OrderIn");
    assert_eq!(body["required"], json!(["item", "quantity", "ship_to"]));
    assert_eq!(
        body["properties"]["item"]["description"],
        "What is ordered."
    );
    assert_eq!(body["properties"]["quantity"]["maximum"], json!(100.0));
    assert_eq!(
        body["properties"]["ship_to"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(
        http(create).body.as_ref().expect("a body").content_type,
        "application/json"
    );
    // the 201 response's schema: the lowest 2xx, not the 422
    assert_eq!(
        create.command.result.as_ref().expect("a result")["title"],
        "Order"
    );

    assert_eq!(tool(&snapshot, "replace_order").effect, Effect::Idempotent);
    assert_eq!(tool(&snapshot, "patch_order").effect, Effect::Write);
    let patch = option(tool(&snapshot, "patch_order"), "body");
    assert_eq!(
        patch.schema.as_ref().expect("a schema")["title"],
        "OrderPatch"
    );
    let delete = tool(&snapshot, "delete_order");
    assert_eq!(delete.effect, Effect::Idempotent);
    assert_eq!(delete.command.result, None, "204 has no content");
    let list = tool(&snapshot, "list_orders");
    let limit = option(list, "limit");
    assert_eq!(
        limit.schema.as_ref().expect("a schema")["maximum"],
        json!(50)
    );
    let result = list.command.result.as_ref().expect("a result");
    assert_eq!(result["type"], "array");
    assert_eq!(result["items"]["title"], "Order");
}

/// A 3.0 document with `paths` and `components` as given.
fn document(paths: Value, components: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "paths": paths,
        "components": components,
    }))
    .expect("serializes")
}

fn get(id: &str, extra: Value) -> Value {
    let mut operation = json!({
        "operationId": id,
        "responses": {"200": {"description": "ok"}},
    });
    if let (Some(operation), Value::Object(extra)) = (operation.as_object_mut(), extra) {
        operation.extend(extra);
    }
    json!({"get": operation})
}

fn answers(schema: Value) -> Value {
    json!({"responses": {"200": {"description": "ok", "content": {"application/json": {"schema": schema}}}}})
}

#[test]
fn cyclic_and_missing_refs_leave_the_operation_out() {
    let document = document(
        json!({
            "/tree": get("tree", answers(json!({"$ref": "#/components/schemas/Node"}))),
            "/missing": get("missing", answers(json!({"$ref": "#/components/schemas/Nope"}))),
            "/param": get("param", json!({"parameters": [{"$ref": "#/components/parameters/Nope"}]})),
            "/external": get("external", answers(json!({"$ref": "other.json#/Pet"}))),
            "/fine": get("fine", answers(json!({"$ref": "#/components/schemas/Leaf"}))),
            "/ghost": {"$ref": "#/components/pathItems/Nope"},
        }),
        json!({"schemas": {
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}},
            "Leaf": {"type": "string", "nullable": true, "enum": ["a", "b"]},
        }}),
    );
    let snapshot = read(&document);
    for name in ["tree", "missing", "param", "external"] {
        assert_eq!(left_out(&snapshot, name), LeftOutReason::UnsupportedSchema);
    }
    assert_eq!(
        left_out(&snapshot, "/ghost"),
        LeftOutReason::UnsupportedSchema
    );
    let fine = tool(&snapshot, "fine");
    // 3.0's `nullable` in JSON Schema's terms
    assert_eq!(
        fine.command.result,
        Some(json!({"type": ["string", "null"], "enum": ["a", "b", null]}))
    );
}

#[test]
fn refs_that_fan_out_stop_at_the_schema_limit() {
    // each level names the next twice: 2^30 nodes if inlined blindly
    let mut schemas = serde_json::Map::new();
    for level in 0..30 {
        let next = json!({"$ref": format!("#/components/schemas/L{}", level + 1)});
        schemas.insert(
            format!("L{level}"),
            json!({"type": "object", "properties": {"a": next, "b": next}}),
        );
    }
    schemas.insert("L30".into(), json!({"type": "string"}));
    let document = document(
        json!({"/bomb": get("bomb", answers(json!({"$ref": "#/components/schemas/L0"})))}),
        json!({"schemas": schemas}),
    );
    let snapshot = read(&document);
    assert_eq!(left_out(&snapshot, "bomb"), LeftOutReason::TooLarge);
}

#[test]
fn documents_that_are_not_openapi_3_are_refused() {
    let refuse = |document: &[u8]| {
        read_openapi(
            document,
            "shop",
            &ToolFilter::default(),
            &BTreeMap::new(),
            &SourceLimits::default(),
        )
        .expect_err("refused")
    };
    assert_eq!(refuse(b"[1, 2, 3]"), OpenApiError::NotOpenApi);
    assert_eq!(refuse(b"\"hello\""), OpenApiError::NotOpenApi);
    assert_eq!(refuse(b"{\"info\": {}}"), OpenApiError::NotOpenApi);
    assert_eq!(refuse(b"title: x\n"), OpenApiError::NotOpenApi);
    assert!(matches!(
        refuse(b"{\"openapi\": "),
        OpenApiError::Invalid { .. }
    ));
    assert!(matches!(
        refuse(b"\x00\xff: [\n"),
        OpenApiError::Invalid { .. }
    ));
    assert_eq!(
        refuse(br#"{"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}}"#),
        OpenApiError::UnsupportedVersion {
            version: "2.0".into()
        }
    );
    assert_eq!(
        refuse(br#"{"openapi": "3.2.0", "info": {"title": "t", "version": "1"}, "paths": {}}"#),
        OpenApiError::UnsupportedVersion {
            version: "3.2.0".into()
        }
    );
    assert_eq!(
        refuse(br#"{"openapi": "3.10.0", "info": {"title": "t", "version": "1"}, "paths": {}}"#),
        OpenApiError::UnsupportedVersion {
            version: "3.10.0".into()
        }
    );
    // a 3.0 document its model rejects (`paths` missing)
    assert!(matches!(
        refuse(br#"{"openapi": "3.0.0", "info": {"title": "t", "version": "1"}}"#),
        OpenApiError::Invalid { .. }
    ));
    let mut huge = document(json!({}), json!({}));
    huge.resize(MAX_DOCUMENT_BYTES + 1, b' ');
    assert_eq!(
        refuse(&huge),
        OpenApiError::TooLarge {
            size: MAX_DOCUMENT_BYTES + 1,
            max: MAX_DOCUMENT_BYTES
        }
    );
}

#[test]
fn long_descriptions_are_cut_and_extra_operations_left_out() {
    let long = "é".repeat(50 * 1024); // 100 KiB
    let mut paths = serde_json::Map::new();
    paths.insert(
        "/long".into(),
        get("long", json!({"summary": "Long", "description": long})),
    );
    for i in 0..600 {
        paths.insert(format!("/op/{i:03}"), get(&format!("op{i:03}"), json!({})));
    }
    let snapshot = read(&document(Value::Object(paths), json!({})));
    let limits = SourceLimits::default();
    assert_eq!(snapshot.tools.len(), limits.max_tools);
    let long = tool(&snapshot, "long");
    assert!(long.description.starts_with("Long\n\néé"));
    assert!(long.description.len() <= limits.max_description_bytes);
    assert!(long.description.len() > limits.max_description_bytes - 2);
    let beyond: Vec<&str> = snapshot
        .left_out
        .iter()
        .filter(|l| l.reason == LeftOutReason::TooLarge)
        .map(|l| l.name.as_str())
        .collect();
    // 101 are beyond the limit; the status lists 99 of them and counts the rest.
    assert_eq!(601 - limits.max_tools, 101);
    assert_eq!(beyond.len(), toolgrid_catalog::sources::MAX_LEFT_OUT);
    assert_eq!(beyond[98], "op597");
    let last = snapshot.left_out.last().unwrap();
    assert_eq!(last.message, "2 more left out, not listed");
}

#[test]
fn names_locations_and_bodies_are_checked() {
    let document = document(
        json!({
            "/items/{id}": {
                "parameters": [
                    {"name": "id", "in": "path", "schema": {"type": "integer"}},
                    {"name": "verbose", "in": "query", "schema": {"type": "boolean"}},
                ],
                "get": {
                    "operationId": "getItem",
                    "parameters": [
                        {"name": "verbose", "in": "query", "required": true, "schema": {"type": "string"}},
                        {"name": "id", "in": "query", "schema": {"type": "string"}},
                        {"name": "Accept", "in": "header", "schema": {"type": "string"}},
                        {"$ref": "#/components/parameters/Limit"},
                    ],
                    "responses": {"2XX": {"description": "ok", "content": {"application/problem+json": {"schema": {"type": "object"}}}}},
                },
                "put": {
                    "operationId": "putItem",
                    "parameters": [{"name": "body", "in": "query", "schema": {"type": "string"}}],
                    "requestBody": {"content": {"application/merge-patch+json": {"schema": {"type": "object"}}}},
                    "responses": {"204": {"description": "done"}},
                },
                "delete": {"responses": {"204": {"description": "done"}}},
                "patch": {"operationId": "getItem", "responses": {}},
                "head": {"operationId": "has space", "responses": {}},
                "post": {
                    "operationId": "cookie",
                    "parameters": [{"name": "session", "in": "cookie", "schema": {"type": "string"}}],
                    "responses": {},
                },
            },
        }),
        json!({"parameters": {
            "Limit": {"name": "limit", "in": "query", "schema": {"$ref": "#/components/schemas/Limit"}},
        }, "schemas": {"Limit": {"type": "integer", "maximum": 10, "exclusiveMaximum": true}}}),
    );
    let snapshot = read(&document);
    let get = tool(&snapshot, "getItem");
    let options: Vec<(&str, bool)> = get
        .command
        .options
        .iter()
        .map(|o| (o.name.as_str(), o.required))
        .collect();
    // the operation's `verbose` replaces the path item's; `id` in two places; no `Accept`
    assert_eq!(
        options,
        [
            ("id", true),
            ("verbose", true),
            ("id-query", false),
            ("limit", false)
        ]
    );
    assert_eq!(
        option(get, "limit").schema,
        Some(json!({"type": "integer", "exclusiveMaximum": 10}))
    );
    assert_eq!(
        option(get, "verbose").schema,
        Some(json!({"type": "string"}))
    );
    assert_eq!(http(get).parameters[2].name, "id");
    assert_eq!(get.command.result, Some(json!({"type": "object"})));

    let put = tool(&snapshot, "putItem");
    assert_eq!(
        option(put, "body-query").schema,
        Some(json!({"type": "string"}))
    );
    assert_eq!(
        http(put).body,
        Some(HttpBody {
            option: "body".into(),
            content_type: "application/merge-patch+json".into(),
            required: false,
        })
    );
    assert_eq!(
        left_out(&snapshot, "DELETE /items/{id}"),
        LeftOutReason::NoOperationId
    );
    assert_eq!(left_out(&snapshot, "has space"), LeftOutReason::InvalidName);
    assert_eq!(
        left_out(&snapshot, "cookie"),
        LeftOutReason::UnsupportedRequest
    );
    let repeated = snapshot
        .left_out
        .iter()
        .find(|l| l.name == "getItem")
        .expect("the second getItem is left out");
    assert_eq!(repeated.reason, LeftOutReason::InvalidName);
}

#[test]
fn a_parameter_that_cannot_be_an_option_leaves_its_operation_out() {
    let document = document(
        json!({
            "/items": get("listItems", json!({"parameters": [
                {"name": "filter[name]", "in": "query", "schema": {"type": "string"}},
            ]})),
            "/other": get("listOther", json!({"parameters": [
                {"name": "page_size", "in": "query", "schema": {"type": "integer"}},
            ]})),
        }),
        json!({}),
    );
    let snapshot = read(&document);
    assert_eq!(
        left_out(&snapshot, "listItems"),
        LeftOutReason::UnsupportedRequest
    );
    assert_eq!(
        option(tool(&snapshot, "listOther"), "page_size").name,
        "page_size"
    );
}
