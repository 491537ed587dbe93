//! Result codecs: how a shared result travels through the backend.
//!
//! A [`ResultCodec`] turns the shared form of a response into bytes and
//! back. [`PostcardCodec`] does it for any serde type; `HttpCodec` (feature
//! `http`) for [`SharedResponse`](flightdeck_core::http::SharedResponse)s:
//! status, headers (non-UTF-8 values included), body and trailers.
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
    use flightdeck_core::http::SharedResponse;
    use http::header::{HeaderName, HeaderValue};
    use http::{HeaderMap, StatusCode};
    use serde::Deserialize;

    /// Encodes [`SharedResponse`]s: status, every header value as bytes (so
    /// non-UTF-8 values survive), body and trailers.
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

    #[derive(Serialize, Deserialize)]
    struct Wire {
        status: u16,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Vec<u8>,
        trailers: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    }

    fn pairs(map: &HeaderMap) -> Vec<(Vec<u8>, Vec<u8>)> {
        map.iter()
            .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn map(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<HeaderMap, BoxError> {
        let mut m = HeaderMap::with_capacity(pairs.len());
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(&k)?, HeaderValue::from_bytes(&v)?);
        }
        Ok(m)
    }

    impl ResultCodec<SharedResponse> for HttpCodec {
        fn codec_id(&self) -> u8 {
            2
        }

        fn encode(&self, value: &SharedResponse) -> Result<Vec<u8>, BoxError> {
            let wire = Wire {
                status: value.status().as_u16(),
                headers: pairs(value.headers()),
                body: value.body().to_vec(),
                trailers: value.trailers().map(pairs),
            };
            Ok(postcard::to_stdvec(&wire)?)
        }

        fn decode(&self, bytes: &[u8]) -> Result<SharedResponse, BoxError> {
            let (wire, rest): (Wire, _) = postcard::take_from_bytes(bytes)?;
            if !rest.is_empty() {
                return Err("trailing bytes after the response".into());
            }
            Ok(SharedResponse::new(
                StatusCode::from_u16(wire.status)?,
                map(wire.headers)?,
                Bytes::from(wire.body),
                wire.trailers.map(map).transpose()?,
            ))
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
}
