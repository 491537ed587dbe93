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

/// A duration the scripts send as whole milliseconds; a negative count
/// is not a duration.
fn millis(v: &Value) -> Option<Duration> {
    int(v)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

/// A stored result as the scripts answer it, six items: `rg, s, b,
/// age_ms, ttl_ms, work_ms`; `None` when any does not parse.
fn stored_result(items: &[Value]) -> Option<StoredResult> {
    let [generation, status, payload, age, ttl, work_time] = items else {
        return None;
    };
    let status = match status.as_str().as_deref() {
        Some("ok") => ResultStatus::Ok,
        Some("err") => ResultStatus::Failed,
        _ => return None,
    };
    let payload = match payload {
        Value::Bytes(b) => b.clone(),
        other => Bytes::copy_from_slice(other.as_bytes()?),
    };
    Some(StoredResult {
        generation: gen(generation)?,
        status,
        payload,
        age: millis(age)?,
        ttl: millis(ttl)?,
        work_time: millis(work_time)?,
    })
}

pub(crate) fn parse_acquire(v: &Value) -> Result<Acquired, BackendError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("ACQUIRE", v));
    };
    acquire_items(items, v)
}

/// An ACQUIRE answer's `items` (without the server's time), of the reply
/// `v` (named in a protocol error).
fn acquire_items(items: &[Value], v: &Value) -> Result<Acquired, BackendError> {
    let action = items.first().and_then(Value::as_str);
    let bad = || bad_reply("ACQUIRE", v);
    // The result from item `at` on, if the answer carries one there.
    let result = |at: usize| items.get(at..).and_then(stored_result).ok_or_else(bad);
    // A result beside an OWNER or FOLLOWER answer (after its three
    // items), if the answer carries one.
    let beside = || match items.len() {
        3 => Ok(None),
        _ => result(3).map(Some),
    };
    Ok(match (action.as_deref(), items.len()) {
        (Some("HIT"), 7) => Acquired::Hit(result(1)?),
        (Some("STALE"), 7) => Acquired::Stale(result(1)?),
        (Some("OWNER"), 3 | 9) => Acquired::Owner {
            generation: gen(&items[1]).ok_or_else(bad)?,
            takeover: int(&items[2]).ok_or_else(bad)? == 1,
            stale: beside()?,
        },
        (Some("FOLLOWER"), 3 | 9) => Acquired::Follower {
            generation: gen(&items[1]).ok_or_else(bad)?,
            // A lease the script saw running has time left: a negative
            // count is not a lease to wait for.
            lease_remaining: millis(&items[2]).ok_or_else(bad)?,
            stale: beside()?,
        },
        (Some("EXPIRED"), 2) => Acquired::Expired {
            generation: gen(&items[1]).ok_or_else(bad)?,
        },
        _ => {
            return Err(BackendError::protocol(format!(
                "unknown ACQUIRE action {:?} with {} items",
                action.as_deref().unwrap_or("?"),
                items.len()
            )))
        }
    })
}

/// An ACQUIRE answer as the script sends it: the answer (`None` for
/// `LATE`: it ran past its not-after and changed nothing), then the
/// server's `TIME` in ms as its last item.
pub(crate) fn parse_timed_acquire(v: &Value) -> Result<(Option<Acquired>, u64), BackendError> {
    let Value::Array(items) = v else {
        return Err(bad_reply("ACQUIRE", v));
    };
    let Some((now, answer)) = items.split_last() else {
        return Err(bad_reply("ACQUIRE", v));
    };
    let now = gen(now).ok_or_else(|| {
        BackendError::protocol("ACQUIRE reply without the server's time as its last item")
    })?;
    let late = matches!(answer, [word] if word.as_str().as_deref() == Some("LATE"));
    if late {
        return Ok((None, now));
    }
    Ok((Some(acquire_items(answer, v)?), now))
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

    fn int(i: i64) -> Value {
        Value::Integer(i)
    }

    /// A stored result's six items: generation 7, `ok`, `body`, 1.5 s
    /// old, fresh for 1 s, 200 ms of work.
    fn result() -> Vec<Value> {
        vec![
            int(7),
            text("ok"),
            text("body"),
            int(1500),
            int(1000),
            int(200),
        ]
    }

    fn kept() -> StoredResult {
        StoredResult {
            generation: 7,
            status: ResultStatus::Ok,
            payload: Bytes::from_static(b"body"),
            age: Duration::from_millis(1500),
            ttl: Duration::from_secs(1),
            work_time: Duration::from_millis(200),
        }
    }

    fn answer(head: &[Value], tail: &[Value]) -> Value {
        Value::Array(head.iter().chain(tail).cloned().collect())
    }

    #[test]
    fn acquire_replies_carry_the_stored_result() {
        assert_eq!(
            parse_acquire(&answer(&[text("HIT")], &result())).unwrap(),
            Acquired::Hit(kept())
        );
        assert_eq!(
            parse_acquire(&answer(&[text("STALE")], &result())).unwrap(),
            Acquired::Stale(kept())
        );
        assert_eq!(
            parse_acquire(&answer(&[text("OWNER"), int(9), int(0)], &result())).unwrap(),
            Acquired::Owner {
                generation: 9,
                takeover: false,
                stale: Some(kept())
            }
        );
        assert_eq!(
            parse_acquire(&answer(&[text("FOLLOWER"), int(9), int(40)], &result())).unwrap(),
            Acquired::Follower {
                generation: 9,
                lease_remaining: Duration::from_millis(40),
                stale: Some(kept())
            }
        );
        assert_eq!(
            parse_acquire(&answer(&[text("FOLLOWER"), int(9), int(40)], &[])).unwrap(),
            Acquired::Follower {
                generation: 9,
                lease_remaining: Duration::from_millis(40),
                stale: None
            }
        );
    }

    #[test]
    fn acquire_replies_end_with_the_server_time() {
        let owner = Value::Array(vec![text("OWNER"), int(3), int(1), text("1700000000123")]);
        let (got, now) = parse_timed_acquire(&owner).unwrap();
        assert_eq!(
            got,
            Some(Acquired::Owner {
                generation: 3,
                takeover: true,
                stale: None
            })
        );
        assert_eq!(now, 1_700_000_000_123);
        let hit = answer(&[text("HIT")], &[result(), vec![int(5)]].concat());
        assert_eq!(
            parse_timed_acquire(&hit).unwrap(),
            (Some(Acquired::Hit(kept())), 5)
        );
        let late = Value::Array(vec![text("LATE"), int(42)]);
        assert_eq!(parse_timed_acquire(&late).unwrap(), (None, 42));
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            // An answer without the time, or a time that is not one.
            Value::Array(vec![text("LATE")]),
            Value::Array(vec![text("EXPIRED"), int(4)]),
            Value::Array(vec![text("LATE"), int(-1)]),
            Value::Array(vec![text("LATE"), text("soon")]),
            Value::Array(vec![text("LATE"), int(1), int(2)]),
            Value::Array(vec![text("OWNER"), int(3), int(1), Value::Null]),
        ] {
            let e = parse_timed_acquire(&bad).unwrap_err();
            assert_eq!(
                e.kind(),
                flightdeck_distributed::BackendErrorKind::Protocol,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn acquire_replies_are_checked() {
        let ok = Value::Array(vec![text("OWNER"), int(3), int(1)]);
        assert_eq!(
            parse_acquire(&ok).unwrap(),
            Acquired::Owner {
                generation: 3,
                takeover: true,
                stale: None
            }
        );
        let with = |i: usize, v: Value| {
            let mut r = result();
            r[i] = v;
            r
        };
        for bad in [
            Value::Null,
            Value::Array(vec![]),
            Value::Array(vec![text("SURPRISE"), int(1)]),
            Value::Array(vec![text("OWNER"), text("x"), int(0)]),
            answer(&[text("HIT")], &with(1, text("maybe"))),
            Value::Array(vec![text("FOLLOWER"), int(-1), int(5)]),
            // Found by the `redis_reply` fuzz target: was a follower told
            // 0 ms, now refused.
            Value::Array(vec![text("FOLLOWER"), int(17), int(-5)]),
            // The previous layout's HIT, without age, TTL and work time.
            Value::Array(vec![text("HIT"), int(1), text("ok"), text("")]),
            // A result cut short, or with one item too many.
            answer(&[text("OWNER"), int(9), int(0)], &result()[..5]),
            answer(
                &[text("FOLLOWER"), int(9), int(1)],
                &[result(), vec![int(0)]].concat(),
            ),
            answer(&[text("STALE")], &[]),
            // A negative age, TTL or work time, a generation that is not
            // one.
            answer(&[text("STALE")], &with(3, int(-1))),
            answer(&[text("HIT")], &with(4, int(-1))),
            answer(&[text("OWNER"), int(9), int(0)], &with(5, text("soon"))),
            answer(&[text("STALE")], &with(0, Value::Null)),
            answer(&[text("STALE")], &with(2, Value::Null)),
        ] {
            let e = parse_acquire(&bad).unwrap_err();
            assert_eq!(
                e.kind(),
                flightdeck_distributed::BackendErrorKind::Protocol,
                "{bad:?}"
            );
        }
    }
}
