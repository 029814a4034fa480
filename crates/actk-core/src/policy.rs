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
//! Each of the three is trusted `always`, only for `privileged` containers (CAP_SYS_ADMIN in the
//! bounding set of `process.capabilities`, as `docker run --privileged` and a Kubernetes
//! `privileged: true` container have), or `never`. A request from an input the policy does not
//! trust is refused: the container fails with a message naming the policy key
//! ([`OnRefused::Fail`]), or the request is dropped with a warning naming it ([`OnRefused::Warn`],
//! what a Kubernetes node wants: CUDA images carry `ENV NVIDIA_VISIBLE_DEVICES=all`).
//!
//! The defaults ([`Policy::default`]) trust everything, as on docker and podman hosts, where the
//! user who runs the container is the authority. The Kubernetes node setup sets
//! `env_requests` and `annotation_requests` to `privileged` and `on_refused` to `warn`, and the
//! device plugin answers Allocate with the device list.
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

/// The capability that makes a container privileged for [`Trust::Privileged`] (as the NVIDIA
/// Container Toolkit's `accept-nvidia-visible-devices-envvar-when-unprivileged` decides it).
pub const PRIVILEGED_CAPABILITY: &str = "CAP_SYS_ADMIN";

/// How far one kind of request input is trusted (config.toml `[policy]` values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Every container may ask this way.
    #[default]
    Always,
    /// Only containers with [`PRIVILEGED_CAPABILITY`] in their bounding set.
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
    /// requests only for privileged containers, the device list always, refusals as warnings.
    pub fn kubernetes() -> Policy {
        Policy {
            env_requests: Trust::Privileged,
            annotation_requests: Trust::Privileged,
            mount_requests: Trust::Always,
            on_refused: OnRefused::Warn,
        }
    }

    /// Why `channel` is not trusted for this container, in words, with the policy key and its
    /// value: `policy.env_requests = "privileged": the container is not privileged (no
    /// CAP_SYS_ADMIN in its bounding set)`.
    pub fn reason(&self, channel: Channel) -> String {
        let trust = self.trust(channel);
        let why = match trust {
            Trust::Privileged => {
                format!("the container is not privileged (no {PRIVILEGED_CAPABILITY} in its bounding set)")
            }
            Trust::Never => "no container may ask this way on this node".to_string(),
            Trust::Always => "trusted".to_string(),
        };
        format!("{} = \"{}\": {why}", channel.key(), trust.as_str())
    }
}

/// Whether the container of `config_json` (an OCI runtime spec) is privileged in the sense of
/// [`Trust::Privileged`]: `process.capabilities.bounding` (runtime-spec config.md "process")
/// lists [`PRIVILEGED_CAPABILITY`].
pub fn is_privileged(config_json: &Value) -> bool {
    config_json
        .pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some(PRIVILEGED_CAPABILITY)))
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
        let p = Policy::kubernetes();
        assert_eq!(
            p.reason(Channel::Env),
            "policy.env_requests = \"privileged\": the container is not privileged (no CAP_SYS_ADMIN in its bounding set)"
        );
        let p = Policy { annotation_requests: Trust::Never, ..Policy::default() };
        assert!(p.reason(Channel::Annotation).starts_with("policy.annotation_requests = \"never\""));
    }
}
