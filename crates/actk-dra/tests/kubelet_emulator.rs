//! The driver's kubelet side against an emulated kubelet (the real cluster tests are in
//! crates/e2e): the registration socket answered to a client that sends what the kubelet's
//! grpc-go sends (the socket path, percent-encoded, as `:authority`), and the DRA service in
//! both versions over its unix socket, with claims from an in-memory API.
//!
//! Covered: GetInfo / NotifyRegistrationStatus as the kubelet calls them (and that tonic alone
//! resets that stream); NodePrepareResources writing one self-contained spec per claim that
//! passes CDI validation, idempotent prepare and unprepare; errors that name the claim and the
//! device and leave nothing behind (unknown device, other pool, missing claim, re-created
//! claim, unwritable checkpoint); a restarted driver answering from its checkpoint.

use actk_dra::api::registration::registration_server::RegistrationServer;
use actk_dra::api::registration::{PluginInfo, RegistrationStatus};
use actk_dra::api::{v1, v1beta1};
use actk_dra::claim::{ClaimRef, SpecOptions};
use actk_dra::driver::{Driver, MemoryClaims};
use actk_dra::plugin::{self, Socket};
use actk_dra::service::{DraService, Registrar};
use actk_testsupport::fixture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, watch};

const NODE: &str = "node-a";

// Claim UIDs as the API server assigns them (RFC 4122, version 4).
const U_GOOD: &str = "6f1c2a3b-0001-4d5e-8f90-a1b2c3d4e5f6";
const U_GONE: &str = "6f1c2a3b-0002-4d5e-8f90-a1b2c3d4e5f6";
const U_OTHER: &str = "6f1c2a3b-0003-4d5e-8f90-a1b2c3d4e5f6";
const U_MISSING: &str = "6f1c2a3b-0004-4d5e-8f90-a1b2c3d4e5f6";
const U_OLD: &str = "6f1c2a3b-0005-4d5e-8f90-a1b2c3d4e5f6";
const U_NEW: &str = "6f1c2a3b-0006-4d5e-8f90-a1b2c3d4e5f6";
const U_THIRD: &str = "6f1c2a3b-0007-4d5e-8f90-a1b2c3d4e5f6";
const U_NEURON: &str = "6f1c2a3b-0008-4d5e-8f90-a1b2c3d4e5f6";

fn spec_file(uid: &str) -> String {
    format!("actk.dev-claim_{uid}.json")
}

fn claim(ns: &str, name: &str, uid: &str, devices: &[(&str, &str)], pool: &str) -> ResourceClaim {
    let results: Vec<serde_json::Value> = devices
        .iter()
        .map(|(req, dev)| serde_json::json!({"request": req, "driver": "actk.dev", "pool": pool, "device": dev}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

// ---- a grpc-go-like client: raw HTTP/2 frames ----

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One unary call as grpc-go makes it over `conn`, with `authority`; returns the response
/// message bytes, or the RST_STREAM error code.
async fn raw_call(
    conn: &mut UnixStream,
    enc: &mut loona_hpack::Encoder<'_>,
    dec: &mut loona_hpack::Decoder<'_>,
    stream: u32,
    path: &str,
    authority: &str,
    msg: &[u8],
) -> Result<Vec<u8>, u32> {
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.72.1"),
        (b"te", b"trailers"),
    ];
    let block = enc.encode(headers);
    let mut out = frame(0x1, 0x4, stream, &block);
    let mut data = vec![0u8];
    data.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    data.extend_from_slice(msg);
    out.extend(frame(0x0, 0x1, stream, &data));
    conn.write_all(&out).await.unwrap();
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).await.unwrap();
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut p = vec![0u8; len];
        conn.read_exact(&mut p).await.unwrap();
        let sid = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match head[3] {
            0x4 if head[4] & 1 == 0 => conn.write_all(&frame(0x4, 1, 0, &[])).await.unwrap(), // SETTINGS ack
            0x6 if head[4] & 1 == 0 => conn.write_all(&frame(0x6, 1, 0, &p)).await.unwrap(),  // PING ack
            0x3 if sid == stream => return Err(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
            0x0 if sid == stream => body.extend_from_slice(&p),
            0x1 if sid == stream => {
                let h = dec.decode(&p).unwrap();
                if head[4] & 1 != 0 {
                    let status = h.iter().find(|(n, _)| n == b"grpc-status").map(|(_, v)| v.clone());
                    assert_eq!(status.as_deref(), Some(&b"0"[..]), "trailers {h:?}");
                    return Ok(body.get(5..).unwrap_or_default().to_vec());
                }
            }
            _ => {}
        }
    }
}

async fn connect_raw(path: &Path) -> UnixStream {
    let mut c = UnixStream::connect(path).await.unwrap();
    c.write_all(actk_dra::authority::PREFACE).await.unwrap();
    c.write_all(&frame(0x4, 0, 0, &[])).await.unwrap();
    c
}

fn registrar(endpoint: &Path) -> (Arc<Registrar>, watch::Receiver<Option<Result<(), String>>>) {
    let (tx, rx) = watch::channel(None);
    (Arc::new(Registrar { name: "actk.dev".into(), endpoint: endpoint.to_path_buf(), status: tx }), rx)
}

#[tokio::test]
async fn registration_answers_the_kubelets_path_authority() {
    let tmp = tempfile::tempdir().unwrap();
    let reg_sock = tmp.path().join("plugins_registry").join(plugin::registration_socket_name("actk.dev"));
    let dra_sock = tmp.path().join("plugins/actk.dev/dra.sock");
    let (reg, mut status) = registrar(&dra_sock);
    let (ready_tx, ready_rx) = oneshot::channel();
    tokio::spawn(plugin::serve(reg_sock.clone(), Socket::Registration(reg.clone()), Some(ready_tx)));
    ready_rx.await.unwrap();
    // What grpc-go 1.72 sends for a dial target that is a plain path.
    let authority = reg_sock.display().to_string().replace('/', "%2F");
    let mut conn = connect_raw(&reg_sock).await;
    let (mut enc, mut dec) = (loona_hpack::Encoder::new(), loona_hpack::Decoder::new());
    let info = raw_call(&mut conn, &mut enc, &mut dec, 1, "/pluginregistration.Registration/GetInfo", &authority, &[])
        .await
        .expect("GetInfo answered");
    let info = PluginInfo::decode(info.as_slice()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "actk.dev");
    assert_eq!(info.endpoint, dra_sock.display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    // Second call on the same connection: the header table is indexed now.
    let st = RegistrationStatus { plugin_registered: true, error: String::new() }.encode_to_vec();
    raw_call(
        &mut conn,
        &mut enc,
        &mut dec,
        3,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        &authority,
        &st,
    )
    .await
    .expect("NotifyRegistrationStatus answered");
    tokio::time::timeout(Duration::from_secs(2), status.wait_for(|s| s.is_some())).await.unwrap().unwrap();
    assert_eq!(*status.borrow(), Some(Ok(())));

    // The same bytes to a tonic server without the fix: the stream is reset (PROTOCOL_ERROR).
    let plain = tmp.path().join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&plain).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::from_arc(reg))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut conn = connect_raw(&plain).await;
    let (mut enc, mut dec) = (loona_hpack::Encoder::new(), loona_hpack::Decoder::new());
    let r =
        raw_call(&mut conn, &mut enc, &mut dec, 1, "/pluginregistration.Registration/GetInfo", &authority, &[]).await;
    assert_eq!(r, Err(1), "h2 without the fix resets the stream with PROTOCOL_ERROR");

    // A socket removed (registry directory cleaned) is served again.
    std::fs::remove_file(&reg_sock).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !reg_sock.exists() {
        assert!(tokio::time::Instant::now() < deadline, "registration socket not re-created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut conn = connect_raw(&reg_sock).await;
    let (mut enc, mut dec) = (loona_hpack::Encoder::new(), loona_hpack::Decoder::new());
    raw_call(&mut conn, &mut enc, &mut dec, 1, "/pluginregistration.Registration/GetInfo", &authority, &[])
        .await
        .expect("GetInfo answered after the socket came back");
}

struct Setup {
    _fixture: fixture::Fixture,
    dir: tempfile::TempDir,
    claims: Arc<MemoryClaims>,
    driver: Arc<Driver>,
    sock: PathBuf,
}

impl Setup {
    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }
    fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("plugin/checkpoint.json")
    }
    fn spec_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.cdi_dir())
            .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn new_driver(
    root: &Path,
    dir: &Path,
    claims: Arc<dyn actk_dra::driver::ClaimSource>,
) -> Result<Driver, actk_dra::driver::DriverError> {
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(root, &profiles);
    let (_tx, rx) = watch::channel(Arc::new(inv));
    std::mem::forget(_tx); // the inventory stays as discovered for the test's life
    Driver::new(
        NODE.into(),
        profiles,
        dir.join("cdi"),
        dir.join("plugin/checkpoint.json"),
        SpecOptions { host_mount: "/".into(), ..Default::default() },
        rx,
        claims,
    )
}

async fn setup(fixture_name: &str) -> Option<Setup> {
    let f = fixture::prepare(fixture_name).unwrap()?;
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(MemoryClaims::default());
    let driver = Arc::new(new_driver(&f.root, dir.path(), claims.clone()).unwrap());
    let sock = dir.path().join("plugin/dra.sock");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(plugin::serve(sock.clone(), Socket::Dra(DraService(driver.clone())), Some(tx)));
    rx.await.unwrap();
    Some(Setup { _fixture: f, dir, claims, driver, sock })
}

fn v1_claim(c: &ClaimRef) -> v1::Claim {
    v1::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() }
}

#[tokio::test]
async fn prepare_writes_one_self_contained_spec_and_unprepare_removes_it() {
    let Some(s) = setup("nvidia-dgx-h100").await else { return };
    let want = ClaimRef {
        namespace: "default".into(),
        uid: "0b6f3c1e-1111-4c2a-9d7e-2f5a6b7c8d9e".into(),
        name: "two-gpus".into(),
    };
    s.claims.put(claim("default", "two-gpus", &want.uid, &[("gpus", "nvidia-2"), ("gpus", "nvidia-5")], NODE));
    let ch = actk_node::uds::connect(&s.sock).await.unwrap();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(ch.clone());
    let req = v1::NodePrepareResourcesRequest { claims: vec![v1_claim(&want)] };
    let resp = client.node_prepare_resources(req.clone()).await.unwrap().into_inner();
    let r = &resp.claims[&want.uid];
    assert_eq!(r.error, "");
    let got: Vec<(&str, &str, Vec<&str>)> = r
        .devices
        .iter()
        .map(|d| (d.pool_name.as_str(), d.device_name.as_str(), d.cdi_device_ids.iter().map(String::as_str).collect()))
        .collect();
    let u = &want.uid;
    assert_eq!(
        got,
        [
            (
                NODE,
                "nvidia-2",
                vec![format!("actk.dev/claim={u}-nvidia-common").as_str(), &format!("actk.dev/claim={u}-nvidia-2")]
            ),
            (NODE, "nvidia-5", vec![format!("actk.dev/claim={u}-nvidia-5").as_str()]),
        ]
    );
    assert!(r.devices.iter().all(|d| d.request_names == ["gpus"]));
    let file = format!("actk.dev-claim_{u}.json");
    assert_eq!(s.spec_files(), std::slice::from_ref(&file));
    let path = s.cdi_dir().join(&file);
    let spec = actk_core::cdi::validate::validate_file(&path).expect("the spec passes CDI validation");
    assert_eq!(spec.kind, "actk.dev/claim");
    assert!(spec.container_edits.device_nodes.is_empty() && spec.container_edits.mounts.is_empty());
    let dev = |n: &str| spec.devices.iter().find(|d| d.name == n).unwrap_or_else(|| panic!("no device {n}"));
    let nodes = |n: &str| dev(n).container_edits.device_nodes.iter().map(|d| d.path.clone()).collect::<Vec<_>>();
    let gpu2 = &s._fixture.root; // host paths are under the fixture root
    assert_eq!(nodes(&format!("{u}-nvidia-2")), ["/dev/nvidia2"]);
    assert_eq!(nodes(&format!("{u}-nvidia-5")), ["/dev/nvidia5"]);
    assert!(
        dev(&format!("{u}-nvidia-2")).container_edits.device_nodes[0]
            .host_path
            .as_deref()
            .unwrap()
            .starts_with(gpu2.to_str().unwrap())
    );
    let common = &dev(&format!("{u}-nvidia-common")).container_edits;
    let cn: Vec<&str> = common.device_nodes.iter().map(|d| d.path.as_str()).collect();
    assert!(cn.contains(&"/dev/nvidiactl") && cn.contains(&"/dev/nvidia-uvm"), "{cn:?}");
    assert!(
        !cn.iter().any(|p| p.starts_with("/dev/nvidia") && p[11..].chars().all(|c| c.is_ascii_digit())),
        "no GPU node in the common edits: {cn:?}"
    );
    assert!(
        common.mounts.iter().any(|m| m.container_path.ends_with("libcuda.so.580.95.05")),
        "driver libraries mounted"
    );
    assert!(common.env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()), "{:?}", common.env);
    assert_eq!(
        spec.devices.len(),
        3,
        "only the allocated devices: {:?}",
        spec.devices.iter().map(|d| &d.name).collect::<Vec<_>>()
    );

    // Idempotent: the same answer, through v1beta1 too, and the spec unchanged.
    let before = std::fs::read(&path).unwrap();
    let again = client.node_prepare_resources(req).await.unwrap().into_inner();
    assert_eq!(again, resp);
    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(ch);
    let b = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: want.namespace.clone(),
                uid: want.uid.clone(),
                name: want.name.clone(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.claims[u].devices.len(), 2);
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let cp: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(s.checkpoint()).unwrap()).unwrap();
    assert_eq!(cp["claims"][u]["spec"], file.as_str());

    // Unprepare removes the spec and the entry; twice is fine.
    for _ in 0..2 {
        let un = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![v1_claim(&want)] })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(un.claims[u].error, "");
        assert!(s.spec_files().is_empty());
        assert!(s.driver.prepared_claims().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn bad_claims_name_the_claim_and_device_and_leave_nothing() {
    let Some(s) = setup("nvidia-dgx-h100").await else { return };
    let ch = actk_node::uds::connect(&s.sock).await.unwrap();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(ch);
    let good = ClaimRef { namespace: "ns".into(), uid: U_GOOD.into(), name: "good".into() };
    let gone = ClaimRef { namespace: "ns".into(), uid: U_GONE.into(), name: "gone".into() };
    let other = ClaimRef { namespace: "ns".into(), uid: U_OTHER.into(), name: "other".into() };
    let missing = ClaimRef { namespace: "ns".into(), uid: U_MISSING.into(), name: "missing".into() };
    let recreated = ClaimRef { namespace: "ns".into(), uid: U_OLD.into(), name: "recreated".into() };
    s.claims.put(claim("ns", "good", U_GOOD, &[("g", "nvidia-0")], NODE));
    s.claims.put(claim("ns", "gone", U_GONE, &[("g", "nvidia-1"), ("g", "nvidia-9")], NODE));
    s.claims.put(claim("ns", "other", U_OTHER, &[("g", "nvidia-1")], "node-b"));
    s.claims.put(claim("ns", "recreated", U_NEW, &[("g", "nvidia-1")], NODE));
    let resp = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: [&good, &gone, &other, &missing, &recreated].into_iter().map(v1_claim).collect(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 5, "every claim answered");
    assert_eq!(resp.claims[U_GOOD].error, "", "a bad claim does not fail the others");
    let e = &resp.claims[U_GONE].error;
    assert!(e.starts_with(&format!("claim ns/gone (uid {U_GONE}): device nvidia-9 is not on this node")), "{e}");
    assert!(e.contains("nvidia-0, nvidia-1"), "{e}");
    assert!(resp.claims[U_GONE].devices.is_empty());
    let e = &resp.claims[U_OTHER].error;
    assert_eq!(
        *e,
        format!("claim ns/other (uid {U_OTHER}): device nvidia-1 is in pool node-b, not in this node's pool node-a")
    );
    let e = &resp.claims[U_MISSING].error;
    assert!(e.starts_with(&format!("claim ns/missing (uid {U_MISSING}): not found in the API server")), "{e}");
    let e = &resp.claims[U_OLD].error;
    assert!(e.contains(&format!("has uid {U_NEW}")), "{e}");
    assert_eq!(s.spec_files(), [spec_file(U_GOOD)], "nothing written for the bad claims");
    assert_eq!(s.driver.prepared_claims().await.unwrap(), [U_GOOD]);

    // An unwritable checkpoint: the error names it and the spec just written is removed again.
    // Its directory is a dangling symlink: reading finds no checkpoint (an empty one), writing
    // cannot create the directory. The node-wide lock lives elsewhere for this driver.
    let bad_cp = s.dir.path().join("not-a-dir");
    std::os::unix::fs::symlink(s.dir.path().join("nowhere"), &bad_cp).unwrap();
    let inv = Arc::new(actk_core::discover::discover(&s._fixture.root, &actk_core::profile::builtin()));
    let (_tx, rx) = watch::channel(inv);
    let d = Driver::new(
        NODE.into(),
        actk_core::profile::builtin(),
        s.cdi_dir(),
        bad_cp.join("checkpoint.json"),
        SpecOptions { host_mount: "/".into(), ..Default::default() },
        rx,
        s.claims.clone(),
    )
    .unwrap()
    .with_lock_file(s.dir.path().join("lock/serialize.lock"));
    s.claims.put(claim("ns", "third", U_THIRD, &[("g", "nvidia-3")], NODE));
    let third = ClaimRef { namespace: "ns".into(), uid: U_THIRD.into(), name: "third".into() };
    let e = d.prepare(&third).await.unwrap_err();
    assert!(e.contains(&bad_cp.display().to_string()) && e.contains("removed again"), "{e}");
    assert_eq!(s.spec_files(), [spec_file(U_GOOD)]);
}

#[tokio::test]
async fn a_restarted_driver_answers_from_its_checkpoint() {
    let Some(s) = setup("aws-inf2-48xlarge").await else { return };
    let want = ClaimRef { namespace: "ml".into(), uid: U_NEURON.into(), name: "pair".into() };
    s.claims.put(claim("ml", "pair", U_NEURON, &[("pair", "neuron-4"), ("pair", "neuron-5")], NODE));
    let first = s.driver.prepare(&want).await.unwrap();
    let spec = std::fs::read_to_string(s.cdi_dir().join(spec_file(U_NEURON))).unwrap();
    assert!(spec.contains("AWS_NEURON_VISIBLE_DEVICES=void"), "{spec}");
    assert!(spec.contains("/dev/neuron4") && spec.contains("/dev/neuron5") && !spec.contains("/dev/neuron6"));
    // A new driver on the same files, with an API server that has no claims at all.
    let restarted = new_driver(&s._fixture.root, s.dir.path(), Arc::new(MemoryClaims::default())).unwrap();
    assert_eq!(restarted.prepared_claims().await.unwrap(), [U_NEURON]);
    assert_eq!(restarted.prepare(&want).await.unwrap(), first);
    restarted.unprepare(&want).await.unwrap();
    assert!(s.spec_files().is_empty());
    // A spec lost while the checkpoint kept the claim (a reboot clears /var/run/cdi): prepared again.
    s.driver.prepare(&want).await.unwrap();
    std::fs::remove_file(s.cdi_dir().join(spec_file(U_NEURON))).unwrap();
    s.driver.prepare(&want).await.unwrap();
    assert_eq!(s.spec_files(), [spec_file(U_NEURON)]);
    // A corrupt checkpoint stops the driver with a message naming the file.
    std::fs::write(s.checkpoint(), "{").unwrap();
    let err = new_driver(&s._fixture.root, s.dir.path(), Arc::new(MemoryClaims::default())).err().unwrap().to_string();
    assert!(err.contains(&s.checkpoint().display().to_string()), "{err}");
}

/// A rolling update (issue 26): two driver processes of one node, on the same plugin
/// directory, CDI directory and checkpoint, prepare claims at the same time, each answering
/// some: every claim ends up in the one checkpoint (no process overwrites what the other
/// wrote), each process answers the other's claims, and unprepares them.
#[tokio::test]
async fn two_driver_processes_of_one_node_share_the_checkpoint() {
    let Some(s) = setup("nvidia-dgx-h100").await else { return };
    let other = Arc::new(new_driver(&s._fixture.root, s.dir.path(), s.claims.clone()).unwrap());
    let refs: Vec<ClaimRef> = (0..8)
        .map(|i| {
            let uid = format!("7a1c2a3b-00{i:02}-4d5e-8f90-a1b2c3d4e5f6");
            let name = format!("c{i}");
            s.claims.put(claim("ns", &name, &uid, &[("g", &format!("nvidia-{i}"))], NODE));
            ClaimRef { namespace: "ns".into(), uid, name }
        })
        .collect();
    let calls = refs.iter().enumerate().map(|(i, r)| {
        let d = if i % 2 == 0 { s.driver.clone() } else { other.clone() };
        let r = r.clone();
        tokio::spawn(async move { d.prepare(&r).await })
    });
    for c in calls.collect::<Vec<_>>() {
        c.await.unwrap().unwrap();
    }
    let mut want: Vec<String> = refs.iter().map(|r| r.uid.clone()).collect();
    want.sort();
    assert_eq!(s.driver.prepared_claims().await.unwrap(), want);
    assert_eq!(other.prepared_claims().await.unwrap(), want);
    let cp: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(s.checkpoint()).unwrap()).unwrap();
    assert_eq!(cp["claims"].as_object().unwrap().len(), 8, "{cp}");
    assert_eq!(s.spec_files().len(), 8);
    // Each unprepares what the other prepared.
    for (i, r) in refs.iter().enumerate() {
        let d = if i % 2 == 0 { &other } else { &s.driver };
        d.unprepare(r).await.unwrap();
    }
    assert!(s.spec_files().is_empty());
    assert!(s.driver.prepared_claims().await.unwrap().is_empty());
}

/// Issue 29 finding 6: a claim is its namespace, name and UID together. Tenant A's prepared UID
/// asked for under tenant B's namespace, another claim name or a namespace that does not exist
/// answers with an error and no device, and unpreparing it so removes nothing; a UID that is not
/// a UID (`x/../<victim's spec>`, with the directory it needs planted in the CDI directory) is
/// refused by both calls before it names a file. Tenant A's own calls still work.
#[tokio::test]
async fn claim_identity_is_namespace_name_and_uid_together() {
    let Some(s) = setup("nvidia-dgx-h100").await else { return };
    let ch = actk_node::uds::connect(&s.sock).await.unwrap();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(ch);
    let a = ClaimRef { namespace: "tenant-a".into(), uid: U_GOOD.into(), name: "gpus".into() };
    s.claims.put(claim("tenant-a", "gpus", U_GOOD, &[("g", "nvidia-1")], NODE));
    s.claims.put(claim("tenant-b", "gpus", U_OTHER, &[("g", "nvidia-2")], NODE));
    let prepare = |c: &ClaimRef| v1::NodePrepareResourcesRequest { claims: vec![v1_claim(c)] };
    let unprepare = |c: &ClaimRef| v1::NodeUnprepareResourcesRequest { claims: vec![v1_claim(c)] };
    let resp = client.node_prepare_resources(prepare(&a)).await.unwrap().into_inner();
    assert_eq!(resp.claims[U_GOOD].error, "");
    let victim = s.cdi_dir().join(spec_file(U_GOOD));
    let before = std::fs::read(&victim).unwrap();
    let checkpoint = std::fs::read(s.checkpoint()).unwrap();

    for (ns, name) in [("tenant-b", "gpus"), ("tenant-a", "other"), ("no-such-namespace", "gpus")] {
        let forged = ClaimRef { namespace: ns.into(), uid: U_GOOD.into(), name: name.into() };
        let r = client.node_prepare_resources(prepare(&forged)).await.unwrap().into_inner();
        let answer = &r.claims[U_GOOD];
        assert!(answer.devices.is_empty(), "{ns}/{name}: tenant A's devices answered: {answer:?}");
        assert!(
            answer.error.starts_with(&format!(
                "claim {ns}/{name} (uid {U_GOOD}): uid {U_GOOD} belongs to another claim (the checkpoint)"
            )),
            "{ns}/{name}: {}",
            answer.error
        );
        assert!(!answer.error.contains("tenant-a/gpus"), "the other claim is not named: {}", answer.error);
        let r = client.node_unprepare_resources(unprepare(&forged)).await.unwrap().into_inner();
        assert!(r.claims[U_GOOD].error.contains("belongs to another claim"), "{ns}/{name}: {:?}", r.claims[U_GOOD]);
        assert_eq!(std::fs::read(&victim).unwrap(), before, "{ns}/{name}: tenant A's spec changed");
        assert_eq!(std::fs::read(s.checkpoint()).unwrap(), checkpoint, "{ns}/{name}: the checkpoint changed");
    }

    // Path-like and malformed UIDs: the directory the traversal needs exists.
    std::fs::create_dir(s.cdi_dir().join("actk.dev-claim_x")).unwrap();
    let traversal = format!("x/../actk.dev-claim_{U_GOOD}");
    let long = "a".repeat(100_000);
    for uid in [
        traversal.as_str(),
        "../../../etc/passwd",
        "",
        "6f1c2a3b-0001-4d5e-8f90-a1b2c3d4e5f",
        &long,
        "6f1c2a3b_0001_4d5e_8f90_a1b2c3d4e5f6",
    ] {
        let bad = ClaimRef { namespace: "tenant-b".into(), uid: uid.into(), name: "gpus".into() };
        let r = client.node_unprepare_resources(unprepare(&bad)).await.unwrap().into_inner();
        let e = &r.claims[uid].error;
        assert!(e.contains("is not a UID (RFC 4122 form") && e.contains("nothing was prepared or removed"), "{e}");
        assert!(e.len() < 1000, "the message does not carry the whole value ({} bytes)", e.len());
        let r = client.node_prepare_resources(prepare(&bad)).await.unwrap().into_inner();
        assert!(r.claims[uid].error.contains("is not a UID"), "{:?}", r.claims[uid]);
        assert!(r.claims[uid].devices.is_empty());
        assert_eq!(std::fs::read(&victim).unwrap(), before, "{uid:?}: tenant A's spec changed");
    }
    assert_eq!(s.spec_files(), [spec_file(U_GOOD), "actk.dev-claim_x".to_string()], "nothing written");
    assert_eq!(std::fs::read(s.checkpoint()).unwrap(), checkpoint);

    // Tenant B's own claim, and tenant A's again, and an upper-case UID (RFC 4122 reads either case).
    let b = ClaimRef { namespace: "tenant-b".into(), uid: U_OTHER.into(), name: "gpus".into() };
    let r = client.node_prepare_resources(prepare(&b)).await.unwrap().into_inner();
    assert_eq!((r.claims[U_OTHER].error.as_str(), r.claims[U_OTHER].devices[0].device_name.as_str()), ("", "nvidia-2"));
    let again = client.node_prepare_resources(prepare(&a)).await.unwrap().into_inner();
    assert_eq!(again, resp);
    let upper = U_THIRD.to_ascii_uppercase();
    s.claims.put(claim("tenant-c", "gpus", &upper, &[("g", "nvidia-3")], NODE));
    let c = ClaimRef { namespace: "tenant-c".into(), uid: upper.clone(), name: "gpus".into() };
    let r = client.node_prepare_resources(prepare(&c)).await.unwrap().into_inner();
    assert_eq!(r.claims[&upper].error, "");
    for c in [&a, &b, &c] {
        let r = client.node_unprepare_resources(unprepare(c)).await.unwrap().into_inner();
        assert_eq!(r.claims[&c.uid].error, "");
    }
    assert_eq!(s.spec_files(), ["actk.dev-claim_x"]);
}

/// Issue 29 finding 1 on the DRA path: whatever the driver's `--capabilities` (here `all`,
/// which names `fabric`), a claim spec carries the nodes of the devices the claim allocated and
/// the control nodes they need, never the NVSwitch nodes the DGX H100 fixture has; the files of
/// every capability are still mounted.
#[tokio::test]
async fn claim_specs_never_carry_nodes_reserved_to_a_capability() {
    let Some(f) = fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let dir = tempfile::tempdir().unwrap();
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(&f.root, &profiles);
    let nvidia = inv.vendor("nvidia").expect("the fixture's GPUs");
    assert!(
        nvidia.shared_nodes.iter().any(|n| n.path.starts_with("/dev/nvidia-nvswitch")),
        "the fixture has NVSwitch nodes: {:?}",
        nvidia.shared_nodes
    );
    let (_tx, rx) = watch::channel(Arc::new(inv));
    let claims = Arc::new(MemoryClaims::default());
    let opts = SpecOptions { host_mount: "/".into(), capabilities: Some(vec!["all".into()]), ..Default::default() };
    let d = Driver::new(
        NODE.into(),
        profiles,
        dir.path().join("cdi"),
        dir.path().join("cp.json"),
        opts,
        rx,
        claims.clone(),
    )
    .unwrap();
    claims.put(claim("tenant-a", "one", U_GOOD, &[("g", "nvidia-4")], NODE));
    let want = ClaimRef { namespace: "tenant-a".into(), uid: U_GOOD.into(), name: "one".into() };
    d.prepare(&want).await.unwrap();
    let spec = actk_core::cdi::validate::validate_file(&dir.path().join("cdi").join(spec_file(U_GOOD))).unwrap();
    let mut nodes: Vec<&str> =
        spec.devices.iter().flat_map(|d| d.container_edits.device_nodes.iter().map(|n| n.path.as_str())).collect();
    nodes.sort();
    assert!(!nodes.iter().any(|n| n.contains("nvswitch")), "{nodes:?}");
    assert!(nodes.contains(&"/dev/nvidia4") && nodes.contains(&"/dev/nvidiactl"), "{nodes:?}");
    let common = spec.devices.iter().find(|d| d.name.ends_with("-common")).unwrap();
    assert!(common.container_edits.mounts.iter().any(|m| m.container_path.ends_with("libcuda.so.580.95.05")));
}
