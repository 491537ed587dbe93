//! A script call's arguments, `script numkeys key ... arg ...`, built
//! into one buffer: the flight's names and the short arguments are written
//! one after the other and split off it, so that every argument shares one
//! allocation (and fred's clones of them are reference counts), instead of
//! a `String` (and a copy of it) per argument and per call. ACQUIRE's and
//! COMMIT's short arguments are packed into one (see
//! [`scripts`](crate::scripts)): each argument costs fred's encoding and
//! Redis's parsing a bulk string.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use flightdeck_distributed::backend::{FlightId, MAX_DURATION};
use fred::prelude::Value;

use crate::backend::LAYOUT;

/// The arguments of one EVALSHA (or EVAL): the first is the script, set by
/// [`RedisBackend::eval`](crate::RedisBackend), then the number of keys,
/// the keys and the script's own arguments.
pub(crate) struct ScriptArgs {
    buf: BytesMut,
    argv: Vec<Value>,
}

/// Where the flight's record name is in the arguments (after the script
/// and the number of keys).
const RECORD: usize = 2;

/// Which of a flight's names a script gets as its keys, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Names {
    /// The record only (every script but INVALIDATE and READ).
    Record,
    /// The record and the last invalidation (`…:f5:i`).
    WithInvalidation,
}

impl Names {
    fn count(self) -> usize {
        match self {
            Names::Record => 1,
            Names::WithInvalidation => 2,
        }
    }
}

/// Longest a number's decimal digits get.
const DIGITS: usize = 20;

/// A number's decimal digits, written on the stack.
struct Decimal {
    digits: [u8; DIGITS],
    at: usize,
}

impl Decimal {
    fn of(n: u64) -> Self {
        let mut d = Self {
            digits: [0; DIGITS],
            at: DIGITS,
        };
        let mut rest = n;
        loop {
            d.at -= 1;
            d.digits[d.at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        d
    }

    fn digits(&self) -> &[u8] {
        &self.digits[self.at..]
    }
}

/// `d` in whole milliseconds, at least 1 (Redis refuses an expiry of 0)
/// and at most [`MAX_DURATION`].
pub(crate) fn millis(d: Duration) -> u64 {
    millis_or_zero(d.max(Duration::from_millis(1)))
}

/// `d` in whole milliseconds, at most [`MAX_DURATION`] (the scripts add
/// durations to the server's clock: the sums stay exact in Lua and valid
/// expiries for Redis).
pub(crate) fn millis_or_zero(d: Duration) -> u64 {
    let ms = d.min(MAX_DURATION).as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl ScriptArgs {
    /// Arguments whose keys are `names` of `flight` under `prefix` (see
    /// [`RedisBackend::record_key`](crate::RedisBackend::record_key)); room for `args`
    /// more arguments. Numbers go as their digits, written here: fred's
    /// own encoding of an integer argument costs more than the argument.
    pub(crate) fn new(prefix: &str, flight: &FlightId, names: Names, args: usize) -> Self {
        let keys = names.count();
        let record = prefix.len() + ":{".len() + 64 + "}:".len() + LAYOUT.len();
        let mut s = Self {
            // The names (the invalidation's repeats the record's), then room
            // for a token (64), an inbox's name and the numbers.
            buf: BytesMut::with_capacity(keys * record + ":i".len() + 2 * 64 + args * DIGITS),
            argv: Vec::with_capacity(2 + keys + args),
        };
        s.argv.push(Value::Null);
        s = s.fixed(if keys == 1 { "1" } else { "2" });
        s.buf.put_slice(prefix.as_bytes());
        s.buf.put_slice(b":{");
        s.buf.put_slice(&flight.digest().hex());
        s.buf.put_slice(b"}:");
        s.buf.put_slice(LAYOUT.as_bytes());
        let record = s.buf.split().freeze();
        s.argv.push(Value::Bytes(record.clone()));
        if names == Names::WithInvalidation {
            s.buf.put_slice(&record);
            s = s.text(":i");
        }
        s
    }

    /// Appends `text` to the argument being written (the next
    /// [`text`](Self::text) ends it).
    pub(crate) fn part(mut self, text: &str) -> Self {
        self.buf.put_slice(text.as_bytes());
        self
    }

    /// Appends `text` (to what was written since the last argument) and
    /// ends the argument.
    pub(crate) fn text(self, text: &str) -> Self {
        self.bytes(text.as_bytes())
    }

    /// [`text`](Self::text), of bytes.
    pub(crate) fn bytes(mut self, text: &[u8]) -> Self {
        self.buf.put_slice(text);
        let arg = self.buf.split().freeze();
        self.argv.push(Value::Bytes(arg));
        self
    }

    /// An argument: [`millis`] of `d`, in decimal.
    pub(crate) fn millis(self, d: Duration) -> Self {
        self.uint(millis(d))
    }

    /// An argument: [`millis_or_zero`] of `d`, in decimal.
    pub(crate) fn millis_or_zero(self, d: Duration) -> Self {
        self.uint(millis_or_zero(d))
    }

    /// An argument: `n` in decimal.
    pub(crate) fn uint(self, n: u64) -> Self {
        self.bytes(Decimal::of(n).digits())
    }

    /// Appends a number to the packed argument being written (see
    /// [`end`](Self::end)): an IEEE double, little-endian (Lua's
    /// `struct.unpack` format `<d`), which a script reads as a Lua number
    /// with no `tonumber` of digits. Exact for every `n` below 2^53 (the
    /// durations, at most [`MAX_DURATION`], and the server times in ms);
    /// a larger `n` reads as `tonumber` of its digits would.
    pub(crate) fn num(mut self, n: u64) -> Self {
        self.buf.put_f64_le(n as f64);
        self
    }

    /// [`num`](Self::num) of `n`, or `-1` (none) for `None`.
    pub(crate) fn num_or_none(mut self, n: Option<u64>) -> Self {
        match n {
            Some(n) => self.num(n),
            None => {
                self.buf.put_f64_le(-1.0);
                self
            }
        }
    }

    /// Appends a flag to the packed argument: one byte, `1` or `0`
    /// (format `B`).
    pub(crate) fn flag(mut self, yes: bool) -> Self {
        self.buf.put_u8(u8::from(yes));
        self
    }

    /// Appends a string to the packed argument: its length in four bytes,
    /// little-endian, then its bytes (format `<I4c0`).
    pub(crate) fn string(mut self, s: &[u8]) -> Self {
        self.buf
            .put_u32_le(u32::try_from(s.len()).unwrap_or(u32::MAX));
        self.buf.put_slice(s);
        self
    }

    /// Appends `n`'s decimal digits as a [`string`](Self::string) (a
    /// generation, which the scripts compare and store as the client
    /// wrote it).
    pub(crate) fn digits(self, n: u64) -> Self {
        self.string(Decimal::of(n).digits())
    }

    /// Ends the packed argument (what [`num`](Self::num),
    /// [`flag`](Self::flag) and [`string`](Self::string) wrote since the
    /// last argument).
    pub(crate) fn end(self) -> Self {
        self.bytes(&[])
    }

    /// An argument of its own (a payload: not copied).
    pub(crate) fn value(mut self, v: Value) -> Self {
        debug_assert!(self.buf.is_empty(), "an argument is being written");
        self.argv.push(v);
        self
    }

    /// A constant argument (a flag, an empty one): neither copied nor
    /// counted, where [`text`](Self::text) would write and split it off.
    pub(crate) fn fixed(self, text: &'static str) -> Self {
        self.value(Value::Bytes(Bytes::from_static(text.as_bytes())))
    }

    /// The flight's record name (its slot is the flight's).
    pub(crate) fn record(&self) -> &[u8] {
        match &self.argv[RECORD] {
            Value::Bytes(b) => b,
            _ => &[],
        }
    }

    /// Every argument, the first (the script's) left for the caller.
    #[cfg(test)]
    pub(crate) fn into_argv(self) -> Vec<Value> {
        self.argv
    }

    /// Every argument, the first `script` (its SHA, or its source).
    pub(crate) fn into_argv_for(self, script: Value) -> Vec<Value> {
        let mut argv = self.argv;
        argv[0] = script;
        argv
    }
}

/// The bytes of an argument.
#[cfg(test)]
fn arg_bytes(v: &Value) -> bytes::Bytes {
    match v {
        Value::Bytes(b) => b.clone(),
        Value::String(s) => s.inner().clone(),
        Value::Integer(i) => bytes::Bytes::from(i.to_string()),
        Value::Null => bytes::Bytes::new(),
        other => panic!("unexpected argument {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use flightdeck_core::{FlightKey, StageName};

    use super::*;

    fn flight() -> FlightId {
        FlightId::of(&FlightKey::from_bytes(StageName::new("args").unwrap(), "q"))
    }

    fn strings(args: ScriptArgs) -> Vec<String> {
        args.into_argv()
            .iter()
            .map(|v| String::from_utf8(arg_bytes(v).to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn names_and_arguments_are_written_in_order() {
        let f = flight();
        let h = f.to_hex();
        let args = ScriptArgs::new("fd:x", &f, Names::Record, 4)
            .text("tok")
            .uint(0)
            .uint(1_700_000_000_123_456)
            .uint(u64::MAX)
            .value(Value::Bytes(bytes::Bytes::from_static(b"pay\0load")))
            .millis(Duration::from_micros(2_500))
            .millis(Duration::ZERO)
            .millis(Duration::MAX)
            .fixed("")
            .fixed("0")
            .text("1");
        assert_eq!(args.record(), format!("fd:x:{{{h}}}:f5").as_bytes());
        assert_eq!(
            strings(args),
            [
                String::new(),
                "1".to_owned(),
                format!("fd:x:{{{h}}}:f5"),
                "tok".to_owned(),
                "0".to_owned(),
                "1700000000123456".to_owned(),
                u64::MAX.to_string(),
                "pay\0load".to_owned(),
                "2".to_owned(),
                "1".to_owned(),
                MAX_DURATION.as_millis().to_string(),
                String::new(),
                "0".to_owned(),
                "1".to_owned(),
            ]
        );
    }

    /// Reads what the scripts' `struct.unpack('<I4c0dB', …)` would.
    fn unpack(mut b: &[u8], format: &str) -> Vec<String> {
        let mut out = Vec::new();
        for f in format.chars() {
            match f {
                's' => {
                    let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
                    out.push(String::from_utf8(b[4..4 + len].to_vec()).unwrap());
                    b = &b[4 + len..];
                }
                'd' => {
                    out.push(f64::from_le_bytes(b[..8].try_into().unwrap()).to_string());
                    b = &b[8..];
                }
                'B' => {
                    out.push(b[0].to_string());
                    b = &b[1..];
                }
                _ => unreachable!(),
            }
        }
        assert!(b.is_empty(), "{} bytes left over", b.len());
        out
    }

    #[test]
    fn packed_arguments_are_one_argument_in_struct_format() {
        let f = flight();
        let argv = ScriptArgs::new("p", &f, Names::Record, 2)
            .string(b"tok")
            .string(b"inbox")
            .string(b"")
            .digits(1_700_000_000_123_456)
            .num(millis(Duration::ZERO))
            .num(millis_or_zero(Duration::MAX))
            .num((1 << 53) - 1)
            .num_or_none(Some(0))
            .num_or_none(None)
            .flag(true)
            .flag(false)
            .end()
            .value(Value::Bytes(bytes::Bytes::from_static(b"payload")))
            .into_argv();
        assert_eq!(argv.len(), 5, "script, key count, record, packed, payload");
        assert_eq!(
            unpack(&arg_bytes(&argv[3]), "ssssdddddBB"),
            [
                "tok",
                "inbox",
                "",
                "1700000000123456",
                "1",
                &MAX_DURATION.as_millis().to_string(),
                "9007199254740991",
                "0",
                "-1",
                "1",
                "0",
            ]
        );
        assert_eq!(arg_bytes(&argv[4]), "payload");
    }

    #[test]
    fn a_script_gets_the_record_alone() {
        let f = flight();
        let h = f.to_hex();
        assert_eq!(
            strings(ScriptArgs::new("p", &f, Names::Record, 1).millis(Duration::from_secs(30))),
            [
                String::new(),
                "1".to_owned(),
                format!("p:{{{h}}}:f5"),
                "30000".to_owned(),
            ]
        );
    }

    #[test]
    fn the_invalidation_key_comes_second() {
        let f = flight();
        let h = f.to_hex();
        assert_eq!(
            strings(ScriptArgs::new("p", &f, Names::WithInvalidation, 1).uint(42)),
            [
                String::new(),
                "2".to_owned(),
                format!("p:{{{h}}}:f5"),
                format!("p:{{{h}}}:f5:i"),
                "42".to_owned(),
            ]
        );
    }

    #[test]
    fn a_long_prefix_outgrows_the_first_buffer() {
        let f = flight();
        let prefix = "p".repeat(64);
        let token = "t".repeat(128);
        let argv = strings(ScriptArgs::new(&prefix, &f, Names::WithInvalidation, 1).text(&token));
        assert_eq!(argv[3], format!("{prefix}:{{{}}}:f5:i", f.to_hex()));
        assert_eq!(argv[4], token);
    }
}
