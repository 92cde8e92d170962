//! Pacing of long walks run in the background: a thread that sets a duty
//! cycle ([`paced`]) works in slices and sleeps between them, so that a
//! scheduled check of a writable layer of tens of thousands of files takes
//! longer instead of taking CPU time and cache from the sandboxes that are
//! working. The walks of this crate call [`tick`] per entry; a thread with no
//! pacer set runs at full speed.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Work done before a pause.
const SLICE: Duration = Duration::from_millis(2);

#[derive(Clone, Copy)]
struct Pacer {
    /// Share of wall time spent working, in (0, 1].
    duty: f64,
    /// Start of the current work slice.
    since: Instant,
}

thread_local! {
    static PACER: Cell<Option<Pacer>> = const { Cell::new(None) };
}

/// Runs `f` on this thread working at most `duty` of the time (0.05 to 1.0;
/// 1.0 is no pacing), then restores the thread's previous pacing.
pub fn paced<T>(duty: f64, f: impl FnOnce() -> T) -> T {
    let duty = duty.clamp(0.05, 1.0);
    let before = PACER.with(|p| p.replace((duty < 1.0).then(|| Pacer { duty, since: Instant::now() })));
    struct Restore(Option<Pacer>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PACER.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// Called between units of work: once the current slice is used up, sleeps
/// so that work stays at the thread's duty cycle. Free when no pacer is set.
pub fn tick() {
    PACER.with(|p| {
        let Some(mut pacer) = p.get() else { return };
        let worked = pacer.since.elapsed();
        if worked < SLICE {
            return;
        }
        std::thread::sleep(worked.mul_f64((1.0 - pacer.duty) / pacer.duty));
        pacer.since = Instant::now();
        p.set(Some(pacer));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 ms of work in 100 µs units, with a tick after each.
    fn busy() {
        for _ in 0..200 {
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(100) {}
            tick();
        }
    }

    #[test]
    fn a_paced_thread_sleeps_between_slices_and_others_do_not() {
        // Unpaced: tick never sleeps (the loop ends as soon as the work does).
        let t = Instant::now();
        busy();
        let unpaced = t.elapsed();
        // At a quarter duty, 20 ms of work takes at least three times as long again in sleeps.
        let t = Instant::now();
        paced(0.25, busy);
        let at_quarter = t.elapsed();
        assert!(at_quarter >= Duration::from_millis(20 + 3 * 18), "{at_quarter:?} (unpaced {unpaced:?})");
        // The pacing ended with the closure.
        assert!(PACER.with(|p| p.get()).is_none());
    }
}
