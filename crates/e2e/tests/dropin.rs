//! Issue 25: the differences runc's own suite and the CNCF CDI reference library showed, as a
//! user sees them with the real runc and dockerd: containers without their own PID namespace
//! get their GPU and its ld.so.cache entries; non-root containers open the 0660 nodes they
//! are given; a read-only /etc does not stop a GPU container (and says so in the log);
//! `actk-runtime create -h` is runc's help; the `--gpus` hook's warnings reach the log file.
//!
//! Nodes a container must open carry the numbers of /dev/null (1:3) and /dev/zero (1:5): a node
//! with a driver's numbers gives ENXIO here, where no driver runs (ENVIRONMENT.md).

use actk_testsupport::engines::{
    self, ActkConfig, Bundle, DockerRuntime, actk, actk_runtime, docker, expect_success, runc, text, unique_name,
    with_global_actk_config,
};
use actk_testsupport::fixture;
use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

/// Replaces fixture node `rel` by one with numbers `major:minor`, mode `mode` and group `gid`
/// (owner root), as a host whose udev rules make it so.
fn node(root: &Path, rel: &str, major: u32, minor: u32, mode: &str, gid: u32) -> Result<()> {
    let p = root.join(rel.trim_start_matches('/'));
    let _ = fs::remove_file(&p);
    for (cmd, args) in [
        (
            "mknod",
            vec![
                "-m".to_string(),
                mode.into(),
                p.display().to_string(),
                "c".into(),
                major.to_string(),
                minor.to_string(),
            ],
        ),
        ("chown", vec![format!("0:{gid}"), p.display().to_string()]),
    ] {
        let o = Command::new(cmd).args(&args).output().with_context(|| format!("running {cmd}"))?;
        if !o.status.success() {
            bail!("{cmd} {args:?}: {}", text(&o).1);
        }
    }
    Ok(())
}

fn run_bundle(cfg: &Path, bundle: &Bundle, what: &str) -> Output {
    let id = unique_name(what);
    actk_runtime(cfg, &[OsString::from("run"), "--bundle".into(), bundle.path().into(), id.into()])
}

/// Drops `type` from the bundle's `linux.namespaces` (a container sharing the host's).
fn without_namespace(bundle: &Bundle, ty: &str) -> Result<()> {
    bundle.edit(|c| {
        if let Some(ns) = c["linux"]["namespaces"].as_array_mut() {
            ns.retain(|n| n["type"] != ty);
        }
    })
}

/// The lines of `ldconfig -p` output naming `soname` in the driver's library directory.
fn lists(out: &str, soname: &str) -> bool {
    out.lines()
        .any(|l| l.trim_start().starts_with(&format!("{soname} ")) && l.contains("=> /usr/lib/x86_64-linux-gnu/"))
}

/// Item 1: a runc bundle without a PID namespace (what `--pid=host` and `hostPID: true` give)
/// starts with its GPU, and the generated createContainer hooks (enable-cuda-compat,
/// update-ldcache), which run in the container's mount namespace but the host's PID namespace,
/// find the container: `ldconfig -p` lists libcuda.
#[test]
fn runc_bundle_without_a_pid_namespace_gets_its_gpu_and_libcuda_in_ldconfig_p() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let bundle = Bundle::glibc(&["sh", "-c", "ls /dev/nvidia0 && /sbin/ldconfig -p"], &["NVIDIA_VISIBLE_DEVICES=0"])?;
    without_namespace(&bundle, "pid")?;
    let actk_config = ActkConfig::new(&fx.root)?;
    let o = run_bundle(&actk_config.write()?, &bundle, "e2e-pid-host");
    let out = expect_success("actk-runtime run (no PID namespace, glibc, ldconfig -p)", &o);
    assert!(out.contains("/dev/nvidia0"), "{out}");
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(lists(&out, soname), "ldconfig -p without a PID namespace does not list {soname}:\n{out}");
    }
    Ok(())
}

/// Item 2: a non-root container (uid 1000) opens an AMD render node and /dev/kfd, both 0660
/// root:render on the host, and NVIDIA nodes 0660 root:video (a host that sets
/// NVreg_DeviceFileMode/GID): generated in memory by actk-runtime, and from a spec file
/// `actk cdi generate` wrote, asked for by CDI name. The nodes are the container user's, with the
/// host's group and mode.
#[test]
fn non_root_container_opens_the_0660_amd_and_nvidia_nodes_it_was_given() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(amd) = fixture::prepare("amd-mi300x")? else { return Ok(()) };
    node(&amd.root, "/dev/dri/renderD128", 1, 3, "0660", 109)?;
    node(&amd.root, "/dev/dri/card1", 1, 5, "0660", 44)?;
    node(&amd.root, "/dev/kfd", 1, 5, "0660", 109)?;
    // NVIDIA nodes 0660 root:video; the GPU node keeps its numbers (discovery checks them), so
    // its open ends in ENXIO (no driver here) after the permission check has passed.
    let Some(nv) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    node(&nv.root, "/dev/nvidia0", 195, 0, "0660", 44)?;
    node(&nv.root, "/dev/nvidiactl", 1, 5, "0660", 44)?;
    let opens = |nodes: &[&str]| {
        let mut s = String::from("id -u; ");
        for n in nodes {
            s.push_str(&format!("if (exec 3<>{n}); then echo opened {n}; fi 2>&1; ls -ln {n}; "));
        }
        s
    };
    let check = |out: &str, nodes: &[&str], gid: u32| {
        assert_eq!(out.lines().next(), Some("1000"), "{out}");
        assert!(!out.contains("Permission denied"), "uid 1000 was refused a node:\n{out}");
        for n in nodes {
            let opened = out.lines().any(|l| l == format!("opened {n}"));
            let no_driver = out.lines().any(|l| l.contains(n) && l.contains("No such device or address"));
            assert!(opened || n.ends_with("nvidia0") && no_driver, "uid 1000 could not open {n}:\n{out}");
            let ls = out.lines().find(|l| l.starts_with('c') && l.ends_with(n)).unwrap_or_default();
            let f: Vec<&str> = ls.split_whitespace().collect();
            assert!(
                f.first().is_some_and(|m| m.starts_with("crw-rw----"))
                    && f.get(2) == Some(&"1000")
                    && f.get(3) == Some(&gid.to_string().as_str()),
                "{n} is not 0660 1000:{gid} in the container: {ls}\n{out}"
            );
        }
    };
    let amd_nodes = ["/dev/dri/renderD128", "/dev/kfd"];
    let nv_nodes = ["/dev/nvidiactl", "/dev/nvidia0"];
    for (fx, env, nodes, gid) in
        [(&amd, "AMD_VISIBLE_DEVICES=0", &amd_nodes, 109), (&nv, "NVIDIA_VISIBLE_DEVICES=0", &nv_nodes, 44)]
    {
        let cfg = ActkConfig::new(&fx.root)?;
        // Generated in memory from discovery.
        let b = Bundle::busybox(&["sh", "-c", &opens(nodes)], &[env])?;
        b.edit(|c| {
            c["process"]["user"]["uid"] = 1000.into();
            c["process"]["user"]["gid"] = 1000.into();
        })?;
        let out = expect_success(
            &format!("actk-runtime run as uid 1000 ({env})"),
            &run_bundle(&cfg.write()?, &b, "e2e-nonroot"),
        );
        check(&out, nodes, gid);
        // From the spec file actk cdi generate writes, asked for by CDI name.
        let g = actk(
            None,
            &[
                OsString::from("cdi"),
                "generate".into(),
                "--root".into(),
                fx.root.clone().into(),
                "--output".into(),
                cfg.spec_dir().into(),
            ],
        );
        expect_success("actk cdi generate", &g);
        let kind = if env.starts_with("AMD") { "amd.com/gpu" } else { "nvidia.com/gpu" };
        let b = Bundle::busybox(&["sh", "-c", &opens(nodes)], &[])?;
        b.edit(|c| {
            c["process"]["user"]["uid"] = 1000.into();
            c["process"]["user"]["gid"] = 1000.into();
            c["annotations"] = serde_json::json!({"cdi.k8s.io/e2e": format!("{kind}=0")});
        })?;
        let out = expect_success(
            &format!("actk-runtime run as uid 1000 ({kind}=0 by CDI name)"),
            &run_bundle(&cfg.write()?, &b, "e2e-nonroot-cdi"),
        );
        check(&out, nodes, gid);
    }
    Ok(())
}

/// Item 10: a read-only /etc (a read-only bind mount over it, as a ConfigMap at /etc gives)
/// does not stop a GPU container: the libraries are mounted, the cache is left as it was, and
/// the hook says so in the log file (its stderr is discarded when it succeeds).
#[test]
fn read_only_etc_starts_the_gpu_container_with_a_warning_in_the_log() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let bundle = Bundle::glibc(
        &["sh", "-c", "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /dev/nvidia0 && touch /etc/x 2>&1; echo started"],
        &["NVIDIA_VISIBLE_DEVICES=0"],
    )?;
    let etc = tempfile::tempdir()?;
    engines::copy_tree(&bundle.rootfs().join("etc"), &etc.path().join("etc"))?;
    let src = etc.path().join("etc").display().to_string();
    bundle.edit(|c| {
        c["mounts"].as_array_mut().unwrap().push(serde_json::json!(
            {"destination": "/etc", "type": "bind", "source": src, "options": ["rbind", "ro"]}
        ));
    })?;
    let log = tempfile::NamedTempFile::new()?;
    let mut cfg = ActkConfig::new(&fx.root)?;
    cfg.extra = format!("log_file = {:?}\n", log.path().display().to_string());
    // The createContainer hook reads the machine's config (a hook gets no ACTK_CONFIG).
    with_global_actk_config(&cfg, || {
        let o = run_bundle(&cfg.write()?, &bundle, "e2e-ro-etc");
        let out = expect_success("actk-runtime run (read-only /etc)", &o);
        assert!(out.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1") && out.ends_with("started\n"), "{out}");
        assert!(out.contains("Read-only file system"), "the test's /etc is not read-only: {out}");
        let logged = fs::read_to_string(log.path())?;
        assert!(
            logged.contains("actk-hook:")
                && logged.contains("/etc/ld.so.cache was not updated")
                && logged.contains("LD_LIBRARY_PATH="),
            "no warning in the log file:\n{logged}"
        );
        Ok(())
    })
}

/// Item 5: `create -h`, `run --help` and every subcommand's help are runc's own, also where no
/// config.json is; an unknown subcommand's help fails as runc's does.
#[test]
fn help_of_every_subcommand_is_runcs() -> Result<()> {
    if !engines::require_root() {
        return Ok(());
    }
    let cfg = ActkConfig::new(Path::new("/nonexistent"))?;
    let cfg_path = cfg.write()?;
    let empty = tempfile::tempdir()?;
    for args in [
        &["create", "-h"][..],
        &["run", "--help"],
        &["create", "--bundle", "/nonexistent", "x", "--help"],
        &["exec", "-h"],
        &["delete", "--help"],
        &["spec", "-h"],
        &["--help"],
    ] {
        let ours = Command::new(engines::bin("actk-runtime"))
            .args(args)
            .env("ACTK_CONFIG", &cfg_path)
            .current_dir(empty.path())
            .output()?;
        let theirs = Command::new("runc").args(args).current_dir(empty.path()).output()?;
        assert_eq!(ours.status.code(), theirs.status.code(), "{args:?}: {}", text(&ours).1);
        assert_eq!(text(&ours).0, text(&theirs).0, "{args:?}: not runc's help");
        assert!(ours.status.success(), "{args:?}");
    }
    let o = actk_runtime(&cfg_path, &["foo", "-h"]);
    assert!(!o.status.success() && text(&o).1.contains("No help topic for 'foo'"), "{:?}", text(&o));
    let o = runc(&["foo", "-h"]);
    assert!(!o.status.success());
    Ok(())
}

/// dockerd with the `--gpus` hook on its PATH, and the glibc image; else skip (or fail under CI).
fn docker_ready() -> Option<&'static str> {
    if !engines::require_root_and_engines() {
        return None;
    }
    Some(engines::docker_glibc_image().expect("glibc image"))
}

fn gpus_supported(o: &Output) {
    assert!(
        !text(o).1.contains("could not select device driver"),
        "dockerd has no --gpus driver: run scripts/start-dockerd.sh after building actk-hook:\n{}",
        text(o).1
    );
}

/// Item 1 with Docker: `docker run --pid=host --gpus 1` starts with its GPU and libcuda in
/// `ldconfig -p`, through the `--gpus` prestart hook (plain runc) and through actk-runtime
/// (`--runtime`, whose generated createContainer hooks run in the host's PID namespace).
#[test]
fn docker_run_pid_host_gpus_1_gets_its_gpu_and_libcuda() -> Result<()> {
    let Some(img) = docker_ready() else { return Ok(()) };
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    let cfg = ActkConfig::new(&fx.root)?;
    let rt = DockerRuntime::register(&cfg.write_wrapper()?)?;
    with_global_actk_config(&cfg, || {
        for runtime in ["runc", rt.name.as_str()] {
            let o = docker(&[
                "run",
                "--rm",
                "--pid=host",
                "--runtime",
                runtime,
                "--gpus",
                "1",
                img,
                "sh",
                "-c",
                "ls /dev/nvidia0 && ldconfig -p",
            ]);
            gpus_supported(&o);
            let out = expect_success(&format!("docker run --pid=host --gpus 1 --runtime {runtime}"), &o);
            assert!(out.contains("/dev/nvidia0") && lists(&out, "libcuda.so.1"), "--runtime {runtime}:\n{out}");
        }
        Ok(())
    })
}

/// Items 2 and 10 with Docker's `--gpus` hook: a `--user 1000` container opens its 0660 GPU
/// node; a read-only /etc volume starts with a warning in the log file.
#[test]
fn docker_gpus_hook_gives_nodes_to_the_user_and_skips_a_read_only_etc() -> Result<()> {
    let Some(img) = docker_ready() else { return Ok(()) };
    let Some(fx) = fixture::prepare("nvidia-dgx-h100")? else { return Ok(()) };
    node(&fx.root, "/dev/nvidia0", 195, 0, "0660", 44)?;
    node(&fx.root, "/dev/nvidiactl", 1, 5, "0660", 44)?;
    let log = tempfile::NamedTempFile::new()?;
    let mut cfg = ActkConfig::new(&fx.root)?;
    cfg.extra = format!("log_file = {:?}\n", log.path().display().to_string());
    let etc = tempfile::tempdir()?;
    engines::copy_tree(&engines::glibc_rootfs()?.join("etc"), &etc.path().join("etc"))?;
    // Docker bind-mounts these over /etc: a read-only /etc must already hold them (as a
    // ConfigMap at /etc would hold what the pod needs).
    for f in ["hosts", "hostname", "resolv.conf"] {
        fs::write(etc.path().join("etc").join(f), "")?;
    }
    let vol = format!("{}:/etc:ro", etc.path().join("etc").display());
    with_global_actk_config(&cfg, || {
        let o = docker(&[
            "run",
            "--rm",
            "--gpus",
            "1",
            "--user",
            "1000:1000",
            img,
            "sh",
            "-c",
            "if (exec 3<>/dev/nvidiactl); then echo opened; fi; ls -ln /dev/nvidia0 /dev/nvidiactl",
        ]);
        gpus_supported(&o);
        let out = expect_success("docker run --gpus 1 --user 1000:1000", &o);
        assert!(out.lines().any(|l| l == "opened"), "uid 1000 could not open /dev/nvidiactl (0660 root:video):\n{out}");
        for n in ["/dev/nvidia0", "/dev/nvidiactl"] {
            let ls = out.lines().find(|l| l.ends_with(n)).unwrap_or_default();
            let f: Vec<&str> = ls.split_whitespace().collect();
            assert!(
                f.first() == Some(&"crw-rw----") && f.get(2) == Some(&"1000") && f.get(3) == Some(&"44"),
                "{n}: {ls}"
            );
        }
        let o = docker(&[
            "run",
            "--rm",
            "--gpus",
            "1",
            "-v",
            &vol,
            img,
            "sh",
            "-c",
            "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ]);
        expect_success("docker run --gpus 1 -v ETC:/etc:ro", &o);
        let logged = fs::read_to_string(log.path())?;
        assert!(logged.contains("/etc/ld.so.cache was not updated"), "no warning in the log file:\n{logged}");
        Ok(())
    })
}

/// Item 11: `docker run --gpus all` on a node without GPUs starts a container without one, as
/// before, but the hook's warning is now in the log file, with what it decided.
#[test]
fn docker_gpus_all_without_gpus_warns_in_the_log_file() -> Result<()> {
    let Some(img) = docker_ready() else { return Ok(()) };
    let Some(fx) = fixture::prepare("empty")? else { return Ok(()) };
    let log = tempfile::NamedTempFile::new()?;
    let mut cfg = ActkConfig::new(&fx.root)?;
    cfg.extra = format!("log_file = {:?}\n", log.path().display().to_string());
    with_global_actk_config(&cfg, || {
        let o = docker(&["run", "--rm", "--gpus", "all", img, "true"]);
        gpus_supported(&o);
        expect_success("docker run --gpus all (no GPUs)", &o);
        let logged = fs::read_to_string(log.path())?;
        assert!(
            logged.contains("WARN")
                && logged.contains("actk-hook: container ")
                && logged.contains("this node has no nvidia.com/gpu devices"),
            "{logged}"
        );
        Ok(())
    })
}
