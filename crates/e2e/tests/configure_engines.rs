//! `actk runtime configure` output read by the engines themselves (issue 9 item 3): containerd
//! 2.1 (`containerd config dump`, which merges the drop-ins the main file imports) and dockerd
//! 28.5 (`dockerd --validate`), both from Debian forky. Files are in a temporary directory,
//! never the machine's /etc.

use actk_testsupport::engines::{self, expect_success, require_forky};
use anyhow::Result;
use std::fs;
use std::process::Command;

const MAIN_V3: &str = "# as a distribution ships it\nversion = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n    runtime_type = 'io.containerd.runc.v2'\n";

#[test]
fn containerd_2_reads_the_drop_in_with_runtime_and_cdi_and_keeps_the_main_file() -> Result<()> {
    let Some((root, _)) = require_forky(false) else { return Ok(()) };
    let d = tempfile::tempdir()?;
    let main = d.path().join("config.toml");
    let drop = d.path().join("conf.d/99-actk.toml");
    fs::write(&main, MAIN_V3)?;
    let args = [
        "runtime",
        "configure",
        "--runtime",
        "containerd",
        "--config",
        main.to_str().unwrap_or_default(),
        "--drop-in",
        drop.to_str().unwrap_or_default(),
        "--path",
        "/usr/local/bin/actk-runtime",
        "--cdi",
        "--cdi-spec-dirs",
        "/etc/cdi,/run/actk/cdi",
    ];
    expect_success("actk runtime configure --drop-in --cdi", &engines::actk(None, &args));
    let o =
        Command::new(root.join("usr/bin/containerd")).arg("--config").arg(&main).args(["config", "dump"]).output()?;
    let dump = expect_success("containerd config dump", &o);
    let t: toml::Table = dump.parse()?;
    let rt = &t["plugins"]["io.containerd.cri.v1.runtime"];
    assert_eq!(rt["enable_cdi"].as_bool(), Some(true), "{dump}");
    let dirs: Vec<&str> = rt["cdi_spec_dirs"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(dirs, ["/etc/cdi", "/run/actk/cdi"]);
    let actk = &rt["containerd"]["runtimes"]["actk"];
    assert_eq!(actk["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(actk["options"]["BinaryName"].as_str(), Some("/usr/local/bin/actk-runtime"));
    assert!(rt["containerd"]["runtimes"]["runc"].is_table(), "the main file's runtime is still there");
    assert_eq!(rt["enable_selinux"].as_bool(), Some(false));

    let mut rm = args[..8].to_vec();
    rm.extend(["--remove", "--cdi"]);
    expect_success("--remove", &engines::actk(None, &rm));
    assert_eq!(fs::read_to_string(&main)?, MAIN_V3, "main file back byte for byte");
    assert!(!drop.exists());
    Ok(())
}

#[test]
fn dockerd_28_validates_the_daemon_json_configure_wrote_with_cdi() -> Result<()> {
    let Some((root, _)) = require_forky(false) else { return Ok(()) };
    let d = tempfile::tempdir()?;
    let f = d.path().join("daemon.json");
    fs::write(&f, "{\n    \"features\": {\"buildkit\": true},\n    \"log-driver\": \"json-file\"\n}\n")?;
    let args = [
        "runtime",
        "configure",
        "--runtime",
        "docker",
        "--config",
        f.to_str().unwrap_or_default(),
        "--path",
        "/usr/local/bin/actk-runtime",
        "--cdi",
        "--cdi-spec-dirs",
        "/etc/cdi,/run/actk/cdi",
    ];
    expect_success("actk runtime configure --runtime docker --cdi", &engines::actk(None, &args));
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&f)?)?;
    assert_eq!(v["features"], serde_json::json!({"buildkit": true, "cdi": true}));
    assert_eq!(v["cdi-spec-dirs"], serde_json::json!(["/etc/cdi", "/run/actk/cdi"]));
    let o = Command::new(root.join("usr/sbin/dockerd")).arg("--validate").arg("--config-file").arg(&f).output()?;
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.contains("configuration OK"), "dockerd 28 --validate: {out}");
    Ok(())
}
