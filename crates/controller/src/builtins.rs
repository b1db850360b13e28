//! The built-in tools in a cluster (`toolgrid controller --builtins DIR`): the Tools and
//! ToolReleases of manifest directories shipped in the image, served in one namespace
//! beside the cluster's own resources, as `toolgrid up` serves them. A resource of the
//! cluster with the same kind, namespace and name replaces a built-in, and a later
//! directory's built-in an earlier one's. Their artifacts are files of the image, read,
//! checked and put in the store once, at start, one release at a time (the python runtime
//! is 158 MB: its bytes are not held after that; retention keeps what a current release
//! uses); they are not objects of the API (nothing to write a status to), and none is bound
//! until a ToolBinding or an Agent opts in.

use std::collections::HashMap;
use std::path::PathBuf;
use toolgrid_catalog::artifacts::{LoadedArtifact, load_local};
use toolgrid_catalog::manifest::{ResourceSet, Sourced, load_dir};
use toolgrid_core::ids::ObjectKey;

/// The built-ins, loaded.
#[derive(Debug, Default)]
pub struct Builtins {
    set: ResourceSet,
    artifacts: HashMap<ObjectKey, LoadedArtifact>,
}

impl Builtins {
    /// Loads `dirs` (a later one's resources replacing an earlier one's) into `namespace`.
    /// Their artifacts are read by [`Builtins::put_in`].
    pub fn load(dirs: &[PathBuf], namespace: &str) -> std::io::Result<Builtins> {
        let mut set = ResourceSet::default();
        for dir in dirs.iter().rev() {
            set = set.with_builtins(load_dir(dir)?);
        }
        for invalid in &set.invalid {
            tracing::warn!(%invalid, "a built-in manifest is invalid");
        }
        let set = into_namespace(set, namespace);
        Ok(Builtins {
            set,
            artifacts: HashMap::new(),
        })
    }

    /// Reads and checks each release's artifact (and its files' and commands'), puts the
    /// Ready ones' bytes in `store`, and keeps only their outcomes. One release at a time:
    /// the built-in `python` and `code` name the same 158 MB of runtime files, and each
    /// release's bytes are stored and dropped before the next are read.
    pub async fn put_in(
        mut self,
        store: &dyn toolgrid_store::Artifacts,
    ) -> Result<Builtins, toolgrid_store::StoreError> {
        for release in &self.set.releases {
            let mut loaded = load_local(release, &self.set.config_maps);
            if let toolgrid_catalog::artifacts::ArtifactOutcome::Ready { digest, .. } =
                &loaded.outcome
            {
                if let Some(bytes) = loaded.bytes.take() {
                    store.put_artifact(digest, bytes).await?;
                }
                for (digest, bytes) in std::mem::take(&mut loaded.file_bytes) {
                    store.put_artifact(&digest, bytes).await?;
                }
            }
            self.artifacts.insert(key_of(release), loaded);
        }
        Ok(self)
    }

    /// `cluster`'s resources with the built-ins under them.
    pub fn under(&self, cluster: ResourceSet) -> ResourceSet {
        cluster.with_builtins(self.set.clone())
    }

    /// The artifact of built-in release `key`, as loaded at start.
    pub fn artifact(&self, key: &ObjectKey) -> Option<LoadedArtifact> {
        self.artifacts.get(key).cloned()
    }

    /// How many Tools the built-ins declare.
    pub fn tools(&self) -> usize {
        self.set.tools.len()
    }
}

fn key_of<K: kube::Resource>(object: &Sourced<K>) -> ObjectKey {
    let meta = object.object.meta();
    ObjectKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Every resource of `set` in `namespace`.
fn into_namespace(mut set: ResourceSet, namespace: &str) -> ResourceSet {
    fn put<K: kube::Resource>(objects: &mut [Sourced<K>], namespace: &str) {
        for o in objects {
            o.object.meta_mut().namespace = Some(namespace.to_string());
        }
    }
    put(&mut set.tools, namespace);
    put(&mut set.releases, namespace);
    put(&mut set.bindings, namespace);
    put(&mut set.middleware, namespace);
    put(&mut set.agents, namespace);
    put(&mut set.pools, namespace);
    put(&mut set.tool_sources, namespace);
    put(&mut set.config_maps, namespace);
    put(&mut set.secrets, namespace);
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toolgrid_catalog::artifacts::ArtifactOutcome;
    use toolgrid_catalog::manifest::load_text;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The shipped built-ins in `namespace`, put in a fresh store (kept in the directory).
    async fn put_in_a_store(
        namespace: &str,
    ) -> (tempfile::TempDir, Arc<dyn toolgrid_store::Store>, Builtins) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            toolgrid_store::open(&format!("sqlite://{}", dir.path().join("s.db").display()))
                .await
                .unwrap();
        let builtins = Builtins::load(&[repo().join("builtins/manifests")], namespace)
            .unwrap()
            .put_in(store.as_ref())
            .await
            .unwrap();
        (dir, store, builtins)
    }

    /// The image's built-ins load into the namespace given, each release Ready from its
    /// committed artifact, and a cluster resource of the same name replaces a built-in.
    #[tokio::test]
    async fn the_shipped_builtins_load_into_a_namespace_and_the_clusters_own_replace_them() {
        let (_dir, _store, builtins) = put_in_a_store("team-a").await;
        assert_eq!(builtins.tools(), 4);
        for release in ["files-1.0.0", "js-1.0.0", "code-1.0.0", "web-fetch-1.0.0"] {
            let loaded = builtins
                .artifact(&ObjectKey::new("team-a", release))
                .unwrap_or_else(|| panic!("{release}"));
            assert!(
                matches!(loaded.outcome, ArtifactOutcome::Ready { .. }),
                "{release}: {:?}",
                loaded.outcome
            );
        }
        let mut cluster = ResourceSet::default();
        load_text(
            std::path::Path::new("cluster"),
            "apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {name: files, namespace: team-a}\n\
             spec: {effect: read, commands: [{name: ls}]}\n",
            &mut cluster,
        );
        let set = builtins.under(cluster);
        let files: Vec<_> = set
            .tools
            .iter()
            .filter(|t| t.object.metadata.name.as_deref() == Some("files"))
            .collect();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].object.spec.commands.len(), 1, "the cluster's own");
        assert!(
            set.tools
                .iter()
                .all(|t| t.object.metadata.namespace.as_deref() == Some("team-a"))
        );
    }

    /// At start their bytes go to the store once; the controller keeps only the outcomes.
    #[tokio::test]
    async fn their_artifacts_go_to_the_store_once_and_only_outcomes_are_kept() {
        let (_dir, store, builtins) = put_in_a_store("default").await;
        let js = builtins
            .artifact(&ObjectKey::new("default", "js-1.0.0"))
            .unwrap();
        assert!(js.bytes.is_none() && js.file_bytes.is_empty());
        let ArtifactOutcome::Ready { digest, size, .. } = js.outcome else {
            panic!("{:?}", js.outcome)
        };
        let stored = store.get_artifact(&digest).await.unwrap().expect("stored");
        assert_eq!(stored.len() as u64, size);
        assert_eq!(toolgrid_core::artifact::digest_of(&stored), digest);
    }
}
