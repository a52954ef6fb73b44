//! The one place where wall time (epoch milliseconds) becomes wheel ticks.
//!
//! A deadline rounds *up* to its tick and "now" rounds *down*, so an entry
//! can fire up to one tick late but never early.

/// Converts epoch milliseconds to ticks of a fixed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickSource {
    tick_ms: u64,
}

impl TickSource {
    /// The wheel's tick: 10 ms.
    pub const DEFAULT_TICK_MS: u64 = 10;

    /// # Panics
    /// If `tick_ms` is zero.
    pub fn new(tick_ms: u64) -> Self {
        assert!(tick_ms > 0, "a tick must last at least 1 ms");
        Self { tick_ms }
    }

    pub fn tick_ms(self) -> u64 {
        self.tick_ms
    }

    /// The tick at which a deadline fires: `ceil(ms / tick)`; times before
    /// the epoch all map to tick 0, which has always passed.
    pub fn deadline_tick(self, ms: i64) -> u64 {
        if ms <= 0 {
            0
        } else {
            (ms as u64).div_ceil(self.tick_ms)
        }
    }

    /// The last tick that has fully begun at `ms`: `floor(ms / tick)`.
    pub fn now_tick(self, ms: i64) -> u64 {
        if ms <= 0 {
            0
        } else {
            ms as u64 / self.tick_ms
        }
    }
}

impl Default for TickSource {
    fn default() -> Self {
        Self::new(Self::DEFAULT_TICK_MS)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn deadline_rounds_up_and_now_rounds_down() {
        let s = TickSource::default();
        assert_eq!(s.deadline_tick(0), 0);
        assert_eq!(s.deadline_tick(1), 1);
        assert_eq!(s.deadline_tick(10), 1);
        assert_eq!(s.deadline_tick(11), 2);
        assert_eq!(s.deadline_tick(-5), 0);
        assert_eq!(s.now_tick(9), 0);
        assert_eq!(s.now_tick(10), 1);
        assert_eq!(s.now_tick(19), 1);
        assert_eq!(s.now_tick(-1), 0);
    }

    #[test]
    fn nothing_fires_early() {
        let s = TickSource::default();
        for due in 0..200_i64 {
            let t = s.deadline_tick(due);
            // The first now at which now_tick reaches t is t * tick_ms.
            assert!(
                (t * s.tick_ms()) as i64 >= due,
                "due {due} fires at tick {t}"
            );
        }
    }
}
