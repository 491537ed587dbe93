//! How flightdeck's layers hold their metric handles: registered once per
//! recorder, whatever the order in which the recorder was installed and
//! the layers were built.
//!
//! The `metrics` macros build a key (allocating its labels) and look it up
//! in the recorder on every event. Hot paths instead keep handles; but a
//! handle registered before a recorder existed is a no-op for ever, and
//! users install recorders in every order. [`Handles`] keeps the handles
//! registered under each recorder it has seen (the no-op one, then the
//! global one: a process installs at most one), picks the set of the
//! recorder in force at each use with two atomic loads, and registers a new
//! set, once, when the recorder changes. Gauges whose value the layer keeps
//! are re-published by the registering closure.
//!
//! ```
//! use flightdeck_core::metric::Handles;
//! use metrics::{Counter, Key, Level, Metadata};
//!
//! static META: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);
//! static REQUESTS: Handles<Counter> = Handles::new();
//!
//! fn count() {
//!     REQUESTS.with(
//!         |r| r.register_counter(&Key::from_name("requests_total"), &META),
//!         |c| c.increment(1),
//!     );
//! }
//! count(); // no recorder yet: a no-op handle, registered once
//! let recorder = metrics_util::debugging::DebuggingRecorder::new();
//! let snapshot = recorder.snapshotter();
//! metrics::with_local_recorder(&recorder, count); // registered again, under this one
//! assert_eq!(snapshot.snapshot().into_vec().len(), 1);
//! ```

use std::sync::OnceLock;

use metrics::Recorder;

/// Identifies a recorder (the one in force on this thread: a local one, the
/// global one, or the no-op recorder).
fn recorder_id(recorder: &dyn Recorder) -> usize {
    (recorder as *const dyn Recorder).cast::<()>() as usize
}

/// The [`recorder_id`] of the recorder in force on this thread. Not
/// generic (so compiled once, here): the thread-local lookup that
/// `metrics::with_recorder` makes is then one plain call from every
/// [`Handles`] use, instead of an instance that may or may not land where
/// its caller can inline it.
#[inline(never)]
pub(crate) fn current_recorder_id() -> usize {
    metrics::with_recorder(recorder_id)
}

/// Handles (a single handle, or a bundle) registered with each recorder in
/// force when they were used: a recorder installed after a handle was
/// first used gets handles of its own at the next use.
///
/// Three recorders are remembered (the no-op one, the global one, and one
/// more, e.g. a test's local recorder); under a fourth, handles are
/// registered on every use.
pub struct Handles<T> {
    gens: [OnceLock<(usize, T)>; 3],
}

impl<T> Handles<T> {
    /// No handles registered yet.
    pub const fn new() -> Self {
        Self {
            gens: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
        }
    }

    /// Runs `f` with the handles registered under the recorder in force,
    /// registering them with `register` the first time that recorder is
    /// seen.
    #[inline]
    pub fn with<R>(&self, register: impl FnOnce(&dyn Recorder) -> T, f: impl FnOnce(&T) -> R) -> R {
        self.resolve(register, f).1
    }

    /// Like [`with`](Self::with), and also returns the [`Generation`] whose
    /// handles `f` got: an operation that records several events (a flight
    /// counted in when it starts and out when it ends) looks the recorder
    /// up once and records every event under the same one with
    /// [`with_generation`](Self::with_generation).
    #[inline]
    pub fn resolve<R>(
        &self,
        register: impl FnOnce(&dyn Recorder) -> T,
        f: impl FnOnce(&T) -> R,
    ) -> (Generation, R) {
        let id = current_recorder_id();
        for (i, gen) in self.gens.iter().enumerate() {
            if let Some((seen, handles)) = gen.get() {
                if *seen == id {
                    return (Generation(i as u8), f(handles));
                }
            }
        }
        self.resolve_slow(register, f)
    }

    /// [`resolve`](Self::resolve) the slow way, out of the way of the
    /// common cases (which then stay small enough to inline): under a
    /// recorder not seen yet its handles are registered, under one seen
    /// already they are found.
    #[cold]
    #[inline(never)]
    fn resolve_slow<R>(
        &self,
        register: impl FnOnce(&dyn Recorder) -> T,
        f: impl FnOnce(&T) -> R,
    ) -> (Generation, R) {
        metrics::with_recorder(|recorder| {
            let id = recorder_id(recorder);
            let out = self.register(recorder, id, register, f);
            let i = self
                .gens
                .iter()
                .position(|g| g.get().is_some_and(|(seen, _)| *seen == id));
            (Generation(i.map_or(Generation::NONE.0, |i| i as u8)), out)
        })
    }

    /// Runs `f` with the handles of `gen` (see [`resolve`](Self::resolve)),
    /// without looking the recorder up; for a generation that holds none
    /// (a fourth recorder), as [`with`](Self::with) does.
    #[inline]
    pub fn with_generation<R>(
        &self,
        gen: Generation,
        register: impl FnOnce(&dyn Recorder) -> T,
        f: impl FnOnce(&T) -> R,
    ) -> R {
        match self.gens.get(usize::from(gen.0)).and_then(OnceLock::get) {
            Some((_, handles)) => f(handles),
            None => self.resolve_slow(register, f).1,
        }
    }

    #[cold]
    fn register<R>(
        &self,
        recorder: &dyn Recorder,
        id: usize,
        register: impl FnOnce(&dyn Recorder) -> T,
        f: impl FnOnce(&T) -> R,
    ) -> R {
        let mut register = Some(register);
        for gen in &self.gens {
            // Our closure runs only for an empty generation, which then is
            // ours; a generation another thread filled is skipped.
            let (seen, handles) = gen.get_or_init(|| {
                let build = register
                    .take()
                    .expect("runs at most once: it fills this generation");
                (id, build(recorder))
            });
            if *seen == id {
                return f(handles);
            }
        }
        // Every generation belongs to another recorder: register for this
        // use only.
        let build = register.expect("not taken: no generation was filled by this call");
        f(&build(recorder))
    }
}

/// Which recorder's handles of a [`Handles`] an operation records under
/// (see [`Handles::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(u8);

impl Generation {
    /// No generation: events are recorded under the recorder in force at
    /// each use.
    pub const NONE: Generation = Generation(u8::MAX);
}

impl<T> Default for Handles<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for Handles<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seen = self.gens.iter().filter(|g| g.get().is_some()).count();
        f.debug_struct("Handles").field("recorders", &seen).finish()
    }
}

/// Whether `histogram` has a recorder behind it: a no-op handle never
/// converts the value it is given, a real one always does, and a count of
/// zero records no sample. Tells the no-op recorder (in force before one
/// is installed) from a real one without registering anything.
pub fn records(histogram: &metrics::Histogram) -> bool {
    struct Probe<'a>(&'a std::cell::Cell<bool>);
    impl metrics::IntoF64 for Probe<'_> {
        fn into_f64(self) -> f64 {
            self.0.set(true);
            0.0
        }
    }
    let converted = std::cell::Cell::new(false);
    histogram.record_many(Probe(&converted), 0);
    converted.get()
}
