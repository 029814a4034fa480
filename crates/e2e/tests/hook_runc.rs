//! actk-hook under plain runc at each hook stage it supports, with the request planned from the
//! container's env on the DGX fixture (actk_core::plan, the code actk-runtime uses).

use actk_testsupport::engines::{self, Bundle, bin, names, require_root, runc, text, unique_name};
use actk_testsupport::fixture::{self, Fixture};
use serde_json::json;
use std::path::PathBuf;

struct Env {
    _fixture: Fixture,
    _config: engines::ActkConfig,
    config_file: PathBuf,
}

fn setup() -> Option<Env> {
    if !require_root() {
        return None;
    }
    let fixture = fixture::prepare("nvidia-dgx-h100").expect("prepare fixture")?;
    let config = engines::ActkConfig::new(&fixture.root).expect("actk config");
    let config_file = config.write().expect("write config");
    Some(Env { _fixture: fixture, _config: config, config_file })
}

impl Env {
    fn bundle(&self, stage: &str, args: &[&str], script: &str, env: &[&str]) -> Bundle {
        let b = Bundle::busybox(&["sh", "-c", script], env).expect("bundle");
        let hook = bin("actk-hook");
        let mut argv = vec!["actk-hook".to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let cfg = format!("ACTK_CONFIG={}", self.config_file.display());
        b.edit(|c| {
            c["hooks"] = json!({ stage: [{ "path": hook.to_string_lossy(), "args": argv, "env": [cfg] }] });
        })
        .expect("edit config");
        b
    }
}

fn run(b: &Bundle) -> std::process::Output {
    runc(&["run".as_ref(), "--bundle".as_ref(), b.path().as_os_str(), unique_name("hook").as_ref()])
}

const SCRIPT: &str = "ls -1 /dev; echo ---; cat /dev/nvidia3 2>&1; ls /usr/lib/x86_64-linux-gnu/libcuda.so.1";

#[test]
fn every_injecting_stage_gives_the_requested_gpus_with_cgroup_access() {
    let Some(env) = setup() else { return };
    for stage in ["prestart", "createRuntime", "createContainer"] {
        let b = env.bundle(stage, &[stage], SCRIPT, &["NVIDIA_VISIBLE_DEVICES=1,3"]);
        let o = run(&b);
        let (out, err) = text(&o);
        let (dev, rest) = out.split_once("---").unwrap_or((&out, ""));
        let dev = names(dev);
        assert!(
            dev.contains("nvidia1") && dev.contains("nvidia3") && dev.contains("nvidiactl"),
            "{stage}: {dev:?}\n{err}"
        );
        assert!(!dev.contains("nvidia0") && !dev.contains("nvidia2"), "{stage}: {dev:?}");
        // No driver backs the fixture's 195:3: ENXIO proves the device cgroup let the open through (EPERM otherwise).
        assert!(
            rest.contains("No such device or address"),
            "{stage}: device cgroup did not allow /dev/nvidia3:\n{rest}"
        );
        assert!(
            rest.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "{stage}: libcuda not mounted:\n{rest}\n{err}"
        );
    }
}

#[test]
fn no_request_and_already_applied_change_nothing() {
    let Some(env) = setup() else { return };
    let b = env.bundle("prestart", &["prestart"], "ls -1 /dev", &[]);
    let dev = names(&engines::expect_success("runc run without a request", &run(&b)));
    assert!(!dev.iter().any(|d| d.starts_with("nvidia")), "{dev:?}");

    let b = env.bundle("prestart", &["prestart"], "ls -1 /dev", &["NVIDIA_VISIBLE_DEVICES=all"]);
    b.edit(|c| c["annotations"] = json!({"io.actk.applied": "nvidia.com/gpu=all (NVIDIA_VISIBLE_DEVICES, generated)"}))
        .unwrap();
    let dev = names(&engines::expect_success("runc run with io.actk.applied", &run(&b)));
    assert!(
        !dev.iter().any(|d| d.starts_with("nvidia")),
        "the hook injected although actk-runtime had applied the edits: {dev:?}"
    );
}

#[test]
fn unknown_device_fails_the_start_with_the_variable_and_value() {
    let Some(env) = setup() else { return };
    let b = env.bundle("prestart", &["prestart"], "true", &["NVIDIA_VISIBLE_DEVICES=7,banana"]);
    let o = run(&b);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "started with a bad device request");
    assert!(err.contains("actk-hook") && err.contains("NVIDIA_VISIBLE_DEVICES") && err.contains("banana"), "{err}");
}

#[test]
fn update_ldcache_as_a_create_container_hook() {
    let Some(env) = setup() else { return };
    let b = env.bundle("createContainer", &["update-ldcache", "--folder", "/opt/drv"], "true", &[]);
    let rf = b.rootfs();
    std::fs::create_dir_all(rf.join("opt/drv")).unwrap();
    std::fs::write(rf.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
    let lib =
        ["/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a host shared library");
    let name = std::path::Path::new(lib).file_name().unwrap().to_string_lossy().to_string();
    std::fs::copy(lib, rf.join("opt/drv").join(&name)).unwrap();
    engines::expect_success("runc run with update-ldcache", &run(&b));
    let cache = std::fs::read(rf.join("etc/ld.so.cache")).expect("ld.so.cache written");
    let needle = format!("/opt/drv/{name}");
    assert!(cache.windows(needle.len()).any(|w| w == needle.as_bytes()), "cache lacks {needle}");
    assert_eq!(
        std::fs::read_to_string(rf.join("etc/ld.so.conf.d/00-actk.conf")).unwrap().lines().last(),
        Some("/opt/drv")
    );
}
