//! The ResourceSlice publisher over a fixture host root, with the API server replaced by a
//! recorder: the first pool, a device node removed (the device leaves the pool within a second
//! or two, at a new generation, and is no longer preparable) and restored, and a kind that a
//! device plugin advertises on the node left out.

use actk_dra::publish::{self, PublishConfig, Sink};
use actk_testsupport::fixture;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

struct Recorder {
    allocatable: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    /// Set by a test: the API server lost the slices (a kubelet restart wiped them).
    wiped: Arc<std::sync::atomic::AtomicBool>,
    tx: mpsc::UnboundedSender<(i64, Vec<String>)>,
}

impl Sink for Recorder {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        Ok(publish::NodeView { allocatable: self.allocatable.clone(), labels: self.labels.clone() })
    }
    async fn intact(&mut self, _: i64) -> Result<bool, String> {
        Ok(!self.wiped.swap(false, std::sync::atomic::Ordering::SeqCst))
    }
    async fn publish(&mut self, generation: i64, pool: actk_dra::slice::Pool) -> Result<(), String> {
        let devices = pool.devices;
        let _ = self.tx.send((generation, devices.into_iter().map(|d| d.name).collect()));
        Ok(())
    }
}

fn config(root: &std::path::Path) -> PublishConfig {
    PublishConfig {
        root: root.to_path_buf(),
        profiles: actk_core::profile::builtin(),
        served: None,
        health: Duration::from_millis(50),
        rediscover: Duration::from_secs(60),
        allow_device_plugin_overlap: false,
        state: None,
        node_choice: None,
        publish_lock: None,
        defer_to: None,
        metrics: None,
        health_engine: Default::default(),
        dynamic_mig: None,
    }
}

/// A registration status that says registered.
fn registered() -> watch::Receiver<Option<Result<(), String>>> {
    watch::channel(Some(Ok(()))).1
}

async fn next(rx: &mut mpsc::UnboundedReceiver<(i64, Vec<String>)>) -> (i64, Vec<String>) {
    tokio::time::timeout(Duration::from_secs(2), rx.recv()).await.expect("published within 2 s").unwrap()
}

#[tokio::test]
async fn a_removed_device_leaves_the_pool_and_comes_back() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (inv_tx, inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let wiped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut cfg = config(&f.root);
    cfg.rediscover = Duration::from_millis(300);
    let task = tokio::spawn(publish::run(
        cfg,
        Recorder { allocatable: BTreeMap::new(), labels: BTreeMap::new(), wiped: wiped.clone(), tx },
        5,
        inv_tx,
        registered(),
    ));
    assert_eq!(
        next(&mut rx).await,
        (5, vec!["nvidia-0".into(), "nvidia-1".into(), "neuron-0".into(), "neuron-1".into()])
    );
    // GPU index 0 is /dev/nvidia1 on this fixture (Device Minor 1, SOURCES.md).
    let node = f.path("/dev/nvidia1");
    std::fs::remove_file(&node).unwrap();
    assert_eq!(next(&mut rx).await, (6, vec!["nvidia-1".into(), "neuron-0".into(), "neuron-1".into()]));
    let inv = inv_rx.borrow().clone();
    assert_eq!(inv.vendor("nvidia").unwrap().devices.iter().map(|d| d.index).collect::<Vec<_>>(), [1]);
    assert!(std::process::Command::new("mknod").arg(&node).args(["c", "195", "1"]).status().unwrap().success());
    assert_eq!(next(&mut rx).await.0, 7);
    // The kubelet wiped the node's slices: published again, at a new generation.
    wiped.store(true, std::sync::atomic::Ordering::SeqCst);
    let (g, devs) = next(&mut rx).await;
    assert_eq!((g, devs.len()), (8, 4));
    task.abort();
}

#[tokio::test]
async fn kinds_a_device_plugin_serves_are_not_published() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (inv_tx, _inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), "2".to_string()), ("cpu".into(), "4".into())]);
    let task = tokio::spawn(publish::run(
        config(&f.root),
        Recorder { allocatable: alloc, labels: BTreeMap::new(), wiped: Default::default(), tx },
        1,
        inv_tx,
        registered(),
    ));
    assert_eq!(next(&mut rx).await, (1, vec!["neuron-0".into(), "neuron-1".into()]));
    task.abort();
    // Served profiles restrict too, and an allocatable of 0 (plugin gone) is no overlap.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (inv_tx, _inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let mut cfg = config(&f.root);
    cfg.served = Some(["nvidia".to_string()].into());
    let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), "0".to_string())]);
    let task = tokio::spawn(publish::run(
        cfg,
        Recorder { allocatable: alloc, labels: BTreeMap::new(), wiped: Default::default(), tx },
        1,
        inv_tx,
        registered(),
    ));
    assert_eq!(next(&mut rx).await, (1, vec!["nvidia-0".into(), "nvidia-1".into()]));
    task.abort();
}

/// Issue 28, item 5: nothing is published before the kubelet registered the driver, though the
/// driver gets its inventory at once (to answer NodePrepareResources for claims an earlier
/// process prepared); a refused registration publishes nothing either; the registration
/// publishes at once.
#[tokio::test]
async fn nothing_is_published_before_the_kubelet_registered_the_driver() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (inv_tx, mut inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
    let (status_tx, status_rx) = watch::channel(None);
    let task = tokio::spawn(publish::run(
        config(&f.root),
        Recorder { allocatable: BTreeMap::new(), labels: BTreeMap::new(), wiped: Default::default(), tx },
        1,
        inv_tx,
        status_rx,
    ));
    tokio::time::timeout(Duration::from_secs(2), inv_rx.wait_for(|i| !i.vendors.is_empty()))
        .await
        .expect("the inventory comes before registration")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(rx.try_recv().is_err(), "published before registration");
    status_tx.send_replace(Some(Err("plugin validation failed".into())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "published though the kubelet refused the driver");
    status_tx.send_replace(Some(Ok(())));
    assert_eq!(next(&mut rx).await.1.len(), 4);
    task.abort();
}

/// The per-node choice (issue 26): the Node's label gives nvidia to the device plugin on this
/// node, so only the Neuron devices are published, and the servers file tells the device
/// plugin that DRA serves neuron here; with the label gone (default dra) both are published.
#[tokio::test]
async fn node_labels_choose_the_server_per_profile_and_the_file_says_so() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("servers/servers.json");
    for (labels, want, dra) in [
        (
            BTreeMap::from([("actk.dev/nvidia.server".to_string(), "device-plugin".to_string())]),
            vec!["neuron-0", "neuron-1"],
            vec!["neuron"],
        ),
        (BTreeMap::new(), vec!["nvidia-0", "nvidia-1", "neuron-0", "neuron-1"], vec!["neuron", "nvidia"]),
    ] {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (inv_tx, _inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
        let mut cfg = config(&f.root);
        cfg.served = Some(["nvidia".to_string(), "neuron".to_string()].into());
        cfg.node_choice = Some(publish::NodeChoice {
            default: actk_dra::servers::Server::Dra,
            file: Some(file.clone()),
            node: "node-a".into(),
        });
        let task = tokio::spawn(publish::run(
            cfg,
            Recorder { allocatable: BTreeMap::new(), labels, wiped: Default::default(), tx },
            1,
            inv_tx,
            registered(),
        ));
        assert_eq!(next(&mut rx).await.1, want);
        let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(written, serde_json::json!({"node": "node-a", "dra": dra}));
        task.abort();
    }
}

/// A rolling update: two publishers of one node with one publisher lock. The second waits (no
/// publication of its own) while the first runs; once the first is gone it takes the pool over
/// above the generation the first published.
#[tokio::test]
async fn one_publisher_per_node_and_the_next_takes_over() {
    let Some(f) = fixture::prepare("hetero-nvidia-neuron").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join(publish::PUBLISH_LOCK);
    // The newest generation the (shared) API server holds.
    let newest = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let start = |first: i64| {
        let (tx, rx) = mpsc::unbounded_channel();
        let (inv_tx, inv_rx) = watch::channel(Arc::new(actk_core::inventory::Inventory::default()));
        let mut cfg = config(&f.root);
        cfg.publish_lock = Some(lock.clone());
        let task = tokio::spawn(publish::run(
            cfg,
            Newest {
                inner: Recorder {
                    allocatable: BTreeMap::new(),
                    labels: BTreeMap::new(),
                    wiped: Default::default(),
                    tx,
                },
                newest: newest.clone(),
            },
            first,
            inv_tx,
            registered(),
        ));
        (task, rx, inv_rx)
    };
    let (old, mut old_rx, _old_inv) = start(3);
    assert_eq!(next(&mut old_rx).await.0, 3, "the first process publishes");
    // The old process went on publishing (a device changed) up to generation 9.
    newest.store(9, std::sync::atomic::Ordering::SeqCst);
    let (new, mut new_rx, mut new_inv) = start(4);
    tokio::time::timeout(Duration::from_secs(2), new_inv.wait_for(|i| !i.vendors.is_empty()))
        .await
        .expect("the waiting process still gets its inventory (it prepares claims)")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(new_rx.try_recv().is_err(), "the second process published while the first held the lock");
    old.abort();
    let (g, devs) = next(&mut new_rx).await;
    assert_eq!((g, devs.len()), (10, 4), "taken over above the newest generation (9)");
    new.abort();
}

/// A recorder whose API server holds generation `newest` of the pool (shared by the processes).
struct Newest {
    inner: Recorder,
    newest: Arc<std::sync::atomic::AtomicI64>,
}

impl Sink for Newest {
    async fn node(&mut self) -> Result<publish::NodeView, String> {
        self.inner.node().await
    }
    async fn intact(&mut self, g: i64) -> Result<bool, String> {
        self.inner.intact(g).await
    }
    async fn newest_generation(&mut self) -> Result<i64, String> {
        Ok(self.newest.load(std::sync::atomic::Ordering::SeqCst))
    }
    async fn publish(&mut self, generation: i64, pool: actk_dra::slice::Pool) -> Result<(), String> {
        let devices = pool.devices;
        self.newest.fetch_max(generation, std::sync::atomic::Ordering::SeqCst);
        self.inner.publish(generation, devices.into()).await
    }
}
