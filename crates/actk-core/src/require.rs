//! `NVIDIA_REQUIRE_*` constraints of a container image, checked against the host driver as
//! nvidia-container-toolkit checks them (internal/requirements and internal/config/image
//! `cuda_image.go`), before any device is injected.
//!
//! - Every env variable named `NVIDIA_REQUIRE_<anything>` (except `NVIDIA_REQUIRE_JETPACK`) is a
//!   requirement; all of them must hold. A legacy image (`CUDA_VERSION` set, no
//!   `NVIDIA_REQUIRE_CUDA`) requires `cuda>=MAJOR.MINOR` of its CUDA_VERSION.
//! - In one requirement, space-separated terms are OR-ed and comma-separated constraints in a
//!   term AND-ed: `cuda>=12.4 brand=tesla,driver>=470,driver<471`.
//! - A constraint is `PROPERTY OP VALUE` with OP one of `= != < <= > >=`; properties: `cuda`
//!   (CUDA driver API version the host driver supports, `13.0`), `driver` (`580.95.05`), `arch`
//!   (compute capability of each selected GPU, `9.0`), `brand` (`tesla`, `nvidia`, ...; string
//!   compare). Versions compare numerically, missing parts as 0. A constraint on another
//!   property is ignored, one without an operator or with a value that is not a version is an
//!   error (as the toolkit's parser).
//! - A property the host does not reveal (no NVML to give a GPU's brand) makes its constraint
//!   fail, so another alternative must hold.
//! - `NVIDIA_DISABLE_REQUIRE` set to a true value (Go `strconv.ParseBool`: 1, t, T, TRUE, true,
//!   True) skips every check.
//!
//! The host side ([`HostProperties`]) is filled by the planner: `driver` from
//! /proc/driver/nvidia/version, `cuda` from NVML on the running system (else from the driver
//! branch, [`cuda_of_driver`]), `arch`/`brand` per selected GPU (NVML, else `arch` from the
//! model, [`arch_of_model`]).

use crate::request::env_value;
use std::cmp::Ordering;

/// Prefix of the requirement variables.
pub const REQUIRE_PREFIX: &str = "NVIDIA_REQUIRE_";
/// The variable that turns the checks off.
pub const DISABLE_REQUIRE: &str = "NVIDIA_DISABLE_REQUIRE";

/// One requirement variable of the container: (`NVIDIA_REQUIRE_CUDA`, its value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Variable name (or `CUDA_VERSION` for a legacy image's implied requirement).
    pub variable: String,
    /// The expression.
    pub value: String,
}

/// What the host offers, for the properties of [`Requirement`]s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostProperties {
    /// Driver version (`580.95.05`).
    pub driver: Option<String>,
    /// CUDA driver API version the driver supports (`13.0`).
    pub cuda: Option<String>,
    /// Per selected GPU: compute capability (`9.0`) and brand (lowercase, `tesla`).
    pub gpus: Vec<GpuProperties>,
}

/// Properties of one selected GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuProperties {
    /// Index (nvidia-smi order), for messages.
    pub index: u32,
    /// Compute capability `MAJOR.MINOR`.
    pub arch: Option<String>,
    /// NVML brand as the toolkit spells it (`tesla`, `nvidia`, `geforce`, ...).
    pub brand: Option<String>,
}

/// A requirement that does not hold, or cannot be read. Displays as
/// `NVIDIA_REQUIRE_CUDA=cuda>=99.0: unsatisfied condition: cuda>=99.0 (cuda=13.0); ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value}: {problem}")]
pub struct RequireError {
    /// The variable.
    pub variable: String,
    /// Its value.
    pub value: String,
    /// What failed and what to do.
    pub problem: String,
}

/// The container's requirements from its env (last duplicate wins, as for every variable);
/// empty when `NVIDIA_DISABLE_REQUIRE` is true. Errors: a legacy `CUDA_VERSION` that is not a version.
pub fn requirements(env: &[String]) -> Result<Vec<Requirement>, RequireError> {
    if env_value(env, DISABLE_REQUIRE).is_some_and(parse_bool) {
        return Ok(Vec::new());
    }
    let mut names: Vec<&str> = env
        .iter()
        .filter_map(|e| e.split_once('=').map(|(n, _)| n))
        .filter(|n| n.starts_with(REQUIRE_PREFIX) && !n.starts_with("NVIDIA_REQUIRE_JETPACK"))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut out: Vec<Requirement> = names
        .into_iter()
        .filter_map(|n| env_value(env, n).map(|v| Requirement { variable: n.to_string(), value: v.to_string() }))
        .collect();
    let require_cuda = env_value(env, "NVIDIA_REQUIRE_CUDA").is_some_and(|v| !v.is_empty());
    if let Some(cv) = env_value(env, "CUDA_VERSION").filter(|v| !v.is_empty() && !require_cuda) {
        let parts: Vec<&str> = cv.trim_start_matches('v').split('.').collect();
        match (parts.first().and_then(|p| p.parse::<u64>().ok()), parts.get(1).and_then(|p| p.parse::<u64>().ok())) {
            (Some(major), Some(minor)) => {
                out.push(Requirement { variable: "CUDA_VERSION".into(), value: format!("cuda>={major}.{minor}") })
            }
            _ => {
                return Err(RequireError {
                    variable: "CUDA_VERSION".into(),
                    value: cv.into(),
                    problem: "not a CUDA version MAJOR.MINOR[.PATCH] (a legacy image's implied requirement)".into(),
                });
            }
        }
    }
    Ok(out)
}

/// Go's `strconv.ParseBool` true values.
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// The properties each constraint may name.
const PROPERTIES: &[&str] = &["cuda", "driver", "arch", "brand"];

/// Checks every requirement against `host`. The error of the first requirement that does not
/// hold names, for each of its alternatives, the condition that failed and the host's value,
/// and says how to go on.
pub fn check(reqs: &[Requirement], host: &HostProperties) -> Result<(), RequireError> {
    for r in reqs {
        let err = |problem: String| RequireError { variable: r.variable.clone(), value: r.value.clone(), problem };
        let mut failures = Vec::new();
        let mut held = false;
        let mut any_term = false;
        for term in r.value.split(' ').filter(|t| !t.trim().is_empty()) {
            let mut term_failure = None;
            let mut factors = 0;
            for factor in term.split(',').filter(|f| !f.trim().is_empty()) {
                let Some(c) = parse_constraint(factor).map_err(err)? else { continue };
                factors += 1;
                if term_failure.is_none()
                    && let Some(why) = c.failure(host)
                {
                    term_failure = Some(why);
                }
            }
            if factors == 0 {
                continue; // only unknown properties: skipped, as the toolkit does
            }
            any_term = true;
            match term_failure {
                None => {
                    held = true;
                    break;
                }
                Some(f) => failures.push(f),
            }
        }
        if any_term && !held {
            let what = if failures.len() == 1 { "unsatisfied condition" } else { "no alternative holds" };
            return Err(err(format!(
                "{what}: {}; update the driver, use an image for this driver, or set {DISABLE_REQUIRE}=true to start anyway",
                failures.join("; ")
            )));
        }
    }
    Ok(())
}

/// One `PROPERTY OP VALUE`.
struct Constraint<'a> {
    property: &'a str,
    op: &'a str,
    value: &'a str,
}

/// Parses a constraint; `Ok(None)` for a property this checker does not know (ignored).
fn parse_constraint(s: &str) -> Result<Option<Constraint<'_>>, String> {
    let s = s.trim();
    let Some(end) = s.find(['<', '>', '=', '!']) else {
        return Err(format!("invalid constraint {s:?}: expected PROPERTY OP VALUE such as cuda>=12.4"));
    };
    let (property, rest) = s.split_at(end);
    if !PROPERTIES.contains(&property) {
        return Ok(None);
    }
    let op = ["!=", "<=", ">=", "=", "<", ">"].into_iter().find(|o| rest.starts_with(o)).unwrap_or("");
    let value = &rest[op.len()..];
    if op.is_empty() || (op == "=" && value.starts_with('=')) {
        return Err(format!("invalid constraint {s:?}: the operator must be one of =, !=, <, <=, >, >="));
    }
    if property != "brand" && parse_version(value).is_none() {
        return Err(format!("invalid constraint {s:?}: {value:?} is not a version"));
    }
    Ok(Some(Constraint { property, op, value }))
}

impl Constraint<'_> {
    /// Why this constraint does not hold on `host` (`None` when it holds). `arch` and `brand`
    /// must hold for every selected GPU.
    fn failure(&self, host: &HostProperties) -> Option<String> {
        let shown = format!("{}{}{}", self.property, self.op, self.value);
        let test = |have: Option<&str>| -> Result<(), String> {
            let Some(have) = have else { return Err("unknown".into()) };
            let ord = if self.property == "brand" {
                have.cmp(self.value)
            } else {
                match (parse_version(have), parse_version(self.value)) {
                    (Some(a), Some(b)) => cmp_versions(&a, &b),
                    _ => return Err(format!("{have} (not a version)")),
                }
            };
            let ok = match self.op {
                "=" => ord == Ordering::Equal,
                "!=" => ord != Ordering::Equal,
                "<" => ord == Ordering::Less,
                "<=" => ord != Ordering::Greater,
                ">" => ord == Ordering::Greater,
                _ => ord != Ordering::Less,
            };
            if ok { Ok(()) } else { Err(have.to_string()) }
        };
        match self.property {
            "cuda" | "driver" => {
                let have = if self.property == "cuda" { host.cuda.as_deref() } else { host.driver.as_deref() };
                test(have).err().map(|v| format!("{shown} ({}={v})", self.property))
            }
            _ => {
                if host.gpus.is_empty() {
                    return Some(format!("{shown} (no GPU selected)"));
                }
                host.gpus.iter().find_map(|g| {
                    let have = if self.property == "arch" { g.arch.as_deref() } else { g.brand.as_deref() };
                    test(have).err().map(|v| format!("{shown} (GPU {} {}={v})", g.index, self.property))
                })
            }
        }
    }
}

/// `12.4` -> [12, 4]; a leading `v` is allowed. `None` when not numeric dot-separated.
fn parse_version(v: &str) -> Option<Vec<u64>> {
    let v = v.trim().trim_start_matches('v');
    if v.is_empty() {
        return None;
    }
    v.split('.').map(|p| p.parse::<u64>().ok()).collect()
}

fn cmp_versions(a: &[u64], b: &[u64]) -> Ordering {
    let n = a.len().max(b.len());
    (0..n).map(|i| a.get(i).unwrap_or(&0).cmp(b.get(i).unwrap_or(&0))).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
}

/// The CUDA driver API version a driver branch supports (what cuDriverGetVersion and the
/// nvidia-smi header report), by the driver's major version. Source: CUDA Toolkit release notes,
/// "CUDA Toolkit and Corresponding Driver Versions", and the nvidia-smi header of each branch
/// (565 reports 12.7, a version without a toolkit of its own). `None` for a branch not listed
/// (older than 410, or newer than this table): then only NVML can tell.
pub fn cuda_of_driver(driver: &str) -> Option<&'static str> {
    const BRANCHES: &[(u64, &str)] = &[
        (580, "13.0"),
        (575, "12.9"),
        (570, "12.8"),
        (565, "12.7"),
        (560, "12.6"),
        (555, "12.5"),
        (550, "12.4"),
        (545, "12.3"),
        (535, "12.2"),
        (530, "12.1"),
        (525, "12.0"),
        (520, "11.8"),
        (515, "11.7"),
        (510, "11.6"),
        (495, "11.5"),
        (470, "11.4"),
        (465, "11.3"),
        (460, "11.2"),
        (455, "11.1"),
        (450, "11.0"),
        (440, "10.2"),
        (418, "10.1"),
        (410, "10.0"),
    ];
    let major: u64 = driver.split('.').next()?.parse().ok()?;
    if major > BRANCHES[0].0 + 4 {
        return None; // a branch newer than the table: its CUDA version is not known here
    }
    BRANCHES.iter().find(|(b, _)| major >= *b).map(|(_, c)| *c)
}

/// Compute capability of a GPU model as /proc/driver/nvidia names it, for data-center GPUs
/// (NVIDIA "CUDA GPUs - Compute Capability", developer.nvidia.com/cuda-gpus). `None` for a
/// model not listed: then only NVML can tell.
pub fn arch_of_model(model: &str) -> Option<&'static str> {
    const MODELS: &[(&str, &str)] = &[
        ("GB300", "10.3"),
        ("B300", "10.3"),
        ("GB200", "10.0"),
        ("B200", "10.0"),
        ("GH200", "9.0"),
        ("H200", "9.0"),
        ("H100", "9.0"),
        ("H800", "9.0"),
        ("L40S", "8.9"),
        ("L40", "8.9"),
        ("L4", "8.9"),
        ("A100", "8.0"),
        ("A800", "8.0"),
        ("A30", "8.0"),
        ("A40", "8.6"),
        ("A10", "8.6"),
        ("T4", "7.5"),
        ("V100", "7.0"),
    ];
    let words: Vec<&str> = model.split(|c: char| c.is_whitespace() || c == '-').collect();
    MODELS.iter().find(|(m, _)| words.iter().any(|w| w.eq_ignore_ascii_case(m))).map(|(_, a)| *a)
}

/// The brand as the toolkit spells it in constraints (internal/requirements
/// `brandTypeToRequirementString`); `None` for Unknown.
fn brand_name(b: nvml_wrapper::enum_wrappers::device::Brand) -> Option<&'static str> {
    use nvml_wrapper::enum_wrappers::device::Brand as B;
    Some(match b {
        B::Unknown => return None,
        B::Quadro => "quadro",
        B::Tesla => "tesla",
        B::NVS => "nvs",
        B::GRID => "grid",
        B::GeForce => "geforce",
        B::Titan => "titan",
        B::VApps => "nvidiavapps",
        B::VPC => "nvidiavpc",
        B::VCS => "nvidiavcs",
        B::VWS => "nvidiavws",
        B::CloudGaming | B::VGaming => "nvidiacloudgaming",
        B::QuadroRTX => "quadrortx",
        B::NvidiaRTX => "nvidiartx",
        B::Nvidia => "nvidia",
        B::GeForceRTX => "geforcertx",
        B::TitanRTX => "titanrtx",
    })
}

/// Per GPU: (compute capability, brand), either unknown.
pub type NvmlGpu = (Option<String>, Option<String>);

/// What NVML (the running system's libnvidia-ml, dlopened) says: the CUDA driver version, and
/// per GPU UUID its compute capability and brand. `None` when NVML does not load.
pub fn from_nvml(uuids: &[&str]) -> Option<(Option<String>, Vec<NvmlGpu>)> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| tracing::debug!("NVML not available: {e}")).ok()?;
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
        format!("{}.{}", nvml_wrapper::cuda_driver_version_major(v), nvml_wrapper::cuda_driver_version_minor(v))
    });
    let gpus = uuids
        .iter()
        .map(|u| match nvml.device_by_uuid(*u) {
            Ok(d) => (
                d.cuda_compute_capability().ok().map(|c| format!("{}.{}", c.major, c.minor)),
                d.brand().ok().and_then(brand_name).map(str::to_string),
            ),
            Err(_) => (None, None),
        })
        .collect();
    Some((cuda, gpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn dgx() -> HostProperties {
        HostProperties {
            driver: Some("580.95.05".into()),
            cuda: Some("13.0".into()),
            gpus: vec![GpuProperties { index: 0, arch: Some("9.0".into()), brand: None }],
        }
    }

    fn run(e: &[&str], host: &HostProperties) -> Result<(), String> {
        let r = requirements(&env(e)).map_err(|e| e.to_string())?;
        check(&r, host).map_err(|e| e.to_string())
    }

    /// Issue 13 item 6: an image requiring a CUDA newer than the driver's is refused with the
    /// condition and the host's value; what CUDA images carry holds on the DGX's 580 driver.
    #[test]
    fn item6_nvidia_require_cuda_is_checked_against_the_host_driver() {
        let e = run(&["NVIDIA_REQUIRE_CUDA=cuda>=99.0"], &dgx()).unwrap_err();
        assert_eq!(
            e,
            "NVIDIA_REQUIRE_CUDA=cuda>=99.0: unsatisfied condition: cuda>=99.0 (cuda=13.0); update the driver, use an image for this driver, or set NVIDIA_DISABLE_REQUIRE=true to start anyway"
        );
        // nvidia/cuda:12.4.1-base-ubuntu22.04's value (first alternative holds).
        let cuda124 = "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471";
        assert_eq!(run(&[cuda124], &dgx()), Ok(()));
        // On a 470 host without NVML (brand unknown) none holds: each alternative says why.
        let old = HostProperties { driver: Some("470.256.02".into()), cuda: Some("11.4".into()), ..dgx() };
        let e = run(&[cuda124], &old).unwrap_err();
        assert!(e.contains("no alternative holds: cuda>=12.4 (cuda=11.4); brand=tesla (GPU 0 brand=unknown)"), "{e}");
        let tesla =
            HostProperties { gpus: vec![GpuProperties { index: 0, brand: Some("tesla".into()), arch: None }], ..old };
        assert_eq!(run(&[cuda124], &tesla), Ok(()), "forward compatibility alternative for Tesla on 470");
    }

    #[test]
    fn item6_driver_arch_brand_and_and_or_and_every_variable() {
        assert_eq!(run(&["NVIDIA_REQUIRE_DRIVER=driver>=580.65.06,driver<581"], &dgx()), Ok(()));
        let e = run(&["NVIDIA_REQUIRE_ARCH=arch>=10.0"], &dgx()).unwrap_err();
        assert!(e.contains("arch>=10.0 (GPU 0 arch=9.0)"), "{e}");
        // Every NVIDIA_REQUIRE_* must hold.
        let e = run(&["NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_X=driver<500"], &dgx()).unwrap_err();
        assert!(
            e.starts_with("NVIDIA_REQUIRE_X=driver<500: unsatisfied condition: driver<500 (driver=580.95.05)"),
            "{e}"
        );
        // Unknown properties are skipped; JETPACK is not a host requirement.
        assert_eq!(run(&["NVIDIA_REQUIRE_OS=os>=22.04", "NVIDIA_REQUIRE_JETPACK=jetpack>=6"], &dgx()), Ok(()));
        // Syntax errors are named.
        let e = run(&["NVIDIA_REQUIRE_CUDA=cuda12"], &dgx()).unwrap_err();
        assert!(e.contains("invalid constraint \"cuda12\""), "{e}");
        let e = run(&["NVIDIA_REQUIRE_CUDA=cuda>=twelve"], &dgx()).unwrap_err();
        assert!(e.contains("\"twelve\" is not a version"), "{e}");
    }

    #[test]
    fn item6_nvidia_disable_require_and_legacy_cuda_version() {
        assert_eq!(run(&["NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=true"], &dgx()), Ok(()));
        assert_eq!(run(&["NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=1"], &dgx()), Ok(()));
        assert!(run(&["NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=yes"], &dgx()).is_err(), "ParseBool");
        // A legacy image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) requires its own CUDA.
        let e = run(&["CUDA_VERSION=13.1.0"], &dgx()).unwrap_err();
        assert!(e.starts_with("CUDA_VERSION=cuda>=13.1: unsatisfied condition: cuda>=13.1 (cuda=13.0)"), "{e}");
        assert_eq!(run(&["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"], &dgx()), Ok(()));
    }

    #[test]
    fn cuda_and_arch_tables() {
        assert_eq!(cuda_of_driver("580.95.05"), Some("13.0"));
        assert_eq!(cuda_of_driver("565.57.01"), Some("12.7"));
        assert_eq!(cuda_of_driver("535.104.05"), Some("12.2"));
        assert_eq!(cuda_of_driver("470.256.02"), Some("11.4"));
        assert_eq!(cuda_of_driver("999.1"), None);
        assert_eq!(cuda_of_driver("390.1"), None);
        assert_eq!(arch_of_model("NVIDIA H100 80GB HBM3"), Some("9.0"));
        assert_eq!(arch_of_model("NVIDIA GH200 480GB"), Some("9.0"));
        assert_eq!(arch_of_model("NVIDIA A100-SXM4-80GB"), Some("8.0"));
        assert_eq!(arch_of_model("Tesla T4"), Some("7.5"));
        assert_eq!(arch_of_model("NVIDIA Quadro X"), None);
    }
}
