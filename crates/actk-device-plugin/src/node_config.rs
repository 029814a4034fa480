//! Per-node named configs, as NVIDIA's device plugin chooses one by its node label
//! `nvidia.com/device-plugin.config` (its config-manager sidecar): the chart mounts several named
//! configs (`config.map` or the ConfigMap `config.name`, one per key) and the label
//! [`CONFIG_LABEL`] (`actk.dev/config=<name>`) of the plugin's Node picks one; without it,
//! NVIDIA's label, then the default (`config.default`, else a key `default`, else the only one).
//!
//! The plugin reads its Node when it starts and then every [`POLL`]; when the label names
//! another config that loads, the plugin stops serving and executes itself again (same pid, same
//! arguments: a restart in place, without the kubelet's crash-loop back-off), which re-registers
//! every resource with the kubelet under the new config. A name that does not load (no such
//! config, or one the config refuses) keeps the running config and is told in the log (error)
//! and a Warning Event `ConfigRefused` on the Node; at start, with nothing to keep, the plugin
//! serves nothing (not ready) until the label is fixed.
//!
//! The decision ([`requested`], [`decide`]) is pure; [`NodeSource`] is the API server side
//! (kube-rs: `get` on its own Node, `create` of Events), which needs the chart's RBAC.

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// The node label naming the node's config: `actk.dev/config=<name>`.
pub const CONFIG_LABEL: &str = "actk.dev/config";

/// NVIDIA's label for the same (k8s-device-plugin's config-manager), honoured when
/// [`CONFIG_LABEL`] is absent so that nodes labelled for NVIDIA's plugin keep their config.
pub const NVIDIA_CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";

/// How often the plugin reads its Node's labels.
pub const POLL: Duration = Duration::from_secs(10);

/// Event reason of a label naming a config that does not load.
pub const REFUSED_REASON: &str = "ConfigRefused";

/// The config name a node's `labels` ask for, with the label that asked: [`CONFIG_LABEL`], else
/// [`NVIDIA_CONFIG_LABEL`]; `None`: neither (or empty), the default config.
pub fn requested(labels: &BTreeMap<String, String>) -> Option<(&'static str, String)> {
    [CONFIG_LABEL, NVIDIA_CONFIG_LABEL]
        .into_iter()
        .find_map(|l| labels.get(l).map(|v| v.trim()).filter(|v| !v.is_empty()).map(|v| (l, v.to_string())))
}

/// What to do about the node's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// They ask for the config in use.
    Keep,
    /// They ask for another config, which loads: serve it (`None`: the default).
    Switch(Option<String>),
    /// They ask for a config that does not load: keep the one in use, and say why.
    Refuse {
        /// The requested name (`None`: the default).
        name: Option<String>,
        /// The label that asked (`None`: no label, the default).
        label: Option<&'static str>,
        /// The loader's error.
        why: String,
    },
}

/// The decision for `labels` while serving config `current` (`None`: the default); `check`
/// loads a config by name (the whole settings, so a config the plugin would refuse is refused
/// here, before anything stops).
pub fn decide(
    current: Option<&str>,
    labels: &BTreeMap<String, String>,
    check: impl Fn(Option<&str>) -> Result<(), String>,
) -> Decision {
    let req = requested(labels);
    let name = req.as_ref().map(|(_, n)| n.as_str());
    if name == current {
        return Decision::Keep;
    }
    match check(name) {
        Ok(()) => Decision::Switch(name.map(str::to_string)),
        Err(why) => Decision::Refuse { name: name.map(str::to_string), label: req.map(|(l, _)| l), why },
    }
}

/// The message of a [`Decision::Refuse`], for the log and the Event: the label, the name, what
/// the plugin serves instead (`current`, `None` at start: nothing yet) and the fix.
pub fn refusal_message(name: Option<&str>, label: Option<&str>, why: &str, current: Option<Option<&str>>) -> String {
    let asked = match (label, name) {
        (Some(l), Some(n)) => format!("node label {l}={n}"),
        _ => "the default config (no node label actk.dev/config)".to_string(),
    };
    let keeps = match current {
        Some(Some(c)) => format!("keeping config {c:?}"),
        Some(None) => "keeping the default config".to_string(),
        None => "serving nothing until it is fixed".to_string(),
    };
    format!("{asked}: {why}; {keeps} (label the node with a name of the chart's config.map, or remove the label)")
}

/// The plugin's Node on the API server.
pub struct NodeSource {
    client: kube::Client,
    node: String,
}

impl NodeSource {
    /// A client from the in-cluster service account (else `$KUBECONFIG`) for Node `node`.
    ///
    /// Errors: no API server configuration found.
    pub async fn connect(node: String) -> anyhow::Result<NodeSource> {
        use anyhow::Context;
        let config = kube::Config::infer().await.context("finding the API server (in-cluster config or KUBECONFIG)")?;
        let client = kube::Client::try_from(config).context("building the API client")?;
        Ok(NodeSource { client, node })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The Node's labels and uid.
    ///
    /// Errors: the API server's message, naming the node.
    pub async fn labels(&self) -> Result<(BTreeMap<String, String>, Option<String>), String> {
        let n = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(|e| format!("reading node {}: {e}", self.node))?;
        Ok((n.metadata.labels.unwrap_or_default(), n.metadata.uid))
    }

    /// Posts a Warning Event [`REFUSED_REASON`] with `message` on the Node (namespace
    /// `default`, where the kubelet posts a Node's events; `kubectl describe node` shows it).
    ///
    /// Errors: the API server's message.
    pub async fn refused(&self, uid: Option<String>, message: &str) -> Result<(), String> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta { generate_name: Some(format!("{}.", self.node)), ..Default::default() },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid,
                ..Default::default()
            },
            reason: Some(REFUSED_REASON.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("Configure".into()),
            reporting_component: Some("actk.dev/device-plugin".into()),
            reporting_instance: Some(self.node.clone()),
            source: Some(EventSource { component: Some("actk-device-plugin".into()), host: Some(self.node.clone()) }),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &ev)
            .await
            .map(|_| ())
            .map_err(|e| format!("posting an event on node {}: {e}", self.node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Only `shared` and `plain` load, as a ConfigMap with those two keys.
    fn check(n: Option<&str>) -> Result<(), String> {
        match n {
            None | Some("shared") | Some("plain") => Ok(()),
            Some(o) => Err(format!("a config named {o:?} in the ConfigMap; it has plain, shared")),
        }
    }

    #[test]
    fn actk_label_first_then_nvidia_then_the_default() {
        assert_eq!(requested(&labels(&[])), None);
        assert_eq!(requested(&labels(&[(CONFIG_LABEL, "  ")])), None, "an empty value is no choice");
        assert_eq!(requested(&labels(&[(NVIDIA_CONFIG_LABEL, "a")])), Some((NVIDIA_CONFIG_LABEL, "a".into())));
        assert_eq!(
            requested(&labels(&[(NVIDIA_CONFIG_LABEL, "a"), (CONFIG_LABEL, "b")])),
            Some((CONFIG_LABEL, "b".into()))
        );
    }

    #[test]
    fn a_label_switches_the_config_and_a_bad_name_keeps_it() {
        let shared = labels(&[(CONFIG_LABEL, "shared")]);
        assert_eq!(decide(None, &shared, check), Decision::Switch(Some("shared".into())));
        assert_eq!(decide(Some("shared"), &shared, check), Decision::Keep);
        // The label removed: back to the default.
        assert_eq!(decide(Some("shared"), &labels(&[]), check), Decision::Switch(None));
        assert_eq!(decide(None, &labels(&[]), check), Decision::Keep);
        // An unknown name: refused with the loader's words, the running config kept.
        let d = decide(Some("shared"), &labels(&[(CONFIG_LABEL, "gone")]), check);
        let Decision::Refuse { name, label, why } = d else { panic!("{d:?}") };
        assert_eq!((name.as_deref(), label), (Some("gone"), Some(CONFIG_LABEL)));
        let m = refusal_message(name.as_deref(), label, &why, Some(Some("shared")));
        assert!(
            m.contains("actk.dev/config=gone")
                && m.contains("it has plain, shared")
                && m.contains("keeping config \"shared\""),
            "{m}"
        );
        let m = refusal_message(name.as_deref(), label, &why, None);
        assert!(m.contains("serving nothing until it is fixed"), "{m}");
    }

    #[test]
    fn a_default_that_does_not_load_is_refused_too() {
        let d = decide(Some("shared"), &labels(&[]), |n| if n.is_none() { Err("no default".into()) } else { Ok(()) });
        assert!(matches!(d, Decision::Refuse { name: None, label: None, .. }), "{d:?}");
    }
}
