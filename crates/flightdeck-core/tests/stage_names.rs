//! Stage names are interned, and a process keeps a bounded number of them.
//! A file of its own: the interner is per process, and this test fills it.

use std::collections::HashSet;

use flightdeck_core::key::MAX_STAGE_NAMES;
use flightdeck_core::StageName;

#[test]
fn names_are_interned_and_bounded() {
    // Equal names, made apart (and on other threads), are one name.
    let here = StageName::new("score").unwrap();
    let there: Vec<StageName> = (0..4)
        .map(|_| std::thread::spawn(|| StageName::new("score").unwrap()))
        .map(|t| t.join().unwrap())
        .collect();
    for s in &there {
        assert_eq!(s, &here);
        assert!(std::ptr::eq(s.as_str(), here.as_str()));
    }
    assert_ne!(here, StageName::new("report").unwrap());
    let set: HashSet<StageName> = there.into_iter().chain([here.clone()]).collect();
    assert_eq!(set.len(), 1);
    assert!(StageName::new("report").unwrap() < here);

    // Fill the interner to its bound ("score" and "report" are in it).
    for i in 2..MAX_STAGE_NAMES {
        StageName::new(format!("s{i}")).unwrap();
    }
    let err = StageName::new("one-too-many").unwrap_err().to_string();
    assert!(
        err.contains("one-too-many") && err.contains("4096"),
        "{err}"
    );
    // Known names still work; invalid names are still told as such.
    assert_eq!(StageName::new("s17").unwrap().as_str(), "s17");
    assert_eq!(StageName::new("score").unwrap(), here);
    assert!(StageName::new("")
        .unwrap_err()
        .to_string()
        .contains("is empty"));
}
