//! `actk runtime configure` and `actk config` as a user runs them, on files in a temporary
//! directory (never the machine's /etc).

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const ACTK: &str = env!("CARGO_BIN_EXE_actk");

fn actk(args: &[&str], config: Option<&Path>) -> Output {
    let mut c = Command::new(ACTK);
    c.args(args);
    match config {
        Some(p) => c.env("ACTK_CONFIG", p),
        // An empty config file: the defaults, never the machine's /etc/actk/config.toml.
        None => c.env("ACTK_CONFIG", "/dev/null"),
    };
    c.output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const DAEMON_JSON: &str = "{\n\t\"features\": { \"buildkit\": true },\n\t\"log-driver\": \"json-file\",\n\t\"log-opts\": { \"max-size\": \"10m\", \"max-file\": \"3\" },\n\t\"default-runtime\": \"runc\",\n\t\"runtimes\": { \"crun\": { \"path\": \"/usr/bin/crun\" } },\n\t\"data-root\": \"/var/lib/docker\"\n}\n";

#[test]
fn f11_docker_configure_keeps_every_other_key_and_remove_restores_the_original_bytes() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("daemon.json");
    fs::write(&f, DAEMON_JSON).unwrap();
    let fs_ = f.to_str().unwrap();
    let out = ok(&actk(
        &["runtime", "configure", "--runtime", "docker", "--config", fs_, "--path", "/usr/bin/actk-runtime"],
        None,
    ));
    assert!(out.contains("registered runtime actk"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
    let mut want: serde_json::Value = serde_json::from_str(DAEMON_JSON).unwrap();
    want["runtimes"]["actk"] = serde_json::json!({"path": "/usr/bin/actk-runtime"});
    assert_eq!(v, want, "only actk's entry is added");
    assert_eq!(fs::read_to_string(d.path().join("daemon.json.bak")).unwrap(), DAEMON_JSON, "backup of the original");
    // A second configure does not overwrite the backup with the edited file.
    ok(&actk(
        &[
            "runtime",
            "configure",
            "--runtime",
            "docker",
            "--config",
            fs_,
            "--path",
            "/usr/bin/actk-runtime",
            "--name",
            "nvidia",
        ],
        None,
    ));
    assert_eq!(fs::read_to_string(d.path().join("daemon.json.bak")).unwrap(), DAEMON_JSON);
    ok(&actk(&["runtime", "configure", "--runtime", "docker", "--config", fs_, "--remove", "--name", "nvidia"], None));
    ok(&actk(&["runtime", "configure", "--runtime", "docker", "--config", fs_, "--remove"], None));
    assert_eq!(fs::read_to_string(&f).unwrap(), DAEMON_JSON, "--remove restores the original exactly");
    assert!(!d.path().join("daemon.json.bak").exists(), "the backup goes once the original is back");
}

#[test]
fn dry_run_prints_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("containers.conf");
    let out = ok(&actk(
        &[
            "runtime",
            "configure",
            "--runtime",
            "podman",
            "--config",
            f.to_str().unwrap(),
            "--path",
            "/opt/actk-runtime",
            "--set-as-default",
            "--dry-run",
        ],
        None,
    ));
    assert!(out.contains("actk = [\"/opt/actk-runtime\"]") && out.contains("runtime = \"actk\""), "{out}");
    assert!(!f.exists());
}

#[test]
fn containerd_new_file_with_name_nvidia_and_remove_deletes_it_again() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("etc/containerd/config.toml");
    let fs_ = f.to_str().unwrap();
    ok(&actk(
        &[
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
            fs_,
            "--name",
            "nvidia",
            "--path",
            "/usr/bin/actk-runtime",
        ],
        None,
    ));
    let t: toml::Table = fs::read_to_string(&f).unwrap().parse().unwrap();
    assert_eq!(
        t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"].as_str(),
        Some("/usr/bin/actk-runtime")
    );
    ok(&actk(
        &["runtime", "configure", "--runtime", "containerd", "--config", fs_, "--name", "nvidia", "--remove"],
        None,
    ));
    assert!(!f.exists(), "a file configure created is removed again");
}

#[test]
fn malformed_engine_file_is_named_and_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("crio.conf");
    fs::write(&f, "[crio.runtime\n").unwrap();
    let o = actk(
        &[
            "runtime",
            "configure",
            "--runtime",
            "crio",
            "--config",
            f.to_str().unwrap(),
            "--path",
            "/usr/bin/actk-runtime",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(f.to_str().unwrap()) && err.contains("TOML"), "{err}");
    assert_eq!(fs::read_to_string(&f).unwrap(), "[crio.runtime\n");
}

#[test]
fn config_default_parses_back_to_the_defaults_and_show_reports_bad_keys() {
    let out = ok(&actk(&["config", "default"], None));
    assert!(out.lines().filter(|l| l.starts_with('#')).count() > 5, "commented: {out}");
    let parsed = actk_core::config::Config::parse(&out, Path::new("default")).unwrap();
    assert_eq!(parsed, actk_core::config::Config::default());

    let d = tempfile::tempdir().unwrap();
    let c = d.path().join("config.toml");
    fs::write(&c, "runtimes = [\"crun\"]\n").unwrap();
    let shown = ok(&actk(&["config", "show"], Some(&c)));
    assert!(shown.contains("runtimes = [\"crun\"]") && shown.contains("spec_dirs"), "{shown}");
    fs::write(&c, "runtimes = [\"crun\"]\nlog_levle = \"debug\"\n").unwrap();
    let o = actk(&["config", "show"], Some(&c));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("log_levle") && err.contains("line 2") && err.contains(c.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn actk_config_naming_a_missing_file_is_an_error_not_the_defaults() {
    let o = actk(&["config", "show"], Some(Path::new("/nonexistent/actk-config.toml")));
    assert!(!o.status.success(), "a typo in ACTK_CONFIG must not fall back to root /");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ACTK_CONFIG=/nonexistent/actk-config.toml: no such file"), "{err}");
    assert!(err.contains("actk config default >"), "the fix is named: {err}");
}

#[test]
fn docker_cdi_turned_on_with_the_runtime_and_remove_restores_the_original_bytes() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("daemon.json");
    fs::write(&f, DAEMON_JSON).unwrap();
    let fs_ = f.to_str().unwrap();
    let out = ok(&actk(
        &["runtime", "configure", "--runtime", "docker", "--config", fs_, "--path", "/usr/bin/actk-runtime", "--cdi"],
        None,
    ));
    assert!(out.contains("registered runtime actk") && out.contains("turned on CDI"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
    let mut want: serde_json::Value = serde_json::from_str(DAEMON_JSON).unwrap();
    want["runtimes"]["actk"] = serde_json::json!({"path": "/usr/bin/actk-runtime"});
    want["features"]["cdi"] = serde_json::json!(true);
    assert_eq!(v, want, "features.cdi added next to buildkit; the default spec dirs are not written");
    ok(&actk(&["runtime", "configure", "--runtime", "docker", "--config", fs_, "--remove", "--cdi"], None));
    assert_eq!(fs::read_to_string(&f).unwrap(), DAEMON_JSON, "--remove --cdi restores the original exactly");
}

#[test]
fn docker_cdi_only_with_other_spec_dirs() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("daemon.json");
    let fs_ = f.to_str().unwrap();
    let out = ok(&actk(
        &[
            "runtime",
            "configure",
            "--runtime",
            "docker",
            "--config",
            fs_,
            "--cdi-only",
            "--cdi-spec-dirs",
            "/etc/cdi,/run/x",
        ],
        None,
    ));
    assert!(!out.contains("registered runtime"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"features": {"cdi": true}, "cdi-spec-dirs": ["/etc/cdi", "/run/x"]}));
    let o = actk(
        &["runtime", "configure", "--runtime", "docker", "--config", fs_, "--cdi", "--cdi-spec-dirs", "cdi"],
        None,
    );
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--cdi-spec-dirs cdi: must be an absolute")
    );
    ok(&actk(&["runtime", "configure", "--runtime", "docker", "--config", fs_, "--remove", "--cdi-only"], None));
    assert!(!f.exists(), "a file configure created is removed again");
}

const CONTAINERD2: &str = "# containerd 2, as the distribution ships it\nversion = 3\nimports = [\"/etc/containerd/extra.toml\"]\n\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_selinux = false\n";

#[test]
fn containerd_drop_in_holds_the_runtime_and_cdi_and_the_main_file_imports_it() {
    let d = tempfile::tempdir().unwrap();
    let main = d.path().join("config.toml");
    let drop = d.path().join("conf.d/99-actk.toml");
    fs::write(&main, CONTAINERD2).unwrap();
    let args = |extra: &[&str]| {
        let mut v = vec![
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
            main.to_str().unwrap(),
            "--drop-in",
            drop.to_str().unwrap(),
        ];
        v.extend_from_slice(extra);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        ok(&actk(&a.iter().map(String::as_str).collect::<Vec<_>>(), None))
    };
    let out = run(&["--path", "/usr/bin/actk-runtime", "--cdi", "--cdi-spec-dirs", "/etc/cdi,/var/run/cdi"]);
    assert!(out.contains("imported by"), "{out}");
    let t: toml::Table = fs::read_to_string(&drop).unwrap().parse().unwrap();
    assert_eq!(t["version"].as_integer(), Some(3), "the drop-in uses the main file's version");
    let cri = &t["plugins"]["io.containerd.cri.v1.runtime"];
    assert_eq!(cri["enable_cdi"].as_bool(), Some(true));
    assert_eq!(cri["containerd"]["runtimes"]["actk"]["options"]["BinaryName"].as_str(), Some("/usr/bin/actk-runtime"));
    let m = fs::read_to_string(&main).unwrap();
    assert!(m.starts_with("# containerd 2, as the distribution ships it\n"), "{m}");
    let mt: toml::Table = m.parse().unwrap();
    let imports: Vec<&str> = mt["imports"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(imports, ["/etc/containerd/extra.toml", drop.to_str().unwrap()]);
    assert!(
        mt["plugins"]["io.containerd.cri.v1.runtime"].get("enable_cdi").is_none(),
        "main file keeps only the import"
    );

    run(&["--remove", "--cdi"]);
    assert!(!drop.exists(), "the drop-in configure created goes");
    assert_eq!(fs::read_to_string(&main).unwrap(), CONTAINERD2, "main file back byte for byte");
    let o = actk(&["runtime", "configure", "--runtime", "docker", "--drop-in", "/x.json", "--cdi-only"], None);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--drop-in is for containerd"));
}

/// Issue 10 finding 6: the backup of a 0600 engine config was written 0644 (readable by every
/// user: daemon.json and containerd's config can hold registry credentials). The backup and the
/// edited file keep the original's mode and owner.
#[test]
fn backup_and_edited_file_keep_the_originals_mode_and_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    for (engine, name, text) in
        [("docker", "daemon.json", DAEMON_JSON), ("containerd", "config.toml", "version = 2\n# a comment\n[plugins]\n")]
    {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join(name);
        fs::write(&f, text).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        let owner = if root {
            std::os::unix::fs::chown(&f, Some(4242), Some(4343)).unwrap();
            (4242, 4343)
        } else {
            let m = fs::metadata(&f).unwrap();
            (m.uid(), m.gid())
        };
        ok(&actk(
            &[
                "runtime",
                "configure",
                "--runtime",
                engine,
                "--config",
                f.to_str().unwrap(),
                "--path",
                "/usr/bin/actk-runtime",
            ],
            None,
        ));
        let bak = d.path().join(format!("{name}.bak"));
        for p in [&bak, &f] {
            let m = fs::metadata(p).unwrap();
            assert_eq!(m.mode() & 0o7777, 0o600, "{engine}: {} has mode {:o}", p.display(), m.mode() & 0o7777);
            assert_eq!((m.uid(), m.gid()), owner, "{engine}: owner of {}", p.display());
        }
        assert_eq!(fs::read_to_string(&bak).unwrap(), text, "{engine}: backup content");
        let left: Vec<_> = fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "{engine}: no temporary file left: {left:?}");
    }
}
