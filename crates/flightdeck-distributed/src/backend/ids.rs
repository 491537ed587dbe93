//! The names of flights and owners.

use std::fmt;
use std::hash::{Hash, Hasher};

use flightdeck_core::{Digest, FlightKey};

/// The name of one flight in the backend: the flight digest of its key
/// ([`FlightKey::flight_digest`]). Never contains raw input.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FlightId(Digest);

/// By the digest's first 8 bytes, as [`FlightKey`] hashes: a digest's
/// bytes are uniform already, and hashing 8 bytes instead of 32 is what
/// a map of flights costs.
impl Hash for FlightId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let d = self.0.as_bytes();
        state.write_u64(u64::from_le_bytes([
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ]));
    }
}

impl FlightId {
    /// The id of a key's flight.
    pub fn of(key: &FlightKey) -> Self {
        Self(key.flight_digest())
    }

    /// Wraps a digest computed elsewhere.
    pub const fn from_digest(digest: Digest) -> Self {
        Self(digest)
    }

    /// The digest.
    pub fn digest(&self) -> &Digest {
        &self.0
    }

    /// The digest as 64 hex characters (the `{h}` of Redis key names).
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }
}

impl fmt::Debug for FlightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FlightId({})", self.0.short())
    }
}

impl fmt::Display for FlightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.short(), f)
    }
}

/// A random token naming one attempt to own a flight. Retries of the same
/// attempt reuse it, which is what makes acquire and commit idempotent.
///
/// Two tokens are equal when their texts are.
#[derive(Clone)]
pub struct OwnerToken(Text);

/// A token's text.
#[derive(Clone)]
enum Text {
    /// Drawn here ([`OwnerToken::random`]): 32 lowercase hex digits, held
    /// inline, so that drawing a token and copying it (into the owner's
    /// fencing token, its settling) allocates nothing.
    Drawn([u8; 32]),
    /// Given ([`OwnerToken::from_string`]), or none yet (empty).
    Given(String),
}

/// The hex digits, by value.
const HEX: &[u8; 16] = b"0123456789abcdef";

impl OwnerToken {
    /// A fresh random token (128 bits, hex; drawn through
    /// `flightdeck_core::random`, seeded under simulation).
    pub fn random() -> Self {
        let v = flightdeck_core::random::u128();
        // The same 32 lowercase digits as `format!("{v:032x}")`, most
        // significant first, written in place (one per owner flight).
        let mut digits = [0u8; 32];
        for (i, d) in digits.iter_mut().enumerate() {
            *d = HEX[((v >> (124 - 4 * i)) & 0xf) as usize];
        }
        Self(Text::Drawn(digits))
    }

    /// A token from a string (tests, or callers with their own ids). Must be
    /// non-empty ASCII without `|`; invalid input gets a random token.
    pub fn from_string(s: impl Into<String>) -> Self {
        let s = s.into();
        if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic() && b != b'|') {
            return Self::random();
        }
        Self(Text::Given(s))
    }

    /// The token text's bytes, for a backend that writes them as they are
    /// (no UTF-8 check of a drawn token's digits, which
    /// [`as_str`](Self::as_str) makes).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Text::Drawn(digits) => digits,
            Text::Given(s) => s.as_bytes(),
        }
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Hex digits only: always UTF-8.
            Text::Drawn(digits) => std::str::from_utf8(digits).unwrap_or_default(),
            Text::Given(s) => s,
        }
    }
}

impl PartialEq for OwnerToken {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for OwnerToken {}

impl Hash for OwnerToken {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As its text (a `str`) hashes: the bytes, then 0xff.
        state.write(self.as_bytes());
        state.write_u8(0xff);
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.as_str();
        write!(f, "OwnerToken({})", &s[..s.len().min(8)])
    }
}

/// The fencing token of an owner: put into the request's extensions so the
/// handler can guard its own downstream writes (reject writes carrying a
/// lower generation than one already seen).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FencingToken {
    /// Increases on every grant of the flight, takeovers included.
    pub generation: u64,
    /// The owner's token for this attempt.
    pub owner: OwnerToken,
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn tokens_are_random_and_validated() {
        assert_ne!(OwnerToken::random(), OwnerToken::random());
        assert_eq!(OwnerToken::random().as_str().len(), 32);
        for _ in 0..64 {
            let t = OwnerToken::random();
            let v = u128::from_str_radix(t.as_str(), 16).unwrap();
            assert_eq!(t.as_str(), format!("{v:032x}"));
        }
        assert_eq!(OwnerToken::from_string("node-1").as_str(), "node-1");
        // A drawn token equals (and hashes as) the same text given.
        let drawn = OwnerToken::random();
        let given = OwnerToken::from_string(drawn.as_str());
        assert_eq!(drawn, given);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&drawn), state.hash_one(&given));
        assert_eq!(state.hash_one(&drawn), state.hash_one(drawn.as_str()));
        assert_eq!(drawn.as_bytes(), drawn.as_str().as_bytes());
        assert_ne!(OwnerToken::from_string("a|b").as_str(), "a|b");
        assert_ne!(OwnerToken::from_string("").as_str(), "");
    }
}
