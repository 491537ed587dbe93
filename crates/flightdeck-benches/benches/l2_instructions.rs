//! One L2 row alone, for `valgrind --tool=callgrind`: instruction counts
//! do not depend on the machine's load, and on a 2-core machine the
//! client's instructions per flight compete with redis-server's. The rows
//! of `benches/l2.rs`, sequential on a current-thread runtime:
//!
//! - `owner`: a flight on a fresh key (ACQUIRE + trivial work + COMMIT),
//!   waiting for its background commit;
//! - `hit`: a flight whose result is stored (one ACQUIRE), from another
//!   node than the one that committed it;
//! - `evalsha`: raw fred running `return 1` (one key) by `EVALSHA`, the
//!   hit's floor;
//! - `evalsha2`: two of them, the owner's floor.
//!
//! `L2_ROW=<row> L2_ITERS=<n>`, after a warm-up; run it at two counts and
//! divide the difference of the totals by the difference of the counts
//! (start-up cancels out): `scripts/l2-instructions` does that. Only this
//! process is traced: the harness's redis-server is a child of its own.

use flightdeck_benches::l2::{
    connect, evalsha, flight, floor_client, fresh_key, load_floor, node, owner,
};
use flightdeck_core::FlightKey;
use flightdeck_harness::RedisServer;

const ROWS: [&str; 4] = ["owner", "hit", "evalsha", "evalsha2"];
/// Calls before the counted ones: scripts loaded, connections warm.
const WARM_UP: u64 = 200;
/// Stored results the `hit` row cycles through.
const STORED: usize = 64;

fn main() {
    let row = std::env::var("L2_ROW").unwrap_or_default();
    if !ROWS.contains(&row.as_str()) {
        eprintln!("no row {row:?}; rows: {ROWS:?}");
        std::process::exit(2);
    }
    let iters: u64 = std::env::var("L2_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let redis = RedisServer::start().expect("redis-server starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let url = redis.url();
        let (a, b) = (connect(&url).await, connect(&url).await);
        let client = floor_client(&url).await;
        let sha = load_floor(&client).await;
        let (node_a, node_b) = (node(a), node(b));
        let stored: Vec<FlightKey> = (0..STORED).map(|_| fresh_key()).collect();
        for k in &stored {
            flight(&node_a, k).await;
        }
        node_a.idle().await;
        let started = std::time::Instant::now();
        for i in 0..WARM_UP + iters {
            match row.as_str() {
                "owner" => owner(&node_a).await,
                "hit" => flight(&node_b, &stored[i as usize % STORED]).await,
                "evalsha" => evalsha(&client, &sha).await,
                _ => {
                    evalsha(&client, &sha).await;
                    evalsha(&client, &sha).await;
                }
            }
        }
        println!(
            "{row}: {iters} (+{WARM_UP} warm-up) in {:?}",
            started.elapsed()
        );
    });
}
