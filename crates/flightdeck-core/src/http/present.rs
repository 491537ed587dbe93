//! [`Present`]: which of a few header names a map has, found in one walk
//! over its names when the map is small.

use http::{HeaderMap, HeaderName, HeaderValue};

/// Maps with at most this many names are walked once; larger ones get a
/// lookup per name asked about. A lookup hashes the name and probes; a
/// walk compares each of the map's names with each asked-about one, so it
/// is the cheaper of the two only while the map is small (as the heads of
/// the usual responses, and of requests from API clients, are).
const WALK_AT_MOST: usize = 8;

/// Which of `names` (at most 64) a header map has: asked by index into the
/// names it was built with. Built once per map, it answers several
/// questions for one walk over the map's names, where each
/// `HeaderMap::contains_key` hashes and probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Present {
    /// Bit `i` set when `names[i]` is in the map; `None` when the map was
    /// too large to walk (or the names too many), and each question is a
    /// lookup.
    mask: Option<u64>,
}

impl Present {
    /// Which of `names` `headers` has.
    pub fn of(headers: &HeaderMap, names: &[HeaderName]) -> Self {
        if headers.keys_len() > WALK_AT_MOST || names.len() > 64 {
            return Self { mask: None };
        }
        let mut mask = 0u64;
        for key in headers.keys() {
            for (i, name) in names.iter().enumerate() {
                if key == name {
                    mask |= 1 << i;
                }
            }
        }
        Self { mask: Some(mask) }
    }

    /// Whether the map has `name`, the `i`-th of the names this was built
    /// with (`headers` is that map: it is asked when the map was not
    /// walked).
    #[inline]
    pub fn has(&self, i: usize, name: &HeaderName, headers: &HeaderMap) -> bool {
        match self.mask {
            Some(mask) => i < 64 && mask >> i & 1 == 1,
            None => headers.contains_key(name),
        }
    }

    /// Whether the walk found the map without the `i`-th name: `false`
    /// when it has it, and when the map was not walked (for a caller that
    /// looks the name up anyway, for its values).
    #[inline]
    pub fn known_absent(&self, i: usize) -> bool {
        match self.mask {
            Some(mask) => i >= 64 || mask >> i & 1 == 0,
            None => false,
        }
    }

    /// The first value of the `i`-th name (`name`) in `headers`, the map
    /// this was built with: no lookup when the walk found none.
    #[inline]
    pub fn get<'h>(
        &self,
        i: usize,
        name: &HeaderName,
        headers: &'h HeaderMap,
    ) -> Option<&'h HeaderValue> {
        if self.known_absent(i) {
            None
        } else {
            headers.get(name)
        }
    }

    /// Whether the map has any of `names` (the names this was built with).
    #[inline]
    pub fn any(&self, names: &[HeaderName], headers: &HeaderMap) -> bool {
        match self.mask {
            Some(mask) => mask != 0,
            None => names.iter().any(|n| headers.contains_key(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{ACCEPT, CONTENT_TYPE, SET_COOKIE, VARY};

    const NAMES: [HeaderName; 4] = [SET_COOKIE, VARY, CONTENT_TYPE, ACCEPT];

    fn map(n_extra: usize, with: &[HeaderName]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for i in 0..n_extra {
            let name = HeaderName::from_bytes(format!("x-extra-{i}").as_bytes()).unwrap();
            m.insert(name, HeaderValue::from_static("v"));
        }
        for name in with {
            m.append(name.clone(), HeaderValue::from_static("a"));
            m.append(name.clone(), HeaderValue::from_static("b"));
        }
        m
    }

    /// Walked (small maps) or looked up (large ones), the answers are the
    /// map's own.
    #[test]
    fn answers_as_lookups_do_for_small_and_large_maps() {
        let subsets: [&[HeaderName]; 4] = [&[], &[VARY], &[SET_COOKIE, ACCEPT], &NAMES];
        for extra in [0, 3, WALK_AT_MOST, WALK_AT_MOST + 5] {
            for with in subsets {
                let m = map(extra, with);
                let p = Present::of(&m, &NAMES);
                assert_eq!(p.mask.is_some(), m.keys_len() <= WALK_AT_MOST);
                // A walked map answers every name from the walk.
                if p.mask.is_some() {
                    for (i, name) in NAMES.iter().enumerate() {
                        assert_eq!(p.known_absent(i), !m.contains_key(name));
                    }
                }
                for (i, name) in NAMES.iter().enumerate() {
                    assert_eq!(
                        p.has(i, name, &m),
                        m.contains_key(name),
                        "{name} of {with:?}"
                    );
                    assert_eq!(p.get(i, name, &m), m.get(name), "{name} of {with:?}");
                    if p.known_absent(i) {
                        assert!(!m.contains_key(name), "{name} of {with:?}");
                    }
                }
                assert_eq!(p.any(&NAMES, &m), !with.is_empty(), "{with:?}");
            }
        }
    }

    /// Names are compared whole: a longer one, or one of the same length
    /// (custom or standard), is another name.
    #[test]
    fn names_are_compared_whole() {
        let names = [HeaderName::from_static("x-api-key"), SET_COOKIE];
        for other in ["x-api-keys", "x-api-kez", "x-set-cook"] {
            let m = map(0, &[HeaderName::from_static(other)]);
            assert!(!Present::of(&m, &names).any(&names, &m), "{other}");
        }
        let m = map(0, &names[..1]);
        let p = Present::of(&m, &names);
        assert!(p.has(0, &names[0], &m));
        assert!(p.known_absent(1));
    }
}
