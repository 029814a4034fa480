//! The API server side, through kube-rs: the client, the Node, the claims, and the pool's
//! ResourceSlices (resource.k8s.io/v1).

use crate::driver::ClaimSource;
use crate::events::{self, DeviceStatus, Notice, Object, PoolState};
use crate::slice::{DRIVER, NodeRef};
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Field manager name of the driver's server-side applies.
pub const FIELD_MANAGER: &str = "actk-dra-driver";

/// A client from `kubeconfig` when given, else the usual inference (in-cluster service account,
/// then `$KUBECONFIG` / ~/.kube/config).
///
/// Errors: the kubeconfig is unreadable or names nothing usable (the message names the file).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer().await.context("finding the API server (in-cluster config or KUBECONFIG)")?,
    };
    kube::Client::try_from(config).context("building the API client")
}

/// The Node `name`: its reference for owner references, and its allocatable resources
/// (`nvidia.com/gpu` -> `8`), which tell whether a device plugin serves a kind on this node.
///
/// Errors: the API server's message, naming the node.
pub async fn node(client: &kube::Client, name: &str) -> Result<(NodeRef, BTreeMap<String, String>), String> {
    let n = Api::<Node>::all(client.clone()).get(name).await.map_err(|e| format!("node {name}: {e}"))?;
    let alloc = n.status.and_then(|s| s.allocatable).unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    Ok((NodeRef { name: name.to_string(), uid: n.metadata.uid }, alloc))
}

/// The Node `name`'s allocatable resources and labels ([`crate::publish::NodeView`]).
///
/// Errors: the API server's message, naming the node.
pub async fn node_view(client: &kube::Client, name: &str) -> Result<crate::publish::NodeView, String> {
    let n = Api::<Node>::all(client.clone()).get(name).await.map_err(|e| format!("node {name}: {e}"))?;
    let allocatable =
        n.status.and_then(|s| s.allocatable).unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    Ok(crate::publish::NodeView { allocatable, labels: n.metadata.labels.unwrap_or_default() })
}

/// Claims read from the API server.
pub struct ApiClaims(pub kube::Client);

impl ClaimSource for ApiClaims {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Pin<Box<dyn Future<Output = Result<ResourceClaim, String>> + Send + '_>> {
        let api = Api::<ResourceClaim>::namespaced(self.0.clone(), namespace);
        let name = name.to_string();
        Box::pin(async move { api.get(&name).await.map_err(|e| e.to_string()) })
    }
}

/// The slices of `node`'s pool that the API server has now.
///
/// Errors: the API server's message.
pub async fn current_slices(client: &kube::Client, node: &str) -> Result<Vec<ResourceSlice>, String> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    Api::<ResourceSlice>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing ResourceSlices of node {node}: {e}"))
}

/// Makes the API server hold exactly `slices` for `node`'s pool: each is server-side applied
/// (created or updated), other slices of the pool are deleted.
///
/// Errors: the first failing call's message, naming the slice.
pub async fn apply_slices(client: &kube::Client, node: &str, slices: &[ResourceSlice]) -> Result<(), String> {
    let api = Api::<ResourceSlice>::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for s in slices {
        let name = s.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(s)).await.map_err(|e| format!("applying ResourceSlice {name}: {e}"))?;
    }
    for old in current_slices(client, node).await? {
        let name = old.metadata.name.unwrap_or_default();
        if !slices.iter().any(|s| s.metadata.name.as_deref() == Some(name.as_str())) {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(format!("deleting ResourceSlice {name}: {e}")),
            }
        }
    }
    Ok(())
}

/// Withdraws `node`'s pool: deletes every ResourceSlice of it, so that the scheduler binds no
/// more claims to a driver that is going away. Lists again afterwards and repeats once if a
/// publish that was in flight re-created a slice.
///
/// Errors: the API server's message.
pub async fn withdraw(client: &kube::Client, node: &str) -> Result<usize, String> {
    let mut deleted = 0;
    for _ in 0..2 {
        let api = Api::<ResourceSlice>::all(client.clone());
        let now = current_slices(client, node).await?;
        if now.is_empty() {
            break;
        }
        for s in now {
            let name = s.metadata.name.unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(format!("deleting ResourceSlice {name}: {e}")),
            }
        }
    }
    Ok(deleted)
}

/// The chart's DeviceClasses (those labelled [`events::PROFILE_LABEL`]): class name -> profile.
///
/// Errors: the API server's message.
pub async fn profile_classes(client: &kube::Client) -> Result<BTreeMap<String, String>, String> {
    let lp = ListParams::default().labels(events::PROFILE_LABEL);
    let list =
        Api::<DeviceClass>::all(client.clone()).list(&lp).await.map_err(|e| format!("listing DeviceClasses: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|c| {
            let p = c.metadata.labels.as_ref()?.get(events::PROFILE_LABEL)?.clone();
            Some((c.metadata.name?, p))
        })
        .collect())
}

/// Posts a Warning (or, for a device healthy again, Normal) Event about `o`.
async fn post_event(client: &kube::Client, node: &str, o: &Object, reason: &str, message: &str) -> Result<(), String> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", o.name)),
            namespace: Some(o.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(o.api_version.clone()),
            kind: Some(o.kind.clone()),
            name: Some(o.name.clone()),
            namespace: Some(o.namespace.clone()),
            uid: Some(o.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(if reason == events::DEVICE_HEALTHY { "Normal" } else { "Warning" }.into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Allocate".into()),
        reporting_component: Some("actk.dev/dra-driver".into()),
        reporting_instance: Some(node.into()),
        source: Some(EventSource { component: Some("actk-dra-driver".into()), host: Some(node.into()) }),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), &o.namespace)
        .create(&PostParams::default(), &ev)
        .await
        .map(|_| ())
        .map_err(|e| format!("posting an event on {} {}/{}: {e}", o.kind, o.namespace, o.name))
}

/// The server-side apply body that sets condition `Ready` of `status`'s device (with its
/// `shareID`, when the allocation result has one) in a claim's `status.devices`, at `now`
/// (RFC 3339).
pub fn device_status_patch(node: &str, status: &DeviceStatus, n: &Notice, now: &str) -> serde_json::Value {
    let mut entry = serde_json::json!({
        "driver": DRIVER, "pool": node, "device": status.device,
        "conditions": [{
            "type": "Ready", "status": if status.ready { "True" } else { "False" },
            "reason": n.reason, "message": n.message, "lastTransitionTime": now,
        }]
    });
    if let Some(share) = &status.share_id {
        entry["shareID"] = share.as_str().into();
    }
    serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": {"devices": [entry]}})
}

/// Sets the condition `Ready` of an allocated device in `claim`'s status (server-side apply of
/// `status.devices`, field manager [`FIELD_MANAGER`]; [`device_status_patch`]).
async fn device_condition(
    client: &kube::Client,
    node: &str,
    claim: &Object,
    status: &DeviceStatus,
    n: &Notice,
) -> Result<(), String> {
    let patch = device_status_patch(node, status, n, &k8s_openapi::jiff::Timestamp::now().to_string());
    Api::<ResourceClaim>::namespaced(client.clone(), &claim.namespace)
        .patch_status(&claim.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
        .map_err(|e| {
            format!(
                "setting condition Ready of device {} in claim {}/{}: {e}",
                status.device, claim.namespace, claim.name
            )
        })
}

/// Tells users why claims cannot be served on this node (see [`crate::events`]): every `period`,
/// judges the claims against the pool's `state` and posts what is new. Runs forever.
pub async fn report(client: kube::Client, node: String, mut state: watch::Receiver<Arc<PoolState>>, period: Duration) {
    // (object uid, reason, message) already posted; devices (claim uid, device, shareID) whose
    // Ready=False was set.
    let mut posted: BTreeSet<(String, &'static str, String)> = BTreeSet::new();
    let mut not_ready: BTreeSet<(String, String, Option<String>)> = BTreeSet::new();
    let mut warned = false;
    loop {
        let pool = state.borrow_and_update().clone();
        let lists = async {
            let classes = profile_classes(&client).await?;
            let claims = Api::<ResourceClaim>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing ResourceClaims: {e}"))?;
            Ok::<_, String>((classes, claims.items))
        };
        match lists.await {
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot explain unserved claims: {e}");
                    warned = true;
                }
            }
            Ok((classes, claims)) => {
                warned = false;
                let notices = events::notices(&node, &pool, &classes, &claims);
                let live: BTreeSet<&str> = claims.iter().filter_map(|c| c.metadata.uid.as_deref()).collect();
                posted.retain(|(uid, _, _)| live.contains(uid.as_str()));
                not_ready.retain(|(uid, _, _)| live.contains(uid.as_str()));
                for n in &notices {
                    let claim = &n.objects[0];
                    if let Some(status) = &n.device {
                        let key = (claim.uid.clone(), status.device.clone(), status.share_id.clone());
                        // A healthy device is news only after it was not.
                        if status.ready && !not_ready.contains(&key) {
                            continue;
                        }
                        if !status.ready
                            && not_ready.contains(&key)
                            && posted.contains(&(claim.uid.clone(), n.reason, n.message.clone()))
                        {
                            continue;
                        }
                        match device_condition(&client, &node, claim, status, n).await {
                            Ok(()) if status.ready => {
                                not_ready.remove(&key);
                            }
                            Ok(()) => {
                                not_ready.insert(key);
                            }
                            Err(e) => tracing::warn!("{e}"),
                        }
                    }
                    if !posted.insert((claim.uid.clone(), n.reason, n.message.clone())) {
                        continue;
                    }
                    if n.device.as_ref().is_some_and(|d| d.ready) {
                        posted.retain(|(uid, r, _)| !(uid == &claim.uid && *r != events::DEVICE_HEALTHY));
                    }
                    tracing::warn!("{}", n.message);
                    for o in &n.objects {
                        if let Err(e) = post_event(&client, &node, o, n.reason, &n.message).await {
                            tracing::warn!("{e}");
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            changed = state.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::events::{self, DeviceStatus, Notice};

    /// Building a TLS client needs exactly one rustls crypto provider (found on a real API server:
    /// without kube's `ring` feature the driver panicked at its first connection).
    #[tokio::test]
    async fn tls_client_builds_from_a_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:9\", insecure-skip-tls-verify: true}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
        )
        .unwrap();
        super::client(Some(&kc)).await.expect("client builds");
        let err = super::client(Some(&dir.path().join("missing"))).await.err().unwrap();
        assert!(format!("{err:#}").contains("missing"), "{err:#}");
    }

    /// The entry names the result's share where it has one (the API server refuses a
    /// `status.devices` entry that matches no allocation result, keyed by shareID since
    /// KEP-5075), and has no `shareID` where the result has none.
    #[test]
    fn the_status_patch_names_the_share_of_a_shared_allocation() {
        let n = Notice {
            objects: vec![],
            reason: events::DEVICE_UNHEALTHY,
            message: "device nvidia-4 is unhealthy".into(),
            device: None,
        };
        let share = "7c5f0a1e-0000-4000-8000-000000000001";
        let mut st = DeviceStatus { device: "nvidia-4".into(), share_id: Some(share.into()), ready: false };
        let p = super::device_status_patch("node-a", &st, &n, "2026-12-05T12:00:00Z");
        let e = &p["status"]["devices"][0];
        assert_eq!(
            (&e["driver"], &e["pool"], &e["device"], &e["shareID"]),
            (&"actk.dev".into(), &"node-a".into(), &"nvidia-4".into(), &share.into())
        );
        assert_eq!(e["conditions"][0]["status"], "False");
        assert_eq!(e["conditions"][0]["reason"], events::DEVICE_UNHEALTHY);
        st.share_id = None;
        st.ready = true;
        let p = super::device_status_patch("node-a", &st, &n, "2026-12-05T12:00:00Z");
        assert!(p["status"]["devices"][0].get("shareID").is_none(), "{p}");
        assert_eq!(p["status"]["devices"][0]["conditions"][0]["status"], "True");
    }
}
