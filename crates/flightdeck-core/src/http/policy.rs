//! Which responses may be handed to callers other than the one whose
//! request produced them: the rules HTTP shared caches have followed for
//! decades, read from the response head before anything is buffered.

use http::header::{CACHE_CONTROL, SET_COOKIE, VARY};
use http::{HeaderMap, HeaderName};

use crate::share::Unshareable;

/// What [`HttpShare`](super::HttpShare) does with a response that sets a
/// cookie (`Set-Cookie`).
///
/// A cookie is usually minted for one visitor: a session id, a CSRF token,
/// a consent record. Handing it to anyone else hands them that visitor's
/// session. Shared caches (nginx, Varnish, CDNs) therefore never store such
/// responses unless told to.
///
/// With the `serde` feature this deserializes from `"refuse"`, `"strip"`
/// or `"share"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
#[non_exhaustive]
pub enum SetCookie {
    /// The default: a response with `Set-Cookie` is not shared. Its caller
    /// gets it untouched, every other caller runs its own request (and gets
    /// its own cookie); nothing is stored.
    #[default]
    Refuse,
    /// Share the response, but with every `Set-Cookie` removed from every
    /// copy except the one of the caller whose request produced it.
    ///
    /// **Risk**: the other callers get no cookie at all. That is right when
    /// the cookie is incidental (a tracking or load-balancer cookie the
    /// page does not depend on); it is wrong when the body refers to the
    /// cookie (a CSRF token embedded in a form, a page saying "you are
    /// logged in as"): then the body itself is per visitor and must not be
    /// shared by any setting.
    Strip,
    /// Share the response whole, cookies included.
    ///
    /// **Risk**: every caller that shares the result receives the same
    /// cookie, for as long as the result is replayed (for the stage's
    /// replay TTL, across nodes). Only for cookies that are the same for
    /// everyone (a fixed feature flag, a static locale): never for a
    /// session, a user id or a token.
    Share,
}

/// What [`HttpShare`](super::HttpShare) does with `Cache-Control`.
///
/// With the `serde` feature this deserializes from `"respect"` or
/// `"ignore"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
#[non_exhaustive]
pub enum CacheControl {
    /// The default: a response whose `Cache-Control` has `private`,
    /// `no-store` or `no-cache` is not shared. The origin said it is meant
    /// for one caller (`private`), must not be kept (`no-store`), or must
    /// not be reused without asking it again (`no-cache`).
    #[default]
    Respect,
    /// Decide as if the response had no `Cache-Control`.
    ///
    /// **Risk**: frameworks mark per-user pages `private` or `no-store`
    /// precisely because their body depends on who asks. Ignore the header
    /// only for a route whose handler sets it for browsers' sake while its
    /// body is the same for every caller of the same key (the key's tenant
    /// scope still separates users that present different credentials).
    Ignore,
}

/// Why the head of a response forbids sharing it under this policy, if it
/// does. `Vary` is read separately ([`vary_on`]): it can also make a
/// response shareable with some callers only.
pub(super) fn refusal(
    headers: &HeaderMap,
    set_cookie: SetCookie,
    cache_control: CacheControl,
) -> Option<Unshareable> {
    if set_cookie == SetCookie::Refuse && headers.contains_key(SET_COOKIE) {
        return Some(Unshareable::SetCookie);
    }
    if cache_control == CacheControl::Respect && forbids_sharing(headers) {
        return Some(Unshareable::CacheControl);
    }
    None
}

/// Whether the `Cache-Control` of a response forbids handing it to another
/// caller: one of its directives is `private`, `no-store` or `no-cache`.
///
/// Every `Cache-Control` line is read, as the comma-separated list of
/// directives HTTP defines: directive names are case-insensitive tokens,
/// optionally followed by `=` and a token or a quoted string (which may
/// itself contain commas and directive names, and is never mistaken for
/// one). The qualified forms (`private="Set-Cookie"`,
/// `no-cache="Set-Cookie"`) count like the bare ones: a shared cache may
/// reuse such a response without the named fields, but we do not rewrite
/// responses field by field.
///
/// A line that is not such a list (an unterminated quote, a stray
/// character, bytes that are not text) counts as forbidding: we cannot tell
/// what the origin meant, and running a request twice is cheaper than
/// handing a private response to a stranger.
pub(crate) fn forbids_sharing(headers: &HeaderMap) -> bool {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .any(|line| line_forbids(line.as_bytes()))
}

fn line_forbids(line: &[u8]) -> bool {
    let mut p = Cursor { s: line, at: 0 };
    loop {
        p.skip(|b| is_ows(b) || b == b',');
        if p.at_end() {
            return false;
        }
        let name = p.token();
        if name.is_empty() {
            return true;
        }
        if [&b"private"[..], b"no-store", b"no-cache"]
            .iter()
            .any(|d| name.eq_ignore_ascii_case(d))
        {
            return true;
        }
        p.skip(is_ows);
        if p.eat(b'=') {
            p.skip(is_ows);
            let ok = if p.peek() == Some(b'"') {
                p.quoted_string()
            } else {
                !p.token().is_empty()
            };
            if !ok {
                return true;
            }
            p.skip(is_ows);
        }
        match p.next() {
            None | Some(b',') => {}
            Some(_) => return true,
        }
    }
}

/// What a response's `Vary` says about the requests it may serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum VaryOn {
    /// No `Vary` (or only empty lists): every request of the key.
    Nothing,
    /// `Vary: *`, or a list we cannot read: no other request is known to
    /// match.
    Everything,
    /// Requests whose values of these headers equal the leader's
    /// (lowercase, sorted, without duplicates).
    Names(Box<[HeaderName]>),
}

/// Reads every `Vary` line of a response: comma-separated header names,
/// case-insensitive, with optional whitespace around the commas.
///
/// A member that is not a header name (stray bytes, a quoted string) is
/// read like `*`: the response depends on something we cannot compare.
pub(super) fn vary_on(headers: &HeaderMap) -> VaryOn {
    let mut names = Vec::new();
    for line in headers.get_all(VARY) {
        for member in line.as_bytes().split(|&b| b == b',') {
            let member = member.trim_ascii();
            if member.is_empty() {
                continue;
            }
            if member == b"*" {
                return VaryOn::Everything;
            }
            // `from_bytes` lowercases: `X-Flavor` and `x-flavor` are one name.
            match HeaderName::from_bytes(member) {
                Ok(name) => names.push(name),
                Err(_) => return VaryOn::Everything,
            }
        }
    }
    if names.is_empty() {
        return VaryOn::Nothing;
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    VaryOn::Names(names.into_boxed_slice())
}

/// Whitespace HTTP allows around list separators (`OWS`).
fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Characters of an HTTP `token`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn at_end(&self) -> bool {
        self.at >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> bool {
        let hit = self.peek() == Some(want);
        if hit {
            self.at += 1;
        }
        hit
    }

    fn skip(&mut self, what: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&what) {
            self.at += 1;
        }
    }

    fn token(&mut self) -> &'a [u8] {
        let start = self.at;
        self.skip(is_tchar);
        &self.s[start..self.at]
    }

    /// A `quoted-string` (with `\` escapes); false when it never ends.
    fn quoted_string(&mut self) -> bool {
        if !self.eat(b'"') {
            return false;
        }
        loop {
            match self.next() {
                None => return false,
                Some(b'"') => return true,
                Some(b'\\') => {
                    if self.next().is_none() {
                        return false;
                    }
                }
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: &'static str, lines: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(name, HeaderValue::from_bytes(l).unwrap());
        }
        h
    }

    fn cc(lines: &[&str]) -> bool {
        let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        forbids_sharing(&headers("cache-control", &lines))
    }

    #[test]
    fn cache_control_directives_that_forbid_sharing() {
        for forbid in [
            "private",
            "no-store",
            "no-cache",
            "PRIVATE",
            "No-Store",
            "max-age=60, private",
            "private, max-age=60",
            "public,no-cache",
            "  no-store  ",
            ",,private,,",
            "max-age=60 , no-store",
            "private=\"set-cookie\"",
            "private=\"set-cookie, x-user\", max-age=60",
            "no-cache=\"Set-Cookie\"",
            "no-cache=set-cookie",
            "max-age=\"60\", private",
            "community=\"a\\\"b\", no-store",
        ] {
            assert!(cc(&[forbid]), "{forbid:?} must forbid sharing");
        }
    }

    #[test]
    fn cache_control_directives_that_allow_sharing() {
        for allow in [
            "",
            "public",
            "max-age=60",
            "public, max-age=60, s-maxage=120",
            "must-revalidate",
            "no-transform",
            "privateish",
            "x-private",
            "no-stores",
            "no-cache-please=1",
            // A directive name inside a quoted value is a value, not a
            // directive.
            "community=\"private, no-store\"",
            "ext=\"no-cache\", max-age=5",
            "ext=\"a\\\"private\"",
        ] {
            assert!(!cc(&[allow]), "{allow:?} must allow sharing");
        }
    }

    #[test]
    fn every_cache_control_line_counts() {
        assert!(cc(&["public, max-age=60", "private"]));
        assert!(cc(&["max-age=60", "", "no-store"]));
        assert!(!cc(&["public", "max-age=60"]));
    }

    #[test]
    fn unreadable_cache_control_forbids_sharing() {
        for bad in [
            "max-age=60;",
            "private\"",
            "ext=\"unterminated, max-age=1",
            "ext=\"ends in an escape\\",
            "max-age=",
            "=60",
            "max-age = 60 private",
            "@",
        ] {
            assert!(cc(&[bad]), "{bad:?} is not a directive list");
        }
        let bin = headers("cache-control", &[&[0xff, 0xfe, b'x']]);
        assert!(forbids_sharing(&bin));
        // Non-text bytes inside a quoted value are allowed (obs-text).
        let quoted = headers("cache-control", &[b"ext=\"\xff\", max-age=1"]);
        assert!(!forbids_sharing(&quoted));
    }

    #[test]
    fn set_cookie_and_cache_control_opt_ins() {
        let mut h = headers("set-cookie", &[b"sid=1"]);
        assert_eq!(
            refusal(&h, SetCookie::Refuse, CacheControl::Respect),
            Some(Unshareable::SetCookie)
        );
        assert_eq!(refusal(&h, SetCookie::Strip, CacheControl::Respect), None);
        assert_eq!(refusal(&h, SetCookie::Share, CacheControl::Respect), None);
        h.append(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        assert_eq!(
            refusal(&h, SetCookie::Share, CacheControl::Respect),
            Some(Unshareable::CacheControl)
        );
        assert_eq!(refusal(&h, SetCookie::Share, CacheControl::Ignore), None);
        // An empty Set-Cookie still sets (or clears) a cookie.
        let empty = headers("set-cookie", &[b""]);
        assert_eq!(
            refusal(&empty, SetCookie::Refuse, CacheControl::Ignore),
            Some(Unshareable::SetCookie)
        );
    }

    fn vary(lines: &[&[u8]]) -> VaryOn {
        vary_on(&headers("vary", lines))
    }

    fn names(list: &[&'static str]) -> VaryOn {
        VaryOn::Names(list.iter().map(|n| HeaderName::from_static(n)).collect())
    }

    #[test]
    fn vary_lists() {
        assert_eq!(vary(&[]), VaryOn::Nothing);
        assert_eq!(vary(&[b"", b" , "]), VaryOn::Nothing);
        assert_eq!(vary(&[b"X-Flavor"]), names(&["x-flavor"]));
        assert_eq!(
            vary(&[b"accept-language, X-Flavor", b"x-flavor,Accept"]),
            names(&["accept", "accept-language", "x-flavor"])
        );
        assert_eq!(vary(&[b"\taccept ,  ,accept\t"]), names(&["accept"]));
    }

    #[test]
    fn vary_star_and_unreadable_members_match_nothing() {
        assert_eq!(vary(&[b"*"]), VaryOn::Everything);
        assert_eq!(vary(&[b"accept, *"]), VaryOn::Everything);
        assert_eq!(vary(&[b"accept", b" * "]), VaryOn::Everything);
        assert_eq!(vary(&[b"x flavor"]), VaryOn::Everything);
        assert_eq!(vary(&[b"\"accept\""]), VaryOn::Everything);
        assert_eq!(vary(&[&[0xff, b'a']]), VaryOn::Everything);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn opt_ins_deserialize_from_kebab_case() {
        use serde::de::value::{Error, StrDeserializer};
        use serde::de::IntoDeserializer;
        use serde::Deserialize;
        let de = |s: &'static str| -> StrDeserializer<'static, Error> { s.into_deserializer() };
        assert_eq!(SetCookie::deserialize(de("refuse")), Ok(SetCookie::Refuse));
        assert_eq!(SetCookie::deserialize(de("strip")), Ok(SetCookie::Strip));
        assert_eq!(SetCookie::deserialize(de("share")), Ok(SetCookie::Share));
        assert!(SetCookie::deserialize(de("Strip")).is_err());
        assert_eq!(
            CacheControl::deserialize(de("respect")),
            Ok(CacheControl::Respect)
        );
        assert_eq!(
            CacheControl::deserialize(de("ignore")),
            Ok(CacheControl::Ignore)
        );
        assert!(CacheControl::deserialize(de("no")).is_err());
    }
}
