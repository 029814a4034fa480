//! The node's trust policy: who may ask for devices (DESIGN.md "Who may ask").
//!
//! A container's requests come from inputs with different owners:
//! - selection variables in `process.env` (`NVIDIA_VISIBLE_DEVICES`, ...): the image's `ENV`, the
//!   pod author, `docker run -e` / `--gpus`, or the device plugin's `envvar` strategy, which the
//!   runtime cannot tell apart;
//! - `cdi.k8s.io/*` annotations: the pod author, or the device plugin's `cdi-annotations` strategy;
//! - the device list: bind mounts of `/dev/null` at `DEVICE_LIST_DIR/<vendor>/<class>/<device>`
//!   (`/var/run/actk/devices/nvidia.com/gpu/0`), which the kubelet adds for the device plugin's
//!   `volume-mounts` strategy. No image can add a mount, and a pod can only forge one with a
//!   `hostPath` volume of `/dev/null` (which already gives it the node's files).
//!
//! Each of the three is trusted `always`, only for `privileged` containers ([`PrivilegedMeans`]
//! says which: CAP_SYS_ADMIN in the bounding set of `process.capabilities` by default; on a
//! Kubernetes node also a device cgroup that allows every device, which only `privileged: true`
//! gets), or `never`. A request from an input the policy does not
//! trust is refused: the container fails with a message naming the policy key
//! ([`OnRefused::Fail`]), or the request is dropped with a warning naming it ([`OnRefused::Warn`],
//! what a Kubernetes node wants: CUDA images carry `ENV NVIDIA_VISIBLE_DEVICES=all`).
//!
//! An input is a request wherever it adds a device node, whatever else it does: a selection
//! variable, a CDI name, `NVIDIA_MIG_CONFIG_DEVICES`, and a driver capability that adds nodes
//! (the `fabric` capability's NVSwitch nodes; [`crate::profile::Profile::node_capabilities`])
//! are env requests. Capabilities that only add files (libraries, binaries) are not requests:
//! they choose the driver files of the devices a trusted input granted.
//!
//! The defaults ([`Policy::default`]) trust everything, as on docker and podman hosts, where the
//! user who runs the container is the authority. The Kubernetes node setup sets
//! `env_requests` and `annotation_requests` to `privileged`, `on_refused` to `warn` and
//! `privileged_means` to `privileged-flag`, and the device plugin answers Allocate with the
//! device list.
//!
//! The policy lives in [`crate::plan::PlanContext`], so every injection path (actk-runtime,
//! actk-hook, an NRI plugin, a DRA driver) applies the same rules through [`crate::plan::plan`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Directory of the device list inside a container (a fixed path: the device plugin's
/// `volume-mounts` strategy mounts `/dev/null` at `<this>/<vendor>/<class>/<device>`).
pub const DEVICE_LIST_DIR: &str = "/var/run/actk/devices";

/// The only mount source a device list entry may have: the device plugin asks the kubelet for a
/// bind mount of `/dev/null`; an `emptyDir` or image path at the same place is not an entry.
pub const DEVICE_LIST_SOURCE: &str = "/dev/null";

/// The NRI gate's qualified CDI name: the device plugin adds it to every allocation on a node
/// whose devices reach containers through the NRI plugin (`nri_gate`), and actk-nri writes its
/// spec and removes its mount from every container it serves (actk-nri `gate`), so a container
/// the plugin did not serve fails, naming the plugin, instead of starting without its devices.
pub const NRI_GATE_CDI_NAME: &str = "actk.dev/nri-plugin=required";

/// The capability that makes a container privileged for [`Trust::Privileged`] (as the NVIDIA
/// Container Toolkit's `accept-nvidia-visible-devices-envvar-when-unprivileged` decides it).
pub const PRIVILEGED_CAPABILITY: &str = "CAP_SYS_ADMIN";

/// Which containers count as privileged for [`Trust::Privileged`] (config.toml
/// `policy.privileged_means`).
///
/// A runtime sees only config.json (OCI runtime-spec config.md), not the flag a user or pod
/// author set, so each rule is a property of config.json:
/// - [`PrivilegedMeans::CapSysAdmin`]: CAP_SYS_ADMIN in `process.capabilities.bounding`, as the
///   NVIDIA Container Toolkit decides it. A Kubernetes pod gets it with `capabilities.add:
///   [SYS_ADMIN]` alone, without `privileged: true`.
/// - [`PrivilegedMeans::PrivilegedFlag`]: CAP_SYS_ADMIN in the bounding set *and* a device
///   cgroup (`linux.resources.devices`) whose last rule for every device allows it: an entry
///   `{"allow": true, "access": "rwm"}` with no type (or type `a`) and no major or minor, with
///   no deny rule after it. containerd's CRI writes that rule only for `privileged: true`
///   (`WithAllDevicesAllowed`), docker for `--privileged`, rootful podman for `--privileged`;
///   no pod spec field without `privileged` reaches `linux.resources.devices` (the kubelet's
///   device plugin allocations become rules with a type, major and minor). Such a container may
///   already open every device node of the host (CAP_MKNOD, or CAP_SYS_ADMIN to mount
///   devtmpfs), so trusting its env grants nothing it could not take. A privileged container of
///   a containerd runtime with `privileged_without_host_devices` (and not
///   `..._all_devices_allowed`) has no such rule and counts as unprivileged: the rule fails
///   closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrivilegedMeans {
    /// CAP_SYS_ADMIN in the bounding set.
    #[default]
    CapSysAdmin,
    /// CAP_SYS_ADMIN in the bounding set and every device allowed by the device cgroup: what
    /// engines write for `privileged: true` / `--privileged` only.
    PrivilegedFlag,
}

impl PrivilegedMeans {
    /// The TOML value (`cap-sys-admin`, `privileged-flag`).
    pub fn as_str(self) -> &'static str {
        match self {
            PrivilegedMeans::CapSysAdmin => "cap-sys-admin",
            PrivilegedMeans::PrivilegedFlag => "privileged-flag",
        }
    }

    /// What a container lacks to be privileged under this rule, for refusal messages.
    fn lacking(self) -> &'static str {
        match self {
            PrivilegedMeans::CapSysAdmin => "no CAP_SYS_ADMIN in its bounding set",
            PrivilegedMeans::PrivilegedFlag => {
                "policy.privileged_means = \"privileged-flag\" asks for CAP_SYS_ADMIN and a device cgroup that allows every device, which privileged: true gives"
            }
        }
    }
}

/// How far one kind of request input is trusted (config.toml `[policy]` values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Every container may ask this way.
    #[default]
    Always,
    /// Only privileged containers ([`Policy::privileged_means`] says which).
    Privileged,
    /// No container may ask this way.
    Never,
}

impl Trust {
    /// Whether a container (privileged or not) may ask this way.
    pub fn allows(self, privileged: bool) -> bool {
        match self {
            Trust::Always => true,
            Trust::Privileged => privileged,
            Trust::Never => false,
        }
    }

    /// The TOML value (`always`, `privileged`, `never`).
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Always => "always",
            Trust::Privileged => "privileged",
            Trust::Never => "never",
        }
    }
}

/// What a refused request does to the container (config.toml `policy.on_refused`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRefused {
    /// The container fails to start; the message names the request and the policy key.
    #[default]
    Fail,
    /// The request is dropped (the container starts with what trusted inputs grant) and a
    /// warning naming the request and the policy key is logged.
    Warn,
}

impl OnRefused {
    /// The TOML value (`fail`, `warn`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnRefused::Fail => "fail",
            OnRefused::Warn => "warn",
        }
    }
}

/// The `[policy]` table of config.toml; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Selection variables in the container's environment (`NVIDIA_VISIBLE_DEVICES`, ...,
    /// `NEURON_RT_VISIBLE_CORES`), whoever set them: the image, the pod, `docker run --gpus`.
    pub env_requests: Trust,
    /// `cdi.k8s.io/*` annotations.
    pub annotation_requests: Trust,
    /// The device list: `/dev/null` mounts under [`DEVICE_LIST_DIR`].
    pub mount_requests: Trust,
    /// What a refused request does.
    pub on_refused: OnRefused,
    /// Which containers `privileged` trusts.
    pub privileged_means: PrivilegedMeans,
}

/// One input of a request, for refusal messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// A selection variable.
    Env,
    /// A `cdi.k8s.io/*` annotation.
    Annotation,
    /// A device list mount.
    Mount,
}

impl Channel {
    /// The policy key that governs this input (`policy.env_requests`).
    pub fn key(self) -> &'static str {
        match self {
            Channel::Env => "policy.env_requests",
            Channel::Annotation => "policy.annotation_requests",
            Channel::Mount => "policy.mount_requests",
        }
    }
}

impl Policy {
    /// The trust of one input.
    pub fn trust(&self, channel: Channel) -> Trust {
        match channel {
            Channel::Env => self.env_requests,
            Channel::Annotation => self.annotation_requests,
            Channel::Mount => self.mount_requests,
        }
    }

    /// The policy of a Kubernetes node (what the chart's node setup writes): env and annotation
    /// requests only for `privileged: true` containers, the device list always, refusals as
    /// warnings.
    pub fn kubernetes() -> Policy {
        Policy {
            env_requests: Trust::Privileged,
            annotation_requests: Trust::Privileged,
            mount_requests: Trust::Always,
            on_refused: OnRefused::Warn,
            privileged_means: PrivilegedMeans::PrivilegedFlag,
        }
    }

    /// Whether the container of `config_json` (an OCI runtime spec) is privileged in the sense
    /// of [`Trust::Privileged`] under [`Policy::privileged_means`].
    pub fn is_privileged(&self, config_json: &Value) -> bool {
        match self.privileged_means {
            PrivilegedMeans::CapSysAdmin => is_privileged(config_json),
            PrivilegedMeans::PrivilegedFlag => is_privileged(config_json) && allows_every_device(config_json),
        }
    }

    /// Why `channel` is not trusted for this container, in words, with the policy key and its
    /// value: `policy.env_requests = "privileged": the container is not privileged (no
    /// CAP_SYS_ADMIN in its bounding set)`.
    pub fn reason(&self, channel: Channel) -> String {
        let trust = self.trust(channel);
        let why = match trust {
            Trust::Privileged => format!("the container is not privileged ({})", self.privileged_means.lacking()),
            Trust::Never => "no container may ask this way on this node".to_string(),
            Trust::Always => "trusted".to_string(),
        };
        format!("{} = \"{}\": {why}", channel.key(), trust.as_str())
    }
}

/// Whether the container of `config_json` (an OCI runtime spec) is privileged in the sense of
/// [`PrivilegedMeans::CapSysAdmin`]: `process.capabilities.bounding` (runtime-spec config.md
/// "process") lists [`PRIVILEGED_CAPABILITY`]. [`Policy::is_privileged`] applies the node's rule.
pub fn is_privileged(config_json: &Value) -> bool {
    config_json
        .pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some(PRIVILEGED_CAPABILITY)))
}

/// Whether the device cgroup of `config_json` (`linux.resources.devices`, runtime-spec
/// config-linux.md "Device allowlist") ends up allowing every device: some rule `allow: true`
/// for all devices (no `type` or `type` `a`, no `major`, no `minor`, `access` with `r`, `w` and
/// `m`) with no deny rule after it. See [`PrivilegedMeans::PrivilegedFlag`].
pub fn allows_every_device(config_json: &Value) -> bool {
    let Some(rules) = config_json.pointer("/linux/resources/devices").and_then(Value::as_array) else {
        return false;
    };
    let every = |r: &Value| {
        let ty = r.get("type").and_then(Value::as_str);
        let access = r.get("access").and_then(Value::as_str).unwrap_or("");
        matches!(ty, None | Some("a"))
            && r.get("major").is_none_or(Value::is_null)
            && r.get("minor").is_none_or(Value::is_null)
            && ['r', 'w', 'm'].iter().all(|c| access.contains(*c))
    };
    let allow = |r: &Value| r.get("allow").and_then(Value::as_bool) == Some(true);
    match rules.iter().rposition(|r| allow(r) && every(r)) {
        Some(i) => !rules[i + 1..].iter().any(|r| !allow(r)),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn trust_levels() {
        assert!(Trust::Always.allows(false) && Trust::Always.allows(true));
        assert!(!Trust::Privileged.allows(false) && Trust::Privileged.allows(true));
        assert!(!Trust::Never.allows(false) && !Trust::Never.allows(true));
    }

    #[test]
    fn privileged_means_cap_sys_admin_in_the_bounding_set() {
        let spec = |caps: Value| json!({"process": {"capabilities": caps}});
        assert!(is_privileged(&spec(json!({"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}))));
        // Effective only, or another capability: not privileged.
        assert!(!is_privileged(&spec(json!({"effective": ["CAP_SYS_ADMIN"], "bounding": ["CAP_CHOWN"]}))));
        assert!(!is_privileged(&json!({"process": {}})));
        assert!(!is_privileged(&json!({})));
    }

    #[test]
    fn reason_names_key_and_value() {
        let p = Policy { privileged_means: PrivilegedMeans::CapSysAdmin, ..Policy::kubernetes() };
        assert_eq!(
            p.reason(Channel::Env),
            "policy.env_requests = \"privileged\": the container is not privileged (no CAP_SYS_ADMIN in its bounding set)"
        );
        let p = Policy { annotation_requests: Trust::Never, ..Policy::default() };
        assert!(p.reason(Channel::Annotation).starts_with("policy.annotation_requests = \"never\""));
    }

    /// A container as containerd's CRI writes it: `caps` in every set, `devices` as
    /// `linux.resources.devices`.
    fn cri(caps: &[&str], devices: Value) -> Value {
        json!({"process": {"capabilities": {"bounding": caps, "effective": caps, "permitted": caps}},
               "linux": {"resources": {"devices": devices}}})
    }

    /// Issue 29 finding 5: `capabilities.add: [SYS_ADMIN]` is privileged for the default rule
    /// only; `privileged: true` (containerd: every capability, `WithAllDevicesAllowed`) and
    /// docker's `--privileged` are privileged for both.
    #[test]
    fn privileged_flag_needs_every_device_allowed_as_only_privileged_true_gives() {
        let flag = Policy { privileged_means: PrivilegedMeans::PrivilegedFlag, ..Policy::default() };
        let cap = Policy::default();
        // containerd's default for a pod: deny all, then the kubelet's allocated GPU.
        let pod_devices = json!([{"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"}]);
        let sys_admin = cri(&["CAP_CHOWN", "CAP_SYS_ADMIN"], pod_devices.clone());
        assert!(cap.is_privileged(&sys_admin));
        assert!(!flag.is_privileged(&sys_admin), "capabilities.add: [SYS_ADMIN] is not privileged: true");
        // `capabilities.add: [ALL]`: every capability, the device cgroup of an ordinary pod.
        let all_caps = cri(&["CAP_CHOWN", "CAP_MKNOD", "CAP_SYS_ADMIN", "CAP_SYS_RAWIO"], pod_devices);
        assert!(!flag.is_privileged(&all_caps));
        // privileged: true (containerd WithPrivileged + WithAllDevicesAllowed), docker --privileged.
        let privileged = cri(&["CAP_CHOWN", "CAP_SYS_ADMIN"], json!([{"allow": true, "access": "rwm"}]));
        assert!(flag.is_privileged(&privileged) && cap.is_privileged(&privileged));
        let typed_a = cri(
            &["CAP_SYS_ADMIN"],
            json!([{"allow": false, "access": "rwm"}, {"allow": true, "type": "a", "access": "rwm"}]),
        );
        assert!(flag.is_privileged(&typed_a));
        // Every device allowed, but no CAP_SYS_ADMIN; or a deny after the allow; or only rw;
        // or a major; or no device cgroup at all: not privileged under the flag rule.
        for (what, spec) in [
            ("no CAP_SYS_ADMIN", cri(&["CAP_CHOWN"], json!([{"allow": true, "access": "rwm"}]))),
            (
                "deny after",
                cri(
                    &["CAP_SYS_ADMIN"],
                    json!([{"allow": true, "access": "rwm"}, {"allow": false, "type": "c", "major": 10, "minor": 229, "access": "rwm"}]),
                ),
            ),
            ("rw only", cri(&["CAP_SYS_ADMIN"], json!([{"allow": true, "access": "rw"}]))),
            (
                "one major",
                cri(&["CAP_SYS_ADMIN"], json!([{"allow": true, "type": "c", "major": 195, "access": "rwm"}])),
            ),
            ("no rules", json!({"process": {"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}})),
        ] {
            assert!(!flag.is_privileged(&spec), "{what}");
        }
        assert_eq!(
            flag.reason(Channel::Env),
            "policy.env_requests = \"always\": trusted",
            "always: the rule does not matter"
        );
        let k = Policy::kubernetes();
        assert_eq!(k.privileged_means, PrivilegedMeans::PrivilegedFlag);
        assert!(
            k.reason(Channel::Env).contains("privileged_means = \"privileged-flag\""),
            "{}",
            k.reason(Channel::Env)
        );
    }
}
