//! CDI spec documents (actk_core::cdi::validate), as found in /etc/cdi and /var/run/cdi. The
//! first byte picks the format (JSON, YAML, sniffed) and whether the JSON schema is checked; the
//! rest is the file. Checks: no panic; every error names the file; a spec that validates writes
//! back as JSON and YAML and reads back equal.
#![no_main]

use actk_core::cdi::Format;
use actk_core::cdi::validate::{parse_value, spec_from_value, validate_value};
use actk_core::cdi::write::to_text;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let format = match mode % 3 {
        0 => None,
        1 => Some(Format::Json),
        _ => Some(Format::Yaml),
    };
    let file = Path::new("/var/run/cdi/fuzz.json");
    let result = parse_value(text, file, format)
        .map_err(|e| vec![e])
        .and_then(|v| if mode & 4 != 0 { validate_value(v, Some(file)) } else { spec_from_value(v, Some(file)) });
    match result {
        Err(errors) => {
            assert!(!errors.is_empty());
            for e in errors {
                assert!(e.to_string().contains("/var/run/cdi/fuzz.json"), "{e}");
            }
        }
        Ok(spec) => {
            for f in [Format::Json, Format::Yaml] {
                let out = to_text(&spec, f).expect("a valid spec serialises");
                let back = parse_value(&out, file, Some(f))
                    .map_err(|e| vec![e])
                    .and_then(|v| spec_from_value(v, Some(file)));
                match back {
                    Ok(back) => assert_eq!(back, spec, "{out}"),
                    Err(e) => panic!("a valid spec does not read back from {f:?}: {e:?}\n{out}"),
                }
            }
        }
    }
});
