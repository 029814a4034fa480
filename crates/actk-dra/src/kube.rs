//! The API server side, through kube-rs: the client, the Node, the claims, and the pool's
//! ResourceSlices (resource.k8s.io/v1).

use crate::driver::ClaimSource;
use crate::slice::{DRIVER, NodeRef};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

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

#[cfg(test)]
mod tests {
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
}
