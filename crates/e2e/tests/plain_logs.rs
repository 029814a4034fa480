//! Logs written to a pipe (a pod's log as `kubectl logs` shows it, a CI log) are plain text: no
//! ANSI colour escapes from any actk binary that logs through tracing (issue 28 item 6). Each
//! binary is run so that it logs a line and stopped once the line is seen.

use actk_testsupport::engines::bin;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` with stdout and stderr on one pipe until `want` shows up (at most 10 s), kills it,
/// and returns what it wrote.
fn output_until(mut cmd: Command, want: &str) -> String {
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    let mut child =
        cmd.stdin(Stdio::null()).stdout(writer.try_clone().expect("dup")).stderr(writer).spawn().expect("spawn");
    drop(cmd);
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    while t.elapsed() < Duration::from_secs(10) && !String::from_utf8_lossy(&out).contains(want) {
        if let Ok(chunk) = rx.recv_timeout(Duration::from_millis(100)) {
            out.extend(chunk);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert!(text.contains(want), "{want:?} not logged within 10 s:\n{text}");
    text
}

#[test]
fn logs_to_a_pipe_carry_no_colour_escapes() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("root");
    std::fs::create_dir_all(&empty).unwrap();
    let mut dp = Command::new(bin("actk-device-plugin"));
    dp.arg("--root").arg(&empty).arg("--socket-dir").arg(tmp.path().join("dp"));
    dp.arg("--pod-resources-socket").arg(tmp.path().join("none.sock"));
    let mut nri = Command::new(bin("actk-nri"));
    std::fs::write(
        tmp.path().join("nri.toml"),
        format!("log_level = \"debug\"\nroot = {:?}\n", empty.display().to_string()),
    )
    .unwrap();
    nri.arg("--socket").arg(tmp.path().join("nri.sock")).env("ACTK_CONFIG", tmp.path().join("nri.toml"));
    // A root whose device nodes are missing: discovery warns for each device.
    let fixture = actk_testsupport::fixture::fixtures_dir().join("amd-mi300x/root");
    let mut actk = Command::new(bin("actk"));
    actk.args(["cdi", "generate", "--root"]).arg(&fixture).arg("--output").arg(tmp.path().join("cdi"));
    for (name, cmd, want) in [
        ("actk-device-plugin", dp, "no accelerators found"),
        ("actk-nri", nri, "cannot connect to"),
        ("actk", actk, "no usable device node"),
    ] {
        let text = output_until(cmd, want);
        assert!(!text.contains('\u{1b}'), "{name} wrote an escape sequence to a pipe:\n{text:?}");
        assert!(text.contains(" WARN ") || text.contains(" DEBUG "), "{name}: a plain level tag:\n{text}");
    }
}
