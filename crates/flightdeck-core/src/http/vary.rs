//! `Vary`: a response that depends on request headers outside its key.
//!
//! A response with `Vary: X-Flavor` was computed for its leader's value of
//! `X-Flavor`. It records (a digest of) that value ([`VaryValues`]) and is
//! handed only to requests with the same value; the others run their own
//! request.
//!
//! Header values are compared in one form everywhere, the form the key
//! extractor hashes them in ([`normalized_values`]), so a header that is
//! both in the key and named by `Vary` can never be judged equal by one and
//! different by the other.

use std::fmt;

use http::header::GetAll;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::key::{Digest, KeyEncoder};

/// The values of one request header in the form flightdeck compares them,
/// in keys and for `Vary`: every line of the header, in the order received,
/// each as its raw bytes.
///
/// Nothing is merged, trimmed or case-folded beyond what the HTTP parser
/// already did (it strips the whitespace around a value): `a, b` on one
/// line and `a` and `b` on two lines, or `gzip` and `GZIP`, are different.
/// That may miss a merge; it never merges requests that a server could
/// tell apart. A non-UTF-8 value is compared byte for byte, never replaced.
/// An absent header has no values, which is not the same as one empty
/// value.
pub fn normalized_values<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers.get_all(name).into_iter().map(HeaderValue::as_bytes)
}

/// A snapshot of the leader's request headers, taken before its request is
/// consumed ([`Serves::leader`](crate::Serves::leader)).
///
/// It is one copy of the header map per flight (values are reference
/// counted, not copied). Its `Debug` shows no values: they include
/// credentials.
#[derive(Clone)]
pub struct LeaderHeaders(pub(super) HeaderMap);

impl LeaderHeaders {
    /// Takes the snapshot.
    pub fn new(headers: &HeaderMap) -> Self {
        Self(headers.clone())
    }
}

impl fmt::Debug for LeaderHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderHeaders")
            .field("len", &self.0.len())
            .finish()
    }
}

/// Appends the values of one header to a digest: the count, then each
/// value (length-prefixed), in [`normalized_values`] form. The key
/// extractor writes the headers it puts in keys this way, and `Vary`
/// compares headers through the same digest.
pub fn push_header_values<const N: usize>(
    enc: &mut KeyEncoder<N>,
    headers: &HeaderMap,
    name: &HeaderName,
) {
    push_values(enc, headers.get_all(name));
}

/// [`push_header_values`] of values already looked up
/// (`headers.get_all(name)`): for a caller that looked first whether there
/// are any.
pub fn push_values<const N: usize>(enc: &mut KeyEncoder<N>, values: GetAll<'_, HeaderValue>) {
    // One lookup of the name, walked twice: the count, then the values.
    enc.push(&(values.iter().count() as u64).to_le_bytes());
    for v in values {
        enc.push(v.as_bytes());
    }
}

/// The digest of one header's values, as `Vary` records and compares them.
fn values_digest(headers: &HeaderMap, name: &HeaderName) -> Digest {
    let mut enc = KeyEncoder::with_domain(b"flightdeck.vary");
    push_header_values(&mut enc, headers, name);
    enc.finish()
}

/// What a shared response remembers of its leader's request headers that
/// it varies on: for each header, a digest of the leader's values (in
/// [`normalized_values`] form). Two requests match when their digests do.
///
/// Result codecs store it with the response, so a result replayed on
/// another node serves the same requests as on the node that made it.
/// Only digests are kept, never the values: a response may vary on a
/// header that carries a credential (`Vary: Authorization`), and those
/// values must not end up in the backend.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct VaryValues {
    // Sorted by name, one entry per name.
    fields: Vec<(HeaderName, Digest)>,
}

impl VaryValues {
    /// No values recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// The digests of the values `headers` has for each of `names`.
    pub fn of<'n>(names: impl IntoIterator<Item = &'n HeaderName>, headers: &HeaderMap) -> Self {
        let mut values = Self::new();
        for name in names {
            values.insert(name.clone(), values_digest(headers, name));
        }
        values
    }

    /// Records the digest of one header's values (replacing an earlier
    /// one): for codecs reading stored values back.
    pub fn insert(&mut self, name: HeaderName, digest: Digest) {
        match self
            .fields
            .binary_search_by(|(n, _)| n.as_str().cmp(name.as_str()))
        {
            Ok(i) => self.fields[i].1 = digest,
            Err(i) => self.fields.insert(i, (name, digest)),
        }
    }

    /// The recorded headers and the digests of their values, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &Digest)> {
        self.fields.iter().map(|(n, d)| (n, d))
    }

    /// The recorded header names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.fields.iter().map(|(n, _)| n)
    }

    /// The number of recorded headers.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether no header is recorded.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Whether `headers` has, for each of `names`, the recorded values. A
    /// name that was not recorded never matches.
    pub(super) fn match_all(&self, names: &[HeaderName], headers: &HeaderMap) -> bool {
        names.iter().all(|name| {
            self.fields
                .binary_search_by(|(n, _)| n.as_str().cmp(name.as_str()))
                .is_ok_and(|i| self.fields[i].1 == values_digest(headers, name))
        })
    }
}

/// Names only.
impl fmt::Debug for VaryValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn map(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn values_match_exactly_absent_on_both_sides_matches() {
        let names = [
            HeaderName::from_static("accept"),
            HeaderName::from_static("x-flavor"),
        ];
        let leader = map(&[("x-flavor", b"vanilla")]);
        let rec = VaryValues::of(&names, &leader);
        assert!(rec.match_all(&names, &map(&[("x-flavor", b"vanilla")])));
        // Absent on one side only: no match.
        assert!(!rec.match_all(&names, &map(&[])));
        assert!(!rec.match_all(
            &names,
            &map(&[("x-flavor", b"vanilla"), ("accept", b"*/*")])
        ));
        assert!(!rec.match_all(&names, &map(&[("x-flavor", b"chocolate")])));
        // An empty value is not an absent header.
        assert!(!rec.match_all(&names, &map(&[("x-flavor", b"vanilla"), ("accept", b"")])));
        // Two lines are not one.
        assert!(!rec.match_all(
            &names,
            &map(&[("x-flavor", b"vanilla"), ("x-flavor", b"vanilla")])
        ));
        // Unrelated headers do not matter.
        assert!(rec.match_all(&names, &map(&[("x-flavor", b"vanilla"), ("x-other", b"1")])));
        // A name that was never recorded never matches.
        let more = [HeaderName::from_static("x-new")];
        assert!(!rec.match_all(&more, &leader));
    }

    #[test]
    fn non_utf8_values_compare_byte_for_byte() {
        let names = [HeaderName::from_static("x-bin")];
        let rec = VaryValues::of(&names, &map(&[("x-bin", &[0xff, 0x80])]));
        assert!(rec.match_all(&names, &map(&[("x-bin", &[0xff, 0x80])])));
        assert!(!rec.match_all(&names, &map(&[("x-bin", &[0xff, 0x81])])));
    }

    #[test]
    fn debug_never_shows_values() {
        let names = [HeaderName::from_static("authorization")];
        let h = map(&[("authorization", b"Bearer secret-token")]);
        let shown = format!(
            "{:?} {:?}",
            VaryValues::of(&names, &h),
            LeaderHeaders::new(&h)
        );
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("authorization"), "{shown}");
    }

    #[test]
    fn insert_keeps_names_sorted_and_unique() {
        let d = |b: &[u8]| KeyEncoder::new().field(b).finish();
        let mut v = VaryValues::new();
        v.insert(HeaderName::from_static("b"), d(b"1"));
        v.insert(HeaderName::from_static("a"), d(b"0"));
        v.insert(HeaderName::from_static("b"), d(b"2"));
        let got: Vec<_> = v.iter().map(|(n, x)| (n.as_str(), *x)).collect();
        assert_eq!(got, [("a", d(b"0")), ("b", d(b"2"))]);
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn the_digest_is_of_every_value_length_prefixed() {
        // `a,b` on one line, `a` and `b` on two, and `ab` differ.
        let one = map(&[("x", b"a,b")]);
        let two = map(&[("x", b"a"), ("x", b"b")]);
        let glued = map(&[("x", b"ab")]);
        let x = HeaderName::from_static("x");
        let all: BTreeSet<_> = [&one, &two, &glued, &map(&[])]
            .iter()
            .map(|h| values_digest(h, &x))
            .collect();
        assert_eq!(all.len(), 4);
    }
}
