//! Flight keys: who may share a result.
//!
//! A [`FlightKey`] names one unit of work. Two requests with equal keys are
//! collapsed into one execution, so the key decides who may see whose result.
//! It is made of a [`StageName`] (the kind of work, e.g. `"score"`), an
//! optional tenant [`Digest`] (the scope: requests of different tenants never
//! share) and the [`Digest`] of the request's meaningful fields.
//!
//! Keys never show raw user input: scope and request are named by 32-byte
//! BLAKE3 digests, so a key is safe to put into Redis key names, logs and
//! metrics. (A key made with [`KeyEncoder::finish_key_lazy`] keeps the
//! encoded fields in memory until its digest is asked for, and compares
//! them in the process; it shows and sends only the digest.)
//! [`KeyEncoder`] builds digests from fields with a length-prefixed, versioned
//! encoding, so that `("ab", "c")` and `("a", "bc")` never collide and a future
//! change of the encoding never collides with today's keys.
//!
//! ```
//! use flightdeck_core::{FlightKey, KeyEncoder, StageName};
//!
//! let stage = StageName::new("score").unwrap();
//! let key = KeyEncoder::new()
//!     .field(b"GET")
//!     .field(b"/v1/score")
//!     .finish_key(stage, None);
//! assert_eq!(key.stage().as_str(), "score");
//! // Display never shows raw input, only the stage and a short digest.
//! assert!(key.to_string().starts_with("score/"));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Maximum length of a stage name, in bytes.
pub const MAX_STAGE_NAME_LEN: usize = 64;

/// Most distinct stage names one process may create (see [`StageName`]).
pub const MAX_STAGE_NAMES: usize = 4096;
// Spelled out in the error of the name past the bound.
const _: () = assert!(MAX_STAGE_NAMES == 4096);

/// The name of a stage: a kind of work with its own policy (e.g. `"score"`,
/// `"report"`).
///
/// Stage names appear in metric labels and Redis key names, so they are
/// restricted to 1–64 ASCII letters, digits, `_`, `-` and `.`.
///
/// Names are interned: each distinct name is stored once for the life of
/// the process, so a `StageName` is a pointer. Cloning, dropping and
/// comparing one touch no reference count and read no bytes, which matters
/// on a path that clones the key of every request. Stage names are a fixed
/// set, like metric names (they are metric label values), so a process may
/// create at most [`MAX_STAGE_NAMES`] distinct ones; past that,
/// [`StageName::new`] refuses new names (names already known still work).
// A thin pointer (to the interned name's `&str`): one word, so a key that
// holds a stage moves in one word less than with the `&str` itself.
#[derive(Clone)]
pub struct StageName(&'static &'static str);

/// The interned names.
static NAMES: std::sync::RwLock<BTreeMap<&'static str, &'static &'static str>> =
    std::sync::RwLock::new(BTreeMap::new());

impl StageName {
    /// Validates and creates a stage name.
    pub fn new(name: impl AsRef<str>) -> Result<Self, InvalidStageName> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(InvalidStageName::new(name, "is empty"));
        }
        if name.len() > MAX_STAGE_NAME_LEN {
            return Err(InvalidStageName::new(name, "is longer than 64 bytes"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(InvalidStageName::new(
                name,
                "may only contain ASCII letters, digits, '_', '-' and '.'",
            ));
        }
        // A panic elsewhere cannot leave the set half-changed: a poisoned
        // lock is still a valid set.
        if let Some(&known) = NAMES.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(Self(known));
        }
        let mut names = NAMES.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = names.get(name) {
            return Ok(Self(known));
        }
        if names.len() >= MAX_STAGE_NAMES {
            return Err(InvalidStageName::new(
                name,
                "is one too many: a process keeps at most 4096 distinct stage names \
                 (stage names are a fixed set, like metric names, not request data)",
            ));
        }
        let interned: &'static str = Box::leak(name.into());
        let thin: &'static &'static str = Box::leak(Box::new(interned));
        names.insert(interned, thin);
        Ok(Self(thin))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

// Interned: equal names are the same pointer.
impl PartialEq for StageName {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for StageName {}

// By identity, as equality is: one word to hash on every request's stage
// lookup. (Only in-process maps hash a stage; keys that leave the process
// are digests of the name's bytes.)
impl std::hash::Hash for StageName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(std::ptr::from_ref(self.0) as usize);
    }
}

impl PartialOrd for StageName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StageName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for StageName {
    type Err = InvalidStageName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<&str> for StageName {
    type Error = InvalidStageName;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

/// A stage name was rejected by [`StageName::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidStageName {
    // Escaped and truncated so the error itself is safe to log.
    name: String,
    reason: &'static str,
}

impl InvalidStageName {
    fn new(name: &str, reason: &'static str) -> Self {
        let name: String = name
            .chars()
            .take(80)
            .collect::<String>()
            .escape_debug()
            .to_string();
        Self { name, reason }
    }
}

impl fmt::Display for InvalidStageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid stage name \"{}\": {}", self.name, self.reason)
    }
}

impl std::error::Error for InvalidStageName {}

/// A 32-byte BLAKE3 digest.
// Aligned to 8 so that the keys holding it move in whole words (byte-aligned,
// an `Option<Digest>` put the digest at an odd offset, and every move of a
// key became unaligned copies).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(align(8))]
pub struct Digest([u8; 32]);

impl Digest {
    /// Wraps raw digest bytes (e.g. computed elsewhere).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The full digest as 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        self.hex().iter().copied().map(char::from).collect()
    }

    /// The ASCII bytes of [`to_hex`](Self::to_hex), without an allocation
    /// (to write the digest into a buffer of one's own).
    ///
    /// ```
    /// let d = flightdeck_core::Digest::from_bytes([0xab; 32]);
    /// assert_eq!(&d.hex()[..], d.to_hex().as_bytes());
    /// ```
    pub fn hex(&self) -> [u8; 64] {
        let mut out = [0; 64];
        // 64 = 2 × 32: the one error (a wrong length) cannot happen.
        let _ = hex::encode_to_slice(self.0, &mut out);
        out
    }

    /// The first 6 bytes as 12 hex characters: enough to tell keys apart in
    /// logs, too short to be used to guess the input.
    pub fn short(&self) -> ShortDigest {
        ShortDigest(*self)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

/// Displays the first 12 hex characters of a [`Digest`].
#[derive(Clone, Copy)]
pub struct ShortDigest(Digest);

impl fmt::Display for ShortDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0; 12];
        // 12 = 2 × 6, and hex digits are ASCII: neither error can happen.
        let _ = hex::encode_to_slice(&self.0 .0[..6], &mut out);
        f.write_str(std::str::from_utf8(&out).unwrap_or_default())
    }
}

impl fmt::Debug for ShortDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The identity of one unit of coalescable work.
///
/// Equal keys share one execution. A key is a stage, an optional scope
/// and the request's identity, which is one of:
///
/// - the [`Digest`] of the request's fields ([`FlightKey::new`],
///   [`KeyEncoder::finish_key`]);
/// - the encoded fields themselves ([`KeyEncoder::finish_key_lazy`]): the
///   digest is computed on the first call of [`digest`](Self::digest) (or
///   [`flight_digest`](Self::flight_digest), `Display`, `Debug`), which a
///   flight that never leaves the process (LOCAL_ONLY) never makes. The
///   bytes, at most the encoder's buffer, are shared by the key's clones
///   (behind an `Arc`), and so is the digest once computed.
///
/// Either way cloning touches no raw input. `Eq` compares everything: the
/// digests of two digest keys, the bytes of two keys of fields (so two
/// different requests never share, whatever their digests). A key of
/// fields never equals a digest key, even over the same fields: make the
/// keys of one stage one way (their [`digest`](Self::digest)s, and so their
/// flights in shared stores, are the same either way). `Hash` feeds 8
/// bytes to the hasher: of a digest (a BLAKE3 output, already uniform),
/// or the fields' hash, taken once when the key is made with a seed of
/// the process (requests, the attacker's input, cannot be made to collide
/// without it).
// `Clone` by hand (see its impl).
#[derive(PartialEq, Eq)]
pub struct FlightKey {
    stage: StageName,
    scope: Option<Digest>,
    /// A digest key's digest. A key of fields keeps its fields' 64-bit
    /// hash in the first 8 bytes (zeros after): hashing and comparing a
    /// key reads this field alike for both kinds, with no branch on the
    /// path of a digest key.
    id: Digest,
    /// A key of fields: its fields, their digest computed when first
    /// asked for.
    fields: Option<Arc<Fields>>,
}

// The fields' reference count first, then the rest read from `self`
// straight into the clone. Derived, the other fields were read first and
// the count taken last: the atomic increment kept the compiler from moving
// those reads past it, so every clone went through a copy on the stack
// (on L1's path a request's key is cloned twice: by the key source, into
// the flight's slot).
impl Clone for FlightKey {
    #[inline]
    fn clone(&self) -> Self {
        let fields = self.fields.clone();
        Self {
            stage: self.stage.clone(),
            scope: self.scope,
            id: self.id,
            fields,
        }
    }
}

struct Fields {
    /// The encoding the digest is the BLAKE3 hash of.
    bytes: Box<[u8]>,
    digest: OnceLock<Digest>,
}

impl Fields {
    fn digest(&self) -> &Digest {
        self.digest
            .get_or_init(|| Digest(*blake3::hash(&self.bytes).as_bytes()))
    }
}

// By their bytes (`Arc`'s `Eq` tries the pointer first).
impl PartialEq for Fields {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Fields {}

/// The 64-bit hash of a key's fields, seeded once per process.
fn fields_hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SEED: OnceLock<foldhash::fast::RandomState> = OnceLock::new();
    SEED.get_or_init(Default::default).hash_one(bytes)
}

impl FlightKey {
    /// Builds a key from its parts.
    pub fn new(stage: StageName, scope: Option<Digest>, digest: Digest) -> Self {
        Self {
            stage,
            scope,
            id: digest,
            fields: None,
        }
    }

    /// Shortcut for tests and simple services: the digest of one opaque
    /// byte string, no scope.
    pub fn from_bytes(stage: StageName, bytes: impl AsRef<[u8]>) -> Self {
        KeyEncoder::new()
            .field(bytes.as_ref())
            .finish_key(stage, None)
    }

    /// The stage this work belongs to.
    pub fn stage(&self) -> &StageName {
        &self.stage
    }

    /// The tenant scope, if any.
    pub fn scope(&self) -> Option<&Digest> {
        self.scope.as_ref()
    }

    /// The digest of the request's fields (of a key of fields, computed on
    /// the first call).
    pub fn digest(&self) -> &Digest {
        match &self.fields {
            None => &self.id,
            Some(f) => f.digest(),
        }
    }

    /// Whether the digest is known without hashing: a digest key, or a key
    /// of fields whose digest was asked for already.
    pub fn has_digest(&self) -> bool {
        self.fields
            .as_ref()
            .is_none_or(|f| f.digest.get().is_some())
    }

    /// Whether the key keeps the request's fields (made by
    /// [`KeyEncoder::finish_key_lazy`]): it owns memory of its own, which a
    /// digest key does not (dropping one frees nothing).
    pub fn keeps_fields(&self) -> bool {
        self.fields.is_some()
    }

    /// One digest over stage, scope and request digest: the name of this
    /// flight in shared stores (e.g. the `{h}` of Redis key names).
    pub fn flight_digest(&self) -> Digest {
        let mut enc = KeyEncoder::with_domain(b"flightdeck.flight");
        enc.push(self.stage.as_str().as_bytes());
        match &self.scope {
            Some(s) => {
                enc.push(b"s");
                enc.push(s.as_bytes());
            }
            None => enc.push(b"-"),
        }
        enc.push(self.digest().as_bytes());
        enc.finish()
    }
}

impl std::hash::Hash for FlightKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let d = &self.id.0;
        state.write_u64(u64::from_le_bytes([
            d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
        ]));
    }
}

impl fmt::Display for FlightKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.stage, self.digest().short())
    }
}

impl fmt::Debug for FlightKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightKey")
            .field("stage", &self.stage)
            .field("scope", &self.scope.map(|s| s.short()))
            .field("digest", &self.digest().short())
            .finish()
    }
}

/// Version of the field encoding. Bumping it changes every digest, so a new
/// encoding never collides with keys written by an older one.
pub const KEY_ENCODING_VERSION: u8 = 1;

/// Builds a [`Digest`] from a sequence of fields.
///
/// Each field is written as its length (u64, little endian) followed by its
/// bytes, after a versioned domain prefix. Different field lists therefore
/// always produce different hash inputs.
///
/// The bytes are gathered in a buffer of `N` bytes (192 by default) and
/// hashed in one call when the key is finished; only a key larger than the
/// buffer (a body, say) streams through a hasher (the digest is the same
/// either way, whatever `N`). A larger buffer suits keys that are larger
/// as a rule (an HTTP request's head: [`KeyEncoder::buffered`]); it costs
/// its size to set up and to move, so the default stays small.
#[derive(Clone)]
pub struct KeyEncoder<const N: usize = 192> {
    /// What was written and not hashed yet.
    buf: [u8; N],
    len: usize,
    /// The hasher, once the input outgrew the buffer (boxed: keys that fit
    /// in the buffer, the usual case, never build one, and the encoder
    /// stays small to move).
    hasher: Option<Box<blake3::Hasher>>,
}

impl KeyEncoder {
    /// A new encoder in the default domain (`flightdeck.key`).
    #[inline]
    pub fn new() -> Self {
        Self::with_domain(b"flightdeck.key")
    }

    /// A new encoder in a caller-chosen domain: digests from different
    /// domains never collide.
    #[inline]
    pub fn with_domain(domain: &[u8]) -> Self {
        Self::buffered(domain)
    }
}

impl<const N: usize> KeyEncoder<N> {
    /// [`KeyEncoder::with_domain`], gathering up to `N` bytes before it
    /// starts hashing them (`KeyEncoder::<512>::buffered(domain)`). The
    /// digest does not depend on `N`.
    #[inline]
    pub fn buffered(domain: &[u8]) -> Self {
        let mut enc = Self {
            buf: [0; N],
            len: 0,
            hasher: None,
        };
        enc.write(&[KEY_ENCODING_VERSION]);
        enc.write(&(domain.len() as u64).to_le_bytes());
        enc.write(domain);
        enc
    }

    /// Writes raw bytes (no length prefix).
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= N {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        } else {
            self.spill(bytes);
        }
    }

    /// Hashes the buffer and `bytes`: the input outgrew the buffer.
    #[cold]
    fn spill(&mut self, bytes: &[u8]) {
        let hasher = self.hasher.get_or_insert_with(Default::default);
        hasher.update(&self.buf[..self.len]);
        self.len = 0;
        hasher.update(bytes);
    }

    /// Appends one length-prefixed field.
    #[must_use]
    #[inline]
    pub fn field(mut self, bytes: &[u8]) -> Self {
        self.push(bytes);
        self
    }

    /// Appends one length-prefixed field in place.
    #[inline]
    pub fn push(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// Appends one field whose content arrives in pieces (e.g. a body in
    /// frames). `len` must be the total length of the pieces.
    pub fn push_parts<'a>(&mut self, len: u64, parts: impl IntoIterator<Item = &'a [u8]>) {
        self.write(&len.to_le_bytes());
        for p in parts {
            self.write(p);
        }
    }

    /// Appends fields encoded ahead of time ([`EncodedFields`]) in one
    /// write: the same digest as pushing each of them in turn.
    #[inline]
    pub fn push_encoded(&mut self, fields: &EncodedFields) {
        self.write(&fields.0);
    }

    /// The digest of everything written so far.
    #[inline]
    pub fn finish(&self) -> Digest {
        let pending = &self.buf[..self.len];
        let hash = match &self.hasher {
            None => blake3::hash(pending),
            Some(h) => {
                let mut h = blake3::Hasher::clone(h);
                h.update(pending);
                h.finalize()
            }
        };
        Digest(*hash.as_bytes())
    }

    /// Finishes into a [`FlightKey`].
    #[inline]
    pub fn finish_key(&self, stage: StageName, scope: Option<Digest>) -> FlightKey {
        FlightKey::new(stage, scope, self.finish())
    }

    /// Finishes into a [`FlightKey`] of fields: the key keeps what was
    /// written (at most `N` bytes) and hashes it only when its
    /// [`digest`](FlightKey::digest) is first asked for, which a flight
    /// that stays in the process never does. Written past the buffer (the
    /// input was being hashed already), it is [`finish_key`](Self::finish_key).
    ///
    /// Such a key never equals a key made by `finish_key`, even over the
    /// same fields (see [`FlightKey`]), and its digest is the same:
    ///
    /// ```
    /// use flightdeck_core::{KeyEncoder, StageName};
    ///
    /// let stage = StageName::new("score").unwrap();
    /// let enc = KeyEncoder::new().field(b"GET").field(b"/v1/score");
    /// let lazy = enc.finish_key_lazy(stage.clone(), None);
    /// assert!(!lazy.has_digest());
    /// assert_eq!(lazy, enc.finish_key_lazy(stage.clone(), None));
    /// assert_eq!(lazy.digest(), enc.finish_key(stage, None).digest());
    /// ```
    #[inline]
    pub fn finish_key_lazy(&self, stage: StageName, scope: Option<Digest>) -> FlightKey {
        if self.hasher.is_some() {
            return self.finish_key(stage, scope);
        }
        let bytes = &self.buf[..self.len];
        let mut id = [0; 32];
        id[..8].copy_from_slice(&fields_hash(bytes).to_le_bytes());
        FlightKey {
            stage,
            scope,
            id: Digest(id),
            fields: Some(Arc::new(Fields {
                bytes: bytes.into(),
                digest: OnceLock::new(),
            })),
        }
    }
}

/// A run of fields in [`KeyEncoder`]'s encoding (each its length, then
/// its bytes), made once and appended to many keys with
/// [`KeyEncoder::push_encoded`] in one write: for fields most keys share,
/// such as the names of key headers a request does not carry and their
/// zero counts. Only whole fields go in, so the encoding stays
/// length-prefixed.
///
/// ```
/// use flightdeck_core::key::EncodedFields;
/// use flightdeck_core::KeyEncoder;
///
/// let mut fields = EncodedFields::new();
/// fields.push(b"accept");
/// fields.push(&0u64.to_le_bytes());
/// let mut enc = KeyEncoder::new();
/// enc.push_encoded(&fields);
/// let one_by_one = KeyEncoder::new().field(b"accept").field(&0u64.to_le_bytes());
/// assert_eq!(enc.finish(), one_by_one.finish());
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EncodedFields(Vec<u8>);

impl EncodedFields {
    /// No fields.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one length-prefixed field.
    pub fn push(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }
}

impl fmt::Debug for EncodedFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedFields")
            .field("bytes", &self.0.len())
            .finish()
    }
}

impl Default for KeyEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Debug for KeyEncoder<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEncoder").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage() -> StageName {
        StageName::new("score").unwrap()
    }

    #[test]
    fn stage_names_are_validated() {
        assert!(StageName::new("ai.score-v2_x").is_ok());
        assert!(StageName::new("")
            .unwrap_err()
            .to_string()
            .contains("is empty"));
        assert!(StageName::new("a b").is_err());
        assert!(StageName::new("é").is_err());
        assert!(StageName::new("x".repeat(65)).is_err());
        let err = StageName::new("bad\nname").unwrap_err().to_string();
        assert!(!err.contains('\n'), "error must be log-safe: {err}");
    }

    /// A stage is one thin pointer, so a key moves in 88 bytes: 8 for the
    /// stage, 40 for the optional scope, 32 for the digest, 8 for the
    /// fields. (The stage's `&str`, two words, made it 96.)
    #[test]
    fn a_stage_is_one_word_and_a_key_88_bytes() {
        assert_eq!(std::mem::size_of::<StageName>(), 8);
        assert_eq!(std::mem::size_of::<FlightKey>(), 88);
    }

    #[test]
    fn stage_names_are_interned_and_ordered_by_name() {
        let a = StageName::new("interned-b").unwrap();
        let b = StageName::new(String::from("interned-b")).unwrap();
        let c = StageName::new("interned-a").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "interned-b");
        assert_ne!(a, c);
        assert!(c < a);
        assert_eq!(format!("{a} {a:?}"), "interned-b \"interned-b\"");
    }

    #[test]
    fn length_prefix_prevents_concatenation_collisions() {
        let a = KeyEncoder::new().field(b"ab").field(b"c").finish();
        let b = KeyEncoder::new().field(b"a").field(b"bc").finish();
        let c = KeyEncoder::new().field(b"abc").finish();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
    }

    #[test]
    fn push_parts_equals_single_field() {
        let mut e = KeyEncoder::new();
        e.push_parts(6, [&b"abc"[..], &b"def"[..]]);
        assert_eq!(e.finish(), KeyEncoder::new().field(b"abcdef").finish());
    }

    /// The encoding is specified, not an accident of the implementation:
    /// version byte, domain length and domain, then each field's length and
    /// bytes, hashed with BLAKE3. Any optimisation must keep every digest.
    #[test]
    fn digest_is_blake3_of_the_specified_encoding() {
        let big = vec![7u8; 3000];
        let fields: [&[u8]; 5] = [b"GET", b"", &big, b"/v1/score", &[0xff; 600]];
        let mut raw = vec![KEY_ENCODING_VERSION];
        raw.extend_from_slice(&5u64.to_le_bytes());
        raw.extend_from_slice(b"dom.x");
        let mut enc = KeyEncoder::with_domain(b"dom.x");
        for f in fields {
            raw.extend_from_slice(&(f.len() as u64).to_le_bytes());
            raw.extend_from_slice(f);
            enc.push(f);
        }
        for _ in 0..300 {
            raw.extend_from_slice(&2u64.to_le_bytes());
            raw.extend_from_slice(b"ab");
            enc.push(b"ab");
        }
        assert_eq!(enc.finish().as_bytes(), blake3::hash(&raw).as_bytes());
    }

    /// Small keys (hashed from the buffer in one call), and writes that
    /// end exactly at, or cross, the buffer's end, give the specified
    /// digest too.
    #[test]
    fn buffered_and_spilled_keys_give_the_specified_digest() {
        for n in [0usize, 1, 100, 160, 161, 166, 167, 168, 191, 192, 193, 400] {
            let field = vec![b'k'; n];
            let mut raw = vec![KEY_ENCODING_VERSION];
            raw.extend_from_slice(&14u64.to_le_bytes());
            raw.extend_from_slice(b"flightdeck.key");
            raw.extend_from_slice(&(n as u64).to_le_bytes());
            raw.extend_from_slice(&field);
            raw.extend_from_slice(&2u64.to_le_bytes());
            raw.extend_from_slice(b"ab");
            let enc = KeyEncoder::new().field(&field).field(b"ab");
            assert_eq!(
                enc.finish().as_bytes(),
                blake3::hash(&raw).as_bytes(),
                "{n}"
            );
            // Finishing does not consume: more fields can follow.
            let more = enc.field(b"c").finish();
            raw.extend_from_slice(&1u64.to_le_bytes());
            raw.push(b'c');
            assert_eq!(more.as_bytes(), blake3::hash(&raw).as_bytes(), "{n} + c");
        }
    }

    /// A flight's digest (the name of its records in shared stores) is
    /// specified as well: nodes of different versions must agree on it.
    #[test]
    fn flight_digest_is_blake3_of_the_specified_encoding() {
        let scope = KeyEncoder::new().field(b"tenant").finish();
        for scope in [None, Some(scope)] {
            let key = FlightKey::new(stage(), scope, KeyEncoder::new().field(b"q").finish());
            let mut raw = vec![KEY_ENCODING_VERSION];
            let mut field = |bytes: &[u8]| {
                raw.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                raw.extend_from_slice(bytes);
            };
            field(b"flightdeck.flight");
            field(b"score");
            match &scope {
                Some(s) => {
                    field(b"s");
                    field(s.as_bytes());
                }
                None => field(b"-"),
            }
            field(key.digest().as_bytes());
            assert_eq!(
                key.flight_digest().as_bytes(),
                blake3::hash(&raw).as_bytes()
            );
        }
    }

    /// Fields appended in one write give the digest of the same fields
    /// pushed one by one, in a small buffer and across its end.
    #[test]
    fn encoded_fields_give_the_digest_of_their_fields() {
        for n in [0usize, 10, 150, 400] {
            let head = vec![b'h'; n];
            let mut fields = EncodedFields::new();
            fields.push(b"content-type");
            fields.push(&0u64.to_le_bytes());
            fields.push(b"");
            let mut enc = KeyEncoder::new().field(&head);
            enc.push_encoded(&fields);
            enc.push(b"tail");
            let one_by_one = KeyEncoder::new()
                .field(&head)
                .field(b"content-type")
                .field(&0u64.to_le_bytes())
                .field(b"")
                .field(b"tail");
            assert_eq!(enc.finish(), one_by_one.finish(), "{n}");
        }
    }

    fn hash_of(key: &FlightKey) -> u64 {
        use std::hash::BuildHasher;
        // One seed for the process: only the keys vary.
        static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        SEED.get_or_init(Default::default).hash_one(key)
    }

    /// A key of fields is hashed only when its digest is asked for, and
    /// that digest is the one `finish_key` computes, and `flight_digest`
    /// the same; its clones share it.
    #[test]
    fn a_lazy_key_hashes_when_asked_and_agrees_with_the_digest_key() {
        let scope = KeyEncoder::new().field(b"tenant").finish();
        for scope in [None, Some(scope)] {
            let enc = KeyEncoder::new().field(b"GET").field(b"/v1/score");
            let eager = enc.finish_key(stage(), scope);
            let lazy = enc.finish_key_lazy(stage(), scope);
            let copy = lazy.clone();
            assert!(eager.has_digest());
            assert!(!lazy.has_digest());
            assert_eq!(lazy.scope(), eager.scope());
            assert_eq!(lazy.digest(), eager.digest());
            assert!(lazy.has_digest() && copy.has_digest(), "clones share it");
            assert_eq!(lazy.flight_digest(), eager.flight_digest());
            assert_eq!(lazy.to_string(), eager.to_string());
        }
    }

    /// Keys of fields are equal exactly when stage, scope and every byte
    /// are; equal ones hash alike; and a key of fields never equals a
    /// digest key (their `Hash`es could not agree).
    #[test]
    fn lazy_keys_are_equal_by_their_bytes() {
        let t = Some(KeyEncoder::new().field(b"tenant").finish());
        let key = |fields: &[&[u8]], scope: Option<Digest>| {
            let mut enc = KeyEncoder::new();
            for f in fields {
                enc.push(f);
            }
            enc.finish_key_lazy(stage(), scope)
        };
        let a = key(&[b"ab", b"c"], None);
        let a2 = key(&[b"ab", b"c"], None);
        assert_eq!(a, a2);
        assert_eq!(hash_of(&a), hash_of(&a2));
        assert_ne!(a, key(&[b"a", b"bc"], None));
        assert_ne!(a, key(&[b"ab", b"d"], None));
        assert_ne!(a, key(&[b"ab", b"c"], t));
        let report = StageName::new("report").unwrap();
        assert_ne!(
            a,
            KeyEncoder::new()
                .field(b"ab")
                .field(b"c")
                .finish_key_lazy(report, None)
        );
        let eager = KeyEncoder::new()
            .field(b"ab")
            .field(b"c")
            .finish_key(stage(), None);
        assert_eq!(a.digest(), eager.digest());
        assert_ne!(a, eager);
        assert_ne!(eager, a);
    }

    /// Past the buffer the input is being hashed already: the key is a
    /// digest key, with the specified digest.
    #[test]
    fn a_spilled_lazy_key_is_a_digest_key() {
        let big = vec![b'b'; 300];
        let enc = KeyEncoder::new().field(&big);
        let key = enc.finish_key_lazy(stage(), None);
        assert!(key.has_digest());
        assert_eq!(key, enc.finish_key(stage(), None));
    }

    #[test]
    fn domains_separate() {
        let a = KeyEncoder::with_domain(b"x").field(b"1").finish();
        let b = KeyEncoder::with_domain(b"y").field(b"1").finish();
        assert_ne!(a, b);
    }

    #[test]
    fn display_never_shows_input() {
        let key = FlightKey::from_bytes(stage(), "secret-user-input");
        let shown = format!("{key} {key:?}");
        assert!(!shown.contains("secret"));
        assert!(shown.starts_with("score/"));
        assert_eq!(key.digest().short().to_string().len(), 12);
        assert_eq!(key.digest().to_hex().len(), 64);
    }

    #[test]
    fn scope_separates_flights() {
        let d = KeyEncoder::new().field(b"x").finish();
        let t1 = KeyEncoder::new().field(b"tenant-1").finish();
        let t2 = KeyEncoder::new().field(b"tenant-2").finish();
        let a = FlightKey::new(stage(), Some(t1), d);
        let b = FlightKey::new(stage(), Some(t2), d);
        let c = FlightKey::new(stage(), None, d);
        assert_ne!(a, b);
        assert_ne!(a.flight_digest(), b.flight_digest());
        assert_ne!(a.flight_digest(), c.flight_digest());
        let other_stage = FlightKey::new(StageName::new("report").unwrap(), Some(t1), d);
        assert_ne!(a.flight_digest(), other_stage.flight_digest());
    }
}
