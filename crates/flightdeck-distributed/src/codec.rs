//! Result codecs: how a shared result travels through the backend.
//!
//! A [`ResultCodec`] turns the shared form of a response into bytes and
//! back. [`PostcardCodec`] does it for any serde type; `HttpCodec` (feature
//! `http`) for [`SharedResponse`](flightdeck_core::http::SharedResponse)s:
//! status, headers (non-UTF-8 values included), body, trailers and the
//! leader's `Vary` values.
//!
//! The [`Envelope`] wraps every encoded result with a version byte, the
//! codec's id and a compression flag, and compresses (lz4) above a
//! threshold. Opening a foreign, corrupt or truncated value is a
//! [`ProtocolError`], never a panic.
//!
//! ```
//! use flightdeck_distributed::codec::{Envelope, PostcardCodec, ResultCodec};
//!
//! let codec = PostcardCodec::<Vec<String>>::new();
//! let env = Envelope::new(16, 1 << 20);
//! let value = vec!["a".repeat(100), "b".to_owned()];
//! let sealed = env.seal(&codec, &value).unwrap();
//! assert!(sealed.len() < 100, "compressed above 16 bytes");
//! assert_eq!(env.open(&codec, &sealed).unwrap(), value);
//! assert!(env.open(&codec, b"garbage").is_err());
//! ```

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use flightdeck_core::error::{BoxError, ProtocolError};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The envelope format version written by this crate.
pub const ENVELOPE_VERSION: u8 = 1;

const FLAG_RAW: u8 = 0;
const FLAG_LZ4: u8 = 1;

/// Encodes and decodes the shared form of a result.
pub trait ResultCodec<T>: Clone + Send + Sync + 'static {
    /// A number identifying the wire format, stored with every result so a
    /// value written by another codec is rejected instead of misread.
    fn codec_id(&self) -> u8;

    /// Encodes a value.
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError>;

    /// Decodes a value; any failure is reported, never a panic.
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// Encodes any serde type with postcard.
pub struct PostcardCodec<T>(PhantomData<fn() -> T>);

impl<T> PostcardCodec<T> {
    /// Creates the codec.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Clone for PostcardCodec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for PostcardCodec<T> {}

impl<T> Default for PostcardCodec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for PostcardCodec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PostcardCodec")
    }
}

impl<T> ResultCodec<T> for PostcardCodec<T>
where
    T: Serialize + DeserializeOwned + 'static,
{
    fn codec_id(&self) -> u8 {
        1
    }

    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(postcard::to_stdvec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        let (v, rest) = postcard::take_from_bytes(bytes)?;
        if !rest.is_empty() {
            return Err(format!("{} trailing bytes after the value", rest.len()).into());
        }
        Ok(v)
    }
}

/// Versioning, codec tagging and compression around encoded results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    compress_above: usize,
    max_bytes: usize,
}

impl Envelope {
    /// Compresses encodings larger than `compress_above`; refuses to open
    /// values that would decode to more than `max_bytes`.
    pub const fn new(compress_above: usize, max_bytes: usize) -> Self {
        Self {
            compress_above,
            max_bytes,
        }
    }

    /// Encodes and wraps a value.
    pub fn seal<T, C: ResultCodec<T>>(&self, codec: &C, value: &T) -> Result<Bytes, BoxError> {
        let raw = codec.encode(value)?;
        let mut out;
        if raw.len() > self.compress_above {
            let packed = lz4_flex::block::compress(&raw);
            let len = u32::try_from(raw.len()).map_err(|_| "result larger than 4 GiB")?;
            out = Vec::with_capacity(7 + packed.len());
            out.extend_from_slice(&[ENVELOPE_VERSION, codec.codec_id(), FLAG_LZ4]);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&packed);
        } else {
            out = Vec::with_capacity(3 + raw.len());
            out.extend_from_slice(&[ENVELOPE_VERSION, codec.codec_id(), FLAG_RAW]);
            out.extend_from_slice(&raw);
        }
        Ok(Bytes::from(out))
    }

    /// Unwraps and decodes a value; anything unexpected is a
    /// [`ProtocolError`].
    pub fn open<T, C: ResultCodec<T>>(&self, codec: &C, bytes: &[u8]) -> Result<T, ProtocolError> {
        let [version, id, flag, rest @ ..] = bytes else {
            return Err(ProtocolError::new("stored result shorter than its header"));
        };
        if *version != ENVELOPE_VERSION {
            return Err(ProtocolError::new(format!(
                "stored result has unsupported version {version} (expected {ENVELOPE_VERSION})"
            )));
        }
        if *id != codec.codec_id() {
            return Err(ProtocolError::new(format!(
                "stored result was written by codec {id}, this stage uses codec {}",
                codec.codec_id()
            )));
        }
        let decoded;
        let raw: &[u8] = match *flag {
            FLAG_RAW => rest,
            FLAG_LZ4 => {
                let [a, b, c, d, packed @ ..] = rest else {
                    return Err(ProtocolError::new("compressed result is truncated"));
                };
                let len = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
                if len > self.max_bytes {
                    return Err(ProtocolError::new(format!(
                        "compressed result claims {len} bytes, over the limit of {}",
                        self.max_bytes
                    )));
                }
                decoded = lz4_flex::block::decompress(packed, len)
                    .map_err(|e| ProtocolError::with_source("compressed result is corrupt", e))?;
                if decoded.len() != len {
                    return Err(ProtocolError::new("compressed result has the wrong length"));
                }
                &decoded
            }
            other => {
                return Err(ProtocolError::new(format!(
                    "stored result has unknown compression flag {other}"
                )))
            }
        };
        codec
            .decode(raw)
            .map_err(|e| ProtocolError::with_source("stored result does not decode", e))
    }
}

#[cfg(feature = "http")]
pub use self::http_codec::HttpCodec;

#[cfg(feature = "http")]
mod http_codec {
    use super::*;
    use flightdeck_core::http::{SharedResponse, VaryValues};
    use flightdeck_core::Digest;
    use http::header::{HeaderName, HeaderValue};
    use http::{HeaderMap, StatusCode};
    use serde::Deserialize;

    /// The codec id of today's format. Format 2 had no `Vary` values: a
    /// result it stored cannot say which requests it may serve, so it is
    /// refused (as a codec mismatch, a [`ProtocolError`]), never read as
    /// if it served everyone.
    const FORMAT: u8 = 3;

    /// Encodes [`SharedResponse`]s: status, every header value as bytes (so
    /// non-UTF-8 values survive), body, trailers, and the digests of the
    /// leader's values of the request headers the response varies on (so a replay on
    /// another node serves the same requests). A leader's own cookies kept
    /// apart under `SetCookie::Strip` are not part of the shared form's
    /// headers and are never stored.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct HttpCodec {
        _priv: (),
    }

    impl HttpCodec {
        /// Creates the codec.
        pub const fn new() -> Self {
            Self { _priv: () }
        }
    }

    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
    /// Recorded `Vary` values: each header name with the digest of its
    /// values.
    type VaryWire = Vec<(Vec<u8>, [u8; 32])>;

    #[derive(Serialize, Deserialize)]
    struct Wire {
        status: u16,
        headers: Pairs,
        body: Vec<u8>,
        trailers: Option<Pairs>,
        /// The recorded `Vary` values: header name, then its values.
        vary: Option<VaryWire>,
    }

    fn pairs(map: &HeaderMap) -> Pairs {
        map.iter()
            .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn map(pairs: Pairs) -> Result<HeaderMap, BoxError> {
        let mut m = HeaderMap::with_capacity(pairs.len());
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(&k)?, HeaderValue::from_bytes(&v)?);
        }
        Ok(m)
    }

    fn vary_wire(values: &VaryValues) -> VaryWire {
        values
            .iter()
            .map(|(name, digest)| (name.as_str().as_bytes().to_vec(), *digest.as_bytes()))
            .collect()
    }

    fn vary_values(wire: VaryWire) -> Result<VaryValues, BoxError> {
        let mut values = VaryValues::new();
        for (name, digest) in wire {
            values.insert(HeaderName::from_bytes(&name)?, Digest::from_bytes(digest));
        }
        Ok(values)
    }

    impl ResultCodec<SharedResponse> for HttpCodec {
        fn codec_id(&self) -> u8 {
            FORMAT
        }

        fn encode(&self, value: &SharedResponse) -> Result<Vec<u8>, BoxError> {
            let wire = Wire {
                status: value.status().as_u16(),
                headers: pairs(value.headers()),
                body: value.body().to_vec(),
                trailers: value.trailers().map(pairs),
                vary: value.vary_values().map(vary_wire),
            };
            Ok(postcard::to_stdvec(&wire)?)
        }

        fn decode(&self, bytes: &[u8]) -> Result<SharedResponse, BoxError> {
            let (wire, rest): (Wire, _) = postcard::take_from_bytes(bytes)?;
            if !rest.is_empty() {
                return Err("trailing bytes after the response".into());
            }
            let resp = SharedResponse::new(
                StatusCode::from_u16(wire.status)?,
                map(wire.headers)?,
                Bytes::from(wire.body),
                wire.trailers.map(map).transpose()?,
            );
            // Without recorded values, a response with `Vary` serves no
            // request: it is read back as it was stored.
            Ok(match wire.vary {
                Some(v) => resp.with_vary_values(vary_values(v)?)?,
                None => resp,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_small_and_compressed() {
        let codec = PostcardCodec::<(u32, String)>::new();
        let env = Envelope::new(64, 1 << 20);
        for v in [(1, "x".to_owned()), (2, "y".repeat(10_000))] {
            let sealed = env.seal(&codec, &v).unwrap();
            assert_eq!(sealed[0], ENVELOPE_VERSION);
            assert_eq!(env.open(&codec, &sealed).unwrap(), v);
        }
        let big = env.seal(&codec, &(2, "y".repeat(10_000))).unwrap();
        assert_eq!(big[2], FLAG_LZ4);
        assert!(big.len() < 1000);
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        let codec = PostcardCodec::<Vec<String>>::new();
        let env = Envelope::new(8, 1 << 16);
        let good = env.seal(&codec, &vec!["z".repeat(500)]).unwrap();
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![1],
            vec![9, 1, 0, 1],
            vec![1, 2, 0, 0],
            vec![1, 1, 7, 0],
            vec![1, 1, 1, 0xff, 0xff, 0xff, 0xff, 1, 2, 3],
            vec![1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f],
            b"hello world, not an envelope".to_vec(),
        ];
        // Every truncation and every single-byte corruption of a valid value.
        for n in 0..good.len() {
            cases.push(good[..n].to_vec());
            let mut c = good.to_vec();
            c[n] ^= 0x5a;
            cases.push(c);
        }
        for c in cases {
            // Must not panic; truncations must fail.
            let _ = env.open(&codec, &c);
        }
        assert!(env.open(&codec, &good[..good.len() - 1]).is_err());
        let e = env.open(&codec, &[1, 2, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("codec 2"), "{e}");
    }

    #[cfg(feature = "http")]
    #[test]
    fn http_codec_keeps_everything() {
        use flightdeck_core::http::SharedResponse;
        use http::{HeaderMap, HeaderValue, StatusCode};
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-bin",
            HeaderValue::from_bytes(&[0xff, 0x80, b'a']).unwrap(),
        );
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let resp = SharedResponse::new(
            StatusCode::CREATED,
            headers,
            Bytes::from(vec![0u8, 1, 2, 255]),
            Some(trailers),
        );
        let env = Envelope::new(2, 1 << 20);
        let codec = HttpCodec::new();
        let back = env.open(&codec, &env.seal(&codec, &resp).unwrap()).unwrap();
        assert_eq!(back.status(), StatusCode::CREATED);
        assert_eq!(back.headers()["x-bin"].as_bytes(), &[0xff, 0x80, b'a']);
        let cookies: Vec<_> = back.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(back.body().as_ref(), &[0u8, 1, 2, 255]);
        assert_eq!(back.trailers().unwrap()["grpc-status"], "0");
        // A postcard value of another type is rejected by the codec id.
        let other = env.seal(&PostcardCodec::<u8>::new(), &7).unwrap();
        assert!(env.open(&codec, &other).is_err());
        // Bad status and bad header names are protocol errors.
        let bad = postcard::to_stdvec(&(
            1000u16,
            Vec::<(Vec<u8>, Vec<u8>)>::new(),
            Vec::<u8>::new(),
            None::<()>,
        ))
        .unwrap();
        assert!(codec.decode(&bad).is_err());
    }

    /// A response shared by `HttpShare` under `policy`, with its leader's
    /// values recorded.
    #[cfg(feature = "http")]
    async fn shared_http(
        policy: flightdeck_core::http::HttpShare,
        headers: &[(&'static str, &'static str)],
        leader: &[(&'static str, &'static str)],
    ) -> flightdeck_core::http::SharedResponse {
        use flightdeck_core::{Serves, Share, Shareable};
        let mut resp = http::Response::new(http_body_util::Full::new(Bytes::from_static(b"body")));
        for (k, v) in headers {
            resp.headers_mut()
                .append(*k, http::HeaderValue::from_static(v));
        }
        let mut req = http::Request::new(());
        for (k, v) in leader {
            req.headers_mut()
                .append(*k, http::HeaderValue::from_static(v));
        }
        let snap = Serves::<http::Request<()>>::leader(&policy, &req);
        let Shareable::Shared(shared) = policy.share(resp).await.unwrap() else {
            panic!("expected a shared response");
        };
        Serves::<http::Request<()>>::record(&policy, shared, snap)
    }

    #[cfg(feature = "http")]
    fn flavor(v: &'static str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("x-flavor", http::HeaderValue::from_static(v));
        h
    }

    #[cfg(feature = "http")]
    #[tokio::test]
    async fn http_codec_keeps_the_recorded_vary_values() {
        use flightdeck_core::http::HttpShare;
        let shared = shared_http(
            HttpShare::new(),
            &[("vary", "X-Flavor, accept-language")],
            &[("x-flavor", "vanilla"), ("authorization", "Bearer a")],
        )
        .await;
        let env = Envelope::new(8, 1 << 20);
        let codec = HttpCodec::new();
        let back = env
            .open(&codec, &env.seal(&codec, &shared).unwrap())
            .unwrap();
        assert_eq!(back.vary_values(), shared.vary_values());
        // Only digests of the named headers are stored, never a value of
        // the leader's request (its credentials).
        let sealed = env.seal(&codec, &shared).unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"vanilla"));
        assert!(!sealed.windows(6).any(|w| w == b"Bearer"));
        let names: Vec<_> = back
            .vary_values()
            .unwrap()
            .names()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["accept-language", "x-flavor"]);
        assert!(back.serves(&flavor("vanilla")));
        assert!(!back.serves(&flavor("chocolate")));
        assert!(!back.serves(&http::HeaderMap::new()));

        // A result stored before its values were recorded serves no one.
        let mut h = http::HeaderMap::new();
        h.insert("vary", http::HeaderValue::from_static("x-flavor"));
        let unrecorded =
            flightdeck_core::http::SharedResponse::new(http::StatusCode::OK, h, Bytes::new(), None);
        let back = env
            .open(&codec, &env.seal(&codec, &unrecorded).unwrap())
            .unwrap();
        assert!(back.vary_values().is_none());
        assert!(!back.serves(&flavor("vanilla")));
    }

    #[cfg(feature = "http")]
    #[tokio::test]
    async fn the_leaders_stripped_cookies_are_never_stored() {
        use flightdeck_core::http::{HttpShare, SetCookie};
        let shared = shared_http(
            HttpShare::new().set_cookie(SetCookie::Strip),
            &[("set-cookie", "sid=secret-session"), ("x-other", "1")],
            &[],
        )
        .await;
        let env = Envelope::new(1 << 20, 1 << 20);
        let codec = HttpCodec::new();
        let sealed = env.seal(&codec, &shared).unwrap();
        assert!(
            !sealed.windows(6).any(|w| w == b"secret"),
            "the leader's cookie reached the backend"
        );
        let back = env.open(&codec, &sealed).unwrap();
        assert_eq!(back.headers()["x-other"], "1");
        let leader = back.to_leader_response::<http_body_util::Empty<Bytes>>();
        assert!(leader.headers().get("set-cookie").is_none());
    }

    #[cfg(feature = "http")]
    #[test]
    fn results_of_the_format_before_vary_are_refused() {
        // What format 2 wrote: status, headers, body, trailers, no Vary.
        type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
        let old_wire = postcard::to_stdvec(&(
            200u16,
            vec![(b"vary".to_vec(), b"x-flavor".to_vec())] as Pairs,
            b"vanilla".to_vec(),
            None::<Pairs>,
        ))
        .unwrap();
        let mut old = vec![ENVELOPE_VERSION, 2, FLAG_RAW];
        old.extend_from_slice(&old_wire);
        let env = Envelope::new(1 << 20, 1 << 20);
        let codec = HttpCodec::new();
        let err = env.open(&codec, &old).unwrap_err();
        assert!(err.to_string().contains("codec 2"), "{err}");
        assert!(err.to_string().contains("codec 3"), "{err}");
        // Even under today's id, the old layout does not decode.
        let mut relabelled = vec![ENVELOPE_VERSION, 3, FLAG_RAW];
        relabelled.extend_from_slice(&old_wire);
        assert!(env.open(&codec, &relabelled).is_err());
    }

    #[cfg(feature = "http")]
    #[test]
    fn vary_values_that_do_not_fit_the_response_are_a_protocol_error() {
        type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
        let encode = |vary: Vec<(Vec<u8>, [u8; 32])>| {
            let wire = postcard::to_stdvec(&(
                200u16,
                vec![(b"vary".to_vec(), b"x-flavor".to_vec())] as Pairs,
                Vec::<u8>::new(),
                None::<Pairs>,
                Some(vary),
            ))
            .unwrap();
            let mut sealed = vec![ENVELOPE_VERSION, 3, FLAG_RAW];
            sealed.extend_from_slice(&wire);
            sealed
        };
        let env = Envelope::new(1 << 20, 1 << 20);
        let codec = HttpCodec::new();
        let names = [http::HeaderName::from_static("x-flavor")];
        let recorded = flightdeck_core::http::VaryValues::of(&names, &flavor("vanilla"));
        let (_, vanilla) = recorded.iter().next().unwrap();
        let good = encode(vec![(b"x-flavor".to_vec(), *vanilla.as_bytes())]);
        assert!(env.open(&codec, &good).unwrap().serves(&flavor("vanilla")));
        for bad in [
            vec![(b"x-tier".to_vec(), [0; 32])],
            vec![],
            vec![(b"bad name".to_vec(), [0; 32])],
            vec![
                (b"x-flavor".to_vec(), [0; 32]),
                (b"x-tier".to_vec(), [0; 32]),
            ],
        ] {
            let err = env.open(&codec, &encode(bad)).unwrap_err();
            assert!(err.to_string().contains("does not decode"), "{err}");
        }
        // Every truncation and corruption of a value with Vary values:
        // an error or a value, never a panic.
        for n in 0..good.len() {
            let _ = env.open(&codec, &good[..n]);
            let mut c = good.clone();
            c[n] ^= 0x5a;
            let _ = env.open(&codec, &c);
        }
    }
}
