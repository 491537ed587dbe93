//! A hash tag per cluster slot, for the slots' inboxes: a name with the
//! tag of slot `s` hashes to `s`, so the scripts' `SPUBLISH` to a node's
//! inbox for a flight stays in the flight's slot (on its shard).

use std::sync::OnceLock;

use crate::cluster::SLOTS;

/// `{t}:`, with `t` the shortest hex number that hashes to `slot`: the
/// hash tag of `slot`'s inbox (found once for every slot, on first use).
pub(super) fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let slots = usize::from(SLOTS);
        let mut tags = vec![String::new(); slots];
        let mut left = slots;
        let mut n: u64 = 0;
        while left > 0 {
            let tag = format!("{{{n:x}}}:");
            let slot = usize::from(fred::util::redis_keyslot(tag.as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_of_its_own() {
        for slot in 0..SLOTS {
            assert_eq!(fred::util::redis_keyslot(slot_tag(slot).as_bytes()), slot);
        }
    }
}
