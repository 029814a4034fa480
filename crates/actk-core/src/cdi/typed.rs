//! Reading a CDI spec document by its schema, as the CNCF reference library does: it decodes
//! every spec (JSON is YAML) with `go.yaml.in/yaml/v3` into the typed Go structs of
//! `specs-go/config.go` (container-device-interface v1.1.x, `pkg/cdi/spec.go` `ParseSpec`), so
//! a scalar is read as the type of the field it lands in, not as the type YAML would infer:
//!
//! - a string field takes any scalar's text: `name: 0` is the name `"0"`, `name: y` is `"y"`
//!   (YAML 1.1 booleans are not booleans there), `closID: 12` is `"12"`; a JSON number or
//!   boolean in a string field likewise;
//! - an integer field (`major`, `minor`, `timeout`: int64; `fileMode`, `uid`, `gid`,
//!   `additionalGids`: uint32) takes a plain scalar as yaml.v3 resolves it: Go's `ParseInt`
//!   with base 0 after removing `_` (so `010` and `0666` are octal, 8 and 438, as are `0o10`;
//!   `0x1b6` is hex, `0b11` binary), then a float (`09` and `1.7` are floats, truncated to 9
//!   and 1); a quoted or non-numeric scalar is a type error;
//! - a boolean field (`enableMonitoring`) takes `true`/`false` in any case yaml.v3 accepts, and
//!   YAML 1.1's `y`/`yes`/`on`/`n`/`no`/`off` forms;
//! - `null` (`~`, `null`, empty) is the field's zero value: an absent field, an empty list or
//!   edits (`containerEdits: null`, `mounts: ~`); a null item of a list of strings, numbers or
//!   devices is dropped, one of a list of device nodes, mounts, hooks or net devices stays an
//!   error (a nil pointer the reference refuses); a null annotation value is `""`;
//! - a key given twice in one mapping is an error (yaml.v3's "mapping key already defined"),
//!   in JSON as in YAML;
//! - an unknown key is an error (the reference decodes with `KnownFields(true)`).
//!
//! One deliberate difference: a YAML scalar reaches actk without its quoting style, so a
//! quoted number in an integer field (`major: "10"`) is read as the number where yaml.v3
//! refuses it.
//!
//! [`coerce`] applies the typing to a JSON value (from a JSON file, or built from YAML by
//! [`yaml_value`] with every scalar as its text), [`shape_errors`] names what still does not
//! fit the schema, with JSON pointers; [`json_value`] parses JSON refusing repeated keys.

use super::CdiError;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;
use std::path::Path;

/// A field's type in the CDI schema (specs-go config.go).
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// Go `string`.
    Str,
    /// Go `int64` / `int`.
    Int,
    /// Go `uint32` (and `os.FileMode`).
    Uint32,
    /// Go `bool`.
    Bool,
    /// A list; `true` when its items are pointers (a null item stays, as an error).
    List(&'static Ty, bool),
    /// `map[string]string` (annotations).
    StrMap,
    /// A struct: its fields and whether each is required (SPEC.md).
    Obj(&'static [Field]),
}

/// One field of a struct: JSON name, type, required.
pub type Field = (&'static str, Ty, bool);

const STR_LIST: Ty = Ty::List(&Ty::Str, false);

/// `deviceNodes[]` (SPEC.md "Device Nodes").
pub const NODE: &[Field] = &[
    ("path", Ty::Str, true),
    ("hostPath", Ty::Str, false),
    ("type", Ty::Str, false),
    ("major", Ty::Int, false),
    ("minor", Ty::Int, false),
    ("fileMode", Ty::Uint32, false),
    ("permissions", Ty::Str, false),
    ("uid", Ty::Uint32, false),
    ("gid", Ty::Uint32, false),
];
/// `mounts[]`.
pub const MOUNT: &[Field] = &[
    ("hostPath", Ty::Str, true),
    ("containerPath", Ty::Str, true),
    ("type", Ty::Str, false),
    ("options", STR_LIST, false),
];
/// `hooks[]`.
pub const HOOK: &[Field] = &[
    ("hookName", Ty::Str, true),
    ("path", Ty::Str, true),
    ("args", STR_LIST, false),
    ("env", STR_LIST, false),
    ("timeout", Ty::Int, false),
];
/// `intelRdt`.
pub const RDT: &[Field] = &[
    ("closID", Ty::Str, false),
    ("l3CacheSchema", Ty::Str, false),
    ("memBwSchema", Ty::Str, false),
    ("schemata", STR_LIST, false),
    ("enableMonitoring", Ty::Bool, false),
];
/// `netDevices[]`.
pub const NET: &[Field] = &[("hostInterfaceName", Ty::Str, true), ("name", Ty::Str, true)];
/// `containerEdits`.
pub const EDITS: &[Field] = &[
    ("env", STR_LIST, false),
    ("deviceNodes", Ty::List(&Ty::Obj(NODE), true), false),
    ("hooks", Ty::List(&Ty::Obj(HOOK), true), false),
    ("mounts", Ty::List(&Ty::Obj(MOUNT), true), false),
    ("intelRdt", Ty::Obj(RDT), false),
    ("additionalGids", Ty::List(&Ty::Uint32, false), false),
    ("netDevices", Ty::List(&Ty::Obj(NET), true), false),
];
/// `devices[]`.
pub const DEVICE: &[Field] =
    &[("name", Ty::Str, true), ("annotations", Ty::StrMap, false), ("containerEdits", Ty::Obj(EDITS), true)];
/// The spec document.
pub const SPEC: &[Field] = &[
    ("cdiVersion", Ty::Str, true),
    ("kind", Ty::Str, true),
    ("annotations", Ty::StrMap, false),
    ("devices", Ty::List(&Ty::Obj(DEVICE), false), true),
    ("containerEdits", Ty::Obj(EDITS), false),
];

/// Types `v` by `ty` in place (see the module docs). `yaml`: the scalars are YAML text (from
/// [`yaml_value`]), so numbers and booleans are resolved from it. What cannot be typed is left
/// as it is, for [`shape_errors`] to name.
pub fn coerce(v: &mut Value, ty: Ty, yaml: bool) {
    match ty {
        Ty::Str => match v {
            Value::Number(n) => *v = Value::String(n.to_string()),
            Value::Bool(b) => *v = Value::String(b.to_string()),
            _ => {}
        },
        Ty::Int | Ty::Uint32 => {
            let unsigned = matches!(ty, Ty::Uint32);
            let typed = match v {
                Value::String(s) if yaml => resolve_number(s).and_then(|n| to_int(n, unsigned)),
                Value::Number(n) => number(n).and_then(|n| to_int(n, unsigned)),
                _ => None,
            };
            if let Some(t) = typed {
                *v = t;
            }
        }
        Ty::Bool => {
            if yaml
                && let Value::String(s) = v
                && let Some(b) = yaml_bool(s)
            {
                *v = Value::Bool(b);
            }
        }
        Ty::List(item, pointers) => {
            if let Value::Array(items) = v {
                if !pointers {
                    items.retain(|i| !i.is_null());
                }
                for i in items {
                    coerce(i, *item, yaml);
                }
            }
        }
        Ty::StrMap => {
            if let Value::Object(m) = v {
                for (_, val) in m.iter_mut() {
                    if val.is_null() {
                        *val = Value::String(String::new());
                    }
                    coerce(val, Ty::Str, yaml);
                }
            }
        }
        Ty::Obj(fields) => {
            if let Value::Object(m) = v {
                // A known field given as null is its zero value: absent.
                m.retain(|k, val| !(val.is_null() && fields.iter().any(|(n, _, _)| n == k)));
                for (name, fty, _) in fields {
                    if let Some(val) = m.get_mut(*name) {
                        coerce(val, *fty, yaml);
                    }
                }
            }
        }
    }
}

/// A number as yaml.v3 resolves it before decoding into an integer field.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

fn number(n: &Number) -> Option<Num> {
    n.as_i64()
        .map(|i| Num::Int(i128::from(i)))
        .or_else(|| n.as_u64().map(|u| Num::Int(i128::from(u))))
        .or_else(|| n.as_f64().map(Num::Float))
}

/// yaml.v3's `resolve` of a plain scalar that may be a number: underscores removed, Go's
/// `strconv.ParseInt`/`ParseUint` with base 0 (sign, `0x`, `0o`, `0b`, a leading `0` for octal),
/// else a float of YAML's float syntax. `None`: not a number.
fn resolve_number(s: &str) -> Option<Num> {
    let plain: String = s.chars().filter(|c| *c != '_').collect();
    let first = plain.chars().next()?;
    if !(first.is_ascii_digit() || matches!(first, '+' | '-' | '.')) {
        return None;
    }
    if let Some(i) = go_parse_int_base0(&plain) {
        return Some(Num::Int(i));
    }
    if is_yaml_float(&plain) {
        return plain.parse::<f64>().ok().map(Num::Float);
    }
    None
}

/// Go's `strconv.ParseInt(s, 0, 64)` or, failing that, `ParseUint(s, 0, 64)`.
fn go_parse_int_base0(s: &str) -> Option<i128> {
    let (neg, body) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let mag = u128::from_str_radix(digits, radix).ok()?;
    let v = if neg { -i128::try_from(mag).ok()? } else { i128::try_from(mag).ok()? };
    // ParseInt's int64 range, or ParseUint's uint64 range for a non-negative value.
    let fits = (i128::from(i64::MIN)..=i128::from(i64::MAX)).contains(&v)
        || (!neg && !s.starts_with('+') && v <= i128::from(u64::MAX));
    fits.then_some(v)
}

/// yaml.v3's float syntax: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    } else {
        if !digits(&mut i) {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == b.len()
}

/// A resolved number decoded into an int64 (`unsigned`: uint32) field as yaml.v3 does: an
/// integer in range, or a float truncated toward zero when it is in range.
fn to_int(n: Num, unsigned: bool) -> Option<Value> {
    let (min, max) =
        if unsigned { (0i128, i128::from(u32::MAX)) } else { (i128::from(i64::MIN), i128::from(i64::MAX)) };
    let i = match n {
        Num::Int(i) => i,
        Num::Float(f) if f.is_finite() && f >= min as f64 && f < max as f64 + 1.0 => f.trunc() as i128,
        Num::Float(_) => return None,
    };
    if !(min..=max).contains(&i) {
        return None;
    }
    Some(if i < 0 { Value::from(i as i64) } else { Value::from(i as u64) })
}

/// A boolean as yaml.v3 decodes a plain scalar into a Go `bool`: YAML 1.2's `true`/`false`
/// spellings and YAML 1.1's `y`, `yes`, `on`, `n`, `no`, `off` forms.
fn yaml_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" | "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "false" | "False" | "FALSE" | "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

fn invalid(file: Option<&Path>, pointer: String, message: String) -> CdiError {
    CdiError::Invalid { file: file.map(Path::to_path_buf), pointer, message }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Escapes a key for a JSON pointer (RFC 6901).
pub fn pointer_key(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// Everything in `v` that does not fit `ty` after [`coerce`]: unknown fields (CDI consumers such
/// as podman and the reference library reject them), missing required fields, and values of
/// the wrong type, each with its JSON pointer (`at` is `v`'s own pointer).
pub fn shape_errors(v: &Value, ty: Ty, at: &str, file: Option<&Path>, out: &mut Vec<CdiError>) {
    let wrong = |expected: &str, out: &mut Vec<CdiError>| {
        let shown = match v {
            Value::String(s) => format!("{} {s:?}", kind_of(v)),
            Value::Number(n) => format!("{} ({n})", kind_of(v)),
            _ => kind_of(v).to_string(),
        };
        out.push(invalid(file, at.to_string(), format!("expected {expected}, found {shown}")));
    };
    match ty {
        Ty::Str => {
            if !v.is_string() {
                wrong("a string", out);
            }
        }
        Ty::Int => {
            if !(v.is_i64() || v.is_u64() && v.as_u64().is_some_and(|u| i64::try_from(u).is_ok())) {
                wrong("an integer (int64)", out);
            }
        }
        Ty::Uint32 => {
            if v.as_u64().is_none_or(|u| u32::try_from(u).is_err()) {
                wrong("an integer from 0 to 4294967295 (uint32)", out);
            }
        }
        Ty::Bool => {
            if !v.is_boolean() {
                wrong("true or false", out);
            }
        }
        Ty::List(item, _) => match v.as_array() {
            Some(items) => {
                for (i, x) in items.iter().enumerate() {
                    shape_errors(x, *item, &format!("{at}/{i}"), file, out);
                }
            }
            None => wrong("a list", out),
        },
        Ty::StrMap => match v.as_object() {
            Some(m) => {
                for (k, x) in m {
                    shape_errors(x, Ty::Str, &format!("{at}/{}", pointer_key(k)), file, out);
                }
            }
            None => wrong("an object of strings", out),
        },
        Ty::Obj(fields) => match v.as_object() {
            Some(m) => {
                for (k, x) in m {
                    match fields.iter().find(|(n, _, _)| n == k) {
                        Some((_, fty, _)) => shape_errors(x, *fty, &format!("{at}/{}", pointer_key(k)), file, out),
                        None => {
                            let known: Vec<&str> = fields.iter().map(|(n, _, _)| *n).collect();
                            out.push(invalid(
                                file,
                                format!("{at}/{}", pointer_key(k)),
                                format!(
                                    "unknown field {k:?} (CDI consumers such as podman reject unknown fields; known here: {})",
                                    known.join(", ")
                                ),
                            ));
                        }
                    }
                }
                for (name, _, required) in fields {
                    if *required && !m.contains_key(*name) {
                        out.push(invalid(file, at.to_string(), format!("missing field {name:?}")));
                    }
                }
            }
            None => wrong("an object", out),
        },
    }
}

/// Parses JSON text into a value, refusing a key given twice in one object (as the reference
/// library's YAML decoder does; serde_json would keep the last). Errors: serde_json's, with
/// line and column.
pub fn json_value(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = NoDuplicates.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// A [`Value`] built by a deserializer, refusing repeated keys.
struct NoDuplicates;

impl<'de> DeserializeSeed<'de> for NoDuplicates {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(NoDuplicates)
    }
}

impl<'de> Visitor<'de> for NoDuplicates {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(Value::from(i))
    }
    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(Value::from(u))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(NoDuplicates)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("key {k:?} is given twice in one object")));
            }
            let v = map.next_value_seed(NoDuplicates)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// Parses a YAML spec document by the schema: every scalar in a known field as its text (or
/// null), everything else as serde-saphyr reads it; then [`coerce`]s it. Keys given twice are
/// an error (serde-saphyr's default policy). Errors: serde-saphyr's message, with line and
/// column.
#[cfg(feature = "yaml")]
pub fn yaml_value(text: &str) -> Result<Value, serde_saphyr::Error> {
    let mut v = serde_saphyr::with_deserializer_from_str(text, |d| Typed(Ty::Obj(SPEC)).deserialize(d))?;
    coerce(&mut v, Ty::Obj(SPEC), true);
    Ok(v)
}

/// A value read by its schema type (see [`yaml_value`]).
#[cfg(feature = "yaml")]
struct Typed(Ty);

#[cfg(feature = "yaml")]
impl<'de> DeserializeSeed<'de> for Typed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_option(self)
    }
}

#[cfg(feature = "yaml")]
impl<'de> Visitor<'de> for Typed {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Ty::List(..) => f.write_str("a list"),
            Ty::StrMap | Ty::Obj(_) => f.write_str("a mapping"),
            _ => f.write_str("a scalar"),
        }
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self.0 {
            // A string target makes serde-saphyr hand over the scalar's text as written.
            Ty::Str | Ty::Int | Ty::Uint32 | Ty::Bool => d.deserialize_string(Text),
            Ty::List(..) => d.deserialize_seq(self),
            Ty::StrMap | Ty::Obj(_) => d.deserialize_map(self),
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let Ty::List(item, _) = self.0 else { return Err(de::Error::custom("a list where none belongs")) };
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Typed(*item))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(Typed(Ty::Str))? {
            let Value::String(k) = k else {
                // A null key (`~: x`): the reference keeps nothing of it.
                map.next_value::<de::IgnoredAny>()?;
                continue;
            };
            let field = match self.0 {
                Ty::StrMap => Some(Ty::Str),
                Ty::Obj(fields) => fields.iter().find(|(n, _, _)| *n == k).map(|(_, t, _)| *t),
                _ => None,
            };
            let v = match field {
                Some(t) => map.next_value_seed(Typed(t))?,
                // Unknown: read as YAML infers it; it is reported by name, not used.
                None => map.next_value::<Value>()?,
            };
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// A scalar's text.
#[cfg(feature = "yaml")]
struct Text;

#[cfg(feature = "yaml")]
impl<'de> Visitor<'de> for Text {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a scalar")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn int(s: &str) -> Option<Value> {
        resolve_number(s).and_then(|n| to_int(n, false))
    }

    /// What yaml.v3 (container-device-interface v1.1.2's decoder) makes of these plain scalars
    /// in an int64 field, checked against the Go library.
    #[test]
    fn integers_resolve_as_yaml_v3_does() {
        for (text, want) in [
            ("010", Some(8)),
            ("0666", Some(438)),
            ("0o17", Some(15)),
            ("0x10", Some(16)),
            ("0b11", Some(3)),
            ("+5", Some(5)),
            ("-1", Some(-1)),
            ("1_000", Some(1000)),
            ("09", Some(9)),
            ("1.7", Some(1)),
            ("1e3", Some(1000)),
            ("abc", None),
            ("true", None),
            ("", None),
            ("0x", None),
        ] {
            assert_eq!(int(text), want.map(Value::from), "{text}");
        }
        assert_eq!(resolve_number("-1").and_then(|n| to_int(n, true)), None, "uint32 refuses a negative");
        assert_eq!(resolve_number("4294967296").and_then(|n| to_int(n, true)), None);
    }

    #[test]
    fn coerce_types_scalars_and_drops_nulls_by_the_schema() {
        let mut v = json!({
            "cdiVersion": "0.5.0", "kind": "vendor.com/dev", "annotations": {"a": null, "b": 1},
            "devices": [null, {"name": 0, "containerEdits": null}, {"name": true, "containerEdits": {
                "env": ["A=1", null], "mounts": null, "deviceNodes": [null, {"path": "/x", "major": 1.9, "permissions": null}]
            }}],
            "containerEdits": null
        });
        coerce(&mut v, Ty::Obj(SPEC), false);
        assert_eq!(
            v,
            json!({
                "cdiVersion": "0.5.0", "kind": "vendor.com/dev", "annotations": {"a": "", "b": "1"},
                "devices": [{"name": "0"}, {"name": "true", "containerEdits": {
                    "env": ["A=1"], "deviceNodes": [null, {"path": "/x", "major": 1}]
                }}]
            })
        );
        let mut out = Vec::new();
        shape_errors(&v, Ty::Obj(SPEC), "", None, &mut out);
        let msgs: Vec<String> = out.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            [
                "/devices/0: missing field \"containerEdits\"",
                "/devices/1/containerEdits/deviceNodes/0: expected an object, found null"
            ]
        );
    }

    #[test]
    fn json_keys_given_twice_are_refused() {
        let e = json_value(r#"{"a": {"b": 1, "b": 2}}"#).unwrap_err().to_string();
        assert!(e.contains("key \"b\" is given twice") && e.contains("line 1"), "{e}");
        assert_eq!(json_value(r#"{"a": [1, {"b": null}]}"#).unwrap(), json!({"a": [1, {"b": null}]}));
        assert!(json_value("{} x").is_err());
    }
}
