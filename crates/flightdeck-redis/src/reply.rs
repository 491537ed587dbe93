//! Script arguments and replies: values in, typed answers out, anything
//! unexpected a protocol error.

use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{
    Acquired, BackendError, Committed, Released, Renewal, ResultStatus, StoredResult,
};
use fred::prelude::*;

pub(crate) fn text(s: &str) -> Value {
    Value::String(s.into())
}

pub(crate) fn bytes(b: &Bytes) -> Value {
    Value::Bytes(b.clone())
}

pub(crate) fn bad_reply(what: &str, v: &Value) -> BackendError {
    BackendError::protocol(format!("unexpected {what} reply of kind {:?}", v.kind()))
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::String(s) => s.parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

pub(crate) fn gen(v: &Value) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

pub(crate) fn parse_acquire(v: &Value) -> Result<Acquired, BackendError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("ACQUIRE", v));
    };
    let action = items.first().and_then(Value::as_str);
    let bad = || bad_reply("ACQUIRE", v);
    Ok(match (action.as_deref(), items.len()) {
        (Some("HIT"), 4) => {
            let status = match items[2].as_str().as_deref() {
                Some("ok") => ResultStatus::Ok,
                Some("err") => ResultStatus::Failed,
                _ => return Err(bad()),
            };
            let payload = match &items[3] {
                Value::Bytes(b) => b.clone(),
                other => Bytes::copy_from_slice(other.as_bytes().ok_or_else(bad)?),
            };
            Acquired::Hit(StoredResult {
                generation: gen(&items[1]).ok_or_else(bad)?,
                status,
                payload,
                // Not in the reply yet.
                age: Duration::ZERO,
                ttl: Duration::ZERO,
                work_time: Duration::ZERO,
            })
        }
        (Some("OWNER"), 3) => Acquired::Owner {
            generation: gen(&items[1]).ok_or_else(bad)?,
            takeover: int(&items[2]).ok_or_else(bad)? == 1,
            stale: None,
        },
        (Some("FOLLOWER"), 3) => Acquired::Follower {
            generation: gen(&items[1]).ok_or_else(bad)?,
            // A lease the script saw running has time left: a negative
            // count is not a lease to wait for.
            lease_remaining: Duration::from_millis(
                int(&items[2])
                    .and_then(|ms| u64::try_from(ms).ok())
                    .ok_or_else(bad)?,
            ),
            stale: None,
        },
        (Some("EXPIRED"), 2) => Acquired::Expired {
            generation: gen(&items[1]).ok_or_else(bad)?,
        },
        _ => {
            return Err(BackendError::protocol(format!(
                "unknown ACQUIRE action {:?}",
                action.as_deref().unwrap_or("?")
            )))
        }
    })
}

/// Maps a one-word script answer through `table`; anything else is a
/// protocol error.
pub(crate) fn answer<T: Copy>(
    what: &str,
    v: &Value,
    table: &[(&str, T)],
) -> Result<T, BackendError> {
    let word = v.as_str().ok_or_else(|| bad_reply(what, v))?;
    table
        .iter()
        .find(|(w, _)| *w == word)
        .map(|(_, t)| *t)
        .ok_or_else(|| BackendError::protocol(format!("unknown {what} answer {word:?}")))
}

/// A HEARTBEAT answer.
pub(crate) fn renewal(v: &Value) -> Result<Renewal, BackendError> {
    answer(
        "HEARTBEAT",
        v,
        &[("RENEWED", Renewal::Renewed), ("LOST", Renewal::Lost)],
    )
}

/// A COMMIT answer.
pub(crate) fn committed(v: &Value) -> Result<Committed, BackendError> {
    answer(
        "COMMIT",
        v,
        &[
            ("COMMITTED", Committed::Committed),
            ("FENCED", Committed::Fenced),
        ],
    )
}

/// INVALIDATE's answer: the new generation.
pub(crate) fn invalidated(v: &Value) -> Result<u64, BackendError> {
    gen(v).ok_or_else(|| bad_reply("INVALIDATE", v))
}

/// An ABANDON or RELEASE answer.
pub(crate) fn released(what: &str, v: &Value) -> Result<Released, BackendError> {
    answer(
        what,
        v,
        &[
            ("RELEASED", Released::Released),
            ("NOT_OWNER", Released::NotOwner),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies_are_checked() {
        let ok = Value::Array(vec![text("OWNER"), Value::Integer(3), Value::Integer(1)]);
        assert_eq!(
            parse_acquire(&ok).unwrap(),
            Acquired::Owner {
                generation: 3,
                takeover: true,
                stale: None
            }
        );
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            Value::Array(vec![text("SURPRISE"), Value::Integer(1)]),
            Value::Array(vec![text("OWNER"), text("x"), Value::Integer(0)]),
            Value::Array(vec![
                text("HIT"),
                Value::Integer(1),
                text("maybe"),
                text(""),
            ]),
            Value::Array(vec![
                text("FOLLOWER"),
                Value::Integer(-1),
                Value::Integer(5),
            ]),
            // Found by the `redis_reply` fuzz target: was a follower told
            // 0 ms, now refused.
            Value::Array(vec![
                text("FOLLOWER"),
                Value::Integer(17),
                Value::Integer(-5),
            ]),
        ] {
            let e = parse_acquire(&bad).unwrap_err();
            assert_eq!(e.kind(), flightdeck_distributed::BackendErrorKind::Protocol);
        }
    }
}
