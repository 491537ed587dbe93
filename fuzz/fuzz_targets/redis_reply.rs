//! What a script answers, as it comes off the wire: any RESP reply (from
//! another layout's keys, a tampered record, a proxy's garbage), decoded
//! and turned into fred's values as fred does. Each parser answers a
//! typed value or a protocol error, never panics, and a value it accepts
//! is what the reply said.
#![no_main]

use bytes::Bytes;
use flightdeck_distributed::backend::{Acquired, BackendErrorKind, ResultStatus, StoredResult};
use flightdeck_redis::fuzzing;
use fred::prelude::Value;
use libfuzzer_sys::fuzz_target;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

/// A frame as fred hands it over: text when it is UTF-8, bytes otherwise;
/// an error reply is not a value.
fn value(frame: OwnedFrame) -> Option<Value> {
    let text = |b: Vec<u8>| match String::from_utf8(b) {
        Ok(s) => Value::String(s.into()),
        Err(e) => Value::Bytes(Bytes::from(e.into_bytes())),
    };
    Some(match frame {
        OwnedFrame::SimpleString(b) | OwnedFrame::BulkString(b) => text(b),
        OwnedFrame::Integer(i) => Value::Integer(i),
        OwnedFrame::Null => Value::Null,
        OwnedFrame::Array(items) => {
            Value::Array(items.into_iter().map(value).collect::<Option<Vec<_>>>()?)
        }
        OwnedFrame::Error(_) => return None,
    })
}

/// The integer a reply item spells, as the scripts write numbers.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::String(s) => s.parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A stored result accepted from `items` (its six items from `at` on) is
/// what they say: generation, status, payload, and age, TTL and work
/// time in whole, non-negative milliseconds.
fn check_result(items: &[Value], at: usize, r: &StoredResult) {
    assert_eq!(items.len(), at + 6, "a result is the answer's last six items");
    assert_eq!(Some(r.generation), int(&items[at]).and_then(|g| u64::try_from(g).ok()));
    let status = items[at + 1].as_str().map(|s| s.to_string());
    match r.status {
        ResultStatus::Ok => assert_eq!(status.as_deref(), Some("ok")),
        ResultStatus::Failed => assert_eq!(status.as_deref(), Some("err")),
    }
    assert_eq!(Some(&r.payload[..]), items[at + 2].as_bytes());
    for (i, d) in [(3, r.age), (4, r.ttl), (5, r.work_time)] {
        let ms = int(&items[at + i]).expect("a duration in ms");
        assert_eq!(i128::try_from(d.as_millis()).unwrap(), i128::from(ms));
    }
}

fn check_acquire(v: &Value, parsed: Result<Acquired, flightdeck_distributed::backend::BackendError>) {
    let items = match v {
        Value::Array(items) => items,
        _ => {
            assert!(parsed.is_err(), "a non-array ACQUIRE reply accepted: {v:?}");
            return;
        }
    };
    let parsed = match parsed {
        Ok(a) => a,
        Err(e) => {
            assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}");
            return;
        }
    };
    let word = items[0].as_str().map(|s| s.to_string());
    let gen_of = |i: usize| int(&items[i]).and_then(|g| u64::try_from(g).ok());
    let beside = |stale: &Option<StoredResult>| match stale {
        Some(r) => check_result(items, 3, r),
        None => assert_eq!(items.len(), 3),
    };
    match parsed {
        Acquired::Hit(hit) => {
            assert_eq!(word.as_deref(), Some("HIT"));
            check_result(items, 1, &hit);
        }
        Acquired::Stale(kept) => {
            assert_eq!(word.as_deref(), Some("STALE"));
            check_result(items, 1, &kept);
        }
        Acquired::Owner { generation, takeover, stale } => {
            assert_eq!(word.as_deref(), Some("OWNER"));
            assert_eq!(Some(generation), gen_of(1));
            assert_eq!(takeover, int(&items[2]) == Some(1));
            beside(&stale);
        }
        Acquired::Follower { generation, lease_remaining, stale } => {
            assert_eq!(word.as_deref(), Some("FOLLOWER"));
            assert_eq!(Some(generation), gen_of(1));
            let ms = int(&items[2]).expect("a remaining lease in ms");
            assert_eq!(i128::try_from(lease_remaining.as_millis()).unwrap(), i128::from(ms));
            beside(&stale);
        }
        Acquired::Expired { generation } => {
            assert_eq!(word.as_deref(), Some("EXPIRED"));
            assert_eq!(items.len(), 2);
            assert_eq!(Some(generation), gen_of(1));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(Some((frame, _))) = decode(data) else { return };
    let Some(v) = value(frame) else { return };
    check_acquire(&v, fuzzing::acquire(&v));
    // As the script sends it: the answer, then the server's time in ms;
    // `LATE` alone before it.
    match fuzzing::timed_acquire(&v) {
        Ok((answer, now)) => {
            let Value::Array(items) = &v else { panic!("a non-array ACQUIRE reply accepted") };
            let (last, head) = items.split_last().expect("an empty ACQUIRE reply accepted");
            assert_eq!(Some(now), int(last).and_then(|t| u64::try_from(t).ok()));
            match answer {
                Some(a) => check_acquire(&Value::Array(head.to_vec()), Ok(a)),
                None => assert!(matches!(head, [w] if w.as_str().as_deref() == Some("LATE"))),
            }
        }
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
    let word = v.as_str().map(|s| s.to_string());
    match fuzzing::heartbeat(&v) {
        Ok(_) => assert!(matches!(word.as_deref(), Some("RENEWED" | "LOST"))),
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
    match fuzzing::commit(&v) {
        Ok(_) => assert!(matches!(word.as_deref(), Some("COMMITTED" | "FENCED"))),
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
    match fuzzing::release(&v) {
        Ok(_) => assert!(matches!(word.as_deref(), Some("RELEASED" | "NOT_OWNER"))),
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
    match fuzzing::invalidate(&v) {
        Ok(g) => assert_eq!(Some(g), int(&v).and_then(|i| u64::try_from(i).ok())),
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
    match fuzzing::read(v.clone()) {
        Ok(Some(hit)) => {
            let Value::Array(items) = &v else { panic!("a non-array READ reply accepted") };
            let as_hit = Value::Array(vec![
                Value::String("HIT".into()),
                items[0].clone(),
                items[1].clone(),
                items[2].clone(),
                items[4].clone(),
                items[5].clone(),
                items[6].clone(),
            ]);
            check_acquire(&as_hit, Ok(hit));
        }
        Ok(None) => assert!(matches!(&v, Value::Array(items) if items.len() == 7 && items[1].is_null())),
        Err(e) => assert_eq!(e.kind(), BackendErrorKind::Protocol),
    }
});
