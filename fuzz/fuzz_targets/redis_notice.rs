//! A message on a node's inbox: `<record>|<gen>|c<work_ms>,<age_ms>|<payload>`,
//! `<record>|<gen>|c<work_ms>,<age_ms>` (`<work_ms>` and `,<age_ms>` may
//! be absent),
//! `<record>|<gen>|a`, or anything another client
//! published there. Parsed into the notice it spells, or refused; never a
//! panic.
#![no_main]

use bytes::Bytes;
use flightdeck_distributed::backend::Notice;
use flightdeck_redis::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let msg = Bytes::copy_from_slice(data);
    let Some((record, notice)) = fuzzing::notice(&msg) else {
        return;
    };
    // The record is everything before the first bar, never empty.
    let bar = data.iter().position(|b| *b == b'|').expect("a bar");
    assert!(bar > 0);
    assert_eq!(&record[..], &data[..bar]);
    let rest = &data[bar + 1..];
    let gen_end = rest.iter().position(|b| *b == b'|').expect("a second bar");
    let digits = std::str::from_utf8(&rest[..gen_end]).expect("digits");
    let tail = &rest[gen_end + 1..];
    match notice {
        Notice::Committed {
            generation,
            inline,
            work_time,
            age,
        } => {
            assert_eq!(digits.parse::<u64>().ok(), Some(generation));
            assert_eq!(tail[0], b'c');
            let ms = tail[1..].iter().take_while(|b| b.is_ascii_digit()).count();
            let told = std::str::from_utf8(&tail[1..1 + ms]).expect("digits");
            assert_eq!(work_time.map(|t| t.as_millis().to_string()), (ms > 0).then(|| {
                told.parse::<u64>().expect("a number").to_string()
            }));
            let mut rest = &tail[1 + ms..];
            match rest.first() {
                Some(b',') => {
                    let n = rest[1..].iter().take_while(|b| b.is_ascii_digit()).count();
                    let told: u64 = std::str::from_utf8(&rest[1..1 + n])
                        .expect("digits")
                        .parse()
                        .expect("a number");
                    assert_eq!(age.as_millis(), u128::from(told));
                    rest = &rest[1 + n..];
                }
                _ => assert!(age.is_zero()),
            }
            match inline {
                Some(p) => {
                    assert_eq!(rest[0], b'|');
                    assert_eq!(&p[..], &rest[1..]);
                }
                None => assert!(rest.is_empty()),
            }
        }
        Notice::Abandoned { generation } => {
            assert_eq!(digits.parse::<u64>().ok(), Some(generation));
            assert_eq!(tail, b"a");
        }
        Notice::Resync => panic!("a message parsed as a resync"),
    }
});
