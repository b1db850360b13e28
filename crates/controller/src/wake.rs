//! Which watch events resolve the catalog again.
//!
//! The cluster source resolves the whole catalog after a change to anything it reads. The
//! controller's own status writes are changes too, and with thousands of Tools and
//! ToolReleases each write would resolve everything again (and the statuses the new
//! snapshot moved would be written, and resolve again). A resolve reads a declared
//! object's spec (its `generation` counts the changes), labels, annotations and whether
//! it is being deleted; its status only as the previous round's outcome, read from the
//! cache whenever the next resolve runs. So for those kinds an event that moved only the
//! status (or the finalizers, also the controller's own) does not wake the resolve. Kinds
//! without a generation (ConfigMaps, Secrets, ServiceAccounts) and ToolSources (whose
//! status keeps the snapshot of their upstream the resolve serves) wake it on any change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// What of an object's changes wakes the resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Any change (a new resourceVersion).
    AnyChange,
    /// A change to what the resolve reads of it: not the status, not the finalizers.
    InputChange,
}

/// The part of an object's metadata a resolve depends on, as one number: the generation
/// (the spec's changes), labels, annotations and a deletion under way; an object without a
/// generation, its resourceVersion.
pub fn input_stamp(meta: &ObjectMeta) -> u64 {
    let mut hasher = DefaultHasher::new();
    match meta.generation {
        Some(generation) => {
            generation.hash(&mut hasher);
            meta.labels.hash(&mut hasher);
            meta.annotations.hash(&mut hasher);
            meta.deletion_timestamp.is_some().hash(&mut hasher);
        }
        None => meta.resource_version.hash(&mut hasher),
    }
    hasher.finish()
}

/// The stamps of one watch's objects, as last seen.
#[derive(Debug)]
pub struct Stamps {
    wake: Wake,
    seen: HashMap<(String, String), u64>,
}

impl Stamps {
    pub fn new(wake: Wake) -> Self {
        Stamps {
            wake,
            seen: HashMap::new(),
        }
    }

    /// Whether `event` should resolve the catalog again; keeps the stamps up to date.
    pub fn wakes<K: Resource>(&mut self, event: &Event<K>) -> bool {
        match event {
            Event::Apply(object) | Event::InitApply(object) => {
                let key = (object.namespace().unwrap_or_default(), object.name_any());
                let stamp = input_stamp(object.meta());
                let before = self.seen.insert(key, stamp);
                self.wake == Wake::AnyChange || before != Some(stamp)
            }
            Event::Delete(object) => {
                self.seen
                    .remove(&(object.namespace().unwrap_or_default(), object.name_any()));
                true
            }
            // A relist starts: objects deleted meanwhile are simply not listed again, so
            // the stamps start over. Its end wakes the resolve.
            Event::Init => {
                self.seen.clear();
                false
            }
            Event::InitDone => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment as Tool;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    /// An object with a status subresource (only its metadata counts; a Deployment stands
    /// in for a Tool).
    fn tool(generation: i64, version: &str) -> Tool {
        let mut tool = Tool::default();
        tool.metadata.name = Some("t".into());
        tool.metadata.namespace = Some("default".into());
        tool.metadata.generation = Some(generation);
        tool.metadata.resource_version = Some(version.into());
        tool
    }

    #[test]
    fn a_status_or_finalizer_write_does_not_wake_the_resolve_a_spec_change_does() {
        let mut stamps = Stamps::new(Wake::InputChange);
        assert!(stamps.wakes(&Event::Apply(tool(1, "10"))), "first seen");
        // The controller's status write: a new resourceVersion, the same generation.
        let mut written = tool(1, "11");
        written.status = Some(Default::default());
        assert!(!stamps.wakes(&Event::Apply(written)));
        let mut finalized = tool(1, "12");
        finalized.metadata.finalizers = Some(vec!["toolgrid.dev/calls-in-flight".into()]);
        assert!(!stamps.wakes(&Event::Apply(finalized)));
        // A spec change, a label, an annotation, a deletion under way: each wakes it.
        assert!(stamps.wakes(&Event::Apply(tool(2, "13"))));
        let mut labelled = tool(2, "14");
        labelled.metadata.labels = Some(BTreeMap::from([("team".into(), "a".into())]));
        assert!(stamps.wakes(&Event::Apply(labelled.clone())));
        let mut annotated = labelled.clone();
        annotated.metadata.annotations = Some(BTreeMap::from([(
            "toolgrid.dev/refresh".into(),
            "1".into(),
        )]));
        assert!(stamps.wakes(&Event::Apply(annotated.clone())));
        let mut deleting = annotated.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(stamps.wakes(&Event::Apply(deleting.clone())));
        assert!(stamps.wakes(&Event::Delete(deleting)));
        // Gone, then listed again: seen anew.
        assert!(stamps.wakes(&Event::Apply(tool(2, "20"))));
    }

    #[test]
    fn a_relist_forgets_the_stamps_and_its_end_wakes_the_resolve() {
        let mut stamps = Stamps::new(Wake::InputChange);
        assert!(stamps.wakes(&Event::Apply(tool(1, "10"))));
        assert!(!stamps.wakes(&Event::<Tool>::Init));
        // Listed again as it was: nothing to resolve for it, but the relist's end does.
        assert!(stamps.wakes(&Event::InitApply(tool(1, "10"))));
        assert!(!stamps.wakes(&Event::InitApply(tool(1, "10"))));
        assert!(stamps.wakes(&Event::<Tool>::InitDone));
    }

    #[test]
    fn kinds_without_a_generation_and_any_change_kinds_wake_on_every_change() {
        let mut config_maps = Stamps::new(Wake::InputChange);
        let mut map = ConfigMap::default();
        map.metadata.name = Some("artifacts".into());
        map.metadata.resource_version = Some("1".into());
        assert!(config_maps.wakes(&Event::Apply(map.clone())));
        map.metadata.resource_version = Some("2".into());
        assert!(config_maps.wakes(&Event::Apply(map)));
        let mut any = Stamps::new(Wake::AnyChange);
        assert!(any.wakes(&Event::Apply(tool(1, "10"))));
        assert!(any.wakes(&Event::Apply(tool(1, "11"))));
    }
}
