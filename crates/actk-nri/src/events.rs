//! "Start anyway, and an Event says so": on a node without the NRI gate (chart `nri.gate:
//! false`), a container created while this plugin was not connected starts without its devices.
//! When the plugin connects and the runtime's Synchronize lists such containers
//! ([`crate::plugin::unserved`]), it posts a Warning Event ([`NOT_SERVED`]) on each one's Pod
//! through the API server (core/v1 Event, as the kubelet posts its own), so that `kubectl
//! describe pod` and `kubectl get events` say what the plugin's log says: which container, what it
//! asked for, which plugin did not serve it, and the fix (recreate the pod; the gate).
//!
//! Each container is reported once per plugin process (by its runtime ID): containerd sends a
//! Synchronize on every reconnect. A post is tried a few times; one that still fails is logged
//! and tried again at the next synchronization. Which containers get an Event is decided by [`to_post`] (pure); [`Notifier`]
//! posts.

use crate::plugin::{PodRef, Unserved};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// Event reason: a container of the pod runs without the devices it asked for, because this
/// NRI plugin did not serve it.
pub const NOT_SERVED: &str = "ActkNriNotServed";

/// `reportingComponent` of the Events (and `source.component`).
pub const COMPONENT: &str = "actk-nri";

/// Tries per Event before it waits for the next synchronization (1, 2, 4, 8 s apart).
const POST_ATTEMPTS: u32 = 5;

/// At most this many missing device nodes are named in a message (a pod with 8 GPUs lacks
/// a dozen nodes; the log has them all).
const MAX_NAMED_NODES: usize = 8;

/// The containers of `found` that get an Event now: those whose pod the runtime named (an
/// Event needs an object) and that this process has not reported yet (`posted`: container IDs).
pub fn to_post<'a>(found: &'a [Unserved], posted: &BTreeSet<String>) -> Vec<(&'a Unserved, &'a PodRef)> {
    found
        .iter()
        .filter(|u| !posted.contains(&u.container_id))
        .filter_map(|u| Some((u, u.pod.as_ref()?)))
        .filter(|(_, p)| !p.namespace.is_empty() && !p.name.is_empty())
        .collect()
}

/// The Event's message for `u`, naming the container, what it asked for, the plugin (`plugin`:
/// its NRI name, `10-actk`) and node, and the fixes.
pub fn message(u: &Unserved, plugin: &str, node: &str) -> String {
    let mut missing = u.missing.iter().take(MAX_NAMED_NODES).cloned().collect::<Vec<_>>().join(", ");
    if u.missing.len() > MAX_NAMED_NODES {
        missing.push_str(&format!(" and {} more", u.missing.len() - MAX_NAMED_NODES));
    }
    format!(
        "container {} started without its devices: it asks for {} but the actk NRI plugin {plugin} on node {node} was not serving when the container was created, so it lacks {missing}. Delete the pod to recreate it with its devices; to make such containers fail instead of starting without devices, set the actk chart value nri.gate: true",
        u.container, u.asks
    )
}

/// Posts [`NOT_SERVED`] Events through the API server, once per container.
pub struct Notifier {
    client: kube::Client,
    node: String,
    plugin: String,
    posted: Mutex<BTreeSet<String>>,
}

impl Notifier {
    /// A notifier with the in-cluster client (the pod's service account; else `$KUBECONFIG`),
    /// posting as plugin `plugin` (`10-actk`) on node `node`.
    ///
    /// Errors: no API server could be found (the message says where it looked).
    pub async fn new(node: String, plugin: String) -> anyhow::Result<Notifier> {
        use anyhow::Context;
        let config = kube::Config::infer().await.context("finding the API server (in-cluster config or KUBECONFIG)")?;
        let client = kube::Client::try_from(config).context("building the API client")?;
        Ok(Notifier { client, node, plugin, posted: Mutex::new(BTreeSet::new()) })
    }

    /// Posts an Event for each container of `found` not reported yet ([`to_post`]), each tried
    /// [`POST_ATTEMPTS`] times; a failure is logged (and the container tried again at the next
    /// synchronization).
    pub async fn post(&self, found: &[Unserved]) {
        let due: Vec<(Unserved, PodRef)> = {
            let posted = self.posted.lock().unwrap_or_else(|e| e.into_inner());
            to_post(found, &posted).into_iter().map(|(u, p)| (u.clone(), p.clone())).collect()
        };
        for (u, pod) in due {
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self.post_one(&u, &pod).await {
                    Ok(()) => {
                        tracing::info!("posted Event {NOT_SERVED} on pod {}/{}", pod.namespace, pod.name);
                        self.posted.lock().unwrap_or_else(|e| e.into_inner()).insert(u.container_id.clone());
                        break;
                    }
                    // A plugin pod just started may reach the API server a moment later.
                    Err(e) if attempt < POST_ATTEMPTS => {
                        tracing::debug!("posting Event {NOT_SERVED} (attempt {attempt}): {e}");
                        tokio::time::sleep(std::time::Duration::from_secs(1 << attempt)).await;
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot post Event {NOT_SERVED} on pod {}/{} ({POST_ATTEMPTS} attempts; the chart's RBAC gives actk-nri events create, and the API server must be reachable from the node): {e}",
                            pod.namespace,
                            pod.name
                        );
                        break;
                    }
                }
            }
        }
    }

    async fn post_one(&self, u: &Unserved, pod: &PodRef) -> Result<(), kube::Error> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", pod.name)),
                namespace: Some(pod.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
                // As the kubelet names a container in its events.
                field_path: Some(format!("spec.containers{{{}}}", u.container)),
                ..Default::default()
            },
            reason: Some(NOT_SERVED.into()),
            message: Some(message(u, &self.plugin, &self.node)),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("CreateContainer".into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.node.clone()),
            source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(self.node.clone()) }),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &pod.namespace)
            .create(&PostParams::default(), &ev)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unserved(id: &str, pod: Option<(&str, &str)>) -> Unserved {
        Unserved {
            container_id: id.into(),
            container: format!("ctr-{id}"),
            pod: pod.map(|(ns, name)| PodRef { namespace: ns.into(), name: name.into(), uid: "u-1".into() }),
            asks: "nvidia.com/gpu=2".into(),
            missing: vec!["/dev/nvidia2".into()],
        }
    }

    /// An Event for each unserved container whose pod is known, once: not for one the runtime
    /// listed without its pod, nor again for one reported before (a reconnect's Synchronize).
    #[test]
    fn each_unserved_container_with_a_pod_gets_one_event() {
        let found = [
            unserved("1", Some(("ns", "pod-a"))),
            unserved("2", None),
            unserved("3", Some(("ns", "pod-b"))),
            unserved("4", Some(("", ""))),
        ];
        let ids = |v: Vec<(&Unserved, &PodRef)>| v.iter().map(|(u, _)| u.container_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(to_post(&found, &BTreeSet::new())), ["1", "3"]);
        let posted = BTreeSet::from(["1".to_string()]);
        assert_eq!(ids(to_post(&found, &posted)), ["3"]);
    }

    #[test]
    fn the_message_names_container_request_plugin_node_and_the_gate() {
        let mut u = unserved("1", Some(("ns", "pod-a")));
        let m = message(&u, "10-actk", "node-1");
        for part in ["container ctr-1", "nvidia.com/gpu=2", "10-actk", "node node-1", "/dev/nvidia2", "nri.gate: true"]
        {
            assert!(m.contains(part), "{part:?} in {m}");
        }
        u.missing = (0..12).map(|i| format!("/dev/nvidia{i}")).collect();
        let m = message(&u, "10-actk", "node-1");
        assert!(m.contains("/dev/nvidia7 and 4 more") && !m.contains("/dev/nvidia8"), "{m}");
    }
}
