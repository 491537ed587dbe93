//! The JSON-lines log the recorders of node processes write
//! ([`EventLog`]), its in-memory stand-in for tests ([`SharedBuffer`]), and
//! the mapping of its wall-clock times onto a reader's clock
//! ([`WallClock`]). Re-exported by [`recorder`](crate::recorder).

use std::fmt;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::time::Instant;

/// Microseconds since the Unix epoch: the time of a logged event.
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Maps logged wall-clock times onto this process's clock: both clocks are
/// read once, and every logged time keeps its distance from that moment,
/// so order and intervals survive (a wall-clock step during the run would
/// not; test machines do not step their clocks mid-run).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    instant: Instant,
    wall_us: u64,
}

impl WallClock {
    /// Both clocks, now.
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall_us: wall_us(),
        }
    }

    /// The instant of a logged time.
    pub fn instant(&self, us: u64) -> Instant {
        if us <= self.wall_us {
            let back = Duration::from_micros(self.wall_us - us);
            self.instant.checked_sub(back).unwrap_or(self.instant)
        } else {
            self.instant + Duration::from_micros(us - self.wall_us)
        }
    }
}

/// A sink of JSON lines shared by the recorders (and other journaling) of
/// one process: each event is one line, written and flushed at once.
/// Write errors are ignored (the journal is for checks after the run).
#[derive(Clone)]
pub struct EventLog {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl EventLog {
    /// Logs to `out`.
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Self {
            out: Arc::new(Mutex::new(Box::new(out))),
        }
    }

    /// Appends to the file at `path`, creating it.
    pub fn append_to(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self::new(file))
    }

    /// Writes `event` as one line and flushes it.
    pub fn write(&self, event: &Value) {
        let mut line = event.to_string();
        line.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
}

/// An in-memory [`Write`] whose clones share one buffer: a log file for
/// tests (`EventLog::new(buffer.clone())`, then `buffer.text()`).
#[derive(Clone, Debug, Default)]
pub struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    /// Everything written so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for EventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLog").finish_non_exhaustive()
    }
}
