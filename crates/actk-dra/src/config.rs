//! Opaque claim parameters of driver `actk.dev`: `apiVersion: actk.dev/v1`, `kind:
//! DeviceConfig`, given in a ResourceClaim's (or its template's) `spec.devices.config[].opaque`
//! or a DeviceClass's `spec.config[].opaque` with `driver: actk.dev`, and copied by the
//! scheduler into the allocation (`status.allocation.devices.config[]`, `source` `FromClass` or
//! `FromClaim`, resource.k8s.io/v1).
//!
//! ```yaml
//! apiVersion: actk.dev/v1
//! kind: DeviceConfig
//! sharing:                        # how a device this claim shares with others is shared
//!   strategy: MPS                 # TimeSlicing (default) or MPS (NVIDIA GPUs)
//!   mps:                          # only with strategy MPS
//!     activeThreadPercentage: 25  # 1..100; default: the claim's share of the GPU's memory
//!     pinnedMemoryLimit: 20Gi     # a quantity, at most the memory the claim consumed (default)
//! neuron:                         # Neuron devices
//!   logicalCoreSize: 2            # physical NeuronCores per logical core, 1 or 2
//!                                 # (NEURON_LOGICAL_NC_CONFIG); default: 1
//! ```
//!
//! Unknown fields are refused at every level. The chart's ValidatingAdmissionPolicy checks the
//! same when the claim is written; the driver checks again at NodePrepareResources (a claim
//! written before the policy, or without the chart), and the error names the field.
//!
//! Which configuration applies to a request follows the API: an entry without `requests`
//! applies to every request, one with `requests` to those named (a `request/subrequest` also
//! matches its base request); entries from the class come first, the claim's after them, and a
//! later entry's `sharing` (or `neuron`) replaces an earlier one's. A section of an entry for
//! every request that is for another kind of device (MPS, for NVIDIA GPUs; `neuron`, for Neuron
//! devices) is left out for a request whose device is not that kind, when another device of
//! the claim takes it ([`Skip`]): a claim for a GPU and Neuron cores can say `MPS` once.
//! NVIDIA's DRA driver likewise skips a `GpuConfig` without requests for a MIG device.
//! Entries of a DeviceClass name the requests that use the class (current allocators), so an
//! admin's section is never left out this way.

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

/// The API version of the parameters.
pub const API_VERSION: &str = "actk.dev/v1";

/// The kind of the parameters.
pub const KIND: &str = "DeviceConfig";

/// How a shared device is shared (`sharing.strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Strategy {
    /// The GPU's (or accelerator's) own time-slicing between processes: the claim gets the
    /// device, nothing limits it. The default.
    #[default]
    TimeSlicing,
    /// NVIDIA CUDA MPS: the claim's processes are clients of the node's MPS control daemon,
    /// limited to a share of the GPU's threads and memory.
    #[serde(rename = "MPS")]
    Mps,
}

/// `sharing.mps`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1..=100.
    pub active_thread_percentage: Option<u32>,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` of each shared GPU, a Kubernetes quantity (bytes).
    pub pinned_memory_limit: Option<Quantity>,
}

/// `sharing`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sharing {
    /// How the device is shared.
    pub strategy: Strategy,
    /// MPS limits (only with [`Strategy::Mps`]).
    pub mps: Option<MpsConfig>,
}

/// `neuron`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NeuronConfig {
    /// Physical NeuronCores per logical core (`NEURON_LOGICAL_NC_CONFIG`), 1 or 2: the cores a
    /// claim consumes are given in aligned groups of this size and `NEURON_RT_VISIBLE_CORES`
    /// counts logical cores.
    pub logical_core_size: Option<u32>,
}

/// The parameters (`opaque.parameters`), checked.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceConfig {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// How shared devices are shared; `None`: time-slicing.
    pub sharing: Option<Sharing>,
    /// Neuron settings.
    pub neuron: Option<NeuronConfig>,
}

/// A byte quantity as a number: plain, decimal (`k`, `M`, `G`, `T`, `P`, `E`) or binary (`Ki`
/// .. `Ei`) suffixes, or a decimal exponent (`131072e3`, `1E3`: the API server's canonical form
/// of a quantity written with one), whole numbers only. `None` for anything else (fractions,
/// `m`, signs, negative exponents).
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: u64 = num.parse().ok()?;
    if let Some(exp) = suffix.strip_prefix(['e', 'E']).filter(|e| !e.is_empty())
        && exp.bytes().all(|b| b.is_ascii_digit())
    {
        let exp: u32 = exp.parse().ok()?;
        return n.checked_mul(10u64.checked_pow(exp)?);
    }
    let mult: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    n.checked_mul(mult)
}

impl DeviceConfig {
    /// Parses and checks `parameters` (the JSON of `opaque.parameters`); `field` is where they
    /// are (`status.allocation.devices.config[0].opaque.parameters`), for the error.
    ///
    /// Errors: a message naming the field and the fix: not an object, another apiVersion or
    /// kind, an unknown field, a strategy other than TimeSlicing or MPS, `mps` without MPS, a
    /// percentage outside 1..100, a memory limit that is not a whole byte quantity.
    pub fn parse(parameters: &serde_json::Value, field: &str) -> Result<DeviceConfig, String> {
        let obj = parameters
            .as_object()
            .ok_or_else(|| format!("{field} must be an object with apiVersion: {API_VERSION} and kind: {KIND}"))?;
        for (key, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
            match obj.get(key).and_then(|v| v.as_str()) {
                Some(v) if v == want => {}
                Some(v) => return Err(format!("{field}.{key} is {v:?}; actk.dev takes {key}: {want}")),
                None => return Err(format!("{field}.{key} is missing; actk.dev takes {key}: {want}")),
            }
        }
        let cfg: DeviceConfig = serde_json::from_value(parameters.clone()).map_err(|e| {
            let msg = e.to_string();
            // serde names the field it did not know; keep its words, say where.
            format!(
                "{field}: {msg} (DeviceConfig fields: apiVersion, kind, sharing.strategy TimeSlicing|MPS, sharing.mps.activeThreadPercentage, sharing.mps.pinnedMemoryLimit, neuron.logicalCoreSize)"
            )
        })?;
        if let Some(s) = &cfg.sharing
            && let Some(m) = &s.mps
        {
            if s.strategy != Strategy::Mps {
                return Err(format!(
                    "{field}.sharing.mps is given but sharing.strategy is TimeSlicing; set strategy: MPS or remove mps"
                ));
            }
            if let Some(p) = m.active_thread_percentage
                && !(1..=100).contains(&p)
            {
                return Err(format!("{field}.sharing.mps.activeThreadPercentage is {p}; it must be 1..100"));
            }
            if let Some(q) = &m.pinned_memory_limit
                && quantity_bytes(&q.0).is_none_or(|b| b == 0)
            {
                return Err(format!(
                    "{field}.sharing.mps.pinnedMemoryLimit is {:?}; it must be a whole, nonzero byte quantity such as 20Gi",
                    q.0
                ));
            }
        }
        if let Some(n) = cfg.neuron.as_ref().and_then(|n| n.logical_core_size)
            && !(1..=2).contains(&n)
        {
            return Err(format!("{field}.neuron.logicalCoreSize is {n}; it must be 1 or 2"));
        }
        Ok(cfg)
    }
}

/// The sections of entries for every request (no `requests`, or an empty list) that are left
/// out for one request, because they are for another kind of device of the same claim. The
/// claim's preparation sets a flag only when the request's device is not of that kind and
/// another device of the claim is: a section that is for none of the claim's devices stays, so
/// that the claim is refused with the device named rather than the setting lost in silence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip {
    /// `sharing` with `strategy: MPS` (for NVIDIA GPUs; `claim::prepare` counts a MIG device
    /// as one, so that MPS is refused on it rather than left out).
    pub mps: bool,
    /// `neuron` (for devices whose profile has a logical core size variable).
    pub neuron: bool,
}

/// The configuration of `request` (an allocation result's request, `gpu` or `gpu/large`) from
/// the allocation's `config` entries of driver `actk.dev`, in order (class entries first, as
/// the API server lists them), the sections `skip` names left out of entries for every request.
/// `Ok(None)` when no entry applies.
///
/// Errors: [`DeviceConfig::parse`]'s, for the first applying entry that is not valid (whatever
/// `skip` leaves out of it).
pub fn for_request(
    configs: &[DeviceAllocationConfiguration],
    request: &str,
    skip: Skip,
) -> Result<Option<DeviceConfig>, String> {
    let base = crate::claim::base_request(request);
    let mut out: Option<DeviceConfig> = None;
    for (i, c) in configs.iter().enumerate() {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == crate::slice::DRIVER) else { continue };
        let every = c.requests.as_ref().is_none_or(|rs| rs.is_empty());
        if !every && !c.requests.iter().flatten().any(|r| r == request || r == base) {
            continue;
        }
        let field = format!("status.allocation.devices.config[{i}].opaque.parameters");
        let from = if c.source == "FromClass" { "the DeviceClass" } else { "the claim" };
        let mut cfg = DeviceConfig::parse(&o.parameters.0, &field).map_err(|e| format!("{e} (set in {from})"))?;
        if every {
            if skip.mps && cfg.sharing.as_ref().is_some_and(|s| s.strategy == Strategy::Mps) {
                cfg.sharing = None;
            }
            if skip.neuron {
                cfg.neuron = None;
            }
        }
        match &mut out {
            None => out = Some(cfg),
            Some(prev) => {
                if cfg.sharing.is_some() {
                    prev.sharing = cfg.sharing;
                }
                if cfg.neuron.is_some() {
                    prev.neuron = cfg.neuron;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<DeviceConfig, String> {
        DeviceConfig::parse(&v, "p")
    }

    #[test]
    fn a_full_config_parses() {
        let c = parse(json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig",
            "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 25, "pinnedMemoryLimit": "20Gi"}}}))
        .unwrap();
        let s = c.sharing.unwrap();
        assert_eq!(s.strategy, Strategy::Mps);
        let m = s.mps.unwrap();
        assert_eq!(m.active_thread_percentage, Some(25));
        assert_eq!(quantity_bytes(&m.pinned_memory_limit.unwrap().0), Some(20 << 30));
        let c = parse(json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig"})).unwrap();
        assert_eq!(c.sharing, None);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let cases = [
            (json!("x"), "p must be an object"),
            (json!({"kind": "DeviceConfig"}), "p.apiVersion is missing"),
            (json!({"apiVersion": "actk.dev/v2", "kind": "DeviceConfig"}), "p.apiVersion is \"actk.dev/v2\""),
            (json!({"apiVersion": "actk.dev/v1", "kind": "Config"}), "p.kind is \"Config\""),
            (json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharingg": {}}), "unknown field `sharingg`"),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "Spatial"}}),
                "unknown variant `Spatial`",
            ),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS", "mps": {"limit": 1}}}),
                "unknown field `limit`",
            ),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "TimeSlicing", "mps": {}}}),
                "p.sharing.mps is given but sharing.strategy is TimeSlicing",
            ),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}}),
                "p.sharing.mps.activeThreadPercentage is 0",
            ),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "1.5Gi"}}}),
                "p.sharing.mps.pinnedMemoryLimit is \"1.5Gi\"",
            ),
            (
                json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "neuron": {"logicalCoreSize": 4}}),
                "p.neuron.logicalCoreSize is 4; it must be 1 or 2",
            ),
            (json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "neuron": {"lnc": 2}}), "unknown field `lnc`"),
        ];
        for (v, want) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert!(e.contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn quantities_in_bytes() {
        assert_eq!(quantity_bytes("1024"), Some(1024));
        assert_eq!(quantity_bytes("2Mi"), Some(2 << 20));
        assert_eq!(quantity_bytes("3G"), Some(3_000_000_000));
        assert_eq!(quantity_bytes("1.5Gi"), None);
        assert_eq!(quantity_bytes("100m"), None);
        assert_eq!(quantity_bytes("20000Ei"), None);
        assert_eq!(quantity_bytes("131072e3"), Some(131_072_000));
        assert_eq!(quantity_bytes("1E3"), Some(1000));
        assert_eq!(quantity_bytes("2E"), Some(2_000_000_000_000_000_000));
        assert_eq!(quantity_bytes("1e-3"), None);
        assert_eq!(quantity_bytes("1e"), None);
        assert_eq!(quantity_bytes("1e30"), None);
        assert_eq!(quantity_bytes("-1"), None);
    }

    #[test]
    fn entries_apply_by_request_and_later_ones_win() {
        use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
        use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
        let entry = |source: &str, requests: Option<Vec<&str>>, strategy: &str| DeviceAllocationConfiguration {
            source: source.into(),
            requests: requests.map(|r| r.into_iter().map(String::from).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "actk.dev".into(),
                parameters: RawExtension(
                    json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "sharing": {"strategy": strategy}}),
                ),
            }),
        };
        let configs = vec![entry("FromClass", None, "TimeSlicing"), entry("FromClaim", Some(vec!["gpu"]), "MPS")];
        let strategy =
            |r: &str| for_request(&configs, r, Skip::default()).unwrap().and_then(|c| c.sharing).map(|s| s.strategy);
        assert_eq!(strategy("gpu"), Some(Strategy::Mps));
        assert_eq!(strategy("gpu/small"), Some(Strategy::Mps));
        assert_eq!(strategy("other"), Some(Strategy::TimeSlicing));
        assert_eq!(for_request(&[], "gpu", Skip::default()).unwrap(), None);
        let mut bad = configs.clone();
        bad[1].opaque.as_mut().unwrap().parameters = RawExtension(json!({"kind": "DeviceConfig"}));
        let e = for_request(&bad, "gpu", Skip::default()).unwrap_err();
        assert!(e.contains("status.allocation.devices.config[1].opaque.parameters.apiVersion is missing"), "{e}");
        assert!(e.contains("(set in the claim)"), "{e}");
        // Another driver's entry is not read.
        bad[1].opaque.as_mut().unwrap().driver = "gpu.example.com".into();
        assert!(for_request(&bad, "gpu", Skip::default()).is_ok());

        // Skip leaves sections out of entries for every request only.
        let configs = vec![
            entry("FromClass", None, "TimeSlicing"),
            entry("FromClaim", Some(vec![]), "MPS"),
            entry("FromClaim", Some(vec!["gpu"]), "MPS"),
        ];
        let skip = Skip { mps: true, neuron: true };
        let strategy = |r: &str| for_request(&configs, r, skip).unwrap().and_then(|c| c.sharing).map(|s| s.strategy);
        assert_eq!(strategy("nc"), Some(Strategy::TimeSlicing), "the claim-wide MPS left out, the class's stays");
        assert_eq!(strategy("gpu"), Some(Strategy::Mps), "named: kept (and refused later if not for the device)");
        let lnc = DeviceAllocationConfiguration {
            source: "FromClaim".into(),
            requests: None,
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "actk.dev".into(),
                parameters: RawExtension(
                    json!({"apiVersion": "actk.dev/v1", "kind": "DeviceConfig", "neuron": {"logicalCoreSize": 2}}),
                ),
            }),
        };
        let neuron = |skip| for_request(std::slice::from_ref(&lnc), "gpu", skip).unwrap().and_then(|c| c.neuron);
        assert_eq!(neuron(Skip { mps: false, neuron: true }), None);
        assert_eq!(neuron(Skip { mps: true, neuron: false }).and_then(|n| n.logical_core_size), Some(2));
    }
}
