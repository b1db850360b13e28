//! Manifest directories: every YAML file (multi-document too), parsed into typed resources,
//! with every problem located by file, document, resource and field.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use toolgrid_api::{
    self as api, Agent, Kind, Middleware, Tool, ToolBinding, ToolRelease, ToolSource, WorkerPool,
};

const CLUSTER: &str = "the cluster";

/// Where a resource was declared.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    pub file: PathBuf,
    /// 1-based index of the YAML document in the file.
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.document == 0 {
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{} (document {})", self.file.display(), self.document)
        }
    }
}

impl Source {
    /// " in FILE (document N)" to append to a message about the resource; nothing for a
    /// resource of the cluster, whose status already says which it is.
    pub fn suffix(&self) -> String {
        if self.is_cluster() {
            String::new()
        } else {
            format!(" in {self}")
        }
    }

    pub fn is_cluster(&self) -> bool {
        self.document == 0 && self.file.starts_with(CLUSTER)
    }

    /// A resource read from the Kubernetes API rather than a file.
    pub fn cluster(kind: &str, namespace: &str, name: &str) -> Source {
        Source {
            file: PathBuf::from(format!("{CLUSTER} ({kind} {namespace}/{name})")),
            document: 0,
        }
    }

    /// The directory a relative artifact path is resolved against.
    pub fn dir(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("."))
    }
}

/// A resource and where it came from.
#[derive(Clone, Debug)]
pub struct Sourced<T> {
    pub object: T,
    pub source: Source,
}

/// A document that could not become a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidDocument {
    pub source: Source,
    pub kind: Option<Kind>,
    pub namespace: String,
    pub name: Option<String>,
    /// Path of the offending field (`spec.commands[0].options`), or empty.
    pub field: String,
    pub message: String,
}

impl fmt::Display for InvalidDocument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.source)?;
        if let (Some(kind), Some(name)) = (self.kind, &self.name) {
            write!(f, "{kind} {}/{name}: ", self.namespace)?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Everything a manifest directory (or a cluster) declares.
#[derive(Clone, Debug, Default)]
pub struct ResourceSet {
    pub tools: Vec<Sourced<Tool>>,
    pub releases: Vec<Sourced<ToolRelease>>,
    pub bindings: Vec<Sourced<ToolBinding>>,
    pub middleware: Vec<Sourced<Middleware>>,
    pub agents: Vec<Sourced<Agent>>,
    pub pools: Vec<Sourced<WorkerPool>>,
    pub tool_sources: Vec<Sourced<ToolSource>>,
    /// ConfigMaps, for release artifacts given by `configMap` and Agents' `configMapRef`.
    pub config_maps: Vec<Sourced<ConfigMap>>,
    /// Secrets (`stringData`, or `data` in base64), for Agents' `tokenSecretRef` and
    /// `secretRef`. In a cluster the controller reads them from the API instead.
    pub secrets: Vec<Sourced<Secret>>,
    pub invalid: Vec<InvalidDocument>,
    /// Documents of other APIs, left alone.
    pub ignored: usize,
}

impl ResourceSet {
    /// Adds `other`'s documents after this set's.
    pub fn extend(&mut self, other: ResourceSet) {
        let ResourceSet {
            tools,
            releases,
            bindings,
            middleware,
            agents,
            pools,
            tool_sources,
            config_maps,
            secrets,
            invalid,
            ignored,
        } = other;
        self.tools.extend(tools);
        self.releases.extend(releases);
        self.bindings.extend(bindings);
        self.middleware.extend(middleware);
        self.agents.extend(agents);
        self.pools.extend(pools);
        self.tool_sources.extend(tool_sources);
        self.config_maps.extend(config_maps);
        self.secrets.extend(secrets);
        self.invalid.extend(invalid);
        self.ignored += ignored;
    }

    /// This set with `builtins` (toolgrid's built-in tools) added under it: a resource of
    /// the built-ins whose kind, namespace and name this set declares already is left out,
    /// so a team's own manifest replaces a built-in.
    pub fn with_builtins(mut self, builtins: ResourceSet) -> ResourceSet {
        fn add<K: kube::Resource>(ours: &mut Vec<Sourced<K>>, theirs: Vec<Sourced<K>>) {
            let key = |o: &K| {
                let meta = o.meta();
                (
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone(),
                )
            };
            let declared: std::collections::HashSet<_> =
                ours.iter().map(|r| key(&r.object)).collect();
            ours.extend(
                theirs
                    .into_iter()
                    .filter(|r| !declared.contains(&key(&r.object))),
            );
        }
        add(&mut self.tools, builtins.tools);
        add(&mut self.releases, builtins.releases);
        add(&mut self.bindings, builtins.bindings);
        add(&mut self.middleware, builtins.middleware);
        add(&mut self.agents, builtins.agents);
        add(&mut self.pools, builtins.pools);
        add(&mut self.tool_sources, builtins.tool_sources);
        add(&mut self.config_maps, builtins.config_maps);
        add(&mut self.secrets, builtins.secrets);
        self.invalid.extend(builtins.invalid);
        self.ignored += builtins.ignored;
        self
    }
}

/// Loads every `.yaml` and `.yml` file under `dir` (sorted, hidden entries skipped).
pub fn load_dir(dir: &Path) -> std::io::Result<ResourceSet> {
    load_dir_cached(dir, &mut ParsedFiles::default())
}

/// The documents of manifest files as last parsed, kept between loads of a directory: a
/// file whose size, modification and change times and inode are what they were is not
/// read or parsed again (a reload of a large directory re-reads only what changed).
#[derive(Default)]
pub struct ParsedFiles {
    /// The files loaded since [`begin`](ParsedFiles::begin).
    files: HashMap<PathBuf, (FileStamp, ResourceSet)>,
    /// The files of the loads before it not loaded again yet: dropped at the next `begin`,
    /// so a file gone from the directories leaves the cache.
    previous: HashMap<PathBuf, (FileStamp, ResourceSet)>,
    /// Files read and parsed since `begin` (the rest came from here).
    parsed: usize,
}

impl ParsedFiles {
    /// Starts a load of some directories: counts afresh; the files the last load kept and
    /// this one does not load again are dropped at the next `begin`.
    pub fn begin(&mut self) {
        self.parsed = 0;
        self.previous = std::mem::take(&mut self.files);
    }

    /// How many files the last load read and parsed.
    pub fn parsed(&self) -> usize {
        self.parsed
    }
}

/// What tells a file's content changed without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    #[cfg(unix)]
    inode: u64,
    #[cfg(unix)]
    changed: (i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt as _;
        Some(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            inode: meta.ino(),
            #[cfg(unix)]
            changed: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// [`load_dir`], reading again only the files `cache` does not hold as they are now; the
/// cache then holds this directory's files (and those of other directories loaded with it).
pub fn load_dir_cached(dir: &Path, cache: &mut ParsedFiles) -> std::io::Result<ResourceSet> {
    let mut files = Vec::new();
    collect_yaml_files(dir, &mut files)?;
    files.sort();
    let mut set = ResourceSet::default();
    for file in files {
        let stamp = FileStamp::of(&file);
        let kept = cache
            .previous
            .remove(&file)
            .or_else(|| cache.files.remove(&file));
        let parsed = match (stamp, kept) {
            (Some(now), Some((then, parsed))) if now == then => parsed,
            _ => {
                cache.parsed += 1;
                parse_file(&file)
            }
        };
        if let Some(stamp) = stamp {
            cache.files.insert(file, (stamp, parsed.clone()));
        }
        set.extend(parsed);
    }
    Ok(set)
}

/// One file's documents.
fn parse_file(file: &Path) -> ResourceSet {
    let mut set = ResourceSet::default();
    match std::fs::read_to_string(file) {
        Ok(text) => load_text(file, &text, &mut set),
        Err(error) => set.invalid.push(InvalidDocument {
            source: Source {
                file: file.to_path_buf(),
                document: 0,
            },
            kind: None,
            namespace: String::new(),
            name: None,
            field: String::new(),
            message: format!("cannot read the file: {error}"),
        }),
    }
    set
}

fn collect_yaml_files(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            collect_yaml_files(&path, files)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            files.push(path);
        }
    }
    Ok(())
}

fn string_at<'a>(value: &'a serde_yaml::Value, path: &[&str]) -> Option<&'a str> {
    let mut v = value;
    for key in path {
        v = v.get(*key)?;
    }
    v.as_str()
}

/// Parses one file's documents into `set`.
pub fn load_text(file: &Path, text: &str, set: &mut ResourceSet) {
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let source = Source {
            file: file.to_path_buf(),
            document: index + 1,
        };
        let value = match serde_yaml::Value::deserialize(document) {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(value) => value,
            Err(error) => {
                set.invalid.push(InvalidDocument {
                    source,
                    kind: None,
                    namespace: String::new(),
                    name: None,
                    field: String::new(),
                    message: format!("not valid YAML: {error}"),
                });
                // A syntax error ends the stream: later documents cannot be trusted.
                break;
            }
        };
        load_value(source, value, set);
    }
}

use serde::Deserialize as _;

fn load_value(source: Source, value: serde_yaml::Value, set: &mut ResourceSet) {
    let api_version = string_at(&value, &["apiVersion"])
        .unwrap_or_default()
        .to_string();
    let kind_name = string_at(&value, &["kind"]).unwrap_or_default().to_string();
    let name = string_at(&value, &["metadata", "name"]).map(String::from);
    let namespace = string_at(&value, &["metadata", "namespace"])
        .unwrap_or(api::DEFAULT_NAMESPACE)
        .to_string();
    let invalid = |kind: Option<Kind>, field: String, message: String| InvalidDocument {
        source: source.clone(),
        kind,
        namespace: namespace.clone(),
        name: name.clone(),
        field,
        message,
    };

    if api_version == "v1" && kind_name == "ConfigMap" {
        match typed::<ConfigMap>(value) {
            Ok(cm) => set.config_maps.push(Sourced {
                object: with_ns(cm, &namespace),
                source,
            }),
            Err((field, message)) => {
                set.invalid
                    .push(invalid(None, field, format!("ConfigMap: {message}")))
            }
        }
        return;
    }
    if api_version == "v1" && kind_name == "Secret" {
        match typed::<Secret>(value) {
            Ok(_) if name.as_deref().is_none_or(str::is_empty) => set.invalid.push(invalid(
                None,
                "metadata.name".into(),
                "Secret: every Secret needs a name".into(),
            )),
            Ok(secret) => set.secrets.push(Sourced {
                object: with_ns(secret, &namespace),
                source,
            }),
            // The message of a bad `data` value names the field, never the value.
            Err((field, message)) => {
                set.invalid
                    .push(invalid(None, field, format!("Secret: {message}")))
            }
        }
        return;
    }
    if api_version != api::API_VERSION {
        if api_version.is_empty() || kind_name.is_empty() {
            set.invalid.push(invalid(
                None,
                if api_version.is_empty() {
                    "apiVersion"
                } else {
                    "kind"
                }
                .into(),
                "every document needs an apiVersion and a kind".into(),
            ));
        } else {
            // Other Kubernetes objects (ServiceAccounts, Deployments...) may share a GitOps
            // directory; toolgrid has nothing to do with them.
            tracing::debug!(%api_version, kind = %kind_name, "{source}: not a toolgrid resource; ignored");
            set.ignored += 1;
        }
        return;
    }
    let Some(kind) = Kind::ALL.into_iter().find(|k| k.as_str() == kind_name) else {
        set.invalid.push(invalid(
            None,
            "kind".into(),
            format!(
                "unknown kind {kind_name:?} (expected one of {})",
                Kind::ALL.map(Kind::as_str).join(", ")
            ),
        ));
        return;
    };
    if name.as_deref().is_none_or(str::is_empty) {
        set.invalid.push(invalid(
            Some(kind),
            "metadata.name".into(),
            "every resource needs a name".into(),
        ));
        return;
    }
    let outcome = match kind {
        Kind::Tool => typed::<Tool>(value).map(|o| set.tools.push(sourced(o, &namespace, &source))),
        Kind::ToolRelease => {
            typed::<ToolRelease>(value).map(|o| set.releases.push(sourced(o, &namespace, &source)))
        }
        Kind::ToolBinding => {
            typed::<ToolBinding>(value).map(|o| set.bindings.push(sourced(o, &namespace, &source)))
        }
        Kind::Middleware => {
            typed::<Middleware>(value).map(|o| set.middleware.push(sourced(o, &namespace, &source)))
        }
        Kind::Agent => {
            typed::<Agent>(value).map(|o| set.agents.push(sourced(o, &namespace, &source)))
        }
        Kind::WorkerPool => {
            typed::<WorkerPool>(value).map(|o| set.pools.push(sourced(o, &namespace, &source)))
        }
        Kind::ToolSource => typed::<ToolSource>(value)
            .map(|o| set.tool_sources.push(sourced(o, &namespace, &source))),
    };
    if let Err((field, message)) = outcome {
        set.invalid.push(invalid(Some(kind), field, message));
    }
}

/// Deserializes a document into its type, naming the failing field.
fn typed<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let field = error.path().to_string();
        let field = if field == "." { String::new() } else { field };
        (field, error.into_inner().to_string())
    })
}

fn sourced<T: kube::Resource>(object: T, namespace: &str, source: &Source) -> Sourced<T> {
    Sourced {
        object: with_ns(object, namespace),
        source: source.clone(),
    }
}

fn with_ns<T: kube::Resource>(mut object: T, namespace: &str) -> T {
    object.meta_mut().namespace = Some(namespace.to_string());
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str) -> String {
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: {name}}}\n\
             spec: {{description: {description}, effect: read, commands: [{{name: default}}]}}\n"
        )
    }

    fn tools(set: &ResourceSet) -> Vec<(String, String)> {
        set.tools
            .iter()
            .map(|t| {
                (
                    t.object.metadata.name.clone().unwrap_or_default(),
                    t.object.spec.description.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn a_cached_load_parses_only_the_files_that_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("sub/b.yaml"));
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(&a, tool("alpha", "first")).unwrap();
        std::fs::write(&b, tool("beta", "first")).unwrap();
        let mut cache = ParsedFiles::default();
        cache.begin();
        let set = load_dir_cached(dir.path(), &mut cache).unwrap();
        assert_eq!(cache.parsed(), 2);
        let first = tools(&set);
        assert_eq!(
            first,
            [
                ("alpha".into(), "first".into()),
                ("beta".into(), "first".into())
            ]
        );
        assert_eq!(tools(&load_dir(dir.path()).unwrap()), first);

        // Nothing changed: nothing is read again, and the set is the same.
        cache.begin();
        let set = load_dir_cached(dir.path(), &mut cache).unwrap();
        assert_eq!(cache.parsed(), 0);
        assert_eq!(tools(&set), first);

        // One file rewritten: only it is parsed again.
        std::fs::write(&b, tool("beta", "once more")).unwrap();
        cache.begin();
        let set = load_dir_cached(dir.path(), &mut cache).unwrap();
        assert_eq!(cache.parsed(), 1);
        assert_eq!(
            tools(&set),
            [
                ("alpha".into(), "first".into()),
                ("beta".into(), "once more".into())
            ]
        );

        // A file removed: its resources are gone, and so is its cached copy.
        std::fs::remove_file(&a).unwrap();
        cache.begin();
        let set = load_dir_cached(dir.path(), &mut cache).unwrap();
        assert_eq!(cache.parsed(), 0);
        assert_eq!(tools(&set), [("beta".into(), "once more".into())]);
        assert!(!cache.files.contains_key(&a));
    }

    fn load(text: &str) -> ResourceSet {
        let mut set = ResourceSet::default();
        load_text(Path::new("m/tools.yaml"), text, &mut set);
        set
    }

    #[test]
    fn builtins_are_added_unless_the_manifests_declare_the_same_resource() {
        let ours = load(
            r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: files}
spec: {description: our own, effect: read, commands: [{name: default}]}
"#,
        );
        let builtins = load(
            r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: files}
spec: {description: built in, effect: idempotent, commands: [{name: ls}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: web-fetch}
spec: {effect: read, commands: [{name: default}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: files, namespace: team}
spec: {effect: read, commands: [{name: default}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {name: files-1.0.0}
spec: {tool: files, version: 1.0.0, artifact: {file: files.wasm}}
"#,
        );
        let set = ours.with_builtins(builtins);
        let tools: Vec<_> = set
            .tools
            .iter()
            .map(|t| {
                (
                    t.object.metadata.namespace.clone().unwrap_or_default(),
                    t.object.metadata.name.clone().unwrap_or_default(),
                    t.object.spec.description.clone(),
                )
            })
            .collect();
        assert_eq!(
            tools,
            [
                ("default".into(), "files".into(), "our own".to_string()),
                ("default".into(), "web-fetch".into(), String::new()),
                ("team".into(), "files".into(), String::new()),
            ]
        );
        assert_eq!(set.releases.len(), 1, "another kind's name is its own");
    }

    #[test]
    fn multi_document_files_load_every_kind() {
        let set = load(
            r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: echo}
spec: {effect: read, commands: [{name: default}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {name: echo-1.0.0, namespace: team}
spec: {tool: echo, version: 1.0.0, artifact: {file: echo.wasm}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default}
spec: {replicas: 2}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: wasm}
binaryData: {echo.wasm: AGFzbQEAAAA=}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: report-agent}
"#,
        );
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        assert_eq!(set.ignored, 1, "other Kubernetes objects are left alone");
        assert_eq!(set.tools.len(), 1);
        assert_eq!(
            set.tools[0].object.metadata.namespace.as_deref(),
            Some("default")
        );
        assert_eq!(
            set.releases[0].object.metadata.namespace.as_deref(),
            Some("team")
        );
        assert_eq!(set.releases[0].source.document, 2);
        assert_eq!(set.pools.len(), 1);
        assert_eq!(set.config_maps.len(), 1);
    }

    #[test]
    fn problems_name_file_resource_and_field() {
        let set = load(
            r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: broken}
spec: {effect: read, commands: [{name: x, options: [{name: n, shcema: {}}]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: noeffect}
spec: {effect: sometimes, commands: []}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Gadget
metadata: {name: g}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
spec: {}
"#,
        );
        assert_eq!(set.invalid.len(), 4, "{:#?}", set.invalid);
        let first = &set.invalid[0];
        assert_eq!(first.kind, Some(Kind::Tool));
        assert_eq!(first.name.as_deref(), Some("broken"));
        assert_eq!(first.field, "spec.commands[0].options[0].shcema");
        assert!(first.message.contains("shcema"), "{}", first.message);
        let text = first.to_string();
        assert!(text.starts_with("m/tools.yaml (document 1): Tool default/broken: spec.commands[0].options[0].shcema:"), "{text}");
        assert_eq!(set.invalid[1].field, "spec.effect");
        assert_eq!(set.invalid[2].field, "kind");
        assert_eq!(set.invalid[3].field, "metadata.name");
    }

    #[test]
    fn secrets_are_read_and_bad_data_is_reported_without_its_value() {
        let set = load(
            r#"
apiVersion: v1
kind: Secret
metadata: {name: tokens, namespace: team}
stringData: {token: plain-value}
data: {b64: czNjcjN0}
---
apiVersion: v1
kind: Secret
metadata: {name: broken}
data: {key: "not base64 at all!"}
"#,
        );
        assert_eq!(set.secrets.len(), 1);
        assert_eq!(
            set.secrets[0].object.metadata.namespace.as_deref(),
            Some("team")
        );
        let data = crate::Identities::secret_data(&set.secrets[0].object);
        assert_eq!(data["token"].expose_str(), Some("plain-value"));
        assert_eq!(data["b64"].expose_str(), Some("s3cr3t"));
        assert_eq!(set.invalid.len(), 1, "{:?}", set.invalid);
        let text = set.invalid[0].to_string();
        assert!(text.contains("Secret"), "{text}");
        assert!(!text.contains("not base64 at all"), "{text}");
    }

    #[test]
    fn a_yaml_syntax_error_is_reported() {
        let set = load(
            "kind: Tool
  bad: [indent
",
        );
        assert_eq!(set.invalid.len(), 1);
        assert!(
            set.invalid[0].message.starts_with("not valid YAML"),
            "{}",
            set.invalid[0].message
        );
    }
}
