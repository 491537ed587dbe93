//! An owner's failure as a stage caches it (`failure_ttl`): its
//! [`ErrorClass`] and its message, so that a node replaying it answers
//! with the owner's status (a 429 stays a 429 on every node), not a 500.
//!
//! The backend stores these bytes as they are, beside the status `err`
//! (in Redis the record's `b` field, written by ABANDON):
//!
//! ```text
//! 0xFF  class name (ErrorClass::name)  0x00  message (UTF-8)
//! ```
//!
//! Before classes were stored, the bytes were the message alone, under
//! the same record layout (`f3`). That form is still read, as class
//! `internal`, which is what it answered before (a 500): nodes of the
//! previous release write it during a rolling upgrade, and refusing it as
//! a protocol error would answer their cached failures worse than they
//! did (a 503, and a follower falling back to run the failing work
//! itself). The first byte tells the forms apart: UTF-8 text never holds
//! 0xFF. A class this version does not know (a newer node's) also reads
//! as `internal`; a previous release reads this form as a message with a
//! replacement character in front, still a 500. Nothing here fails: a
//! cached failure is an answer.

use std::error::Error as StdError;

use bytes::{BufMut, Bytes, BytesMut};
use flightdeck_core::error::RemoteFailure;
use flightdeck_core::ErrorClass;

/// Marks the classed form (never the first byte of UTF-8 text).
const CLASSED: u8 = 0xFF;
/// Ends the class name.
const END_OF_CLASS: u8 = 0x00;

/// The bytes to cache for the owner's error `err`.
pub(crate) fn encode(err: &(dyn StdError + 'static)) -> Bytes {
    let class = ErrorClass::of(err).name();
    let message = err.to_string();
    let mut out = BytesMut::with_capacity(2 + class.len() + message.len());
    out.put_u8(CLASSED);
    out.put_slice(class.as_bytes());
    out.put_u8(END_OF_CLASS);
    out.put_slice(message.as_bytes());
    out.freeze()
}

/// The error a replayed failure answers with.
pub(crate) fn decode(payload: &[u8]) -> RemoteFailure {
    let classed = payload.strip_prefix(&[CLASSED]).and_then(|rest| {
        let end = rest.iter().position(|&b| b == END_OF_CLASS)?;
        Some((&rest[..end], &rest[end + 1..]))
    });
    let (class, message) = match classed {
        Some((name, message)) => {
            let class = std::str::from_utf8(name)
                .ok()
                .and_then(ErrorClass::from_name);
            (class.unwrap_or(ErrorClass::Internal), message)
        }
        // The form without a class (or one cut short).
        None => (ErrorClass::Internal, payload),
    };
    RemoteFailure::new(class, String::from_utf8_lossy(message))
}

#[cfg(test)]
mod tests {
    use flightdeck_core::error::{BulkheadFull, CoordinationUnavailable, SharedError};

    use super::*;

    #[test]
    fn the_class_and_message_survive_the_store() {
        let busy = SharedError::new(BulkheadFull::new(None));
        let back = decode(&encode(&busy));
        assert_eq!(back.class(), ErrorClass::TooManyRequests);
        assert_eq!(back.message(), busy.to_string());
        let down = CoordinationUnavailable::new("db down");
        assert_eq!(decode(&encode(&down)).class(), ErrorClass::Unavailable);
        let business = std::io::Error::other("database on fire");
        let back = decode(&encode(&business));
        assert_eq!(
            (back.class(), back.message()),
            (ErrorClass::Internal, "database on fire")
        );
    }

    #[test]
    fn the_form_without_a_class_and_unknown_classes_read_as_internal() {
        let old = decode(b"database on fire");
        assert_eq!(
            (old.class(), old.message()),
            (ErrorClass::Internal, "database on fire")
        );
        let newer = decode(b"\xffteapot\x00short and stout");
        assert_eq!(
            (newer.class(), newer.message()),
            (ErrorClass::Internal, "short and stout")
        );
        let cut = decode(b"\xffunavailable");
        assert_eq!(cut.class(), ErrorClass::Internal);
        assert_eq!(decode(b"").message(), "");
    }
}
