//! A validating JSON scanner for the lazy reading of spec files at container start
//! ([`super::validate::lazy_from_text`], issue 31).
//!
//! A start names a few devices of a spec that may list hundreds. The devices it does not name
//! are never parsed into the model, but the file must still be valid JSON as a whole: the CNCF
//! CDI library decodes a spec file with Go's `encoding/json` and refuses all of it for a syntax
//! error anywhere, so actk must too. serde_json's own skipping (`RawValue`, `IgnoredAny`)
//! validates too, but took 14 instructions a byte of a compact spec (411 k for the 29 KB spec of
//! a 64-device Neuron node); this scanner checks the same grammar (RFC 8259 sections 2-7) in 9
//! (265 k): strings eight bytes at a time, no allocation, no call per token.
//!
//! It is sound, not complete: text it accepts is one valid JSON value (a property test in
//! `tests/prop_cdi.rs` holds it to serde_json's acceptance on random and mutated text); it
//! gives up (`None`) on nesting deeper than its caller allows and on escaped top-level keys, and
//! the caller then reads the file whole, which refuses or accepts it with the full report.

/// Whitespace as RFC 8259 section 2 defines it: space, tab, line feed, carriage return.
#[inline(always)]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The first index at or after `i` that is not whitespace (`b.len()` at the end).
#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ws(b[i]) {
        i += 1;
    }
    i
}

/// Bytes a string's scan stops at: `"`, `\` and the control characters U+0000-U+001F that
/// RFC 8259 section 7 requires escaped.
static STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// The index just past the string whose opening quote is at `i`, or `None` when it is not a
/// valid JSON string (unterminated, a raw control character, an unknown escape, a `\u` without
/// four hex digits). Lone surrogate escapes are accepted, as Go's decoder and serde_json's
/// skipping accept them. `b` must be valid UTF-8 (it comes from a `&str`).
#[inline(always)]
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    debug_assert_eq!(b.get(i), Some(&b'"'));
    let mut i = i + 1;
    loop {
        i = stop_at(b, i)?;
        match b[i] {
            b'"' => return Some(i + 1),
            b'\\' => match *b.get(i + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => i += 6,
                _ => return None,
            },
            _ => return None,
        }
    }
}

/// The first index at or after `i` whose byte stops a string's scan ([`STOP`]), or `None` at
/// the end of `b`. Eight bytes at a time: in a word `x`, a byte `c` of `(x - 0x01 * k) & !x &
/// 0x80` (each byte) is flagged when it is below `k` (k <= 0x80), and `x ^ (0x01 * c)` turns the
/// bytes equal to `c` into zeros; a borrow can flag a byte wrongly only above a byte rightly
/// flagged, so the lowest flag of the three tests is the first stop.
#[inline(always)]
fn stop_at(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(chunk.try_into().ok()?);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        let flags = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (x.wrapping_sub(ONES * 0x20) & !x))
            & HIGH;
        if flags != 0 {
            return Some(i + (flags.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    while !STOP[*b.get(i)? as usize] {
        i += 1;
    }
    Some(i)
}

/// The index just past the digits at `i` (at least one), or `None` when there are none.
#[inline(always)]
fn digits_end(b: &[u8], mut i: usize) -> Option<usize> {
    let start = i;
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    (i > start).then_some(i)
}

/// The index just past the number at `i`: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
/// (RFC 8259 section 6). What follows it is the caller's to check (`01` ends after the `0`).
#[inline(always)]
fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match *b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => digits_end(b, i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = digits_end(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits_end(b, i)?;
    }
    Some(i)
}

/// The index just past the literal `word` (`true`, `false`, `null`) at `i`.
#[inline(always)]
fn literal_end(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// After an object's `{` or `,` (at `i`, whitespace skipped): the key string and its `:`, then
/// whitespace; the index of the member's value.
#[inline(always)]
fn member_value(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let i = skip_ws(b, string_end(b, i)?);
    (b.get(i) == Some(&b':')).then(|| skip_ws(b, i + 1))
}

/// The index just past the one JSON value that starts at `start` (no whitespace before it), or
/// `None` when the text there does not start with a valid JSON value, or nests objects and
/// arrays deeper than `max_depth` (at most 64). What follows the value is the caller's to check.
pub fn value_end(b: &[u8], start: usize, max_depth: usize) -> Option<usize> {
    // Open containers as a stack of bits, innermost at bit `depth - 1`: 1 for an object, 0 for
    // an array. No allocation: this runs once per device of every spec at each start.
    let max_depth = max_depth.min(64);
    let (mut open, mut depth) = (0u64, 0u32);
    let mut i = start;
    loop {
        // A value at `i`.
        i = match *b.get(i)? {
            b'"' => string_end(b, i)?,
            c @ (b'{' | b'[') => {
                if depth as usize >= max_depth {
                    return None;
                }
                let object = c == b'{';
                let j = skip_ws(b, i + 1);
                if b.get(j) == Some(if object { &b'}' } else { &b']' }) {
                    j + 1
                } else {
                    open = (open & !(1u64 << depth)) | (u64::from(object) << depth);
                    depth += 1;
                    i = if object { member_value(b, j)? } else { j };
                    continue;
                }
            }
            b't' => literal_end(b, i, b"true")?,
            b'f' => literal_end(b, i, b"false")?,
            b'n' => literal_end(b, i, b"null")?,
            _ => number_end(b, i)?,
        };
        // After a value: the next member or element, or the containers it closes.
        loop {
            if depth == 0 {
                return Some(i);
            }
            let object = (open >> (depth - 1)) & 1 == 1;
            i = skip_ws(b, i);
            match *b.get(i)? {
                b',' => {
                    let j = skip_ws(b, i + 1);
                    i = if object { member_value(b, j)? } else { j };
                    break;
                }
                b'}' if object => {}
                b']' if !object => {}
                _ => return None,
            }
            depth -= 1;
            i += 1;
        }
    }
}

/// A device's `name` read from its text when the object starts with it as a string without
/// escapes (`{"name":"0",...`, as `actk cdi generate`, nvidia-ctk and most writers put it),
/// else `None`. `device` must be valid JSON ([`value_end`]), so the string's end is its end.
pub fn leading_name(device: &str) -> Option<&str> {
    let b = device.as_bytes();
    if b.first() != Some(&b'{') {
        return None;
    }
    let i = skip_ws(b, 1);
    if b.get(i..i + 6)? != b"\"name\"" {
        return None;
    }
    let i = skip_ws(b, i + 6);
    if b.get(i) != Some(&b':') {
        return None;
    }
    let start = skip_ws(b, i + 1);
    if b.get(start) != Some(&b'"') {
        return None;
    }
    let end = stop_at(b, start + 1)?;
    (b[end] == b'"').then(|| &device[start + 1..end])
}

/// How deep a device may nest objects and arrays in [`split_devices`]: well past any real
/// device (five levels), and below serde_json's recursion limit of 128 for the whole file.
pub const DEVICE_DEPTH: usize = 64;

/// A spec file's text taken apart for the lazy reading: `rest` is the top-level object without
/// its `devices` member (as JSON text, for serde to read), `devices` the text of each element
/// of `devices`, in order, each checked as a valid JSON value by [`value_end`].
#[derive(Debug)]
pub struct Split<'a> {
    /// `{` + the text of every member before `devices`, joined by `,` + the file's text after
    /// the `devices` member (its other members, the closing `}` and what follows), unscanned:
    /// the reader of `rest` must judge it as a whole JSON document, and refuse a `devices` key
    /// in it (the file had two).
    pub rest: String,
    /// Each device's JSON text, a slice of the input.
    pub devices: Vec<&'a str>,
}

/// Splits a JSON spec file's text ([`Split`]), or `None` when the text up to the end of the
/// `devices` member is not the start of one JSON object whose members are valid JSON and whose
/// `devices` member is an array (a file without one gives `None`); or when a key before it has
/// an escape (it might spell `devices`), or a value nests deeper than [`DEVICE_DEPTH`]. What
/// follows `devices` is left to the reader of [`Split::rest`]. `None` means: read the file whole.
pub fn split_devices(text: &str) -> Option<Split<'_>> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut rest = String::with_capacity(256);
    rest.push('{');
    i = skip_ws(b, i + 1);
    if b.get(i) != Some(&b'}') {
        loop {
            let key_start = i;
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = string_end(b, i)?;
            let key = &b[key_start + 1..key_end - 1];
            if key.contains(&b'\\') {
                return None;
            }
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            i = skip_ws(b, i + 1);
            if key == b"devices" {
                if b.get(i) != Some(&b'[') {
                    return None;
                }
                let mut list = Vec::with_capacity(b.len() / 512 + 1);
                i = skip_ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    i += 1;
                } else {
                    loop {
                        let end = value_end(b, i, DEVICE_DEPTH)?;
                        list.push(&text[i..end]);
                        i = skip_ws(b, end);
                        match *b.get(i)? {
                            b',' => i = skip_ws(b, i + 1),
                            b']' => {
                                i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                // The members after `devices` are not scanned (issue 31: the spec-level edits
                // that `actk cdi generate` and nvidia-ctk write there are most of the file):
                // their text goes into `rest` as it is, and the reader of `rest` judges it. Only
                // the grammar at the seam is checked here: a comma must lead to a key.
                i = skip_ws(b, i);
                match *b.get(i)? {
                    b'}' => rest.push_str(&text[i..]),
                    b',' => {
                        let key = skip_ws(b, i + 1);
                        if b.get(key) != Some(&b'"') {
                            return None;
                        }
                        if rest.len() > 1 {
                            rest.push(',');
                        }
                        rest.push_str(&text[key..]);
                    }
                    _ => return None,
                }
                return Some(Split { rest, devices: list });
            } else {
                let end = value_end(b, i, DEVICE_DEPTH)?;
                if rest.len() > 1 {
                    rest.push(',');
                }
                rest.push_str(&text[key_start..end]);
                i = end;
            }
            i = skip_ws(b, i);
            match *b.get(i)? {
                b',' => i = skip_ws(b, i + 1),
                b'}' => break,
                _ => return None,
            }
        }
    }
    // No `devices` member.
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(s: &str) -> bool {
        let b = s.as_bytes();
        let i = skip_ws(b, 0);
        value_end(b, i, 64).is_some_and(|e| skip_ws(b, e) == b.len())
    }

    #[test]
    fn the_grammar_of_rfc_8259() {
        for good in [
            "0",
            "-0",
            "-0.5e+10",
            "1E5",
            "123.456",
            "true",
            "false",
            "null",
            r#""""#,
            r#""a\"b\\c\/d\b\f\n\r\t\u00e9\uD800""#,
            "\"é ü 漢\"",
            "[]",
            "{}",
            " [ 1 , [ ] , { } , { \"a\" : [ null ] } ] ",
            r#"{"a":{"b":{"c":[1,2,{"d":"e"}]}},"f":-1}"#,
        ] {
            assert!(accepts(good), "{good}");
            assert!(serde_json::from_str::<serde::de::IgnoredAny>(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "tru",
            "nul",
            "True",
            "\"a",
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"\\u12\"",
            "\"tab\there\"",
            "\"nl\nhere\"",
            "[1,]",
            "[,1]",
            "[1 2]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "{\"a\":}",
            "{1:2}",
            "[}",
            "{]",
            "[1]]",
            "[",
            "{\"a\":[1}",
            "1 2",
            "\u{feff}1",
            "NaN",
            "[\u{a0}1]",
        ] {
            assert!(!accepts(bad), "{bad:?}");
            assert!(serde_json::from_str::<serde::de::IgnoredAny>(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nesting_past_the_limit_gives_up() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(value_end(deep(4).as_bytes(), 0, 4).is_some());
        assert!(value_end(deep(5).as_bytes(), 0, 4).is_none());
        assert!(value_end(b"[[[]]", 0, 8).is_none());
    }

    #[test]
    fn a_spec_splits_into_its_devices_and_the_rest() {
        let text = r#" {"cdiVersion":"0.6.0", "kind":"v.com/c","devices": [ {"name":"0"} , {"name":"1","x":[1,{"y":null}]} ],"containerEdits":{"env":["A=b"]}} "#;
        let s = split_devices(text).unwrap();
        assert_eq!(s.devices, [r#"{"name":"0"}"#, r#"{"name":"1","x":[1,{"y":null}]}"#]);
        assert_eq!(s.rest, r#"{"cdiVersion":"0.6.0","kind":"v.com/c","containerEdits":{"env":["A=b"]}} "#);
        let rest: serde_json::Value = serde_json::from_str(&s.rest).unwrap();
        assert_eq!(rest["containerEdits"]["env"][0], "A=b");
        assert!(split_devices(r#"{"kind":"v.com/c","devices":[]}"#).unwrap().devices.is_empty());
    }

    #[test]
    fn a_leading_name_is_read_from_the_text() {
        assert_eq!(leading_name(r#"{"name":"gpu-0","containerEdits":{}}"#), Some("gpu-0"));
        assert_eq!(leading_name("{ \"name\" :\t\"é\"}"), Some("é"));
        assert_eq!(leading_name(r#"{"name":""}"#), Some(""));
        for other in
            [r#"{"name":"a\"b"}"#, r#"{"containerEdits":{},"name":"0"}"#, r#"{"name":0}"#, r#"{"names":"0"}"#, "[]"]
        {
            assert_eq!(leading_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_split_gives_up_where_the_whole_reading_must_judge() {
        for text in [
            r#"{"kind":"v.com/c"}"#,
            r#"{"dev\u0069ces":[{"name":"0"}],"devices":[]}"#,
            r#"{"devices":{"name":"0"}}"#,
            r#"{"devices":[{"name":"0"},{"name":"1",}]}"#,
            r#"{"devices":[{"name":"0"} {"name":"1"}]}"#,
            r#"{"devices":[{"name":"0"}],}"#,
            r#"{"devices":[{"name":"0"}] "kind":"a"}"#,
            r#"[{"devices":[]}]"#,
        ] {
            assert!(split_devices(text).is_none(), "{text}");
        }
        // After `devices` the text is `rest`'s, unscanned: what is wrong there (a second
        // `devices`, text after the object, a string left open or with a bad escape) is in
        // `rest` as it was, for its reader to refuse.
        for (text, rest) in [
            (r#"{"devices":[{"name":"0"}],"devices":[{"name":"1"}]}"#, r#"{"devices":[{"name":"1"}]}"#),
            (r#"{"devices":[{"name":"0"}]} x"#, "{} x"),
            (r#"{"devices":[{"name":"0"}],"kind":"a"#, r#"{"kind":"a"#),
            (r#"{"kind":"k", "devices":[{"name":"0"}] , "x":"a\x"}"#, r#"{"kind":"k","x":"a\x"}"#),
        ] {
            assert_eq!(split_devices(text).map(|s| s.rest).as_deref(), Some(rest), "{text}");
            assert!(serde_json::from_str::<serde_json::Value>(rest).map_or(true, |v| v.get("devices").is_some()));
        }
    }
}
