//! The contents of the Secrets and ConfigMaps that Agents refer to (`tokenSecretRef`,
//! `secretRef`, `configMapRef`), and nothing else: the controller watches Secrets by
//! metadata only and reads a Secret's contents only while an Agent names it
//! ([`SecretContents`]), so the Secrets of a namespace are not all held in memory.
//!
//! Which objects are wanted and what they hold are plain functions ([`references`],
//! [`agent_data`], [`plan`]); only [`SecretContents::refresh`] talks to the API.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, Resource};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use toolgrid_api::Agent;
use toolgrid_core::ids::ObjectKey;

/// Secrets and ConfigMaps Agents name, by namespace (the Agent's) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    pub secrets: BTreeSet<ObjectKey>,
    pub config_maps: BTreeSet<ObjectKey>,
}

/// What the catalog needs to know of the objects Agents refer to: Secret values (bytes,
/// as Kubernetes keeps them) and ConfigMap values, by object and key. An object missing
/// here does not exist (or is not readable); its absence is the catalog's to judge.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AgentData {
    pub secrets: BTreeMap<ObjectKey, BTreeMap<String, Vec<u8>>>,
    pub config_maps: BTreeMap<ObjectKey, BTreeMap<String, String>>,
}

/// Names the objects and keys, never a Secret's values.
impl std::fmt::Debug for AgentData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
        f.debug_struct("AgentData")
            .field(
                "secrets",
                &self
                    .secrets
                    .iter()
                    .map(|(k, v)| (k.to_string(), keys(v)))
                    .collect::<BTreeMap<_, _>>(),
            )
            .field("config_maps", &self.config_maps)
            .finish()
    }
}

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// The Secrets (token and values) and ConfigMaps the Agents name.
pub fn references<'a>(agents: impl IntoIterator<Item = &'a Agent>) -> References {
    let mut out = References::default();
    for agent in agents {
        let namespace = agent.metadata.namespace.clone().unwrap_or_default();
        let spec = &agent.spec;
        let key = |name: &str| ObjectKey::new(namespace.clone(), name);
        if let Some(token) = &spec.token_secret_ref {
            out.secrets.insert(key(&token.name));
        }
        if let Some(secret) = &spec.secret_ref {
            out.secrets.insert(key(&secret.name));
        }
        if let Some(config) = &spec.config_map_ref {
            out.config_maps.insert(key(&config.name));
        }
    }
    out
}

/// The contents of the objects the Agents name, from the Secrets and ConfigMaps at hand
/// (others are ignored). A Secret's `stringData` (only ever seen in objects not yet
/// stored) wins over its `data`, as the API server does it; a ConfigMap's `binaryData` is
/// not config and is left out.
pub fn agent_data<'a>(
    agents: impl IntoIterator<Item = &'a Agent>,
    secrets: impl IntoIterator<Item = &'a Secret>,
    config_maps: impl IntoIterator<Item = &'a ConfigMap>,
) -> AgentData {
    data_of(&references(agents), secrets, config_maps)
}

/// The Secrets ToolSources name (bearer tokens, header values), in their namespaces.
pub fn source_references<'a>(
    sources: impl IntoIterator<Item = &'a toolgrid_api::ToolSource>,
) -> BTreeSet<ObjectKey> {
    let mut out = BTreeSet::new();
    for source in sources {
        let namespace = source.metadata.namespace.clone().unwrap_or_default();
        let spec = &source.spec;
        let (auth, headers) = match (&spec.mcp, &spec.openapi) {
            (Some(mcp), _) => (&mcp.auth, &mcp.headers),
            (None, Some(openapi)) => (&openapi.auth, &openapi.headers),
            (None, None) => continue,
        };
        let refs = auth
            .iter()
            .filter_map(|a| a.secret_ref.as_ref())
            .chain(headers.iter().filter_map(|h| h.secret_ref.as_ref()));
        for secret in refs {
            out.insert(ObjectKey::new(namespace.clone(), secret.name.clone()));
        }
    }
    out
}

/// The contents of the `wanted` objects among those at hand.
pub fn data_of<'a>(
    wanted: &References,
    secrets: impl IntoIterator<Item = &'a Secret>,
    config_maps: impl IntoIterator<Item = &'a ConfigMap>,
) -> AgentData {
    let mut out = AgentData::default();
    for secret in secrets {
        let key = key_of(secret);
        if !wanted.secrets.contains(&key) {
            continue;
        }
        let mut values: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        for (k, v) in secret.string_data.iter().flatten() {
            values.insert(k.clone(), v.clone().into_bytes());
        }
        out.secrets.insert(key, values);
    }
    for config_map in config_maps {
        let key = key_of(config_map);
        if !wanted.config_maps.contains(&key) {
            continue;
        }
        out.config_maps
            .insert(key, config_map.data.clone().unwrap_or_default());
    }
    out
}

/// What to do about the Secrets' contents held: read again those wanted whose version
/// changed (or that are not held yet), drop those no longer wanted or gone.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub fetch: Vec<ObjectKey>,
    pub drop: Vec<ObjectKey>,
}

/// Plans a refresh: `wanted` are the Secrets Agents name, `existing` the resourceVersion of
/// every Secret the metadata watch sees, `held` the resourceVersion of each one held.
pub fn plan(
    wanted: &BTreeSet<ObjectKey>,
    existing: &BTreeMap<ObjectKey, String>,
    held: &BTreeMap<ObjectKey, String>,
) -> Plan {
    let mut out = Plan::default();
    for key in wanted {
        match existing.get(key) {
            Some(version) if held.get(key) != Some(version) => out.fetch.push(key.clone()),
            Some(_) => {}
            None if held.contains_key(key) => out.drop.push(key.clone()),
            None => {}
        }
    }
    out.drop
        .extend(held.keys().filter(|k| !wanted.contains(*k)).cloned());
    out
}

/// The contents of the Secrets Agents name, read by name when their resourceVersion
/// changes, held only while an Agent names them.
pub struct SecretContents {
    client: Client,
    held: Mutex<BTreeMap<ObjectKey, (String, Secret)>>,
}

impl SecretContents {
    pub fn new(client: Client) -> Self {
        SecretContents {
            client,
            held: Mutex::default(),
        }
    }

    /// Brings the held Secrets in line with `wanted` and `existing` (see [`plan`]) and
    /// returns them. A Secret that cannot be read now keeps its last contents, if any.
    pub async fn refresh(
        &self,
        wanted: &BTreeSet<ObjectKey>,
        existing: &BTreeMap<ObjectKey, String>,
    ) -> Vec<Secret> {
        let versions: BTreeMap<ObjectKey, String> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        let plan = plan(wanted, existing, &versions);
        let mut read = Vec::new();
        for key in &plan.fetch {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &key.namespace);
            match api.get_opt(&key.name).await {
                Ok(Some(secret)) => {
                    let version = secret.metadata.resource_version.clone().unwrap_or_default();
                    read.push((key.clone(), Some((version, secret))));
                }
                Ok(None) => read.push((key.clone(), None)),
                Err(error) => {
                    tracing::warn!(secret = %key, %error, "cannot read a Secret an Agent names")
                }
            }
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for key in &plan.drop {
            held.remove(key);
        }
        for (key, secret) in read {
            match secret {
                Some(secret) => held.insert(key, secret),
                None => held.remove(&key),
            };
        }
        held.values().map(|(_, s)| s.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::mock::{expect, expect_nothing, mock_client};
    use super::*;
    use http::{Method, StatusCode};
    use serde_json::json;
    use std::sync::Arc;
    use toolgrid_catalog::manifest::{ResourceSet, load_text};

    const AGENTS: &str = r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: reporter, namespace: team}
spec:
  tokenSecretRef: {name: reporter-token, key: token}
  configMapRef: {name: reporter-config}
  secretRef: {name: reporter-secrets}
  permissions: [{tools: ["*"]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: bot, namespace: other}
spec:
  serviceAccount: bot
  secretRef: {name: reporter-secrets}
"#;

    fn agents() -> Vec<Agent> {
        let mut set = ResourceSet::default();
        load_text(std::path::Path::new("cluster"), AGENTS, &mut set);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        set.agents.into_iter().map(|s| s.object).collect()
    }

    fn secret(namespace: &str, name: &str, data: &[(&str, &[u8])]) -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "data": data.iter().map(|(k, v)| {
                use base64::Engine as _;
                (k.to_string(), json!(base64::engine::general_purpose::STANDARD.encode(v)))
            }).collect::<serde_json::Map<_, _>>(),
        }))
        .unwrap()
    }

    fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace},
            "data": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        }))
        .unwrap()
    }

    #[test]
    fn agents_refer_to_objects_in_their_own_namespace() {
        let refs = references(&agents());
        assert_eq!(
            refs.secrets,
            BTreeSet::from([
                ObjectKey::new("other", "reporter-secrets"),
                ObjectKey::new("team", "reporter-secrets"),
                ObjectKey::new("team", "reporter-token"),
            ])
        );
        assert_eq!(
            refs.config_maps,
            BTreeSet::from([ObjectKey::new("team", "reporter-config")])
        );
    }

    #[test]
    fn only_what_agents_name_is_kept_and_values_stay_out_of_debug_output() {
        let agents = agents();
        let secrets = [
            secret("team", "reporter-token", &[("token", b"t0k3n")]),
            secret(
                "team",
                "reporter-secrets",
                &[("api-token", b"s3cr3t-value")],
            ),
            secret("team", "unrelated", &[("password", b"hunter2")]),
            // Same name, namespace no Agent of which names it.
            secret("elsewhere", "reporter-token", &[("token", b"nope")]),
        ];
        let config_maps = [
            config_map("team", "reporter-config", &[("region", "eu-west-1")]),
            config_map("team", "echo-wasm", &[("x", "y")]),
        ];
        let data = agent_data(&agents, &secrets, &config_maps);
        assert_eq!(
            data.secrets.keys().cloned().collect::<Vec<_>>(),
            [
                ObjectKey::new("team", "reporter-secrets"),
                ObjectKey::new("team", "reporter-token")
            ]
        );
        assert_eq!(
            data.secrets[&ObjectKey::new("team", "reporter-secrets")]["api-token"],
            b"s3cr3t-value"
        );
        assert_eq!(
            data.secrets[&ObjectKey::new("team", "reporter-token")]["token"],
            b"t0k3n"
        );
        assert_eq!(
            data.config_maps[&ObjectKey::new("team", "reporter-config")]["region"],
            "eu-west-1"
        );
        assert_eq!(data.config_maps.len(), 1);
        let printed = format!("{data:?}");
        assert!(printed.contains("api-token"), "{printed}");
        assert!(!printed.contains("s3cr3t") && !printed.contains("t0k3n"));
        // `stringData` wins over `data`.
        let mut unstored = secret("team", "reporter-token", &[("token", b"old")]);
        unstored.string_data = Some(BTreeMap::from([("token".into(), "new".into())]));
        let data = agent_data(&agents, [&unstored], []);
        assert_eq!(
            data.secrets[&ObjectKey::new("team", "reporter-token")]["token"],
            b"new"
        );
    }

    #[test]
    fn a_refresh_reads_only_changed_wanted_secrets_and_forgets_the_rest() {
        let k = |n: &str| ObjectKey::new("team", n);
        let wanted = BTreeSet::from([k("a"), k("b"), k("c"), k("gone")]);
        let existing = BTreeMap::from([
            (k("a"), "1".to_string()),
            (k("b"), "7".to_string()),
            (k("c"), "3".to_string()),
            (k("unwanted"), "1".to_string()),
        ]);
        let held = BTreeMap::from([
            (k("a"), "1".to_string()),    // unchanged
            (k("b"), "6".to_string()),    // changed
            (k("gone"), "2".to_string()), // deleted
            (k("old"), "1".to_string()),  // no Agent names it now
        ]);
        assert_eq!(
            plan(&wanted, &existing, &held),
            Plan {
                fetch: vec![k("b"), k("c")],
                drop: vec![k("gone"), k("old")],
            }
        );
    }

    #[tokio::test]
    async fn secrets_are_read_by_name_and_again_only_when_they_change() {
        let (client, mut handle) = mock_client();
        let contents = Arc::new(SecretContents::new(client));
        let token = ObjectKey::new("team", "reporter-token");
        let wanted = BTreeSet::from([token.clone()]);
        let mut existing = BTreeMap::from([
            (token.clone(), "5".to_string()),
            (ObjectKey::new("team", "unrelated"), "9".to_string()),
        ]);
        let answer = |version: &str, value: &str| {
            use base64::Engine as _;
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "reporter-token", "namespace": "team", "resourceVersion": version},
                   "data": {"token": base64::engine::general_purpose::STANDARD.encode(value)}})
        };
        let task = tokio::spawn({
            let (contents, wanted, existing) = (contents.clone(), wanted.clone(), existing.clone());
            async move { contents.refresh(&wanted, &existing).await }
        });
        expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/team/secrets/reporter-token",
            &[],
            StatusCode::OK,
            |_| answer("5", "first"),
        )
        .await;
        let secrets = task.await.unwrap();
        assert_eq!(secrets.len(), 1);
        assert_eq!(secrets[0].data.as_ref().unwrap()["token"].0, b"first");

        // Unchanged: nothing is read.
        let again = contents.refresh(&wanted, &existing).await;
        assert_eq!(again, secrets);
        expect_nothing(&mut handle).await;

        // Changed: read again.
        existing.insert(token.clone(), "6".into());
        let task = tokio::spawn({
            let (contents, wanted, existing) = (contents.clone(), wanted.clone(), existing.clone());
            async move { contents.refresh(&wanted, &existing).await }
        });
        expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/team/secrets/reporter-token",
            &[],
            StatusCode::OK,
            |_| answer("6", "second"),
        )
        .await;
        let secrets = task.await.unwrap();
        assert_eq!(secrets[0].data.as_ref().unwrap()["token"].0, b"second");

        // No Agent names it any more: forgotten without asking.
        assert!(
            contents
                .refresh(&BTreeSet::new(), &existing)
                .await
                .is_empty()
        );
        expect_nothing(&mut handle).await;
    }
}
