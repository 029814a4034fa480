//! `docker run --gpus` with plain runc reaching actk-hook (installed as
//! `nvidia-container-runtime-hook` on dockerd's PATH by scripts/start-dockerd.sh).
//!
//! Docker passes the hook dockerd's own environment, so the hook reads its host root from
//! /etc/actk/config.toml: every test installs its fixture config there under
//! `with_global_actk_config` (a lock, and the previous file restored).

use actk_testsupport::engines::{self, ActkConfig, docker, expect_success, names, text, with_global_actk_config};
use actk_testsupport::fixture;
use std::path::Path;

/// The busybox image, when dockerd runs with the `--gpus` driver; else skip (or fail under CI).
fn ready() -> Option<&'static str> {
    if !engines::require_root_and_engines() {
        return None;
    }
    let img = engines::docker_busybox_image().expect("busybox image");
    Some(img)
}

/// Fails with the fix when dockerd did not register `--gpus` (started before the hook existed).
fn gpus_supported(o: &std::process::Output) {
    let (_, err) = text(o);
    assert!(
        !err.contains("could not select device driver"),
        "dockerd has no --gpus driver: run scripts/start-dockerd.sh after building actk-hook (it restarts dockerd with nvidia-container-runtime-hook on its PATH):\n{err}"
    );
}

fn fixture_mounts(root: &Path) -> Vec<String> {
    let r = root.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&r))
        .map(String::from)
        .collect()
}

#[test]
fn gpus_2_shows_two_gpus_control_nodes_and_libraries() {
    let Some(img) = ready() else { return };
    let f = fixture::prepare("nvidia-dgx-h100").unwrap().unwrap();
    let cfg = ActkConfig::new(&f.root).unwrap();
    with_global_actk_config(&cfg, || {
        let o = docker(&[
            "run",
            "--rm",
            "--gpus",
            "2",
            img,
            "sh",
            "-c",
            "ls -1 /dev; echo ---; ls -1 /usr/lib/x86_64-linux-gnu /usr/bin",
        ]);
        gpus_supported(&o);
        let out = expect_success("docker run --gpus 2", &o);
        let (dev, rest) = out.split_once("---").unwrap();
        let dev = names(dev);
        for n in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"] {
            assert!(dev.contains(n), "/dev lacks {n}: {dev:?}");
        }
        for n in ["nvidia2", "nvidia7"] {
            assert!(!dev.contains(n), "/dev has {n} though 2 GPUs were asked: {dev:?}");
        }
        let files = names(rest);
        assert!(
            files.contains("libcuda.so.1") && files.contains("nvidia-smi"),
            "libraries/tools not mounted: {files:?}"
        );

        let o = docker(&["run", "--rm", "--gpus", "\"device=1,3\"", img, "ls", "-1", "/dev"]);
        let dev = names(&expect_success("docker run --gpus device=1,3", &o));
        assert!(
            dev.contains("nvidia1") && dev.contains("nvidia3") && !dev.contains("nvidia0") && !dev.contains("nvidia2"),
            "{dev:?}"
        );
        Ok(())
    })
    .unwrap();
    assert!(fixture_mounts(&f.root).is_empty(), "actk mounts left on the host: {:?}", fixture_mounts(&f.root));
}

#[test]
fn neuron_variable_is_served_by_the_gpus_hook() {
    let Some(img) = ready() else { return };
    let f = fixture::prepare("hetero-nvidia-neuron").unwrap().unwrap();
    let cfg = ActkConfig::new(&f.root).unwrap();
    with_global_actk_config(&cfg, || {
        let o = docker(&["run", "--rm", "--gpus", "1", "-e", "AWS_NEURON_VISIBLE_DEVICES=1", img, "ls", "-1", "/dev"]);
        gpus_supported(&o);
        let dev = names(&expect_success("docker run --gpus 1 -e AWS_NEURON_VISIBLE_DEVICES=1", &o));
        assert!(dev.contains("neuron1") && !dev.contains("neuron0"), "{dev:?}");
        // One GPU: exactly one per-GPU node (this fixture's minors are not in index order).
        let gpus: Vec<&String> =
            dev.iter().filter(|n| n.strip_prefix("nvidia").is_some_and(|d| d.parse::<u32>().is_ok())).collect();
        assert_eq!(gpus.len(), 1, "{dev:?}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn glibc_image_sees_libcuda_in_ld_so_cache() {
    let Some(_) = ready() else { return };
    let img = engines::docker_glibc_image().expect("glibc image");
    let f = fixture::prepare("nvidia-dgx-h100").unwrap().unwrap();
    let cfg = ActkConfig::new(&f.root).unwrap();
    with_global_actk_config(&cfg, || {
        let o =
            docker(&["run", "--rm", "--gpus", "1", img, "sh", "-c", "ldconfig -p; cat /etc/ld.so.conf.d/00-actk.conf"]);
        gpus_supported(&o);
        let out = expect_success("docker run --gpus 1 (glibc) ldconfig -p", &o);
        assert!(out.contains("libcuda.so.1 ") && out.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), "{out}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn sixteen_parallel_gpu_containers_start() {
    let Some(img) = ready() else { return };
    let f = fixture::prepare("nvidia-dgx-h100").unwrap().unwrap();
    let cfg = ActkConfig::new(&f.root).unwrap();
    with_global_actk_config(&cfg, || {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let img = img.to_string();
                std::thread::spawn(move || {
                    (
                        i,
                        docker(&[
                            "run",
                            "--rm",
                            "--gpus",
                            "1",
                            &img,
                            "ls",
                            "/dev/nvidia0",
                            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                        ]),
                    )
                })
            })
            .collect();
        for h in handles {
            let (i, o) = h.join().unwrap();
            gpus_supported(&o);
            expect_success(&format!("parallel docker run --gpus 1 #{i}"), &o);
        }
        Ok(())
    })
    .unwrap();
    assert!(fixture_mounts(&f.root).is_empty(), "actk mounts left on the host: {:?}", fixture_mounts(&f.root));
}
