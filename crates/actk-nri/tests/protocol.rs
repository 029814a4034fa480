//! actk-nri as the runtime sees it, over a real unix socket: this test plays NRI's runtime side
//! (the multiplexed socket, ttrpc requests on connection 1, the registration on connection 2)
//! against the actk-nri binary on the DGX H100 fixture. The same conversation with the real
//! containerd 2.1 is in crates/e2e/tests/nri_containerd.rs.

use actk_nri::mux::{self, Demux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use actk_nri::proto::nri;
use actk_nri::ttrpc::{self, Decoder, Frame};
use prost::Message;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The runtime's end of one plugin connection.
struct Runtime {
    sock: UnixStream,
    demux: Demux,
    conns: [Decoder; 3],
    next_stream: u32,
}

impl Runtime {
    fn send(&mut self, conn: u32, f: &Frame) {
        self.sock.write_all(&mux::encode(conn, &f.encode())).unwrap();
    }

    /// The next whole ttrpc message on `conn` (others are kept for later).
    fn recv(&mut self, conn: u32) -> Frame {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(f) = self.conns[conn as usize].next_frame().unwrap() {
                return f;
            }
            let n = self.sock.read(&mut buf).expect("the plugin answers within the timeout");
            assert!(n > 0, "the plugin closed the connection");
            self.demux.push(&buf[..n]);
            while let Some((c, bytes)) = self.demux.next_frame().unwrap() {
                self.conns[c as usize].push(&bytes);
            }
        }
    }

    /// Calls `method` of the plugin's service: (status code, message, response payload).
    fn call(&mut self, method: &str, payload: Vec<u8>) -> (i32, String, Vec<u8>) {
        let stream = self.next_stream;
        self.next_stream += 2;
        self.send(PLUGIN_SERVICE_CONN, &Frame::request(stream, "nri.pkg.api.v1alpha1.Plugin", method, payload, 0));
        let f = self.recv(PLUGIN_SERVICE_CONN);
        assert_eq!((f.stream, f.kind), (stream, ttrpc::TYPE_RESPONSE), "a response to our request");
        let r = ttrpc::Response::decode(f.payload.as_slice()).unwrap();
        let s = r.status.unwrap_or_default();
        (s.code, s.message, r.payload)
    }

    fn create(&mut self, env: &[&str], annotations: &[(&str, &str)]) -> (i32, String, nri::CreateContainerResponse) {
        let req = nri::CreateContainerRequest {
            pod: Some(nri::PodSandbox { name: "pod".into(), namespace: "default".into(), ..Default::default() }),
            container: Some(nri::Container {
                id: "c1".into(),
                name: "ctr".into(),
                env: env.iter().map(|s| s.to_string()).collect(),
                annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ..Default::default()
            }),
        };
        let (code, msg, payload) = self.call("CreateContainer", req.encode_to_vec());
        (code, msg, nri::CreateContainerResponse::decode(payload.as_slice()).unwrap())
    }
}

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn device_paths(r: &nri::CreateContainerResponse) -> Vec<String> {
    let mut p: Vec<String> = r
        .adjust
        .as_ref()
        .and_then(|a| a.linux.as_ref())
        .map(|l| l.devices.iter().map(|d| d.path.clone()).collect())
        .unwrap_or_default();
    p.sort();
    p
}

#[test]
fn registers_configures_and_answers_create_container_with_the_plan() {
    let Some(fx) = actk_testsupport::fixture::prepare("nvidia-dgx-h100").unwrap() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (cdi, sock) = (tmp.path().join("cdi"), tmp.path().join("nri.sock"));
    std::fs::create_dir_all(&cdi).unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "root = {:?}\nspec_dirs = [{:?}]\nprofiles_dir = {:?}\n",
            fx.root.display().to_string(),
            cdi.display().to_string(),
            tmp.path().join("profiles.d").display().to_string()
        ),
    )
    .unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let _plugin = Plugin(
        Command::new(env!("CARGO_BIN_EXE_actk-nri"))
            .args(["--socket", sock.to_str().unwrap(), "--name", "actk", "--idx", "42"])
            .env("ACTK_CONFIG", &config)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut rt = Runtime { sock: conn, demux: Demux::default(), conns: Default::default(), next_stream: 1 };

    // 1. The plugin registers on connection 2.
    let reg = rt.recv(RUNTIME_SERVICE_CONN);
    let req = ttrpc::Request::decode(reg.payload.as_slice()).unwrap();
    assert_eq!((req.service.as_str(), req.method.as_str()), ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin"));
    let r = nri::RegisterPluginRequest::decode(req.payload.as_slice()).unwrap();
    assert_eq!((r.plugin_name.as_str(), r.plugin_idx.as_str()), ("actk", "42"));
    rt.send(RUNTIME_SERVICE_CONN, &Frame::response(reg.stream, ttrpc::ok(), nri::Empty {}.encode_to_vec()));

    // 2. Configure: it subscribes to CreateContainer only.
    let c = nri::ConfigureRequest { runtime_name: "fake".into(), runtime_version: "0".into(), ..Default::default() };
    let (code, _, payload) = rt.call("Configure", c.encode_to_vec());
    assert_eq!(code, 0);
    assert_eq!(nri::ConfigureResponse::decode(payload.as_slice()).unwrap().events, 1 << 3, "CREATE_CONTAINER = 4");
    let (code, _, _) = rt.call("Synchronize", nri::SynchronizeRequest::default().encode_to_vec());
    assert_eq!(code, 0);

    // 2b. A busy node's Synchronize in three parts (containerd/nri#111), the middle one close to
    // ttrpc's 4 MiB: each part but the last answered `more`, none with updates (issue 28 item 8).
    let big_pod = |i: usize| nri::PodSandbox {
        id: format!("p{i}"),
        name: format!("big{i}"),
        namespace: "default".into(),
        annotations: [("example.com/blob".to_string(), "x".repeat(250 << 10))].into(),
        ..Default::default()
    };
    for (pods, more) in [(0..2, true), (2..17, true), (17..18, false)] {
        let req = nri::SynchronizeRequest { pods: pods.clone().map(big_pod).collect(), containers: vec![], more };
        let (code, msg, payload) = rt.call("Synchronize", req.encode_to_vec());
        assert_eq!(code, 0, "{msg}");
        let r = nri::SynchronizeResponse::decode(payload.as_slice()).unwrap();
        assert_eq!((r.more, r.update.len()), (more, 0), "part {pods:?}");
    }
    // A message over ttrpc's limit costs one call (RESOURCE_EXHAUSTED, as ttrpc answers), not the
    // connection.
    let huge = nri::SynchronizeRequest { pods: (0..20).map(big_pod).collect(), ..Default::default() };
    let (code, msg, _) = rt.call("Synchronize", huge.encode_to_vec());
    assert_eq!(code, 8, "{msg}");
    assert!(msg.contains("exceeds maximum message size"), "{msg}");

    // 3. A container asking for GPUs 1 and 3 gets exactly those, the control nodes and libraries.
    let (code, msg, resp) = rt.create(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1,3"], &[]);
    assert_eq!(code, 0, "{msg}");
    let devs = device_paths(&resp);
    assert!(devs.contains(&"/dev/nvidia1".to_string()) && devs.contains(&"/dev/nvidia3".to_string()), "{devs:?}");
    assert!(!devs.iter().any(|d| d == "/dev/nvidia0" || d == "/dev/nvidia2"), "only what was asked: {devs:?}");
    assert!(devs.contains(&"/dev/nvidiactl".to_string()), "{devs:?}");
    let a = resp.adjust.unwrap();
    assert!(a.mounts.iter().any(|m| m.destination.contains("libcuda.so")), "{:?}", a.mounts);
    assert!(a.annotations["io.actk.applied"].starts_with("nvidia.com/gpu=1,3"), "{:?}", a.annotations);
    let dev1 = a.linux.as_ref().unwrap().devices.iter().find(|d| d.path == "/dev/nvidia1").unwrap();
    assert_eq!((dev1.r#type.as_str(), dev1.major, dev1.minor), ("c", 195, 1));

    // 4. Nothing asked: no adjustment. A bad request: the error the user would see from actk-runtime.
    let (code, _, resp) = rt.create(&["PATH=/bin"], &[]);
    assert_eq!((code, resp.adjust), (0, None));
    let (code, msg, _) = rt.create(&["NVIDIA_VISIBLE_DEVICES=9"], &[]);
    assert_ne!(code, 0);
    assert!(msg.contains("default/pod container ctr") && msg.contains("NVIDIA_VISIBLE_DEVICES=9"), "{msg}");

    // 5. A spec file written while it runs is used for the next container (specs refreshed on change).
    let profiles = actk_core::profile::builtin();
    let inv = actk_core::discover::discover(&fx.root, &profiles);
    for spec in actk_core::cdi::generate::generate_all(&profiles, &inv, Some("nvidia"), &Default::default()).unwrap() {
        actk_core::cdi::write::write_spec_in_dir(&spec, &cdi, actk_core::cdi::Format::Json).unwrap();
    }
    let (code, msg, resp) = rt.create(&["NVIDIA_VISIBLE_DEVICES=0"], &[("cdi.k8s.io/x", "nvidia.com/gpu=2")]);
    assert_eq!(code, 0, "{msg}");
    let ann = &resp.adjust.as_ref().unwrap().annotations["io.actk.applied"];
    assert!(ann.contains("(NVIDIA_VISIBLE_DEVICES, spec)") && ann.contains("nvidia.com/gpu=2"), "{ann}");
    assert!(device_paths(&resp).contains(&"/dev/nvidia2".to_string()));
    assert!(Path::new(&sock).exists());
}
