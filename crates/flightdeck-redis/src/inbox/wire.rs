//! What crosses the wire for the inboxes: their names, as every ACQUIRE
//! carries them and the node subscribes them, and the messages the
//! scripts publish to them (see [`scripts`](crate::scripts)).

use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::Notice;
use fred::types::Value;

use super::tags::slot_tag;
use crate::args::ScriptArgs;
use crate::backend::LAYOUT;

/// The names of a node's inboxes (their pub/sub channels).
pub(super) struct Channels {
    prefix: String,
    /// This node's name in its inboxes' names (random, one per backend).
    node: String,
    /// One server's inbox (a cluster names one per slot).
    single: Bytes,
    sharded: bool,
}

impl Channels {
    /// A new node's inboxes under `prefix`: one per cluster slot when
    /// `sharded`, else one.
    pub(super) fn new(prefix: &str, sharded: bool) -> Self {
        let node = flightdeck_distributed::OwnerToken::random()
            .as_str()
            .to_owned();
        let single = Bytes::from(parts(prefix, "", &node).concat());
        Self {
            prefix: prefix.to_owned(),
            node,
            single,
            sharded,
        }
    }

    /// The inbox a flight of `slot` names: the one server's, or in a
    /// cluster the slot's (its hash tag hashes to `slot`, so the scripts'
    /// `SPUBLISH` stays in the flight's slot).
    pub(super) fn name(&self, slot: u16) -> Bytes {
        if !self.sharded {
            return self.single.clone();
        }
        Bytes::from(parts(&self.prefix, slot_tag(slot), &self.node).concat())
    }

    /// `args` with the inbox a flight of `slot` names as their next
    /// argument, written into their buffer (an ACQUIRE's: no string of its
    /// own per call).
    pub(super) fn write(&self, slot: u16, args: ScriptArgs) -> ScriptArgs {
        if !self.sharded {
            return args.value(Value::Bytes(self.single.clone()));
        }
        let [parts @ .., last] = parts(&self.prefix, slot_tag(slot), &self.node);
        parts
            .iter()
            .fold(args, |args, part| args.part(part))
            .text(last)
    }
}

/// An inbox's name, in the pieces it is written from:
/// `{prefix}:{LAYOUT}:n:{node}` on one server, `{prefix}:{tag}:{LAYOUT}:n:{node}`
/// with `tag` a slot's ([`slot_tag`]) in a cluster.
fn parts<'a>(prefix: &'a str, tag: &'a str, node: &'a str) -> [&'a str; 6] {
    [prefix, ":", tag, LAYOUT, ":n:", node]
}

/// A message's bytes (a payload that is valid UTF-8 comes as a string).
pub(super) fn value_bytes(v: &Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b.clone()),
        Value::String(s) => Some(s.inner().clone()),
        _ => None,
    }
}

/// Parses `<record>|<gen>|c|<payload>`, `<record>|<gen>|c`,
/// `<record>|<gen>|a`.
pub(crate) fn parse_message(msg: &Bytes) -> Option<(Bytes, Notice)> {
    let bar = msg.iter().position(|b| *b == b'|')?;
    if bar == 0 {
        return None;
    }
    let notice = parse_notice(&msg.slice(bar + 1..))?;
    Some((msg.slice(..bar), notice))
}

/// Parses `<gen>|c<work_ms>,<age_ms>|<payload>`, `<gen>|c<work_ms>,<age_ms>`,
/// `<gen>|a` (`<work_ms>`, the work's time, and `,<age_ms>`, the result's
/// age when published, in milliseconds, may be absent).
fn parse_notice(payload: &Bytes) -> Option<Notice> {
    let bar = payload.iter().position(|b| *b == b'|')?;
    let generation: u64 = std::str::from_utf8(&payload[..bar]).ok()?.parse().ok()?;
    match &payload[bar + 1..] {
        b"a" => Some(Notice::Abandoned { generation }),
        [b'c', tail @ ..] => {
            let (work_time, tail) = split_millis(tail)?;
            let (age, rest) = match tail {
                [b',', rest @ ..] => {
                    let (Some(age), rest) = split_millis(rest)? else {
                        return None;
                    };
                    (age, rest)
                }
                rest => (Duration::ZERO, rest),
            };
            let inline = match rest {
                [] => None,
                [b'|', ..] => Some(payload.slice(payload.len() - rest.len() + 1..)),
                _ => return None,
            };
            Some(Notice::Committed {
                generation,
                inline,
                work_time,
                age,
            })
        }
        _ => None,
    }
}

/// Splits the run of ASCII digits `b` starts with from what follows: the
/// run read as milliseconds (`None` for an empty run), and the rest. `None`
/// when the run does not fit a `u64`.
fn split_millis(b: &[u8]) -> Option<(Option<Duration>, &[u8])> {
    let n = b.iter().take_while(|b| b.is_ascii_digit()).count();
    let (digits, rest) = b.split_at(n);
    if digits.is_empty() {
        return Some((None, rest));
    }
    let ms: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((Some(Duration::from_millis(ms)), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Names;

    #[test]
    fn messages_parse_and_garbage_does_not() {
        let m = |s: &'static [u8]| parse_message(&Bytes::from_static(s));
        assert_eq!(
            m(b"p:{ab}:f4|7|c|\x00a|b"),
            Some((
                Bytes::from_static(b"p:{ab}:f4"),
                Notice::Committed {
                    generation: 7,
                    inline: Some(Bytes::from_static(b"\x00a|b")),
                    work_time: None,
                    age: Duration::ZERO,
                }
            ))
        );
        assert_eq!(
            m(b"r|7|c"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Committed {
                    generation: 7,
                    inline: None,
                    work_time: None,
                    age: Duration::ZERO,
                }
            ))
        );
        assert_eq!(
            m(b"r|7|c250|9|x"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Committed {
                    generation: 7,
                    inline: Some(Bytes::from_static(b"9|x")),
                    work_time: Some(Duration::from_millis(250)),
                    age: Duration::ZERO,
                }
            ))
        );
        assert_eq!(
            m(b"r|7|c250,1800|,x"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Committed {
                    generation: 7,
                    inline: Some(Bytes::from_static(b",x")),
                    work_time: Some(Duration::from_millis(250)),
                    age: Duration::from_millis(1800),
                }
            ))
        );
        assert_eq!(
            m(b"r|7|c0,0"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Committed {
                    generation: 7,
                    inline: None,
                    work_time: Some(Duration::ZERO),
                    age: Duration::ZERO,
                }
            ))
        );
        assert_eq!(
            m(b"r|3|a"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Abandoned { generation: 3 }
            ))
        );
        for bad in [
            &b""[..],
            b"|",
            b"r",
            b"|1|a",
            b"r|x|a",
            b"r|1|",
            b"r|1|z",
            b"r|-1|a",
            b"r|1|cx",
            b"r|1|c12x",
            b"r|1|c12,",
            b"r|1|c12,x",
            b"r|1|c12,3x",
            b"r|1|c99999999999999999999999",
            b"r|1|c12,99999999999999999999999",
        ] {
            assert_eq!(parse_message(&Bytes::from_static(bad)), None, "{bad:?}");
        }
    }

    /// A slot's inbox hashes to the slot (its tag's).
    #[test]
    fn every_slot_has_an_inbox_of_its_own() {
        let channels = Channels::new("fd", true);
        for slot in [0, 1, 5000, 16383] {
            let inbox = channels.name(slot);
            assert_eq!(fred::util::redis_keyslot(&inbox), slot);
        }
    }

    /// An ACQUIRE names the inbox that the node subscribes to.
    #[test]
    fn the_inbox_an_acquire_names_is_the_one_subscribed() {
        let flight = flightdeck_distributed::FlightId::of(&flightdeck_core::FlightKey::from_bytes(
            flightdeck_core::StageName::new("inbox").unwrap(),
            "q",
        ));
        for sharded in [false, true] {
            let channels = Channels::new("fd", sharded);
            for slot in [0, 7, 16383] {
                let args = ScriptArgs::new("fd", &flight, Names::Record, 1);
                let argv = channels.write(slot, args).into_argv();
                assert_eq!(
                    argv.last().and_then(Value::as_bytes),
                    Some(&channels.name(slot)[..])
                );
            }
        }
    }
}
