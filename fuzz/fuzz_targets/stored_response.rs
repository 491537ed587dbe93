//! A stored result as read back from Redis: the envelope (version, codec,
//! compression) around an encoded HTTP response, or any bytes at all.
//! Opened into a response or refused with a protocol error; never a
//! panic, never more memory than the envelope's limit; a response that
//! opens seals and opens to the same response.
#![no_main]

use flightdeck_distributed::{Envelope, HttpCodec, PostcardCodec};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let env = Envelope::new(64, LIMIT);
    let codec = HttpCodec::new();
    if let Ok(resp) = env.open(&codec, data) {
        let sealed = env.seal(&codec, &resp).expect("an opened response seals");
        let again = env.open(&codec, &sealed).expect("a sealed response opens");
        assert_eq!(again.status(), resp.status());
        assert_eq!(again.headers(), resp.headers());
        assert_eq!(again.body(), resp.body());
        assert_eq!(again.trailers(), resp.trailers());
    }
    let strings = PostcardCodec::<Vec<String>>::new();
    if let Ok(v) = env.open(&strings, data) {
        let sealed = env.seal(&strings, &v).expect("seals");
        assert_eq!(env.open(&strings, &sealed).expect("opens"), v);
    }
});
