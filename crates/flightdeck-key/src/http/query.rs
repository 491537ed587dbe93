//! The canonical form of a query string.
//!
//! - Parameters are split on `&`; empty pieces are dropped, so `""`, `"?"`
//!   and `"&&"` are all the empty query.
//! - Names and values are decoded as `application/x-www-form-urlencoded`
//!   (what axum's `Query` sees): `%41` ≡ `A`, `%2b` ≡ `%2B` ≡ a literal `+`
//!   byte, `+` ≡ `%20` ≡ space. A `%` not followed by two hex digits stays as
//!   it is. Decoded bytes are hashed as they are, UTF-8 or not.
//! - `a` ≡ `a=` (a name without `=` has the empty value).
//! - Parameters whose decoded name is in the ignore list are dropped.
//! - Parameters are sorted by decoded name, *stably*: repeated parameters
//!   keep their relative order (`a=1&a=2` ≠ `a=2&a=1`, since many servers
//!   read them as an ordered list) and are all kept (`a=1&a=1` ≠ `a=1`).

use std::borrow::Cow;

use flightdeck_core::KeyEncoder;

/// A decoded `(name, value)` pair.
type Param<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// Writes the canonical query (count, then name and value of each kept
/// parameter) into `enc`.
pub(crate) fn write_query<const N: usize>(
    enc: &mut KeyEncoder<N>,
    query: Option<&str>,
    ignore: &[Box<[u8]>],
) {
    // No query: no parameters, without splitting anything.
    if query.is_none_or(str::is_empty) {
        enc.push(&0u64.to_le_bytes());
        return;
    }
    let mut params: Vec<Param<'_>> = Vec::new();
    for piece in query.unwrap_or("").split('&') {
        if piece.is_empty() {
            continue;
        }
        let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
        let name = decode(name);
        if ignore.iter().any(|i| **i == *name) {
            continue;
        }
        params.push((name, decode(value)));
    }
    // `sort_by` is stable: repeated names keep their order.
    params.sort_by(|a, b| a.0.cmp(&b.0));
    enc.push(&(params.len() as u64).to_le_bytes());
    for (name, value) in &params {
        enc.push(name);
        enc.push(value);
    }
}

/// Form-urlencoded decoding, borrowing when there is nothing to decode.
pub(crate) fn decode(s: &str) -> Cow<'_, [u8]> {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match (
                bytes.get(i + 1).and_then(hex),
                bytes.get(i + 2).and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                }
                _ => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightdeck_core::Digest;

    fn digest(q: Option<&str>, ignore: &[&str]) -> Digest {
        let ignore: Vec<Box<[u8]>> = ignore.iter().map(|s| s.as_bytes().into()).collect();
        let mut enc = KeyEncoder::new();
        write_query(&mut enc, q, &ignore);
        enc.finish()
    }

    #[test]
    fn empty_query_forms_are_equal() {
        let none = digest(None, &[]);
        assert_eq!(digest(Some(""), &[]), none);
        assert_eq!(digest(Some("&"), &[]), none);
        assert_eq!(digest(Some("&&"), &[]), none);
        assert_eq!(digest(Some("_=1"), &["_"]), none);
        assert_ne!(
            digest(Some("="), &[]),
            none,
            "an empty name is still a parameter"
        );
    }

    #[test]
    fn percent_encoding_variants() {
        assert_eq!(digest(Some("q=%41"), &[]), digest(Some("q=A"), &[]));
        assert_eq!(digest(Some("%71=A"), &[]), digest(Some("q=A"), &[]));
        assert_eq!(digest(Some("q=%2b"), &[]), digest(Some("q=%2B"), &[]));
        assert_eq!(digest(Some("q=a+b"), &[]), digest(Some("q=a%20b"), &[]));
        assert_ne!(digest(Some("q=a+b"), &[]), digest(Some("q=a%2Bb"), &[]));
        // Broken escapes stay literal and never panic.
        assert_eq!(decode("%zz%4").as_ref(), b"%zz%4");
        assert_eq!(decode("%").as_ref(), b"%");
        // Decoded bytes need not be UTF-8.
        assert_eq!(decode("%FF").as_ref(), [0xff]);
        assert_ne!(digest(Some("q=%FF"), &[]), digest(Some("q=%EF%BF%BD"), &[]));
    }

    #[test]
    fn repeated_parameters_keep_order_and_count() {
        assert_ne!(digest(Some("a=1&a=2"), &[]), digest(Some("a=2&a=1"), &[]));
        assert_ne!(digest(Some("a=1&a=1"), &[]), digest(Some("a=1"), &[]));
        assert_eq!(
            digest(Some("a=1&b=x&a=2"), &[]),
            digest(Some("b=x&a=1&a=2"), &[])
        );
    }

    #[test]
    fn name_without_value_equals_empty_value() {
        assert_eq!(digest(Some("a"), &[]), digest(Some("a="), &[]));
        assert_ne!(digest(Some("a"), &[]), digest(Some("a=0"), &[]));
    }

    #[test]
    fn encoded_separators_stay_inside_values() {
        assert_ne!(
            digest(Some("a=x%26b%3Dy"), &[]),
            digest(Some("a=x&b=y"), &[])
        );
    }
}
