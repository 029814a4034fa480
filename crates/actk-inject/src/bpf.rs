//! cgroup v2 device control: an eBPF `BPF_PROG_TYPE_CGROUP_DEVICE` program built from device
//! rules, and its attachment in place of the runtime's program.
//!
//! Program shape (own small emitter; the context is `struct bpf_cgroup_dev_ctx { u32
//! access_type; u32 major; u32 minor; }` of linux/bpf.h, access_type = access << 16 | type):
//! load type, access, major, minor into r2..r5; then one block per rule, **last rule first**
//! (OCI semantics: later rules override earlier ones), each "if every given field matches and
//! the requested access is a subset of the rule's: return allow(1)/deny(0)"; finally return 0
//! (omitted when a rule without conditions ends the program: the verifier rejects dead code).
//!
//! Attaching: the kernel ANDs all programs attached with `BPF_F_ALLOW_MULTI`, so adding an allow
//! program next to runc's cannot grant anything. [`replace_program`] therefore loads a program
//! made of the container's own rules plus actk's (a superset), attaches it, then detaches every
//! program that was there before.
//!
//! This development host has hybrid cgroups (the v1 devices controller governs containers), so
//! the v2 path is not reached by runc here; it is unit-tested on the instruction sequence and a
//! test loads, attaches and replaces programs on a cgroup of the unified mount (device programs
//! apply there even on a hybrid host) and checks that access really changes.

// Raw syscalls with no safe wrapper in rustix: each unsafe block says what it relies on.
#![allow(unsafe_code)]

use rustix::fd::{AsRawFd, OwnedFd};

/// One device cgroup rule (OCI `LinuxDeviceCgroup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRule {
    /// Allow (true) or deny.
    pub allow: bool,
    /// `'a'` (all), `'c'` or `'b'`.
    pub kind: char,
    /// Major number; `None` = any.
    pub major: Option<u32>,
    /// Minor number; `None` = any.
    pub minor: Option<u32>,
    /// Any of `rwm`.
    pub access: String,
}

impl DeviceRule {
    /// An allow rule for one node.
    pub fn allow_node(kind: char, major: u32, minor: u32, access: &str) -> DeviceRule {
        DeviceRule { allow: true, kind, major: Some(major), minor: Some(minor), access: access.to_string() }
    }

    /// The cgroup v1 `devices.allow`/`devices.deny` line: `c 195:0 rwm`, `*` for any number.
    pub fn v1_line(&self) -> String {
        let n = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_else(|| "*".into());
        format!("{} {}:{} {}", self.kind, n(self.major), n(self.minor), self.access)
    }

    /// Parses an OCI `linux.resources.devices[]` entry (`allow`, `type`, `major`, `minor`,
    /// `access`); a missing type means `a`, missing numbers mean any, missing access `rwm`.
    pub fn from_oci(v: &serde_json::Value) -> Option<DeviceRule> {
        let allow = v.get("allow")?.as_bool()?;
        let kind = v.get("type").and_then(|t| t.as_str()).and_then(|t| t.chars().next()).unwrap_or('a');
        let num = |k: &str| v.get(k).and_then(|x| x.as_i64()).filter(|x| *x >= 0).map(|x| x as u32);
        let access = v.get("access").and_then(|a| a.as_str()).unwrap_or("rwm").to_string();
        Some(DeviceRule { allow, kind, major: num("major"), minor: num("minor"), access })
    }
}

/// The device rules runc appends after the spec's own (`AllowedDevices` in runc's specconv,
/// 1.1): mknod of any node; /dev/null, zero, full, random, urandom, tty, console, ptmx, pts/*,
/// net/tun. A replacement program must keep them or the container loses /dev/null.
pub fn runtime_default_rules() -> Vec<DeviceRule> {
    let any = |kind: char| DeviceRule { allow: true, kind, major: None, minor: None, access: "m".into() };
    let mut v = vec![any('c'), any('b')];
    for (ma, mi) in [(1, 3), (1, 8), (1, 7), (5, 0), (1, 5), (1, 9), (5, 1), (5, 2), (10, 200)] {
        v.push(DeviceRule::allow_node('c', ma, mi, "rwm"));
    }
    v.push(DeviceRule { allow: true, kind: 'c', major: Some(136), minor: None, access: "rwm".into() });
    v
}

/// One eBPF instruction (`struct bpf_insn`, 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u8,
    /// dst_reg (low 4 bits) | src_reg << 4.
    pub regs: u8,
    /// Jump offset.
    pub off: i16,
    /// Immediate.
    pub imm: i32,
}

const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const AND32_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const RSH32_K: u8 = 0x74; // BPF_ALU | BPF_RSH | BPF_K
const MOV32_X: u8 = 0xbc; // BPF_ALU | BPF_MOV | BPF_X
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

const fn ins(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst | (src << 4), off, imm }
}

fn type_code(kind: char) -> Option<i32> {
    match kind {
        'b' => Some(1), // BPF_DEVCG_DEV_BLOCK
        'c' => Some(2), // BPF_DEVCG_DEV_CHAR
        _ => None,
    }
}

fn access_bits(access: &str) -> i32 {
    // BPF_DEVCG_ACC_MKNOD = 1, READ = 2, WRITE = 4
    access
        .chars()
        .map(|c| match c {
            'm' => 1,
            'r' => 2,
            'w' => 4,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

/// Builds the program for `rules` (in OCI order; the last matching rule decides).
pub fn program(rules: &[DeviceRule]) -> Vec<Insn> {
    let mut p = vec![
        ins(LDX_W, 2, 1, 0, 0),
        ins(AND32_K, 2, 0, 0, 0xffff),
        ins(LDX_W, 3, 1, 0, 0),
        ins(RSH32_K, 3, 0, 0, 16),
        ins(LDX_W, 4, 1, 4, 0),
        ins(LDX_W, 5, 1, 8, 0),
    ];
    for r in rules.iter().rev() {
        let mut checks: Vec<Vec<Insn>> = Vec::new();
        if let Some(t) = type_code(r.kind) {
            checks.push(vec![ins(JNE_K, 2, 0, 0, t)]);
        }
        let acc = access_bits(&r.access);
        if acc != 7 {
            checks.push(vec![ins(MOV32_X, 1, 3, 0, 0), ins(AND32_K, 1, 0, 0, !acc & 7), ins(JNE_K, 1, 0, 0, 0)]);
        }
        if let Some(m) = r.major {
            checks.push(vec![ins(JNE_K, 4, 0, 0, m as i32)]);
        }
        if let Some(m) = r.minor {
            checks.push(vec![ins(JNE_K, 5, 0, 0, m as i32)]);
        }
        let unconditional = checks.is_empty();
        let mut block: Vec<Insn> = checks.into_iter().flatten().collect();
        block.push(ins(MOV64_K, 0, 0, 0, r.allow as i32));
        block.push(ins(EXIT, 0, 0, 0, 0));
        let n = block.len();
        // Every conditional jump skips to the end of this block.
        for (i, insn) in block.iter_mut().enumerate() {
            if insn.code == JNE_K {
                insn.off = (n - i - 1) as i16;
            }
        }
        p.extend(block);
        if unconditional {
            // This rule matches everything: nothing after it is reachable (and the verifier
            // rejects unreachable instructions).
            return p;
        }
    }
    p.push(ins(MOV64_K, 0, 0, 0, 0));
    p.push(ins(EXIT, 0, 0, 0, 0));
    p
}

/// Evaluates a program the way the kernel would for one access (for tests and for
/// double-checking a program before it replaces the runtime's).
pub fn evaluate(prog: &[Insn], kind: char, major: u32, minor: u32, access: &str) -> bool {
    let mut r = [0u64; 11];
    let ctx = [((access_bits(access) as u32) << 16) | type_code(kind).unwrap_or(0) as u32, major, minor];
    let mut pc = 0usize;
    while pc < prog.len() {
        let i = prog[pc];
        let (d, s) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        match i.code {
            LDX_W => r[d] = ctx[(i.off / 4) as usize] as u64,
            AND32_K => r[d] = (r[d] as u32 & i.imm as u32) as u64,
            RSH32_K => r[d] = ((r[d] as u32) >> i.imm) as u64,
            MOV32_X => r[d] = r[s] as u32 as u64,
            MOV64_K => r[d] = i.imm as i64 as u64,
            JNE_K if r[d] != i.imm as i64 as u64 => pc += i.off as usize,
            JNE_K => {}
            EXIT => return r[0] == 1,
            _ => return false,
        }
        pc += 1;
    }
    false
}

const BPF_PROG_LOAD: i32 = 5;
const BPF_PROG_ATTACH: i32 = 8;
const BPF_PROG_DETACH: i32 = 9;
const BPF_PROG_GET_FD_BY_ID: i32 = 13;
const BPF_PROG_QUERY: i32 = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

fn bpf(cmd: i32, attr: &mut [u8; 128]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-filled union bpf_attr large enough for every command used here.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(rc) }
}

fn put32(a: &mut [u8; 128], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put64(a: &mut [u8; 128], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn own(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this new fd to us.
    unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd as i32) }
}

/// Loads `program(rules)`, attaches it to the cgroup2 directory `dir` with
/// `BPF_F_ALLOW_MULTI`, and detaches every device program that was attached there before.
///
/// Errors: a message naming the directory and the bpf(2) command that failed.
pub fn replace_program(dir: &std::path::Path, rules: &[DeviceRule]) -> Result<(), String> {
    let insns = program(rules);
    let mut raw = Vec::with_capacity(insns.len() * 8);
    for i in &insns {
        raw.push(i.code);
        raw.push(i.regs);
        raw.extend_from_slice(&i.off.to_ne_bytes());
        raw.extend_from_slice(&i.imm.to_ne_bytes());
    }
    let license = c"Apache-2.0";
    let mut a = [0u8; 128];
    put32(&mut a, 0, BPF_PROG_TYPE_CGROUP_DEVICE);
    put32(&mut a, 4, insns.len() as u32);
    put64(&mut a, 8, raw.as_ptr() as u64);
    put64(&mut a, 16, license.as_ptr() as u64);
    let prog = match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => own(fd),
        Err(e) => {
            // Load again with the verifier log, so the error says why.
            let mut log = vec![0u8; 1 << 16];
            put32(&mut a, 24, 1);
            put32(&mut a, 28, log.len() as u32);
            put64(&mut a, 32, log.as_mut_ptr() as u64);
            let _ = bpf(BPF_PROG_LOAD, &mut a);
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(6).collect();
            return Err(format!(
                "bpf(BPF_PROG_LOAD) of the device program: {e}; verifier: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
    };
    let cg = rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("open cgroup {}: {e}", dir.display()))?;
    // Programs attached before ours (the runtime's).
    let mut ids = [0u32; 64];
    let mut a = [0u8; 128];
    put32(&mut a, 0, cg.as_raw_fd() as u32);
    put32(&mut a, 4, BPF_CGROUP_DEVICE);
    put64(&mut a, 16, ids.as_mut_ptr() as u64);
    put32(&mut a, 24, ids.len() as u32);
    bpf(BPF_PROG_QUERY, &mut a).map_err(|e| format!("bpf(BPF_PROG_QUERY) on {}: {e}", dir.display()))?;
    let count = u32::from_ne_bytes([a[24], a[25], a[26], a[27]]) as usize;
    let old: Vec<u32> = ids[..count.min(ids.len())].to_vec();
    let mut a = [0u8; 128];
    put32(&mut a, 0, cg.as_raw_fd() as u32);
    put32(&mut a, 4, prog.as_raw_fd() as u32);
    put32(&mut a, 8, BPF_CGROUP_DEVICE);
    put32(&mut a, 12, BPF_F_ALLOW_MULTI);
    bpf(BPF_PROG_ATTACH, &mut a).map_err(|e| format!("bpf(BPF_PROG_ATTACH) to {}: {e}", dir.display()))?;
    for id in old {
        let mut a = [0u8; 128];
        put32(&mut a, 0, id);
        let Ok(fd) = bpf(BPF_PROG_GET_FD_BY_ID, &mut a) else { continue };
        let fd = own(fd);
        let mut a = [0u8; 128];
        put32(&mut a, 0, cg.as_raw_fd() as u32);
        put32(&mut a, 4, fd.as_raw_fd() as u32);
        put32(&mut a, 8, BPF_CGROUP_DEVICE);
        bpf(BPF_PROG_DETACH, &mut a)
            .map_err(|e| format!("bpf(BPF_PROG_DETACH) of program {id} from {}: {e}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runc_defaults() -> Vec<DeviceRule> {
        // runc's default: deny all, then allow the standard nodes (null, zero, full, random, urandom, tty, ptmx, pts).
        let mut v = vec![DeviceRule { allow: false, kind: 'a', major: None, minor: None, access: "rwm".into() }];
        for (ma, mi) in [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)] {
            v.push(DeviceRule::allow_node('c', ma, mi, "rwm"));
        }
        v.push(DeviceRule { allow: true, kind: 'c', major: Some(136), minor: None, access: "rwm".into() });
        v
    }

    #[test]
    fn single_rule_instruction_sequence() {
        let p = program(&[DeviceRule::allow_node('c', 195, 0, "rw")]);
        let expect = vec![
            ins(LDX_W, 2, 1, 0, 0),
            ins(AND32_K, 2, 0, 0, 0xffff),
            ins(LDX_W, 3, 1, 0, 0),
            ins(RSH32_K, 3, 0, 0, 16),
            ins(LDX_W, 4, 1, 4, 0),
            ins(LDX_W, 5, 1, 8, 0),
            ins(JNE_K, 2, 0, 7, 2),
            ins(MOV32_X, 1, 3, 0, 0),
            ins(AND32_K, 1, 0, 0, 1),
            ins(JNE_K, 1, 0, 4, 0),
            ins(JNE_K, 4, 0, 3, 195),
            ins(JNE_K, 5, 0, 2, 0),
            ins(MOV64_K, 0, 0, 0, 1),
            ins(EXIT, 0, 0, 0, 0),
            ins(MOV64_K, 0, 0, 0, 0),
            ins(EXIT, 0, 0, 0, 0),
        ];
        assert_eq!(p, expect);
    }

    #[test]
    fn wildcard_rule_has_no_checks() {
        let p = program(&[DeviceRule { allow: false, kind: 'a', major: None, minor: None, access: "rwm".into() }]);
        // Matches everything, so it ends the program: no unreachable default after it.
        assert_eq!(&p[6..], &[ins(MOV64_K, 0, 0, 0, 0), ins(EXIT, 0, 0, 0, 0)]);
    }

    #[test]
    fn superset_keeps_runtime_rules_and_adds_ours() {
        let mut rules = runc_defaults();
        let before = program(&rules);
        assert!(evaluate(&before, 'c', 1, 3, "rw"));
        assert!(!evaluate(&before, 'c', 195, 0, "rw"));
        rules.push(DeviceRule::allow_node('c', 195, 0, "rwm"));
        rules.push(DeviceRule::allow_node('c', 195, 255, "rw"));
        let after = program(&rules);
        for (k, ma, mi, acc) in
            [('c', 1, 3, "rwm"), ('c', 5, 2, "rw"), ('c', 136, 4, "rw"), ('c', 195, 0, "rwm"), ('c', 195, 255, "rw")]
        {
            assert!(evaluate(&after, k, ma, mi, acc), "{k} {ma}:{mi} {acc} should be allowed");
        }
        // Not granted: another minor, mknod on a rw-only rule, a block device with the same numbers.
        assert!(!evaluate(&after, 'c', 195, 1, "r"));
        assert!(!evaluate(&after, 'c', 195, 255, "m"));
        assert!(!evaluate(&after, 'b', 195, 0, "r"));
    }

    #[test]
    fn later_deny_overrides_earlier_allow() {
        let rules = vec![
            DeviceRule::allow_node('c', 10, 200, "rwm"),
            DeviceRule { allow: false, kind: 'c', major: Some(10), minor: Some(200), access: "rwm".into() },
        ];
        assert!(!evaluate(&program(&rules), 'c', 10, 200, "r"));
    }

    #[test]
    fn from_oci_reads_runtime_spec_rules() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"allow":true,"type":"c","major":195,"access":"rw"}"#).unwrap();
        assert_eq!(
            DeviceRule::from_oci(&v).unwrap(),
            DeviceRule { allow: true, kind: 'c', major: Some(195), minor: None, access: "rw".into() }
        );
        assert_eq!(DeviceRule::from_oci(&v).unwrap().v1_line(), "c 195:* rw");
    }

    /// Runs `sh` inside the cgroup2 directory `cg` and reads one byte from `dev`.
    fn read_in_cgroup(cg: &std::path::Path, dev: &str) -> std::process::Output {
        let script = format!("echo $$ > {}/cgroup.procs && head -c 1 {dev} | wc -c", cg.display());
        std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .output()
            .unwrap()
    }

    #[test]
    fn replace_program_on_a_real_cgroup2_directory() {
        // Hybrid hosts (this one) still run cgroup2 device programs for the unified hierarchy.
        let unified = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"].iter().map(std::path::Path::new).find(|p| {
            p.join("cgroup.procs").exists()
                && rustix::fs::statfs(*p).map(|s| s.f_type as u64 == 0x6367_7270).unwrap_or(false)
        });
        let Some(unified) = unified else {
            eprintln!("skipping: no cgroup2 mount");
            return;
        };
        let cg = unified.join(format!("actk-bpf-test-{}", std::process::id()));
        if std::fs::create_dir(&cg).is_err() {
            eprintln!("skipping: cannot create a cgroup under {} (not root?)", unified.display());
            return;
        }
        // The "runtime's" program: runc-like defaults, /dev/zero (1:5) not allowed... except it is in
        // runc's list, so take it out to have something to grant.
        let base: Vec<DeviceRule> = runc_defaults().into_iter().filter(|r| r.minor != Some(5)).collect();
        let r1 = replace_program(&cg, &base);
        let denied = read_in_cgroup(&cg, "/dev/zero");
        let mut more = base.clone();
        more.push(DeviceRule::allow_node('c', 1, 5, "rwm"));
        let r2 = replace_program(&cg, &more);
        let allowed = read_in_cgroup(&cg, "/dev/zero");
        // Count the programs left attached: the replacement must have detached the first.
        let cgfd = rustix::fs::open(
            &cg,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let mut ids = [0u32; 8];
        let mut a = [0u8; 128];
        put32(&mut a, 0, cgfd.as_raw_fd() as u32);
        put32(&mut a, 4, BPF_CGROUP_DEVICE);
        put64(&mut a, 16, ids.as_mut_ptr() as u64);
        put32(&mut a, 24, ids.len() as u32);
        let q = bpf(BPF_PROG_QUERY, &mut a);
        let count = u32::from_ne_bytes([a[24], a[25], a[26], a[27]]);
        let _ = std::fs::remove_dir(&cg);
        r1.unwrap();
        r2.unwrap();
        q.unwrap();
        assert!(
            !denied.status.success() || String::from_utf8_lossy(&denied.stdout).trim() == "0",
            "/dev/zero readable before the rule: {denied:?}"
        );
        assert!(String::from_utf8_lossy(&denied.stderr).contains("ermitted"), "{denied:?}");
        assert_eq!(String::from_utf8_lossy(&allowed.stdout).trim(), "1", "{allowed:?}");
        assert_eq!(count, 1, "old device programs left attached");
    }

    #[test]
    fn runtime_defaults_keep_dev_null_after_a_deny_all_spec() {
        let mut rules = vec![DeviceRule { allow: false, kind: 'a', major: None, minor: None, access: "rwm".into() }];
        rules.extend(runtime_default_rules());
        rules.push(DeviceRule::allow_node('c', 195, 0, "rwm"));
        let p = program(&rules);
        assert!(evaluate(&p, 'c', 1, 3, "rw") && evaluate(&p, 'c', 136, 2, "rw") && evaluate(&p, 'b', 8, 0, "m"));
        assert!(evaluate(&p, 'c', 195, 0, "rw"));
        assert!(!evaluate(&p, 'b', 8, 0, "r") && !evaluate(&p, 'c', 195, 1, "r"));
    }
}
