//! A hierarchical timing wheel for the runs due in the near term.
//!
//! Time is counted in ticks of 10 ms (see [`TickSource`]). The wheel has
//! [`NUM_LEVELS`] levels of `1 << BITS_PER_LEVEL` = 512 slots each:
//!
//! | level | slot covers      | level covers          |
//! |-------|------------------|-----------------------|
//! | 0     | 1 tick = 10 ms   | 512 ticks = 5.12 s    |
//! | 1     | 512 ticks = 5.12 s | 262,144 ticks = 43.7 min |
//! | 2     | 43.7 min         | 134,217,728 ticks = 15.5 days |
//!
//! Anything further than the top level's block waits in an *overflow* set,
//! ordered by tick, that is re-examined each time the wheel crosses into a
//! new top-level block.
//!
//! **How an entry moves.** An entry is placed at the lowest level whose
//! block contains both the wheel's `elapsed` tick and the entry's tick: the
//! highest bit in which the two differ, divided by `BITS_PER_LEVEL`, is the
//! level. Worked example with `elapsed = 0`: an entry due at 7.32 s is tick
//! 732; 732 = 1 * 512 + 220, its highest differing bit is 9, so it goes to
//! level 1, slot 1 (ticks 512..1024). When the wheel reaches tick 512 that
//! slot *expires*: its entries are placed again relative to `elapsed = 512`,
//! and tick 732 now differs from 512 only in bits below 9, so it drops to
//! level 0, slot 220, and fires when the wheel reaches tick 732. Every entry
//! is touched at most once per level: O(1) insert, cancel and amortised tick.
//!
//! **Storage.** Entries live in a slab (`Vec<Entry>` plus a free list); slot
//! lists link slab indices, and a map from the caller's handle to its slab
//! index makes cancel O(1) and lets a re-insert of a present handle move it
//! rather than add a second entry: the leader reloads the store with overlap.

mod level;

use std::collections::{BTreeSet, HashMap};

use level::{Level, NIL};

pub use crate::source::TickSource;

/// Levels in the wheel.
pub const NUM_LEVELS: usize = 3;
/// log2 of the slots per level: 512 slots.
pub const BITS_PER_LEVEL: u32 = 9;
/// Ticks the levels cover from a block start: `1 << (9 * 3)` = 15.5 days of
/// 10 ms ticks. Further deadlines wait in the overflow.
pub const MAX_DURATION: u64 = 1 << (BITS_PER_LEVEL * NUM_LEVELS as u32);

/// What an accepted insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// The handle was not in the wheel.
    New,
    /// The handle was present with another deadline and has moved.
    Moved,
    /// The handle was present with this very deadline: nothing changed.
    Unchanged,
}

/// Why an insert was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The deadline's tick has already passed: the caller fires it now. A
    /// previous entry for the same handle, if any, has been removed.
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Slot { level: u8, slot: u16 },
    Overflow,
    Free,
}

#[derive(Debug, Clone)]
struct Entry {
    handle: i64,
    due_ms: i64,
    tick: u64,
    prev: u32,
    next: u32,
    place: Place,
}

/// Where the next expiration comes from.
#[derive(Debug, Clone, Copy)]
enum Expiration {
    Slot { level: usize, deadline: u64 },
    OverflowRefill { deadline: u64 },
}

impl Expiration {
    fn deadline(self) -> u64 {
        match self {
            Expiration::Slot { deadline, .. } | Expiration::OverflowRefill { deadline } => deadline,
        }
    }
}

/// The hierarchical timing wheel. See the module documentation.
#[derive(Debug)]
pub struct Wheel {
    source: TickSource,
    bits: u32,
    elapsed: u64,
    levels: Vec<Level>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    index: HashMap<i64, u32>,
    overflow: BTreeSet<(u64, u32)>,
    fired: Vec<(i64, i64)>,
}

impl Wheel {
    /// A wheel of the standard geometry whose clock starts at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self::with_geometry(now_ms, TickSource::default(), BITS_PER_LEVEL, NUM_LEVELS)
    }

    /// A wheel of any geometry; tests use tiny ones so that cascades and the
    /// overflow appear within a few ticks.
    ///
    /// # Panics
    /// If `bits` is not in `1..=9` or the levels would not fit a `u64` tick.
    pub fn with_geometry(now_ms: i64, source: TickSource, bits: u32, num_levels: usize) -> Self {
        assert!((1..=BITS_PER_LEVEL).contains(&bits), "1..=9 bits per level");
        assert!(
            num_levels >= 1 && bits as usize * num_levels < 64,
            "levels must fit a u64 tick"
        );
        Self {
            source,
            bits,
            elapsed: source.now_tick(now_ms),
            levels: (0..num_levels)
                .map(|l| Level::new(l as u32, bits))
                .collect(),
            entries: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            overflow: BTreeSet::new(),
            fired: Vec::new(),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn contains(&self, handle: i64) -> bool {
        self.index.contains_key(&handle)
    }

    /// The tick up to which everything has fired.
    pub fn elapsed_tick(&self) -> u64 {
        self.elapsed
    }

    /// Bytes held by the wheel's own storage (slab, map, levels), by capacity.
    pub fn memory_bytes(&self) -> usize {
        let slab = self.entries.capacity() * std::mem::size_of::<Entry>();
        let free = self.free.capacity() * std::mem::size_of::<u32>();
        // hashbrown: one (key, value) pair plus one control byte per bucket.
        let map = self.index.capacity() * (std::mem::size_of::<(i64, u32)>() + 1);
        let levels: usize = self
            .levels
            .iter()
            .map(|l| l.heads.capacity() * 4 + 64)
            .sum();
        let overflow = self.overflow.len() * std::mem::size_of::<(u64, u32)>() * 2;
        slab + free + map + levels + overflow + self.fired.capacity() * 16
    }

    /// Schedules `handle` at `due_ms`, or refuses with `Expired` when its
    /// tick has passed. A present handle is moved, never duplicated.
    pub fn insert(&mut self, handle: i64, due_ms: i64) -> Result<Inserted, InsertError> {
        let mut outcome = Inserted::New;
        if let Some(&idx) = self.index.get(&handle) {
            if self.entries[idx as usize].due_ms == due_ms {
                // same deadline: a reload overlap
                return Ok(Inserted::Unchanged);
            }
            // new deadline: move it
            self.remove_index(idx);
            outcome = Inserted::Moved;
        }
        let tick = self.source.deadline_tick(due_ms);
        if tick <= self.elapsed {
            // already due: caller fires
            return Err(InsertError::Expired);
        }
        let idx = self.alloc(handle, due_ms, tick);
        self.index.insert(handle, idx);
        self.place(idx);
        Ok(outcome)
    }

    /// Removes `handle`; false when it was not there (fired or never added).
    pub fn cancel(&mut self, handle: i64) -> bool {
        match self.index.get(&handle) {
            Some(&idx) => {
                self.remove_index(idx);
                true
            }
            None => false,
        }
    }

    /// Moves the wheel to `now_ms` and appends the handles now due to `out`,
    /// ordered by (due time, handle). A `now_ms` behind the wheel is a no-op.
    pub fn advance(&mut self, now_ms: i64, out: &mut Vec<i64>) {
        let now = self.source.now_tick(now_ms);
        self.fired.clear();
        while let Some(expiration) = self.next_expiration() {
            if expiration.deadline() > now {
                break;
            }
            debug_assert!(
                expiration.deadline() >= self.elapsed,
                "expiration {expiration:?} behind elapsed {}",
                self.elapsed
            );
            self.elapsed = expiration.deadline();
            match expiration {
                Expiration::Slot { level, .. } => self.expire_slot(level),
                Expiration::OverflowRefill { .. } => self.refill_from_overflow(),
            }
        }
        self.elapsed = self.elapsed.max(now);
        self.fired.sort_unstable();
        out.extend(self.fired.iter().map(|&(_, handle)| handle));
    }

    fn next_expiration(&self) -> Option<Expiration> {
        let mut best: Option<Expiration> = None;
        for (level, l) in self.levels.iter().enumerate() {
            if let Some(deadline) = l.next_expiration(self.elapsed) {
                if best.is_none_or(|b| deadline < b.deadline()) {
                    best = Some(Expiration::Slot { level, deadline });
                }
            }
        }
        if !self.overflow.is_empty() {
            // The overflow is looked at again when the top block turns over.
            let top = self
                .levels
                .last()
                .expect("at least one level")
                .level_range();
            let deadline = (self.elapsed | (top - 1)) + 1;
            if best.is_none_or(|b| deadline < b.deadline()) {
                best = Some(Expiration::OverflowRefill { deadline });
            }
        }
        best
    }

    fn expire_slot(&mut self, level: usize) {
        let slot = self.levels[level].slot_for(self.elapsed);
        let mut idx = std::mem::replace(&mut self.levels[level].heads[slot], NIL);
        self.levels[level].clear_occupied(slot);
        while idx != NIL {
            let next = self.entries[idx as usize].next;
            self.settle(idx);
            idx = next;
        }
    }

    fn refill_from_overflow(&mut self) {
        let top = self
            .levels
            .last()
            .expect("at least one level")
            .level_range();
        let block_end = (self.elapsed | (top - 1)) + 1;
        while let Some(&(tick, idx)) = self.overflow.first() {
            if tick >= block_end {
                break;
            }
            self.overflow.pop_first();
            self.settle(idx);
        }
    }

    /// Fires an entry whose tick has come, or places it lower down.
    fn settle(&mut self, idx: u32) {
        let entry = &self.entries[idx as usize];
        if entry.tick <= self.elapsed {
            self.fired.push((entry.due_ms, entry.handle));
            let handle = entry.handle;
            self.index.remove(&handle);
            self.release(idx);
        } else {
            self.place(idx);
        }
    }

    /// The level for a tick relative to `elapsed`; `levels.len()` = overflow.
    fn level_for(&self, tick: u64) -> usize {
        let slot_mask = (1_u64 << self.bits) - 1;
        let masked = (self.elapsed ^ tick) | slot_mask;
        let significant = masked.ilog2();
        (significant / self.bits) as usize
    }

    fn place(&mut self, idx: u32) {
        let tick = self.entries[idx as usize].tick;
        debug_assert!(
            tick > self.elapsed,
            "placing tick {tick} at elapsed {}",
            self.elapsed
        );
        let level = self.level_for(tick);
        if level >= self.levels.len() {
            self.overflow.insert((tick, idx));
            let e = &mut self.entries[idx as usize];
            e.place = Place::Overflow;
            e.prev = NIL;
            e.next = NIL;
            return;
        }
        let l = &mut self.levels[level];
        let slot = l.slot_for(tick);
        let head = l.heads[slot];
        l.heads[slot] = idx;
        l.set_occupied(slot);
        if head != NIL {
            self.entries[head as usize].prev = idx;
        }
        let e = &mut self.entries[idx as usize];
        e.prev = NIL;
        e.next = head;
        e.place = Place::Slot {
            level: level as u8,
            slot: slot as u16,
        };
    }

    fn remove_index(&mut self, idx: u32) {
        let Entry {
            handle,
            tick,
            prev,
            next,
            place,
            ..
        } = self.entries[idx as usize];
        match place {
            Place::Slot { level, slot } => {
                let l = &mut self.levels[level as usize];
                if prev == NIL {
                    l.heads[slot as usize] = next;
                    if next == NIL {
                        l.clear_occupied(slot as usize);
                    }
                } else {
                    self.entries[prev as usize].next = next;
                }
                if next != NIL {
                    self.entries[next as usize].prev = prev;
                }
            }
            Place::Overflow => {
                self.overflow.remove(&(tick, idx));
            }
            Place::Free => unreachable!("handle {handle} indexes a free slab entry"),
        }
        self.index.remove(&handle);
        self.release(idx);
    }

    fn alloc(&mut self, handle: i64, due_ms: i64, tick: u64) -> u32 {
        let entry = Entry {
            handle,
            due_ms,
            tick,
            prev: NIL,
            next: NIL,
            place: Place::Free,
        };
        if let Some(idx) = self.free.pop() {
            self.entries[idx as usize] = entry;
            idx
        } else {
            let idx = u32::try_from(self.entries.len()).expect("fewer than 2^32 entries");
            assert!(idx != NIL, "slab full");
            self.entries.push(entry);
            idx
        }
    }

    fn release(&mut self, idx: u32) {
        self.entries[idx as usize].place = Place::Free;
        self.free.push(idx);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn drain(w: &mut Wheel, now_ms: i64) -> Vec<i64> {
        let mut out = Vec::new();
        w.advance(now_ms, &mut out);
        out
    }

    #[test]
    fn constants_match_the_table() {
        assert_eq!(MAX_DURATION, 134_217_728);
        // 15.5 days of 10 ms ticks.
        assert_eq!(MAX_DURATION * 10 / 1000 / 86_400, 15);
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut w = Wheel::new(0);
        assert_eq!(w.insert(1, 7_320), Ok(Inserted::New));
        assert_eq!(drain(&mut w, 7_319), Vec::<i64>::new());
        assert_eq!(drain(&mut w, 7_320), vec![1]);
        assert!(w.is_empty());
    }

    #[test]
    fn deadline_between_ticks_rounds_up() {
        let mut w = Wheel::new(0);
        w.insert(1, 15).unwrap();
        assert!(drain(&mut w, 19).is_empty());
        assert_eq!(drain(&mut w, 20), vec![1]);
    }

    #[test]
    fn expired_insert_is_refused() {
        let mut w = Wheel::new(1_000);
        assert_eq!(w.insert(1, 1_000), Err(InsertError::Expired));
        assert_eq!(w.insert(2, 500), Err(InsertError::Expired));
        assert_eq!(w.insert(3, 1_001), Ok(Inserted::New));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn reinsert_does_not_duplicate() {
        let mut w = Wheel::new(0);
        assert_eq!(w.insert(7, 5_000), Ok(Inserted::New));
        assert_eq!(w.insert(7, 5_000), Ok(Inserted::Unchanged));
        assert_eq!(w.insert(7, 9_000), Ok(Inserted::Moved));
        assert_eq!(w.len(), 1);
        assert!(drain(&mut w, 8_000).is_empty());
        assert_eq!(drain(&mut w, 9_000), vec![7]);
        assert!(drain(&mut w, 100_000).is_empty());
    }

    #[test]
    fn reinsert_into_the_past_removes_and_reports() {
        let mut w = Wheel::new(1_000);
        w.insert(7, 5_000).unwrap();
        assert_eq!(w.insert(7, 900), Err(InsertError::Expired));
        assert!(!w.contains(7));
    }

    #[test]
    fn cancel_unlinks_from_the_middle_of_a_slot() {
        let mut w = Wheel::new(0);
        for h in 1..=3 {
            w.insert(h, 100).unwrap();
        }
        assert!(w.cancel(2));
        assert!(!w.cancel(2));
        assert_eq!(drain(&mut w, 100), vec![1, 3]);
    }

    #[test]
    fn output_is_in_due_order_then_handle() {
        let mut w = Wheel::new(0);
        w.insert(5, 3_000).unwrap();
        w.insert(9, 1_000).unwrap();
        w.insert(1, 3_000).unwrap();
        w.insert(2, 2_000_000).unwrap();
        assert_eq!(drain(&mut w, 4_000_000), vec![9, 1, 5, 2]);
    }

    #[test]
    fn cascades_through_every_level() {
        let mut w = Wheel::new(0);
        let day_ms = 86_400_000;
        w.insert(1, 1_000).unwrap();
        w.insert(2, 600_000).unwrap();
        w.insert(3, day_ms).unwrap();
        w.insert(4, 20 * day_ms).unwrap(); // beyond 15.5 days: overflow
        assert_eq!(w.len(), 4);
        assert_eq!(drain(&mut w, 999), Vec::<i64>::new());
        assert_eq!(drain(&mut w, 1_000), vec![1]);
        assert_eq!(drain(&mut w, 599_999), Vec::<i64>::new());
        assert_eq!(drain(&mut w, 600_000), vec![2]);
        assert_eq!(drain(&mut w, day_ms - 1), Vec::<i64>::new());
        assert_eq!(drain(&mut w, day_ms), vec![3]);
        assert_eq!(drain(&mut w, 20 * day_ms - 10), Vec::<i64>::new());
        assert_eq!(drain(&mut w, 20 * day_ms), vec![4]);
        assert!(w.is_empty());
    }

    #[test]
    fn tiny_wheel_overflows_at_once() {
        // 4 slots x 2 levels of 1 ms ticks: the levels cover 16 ticks.
        let mut w = Wheel::with_geometry(0, TickSource::new(1), 2, 2);
        for (h, due) in [(1, 3), (2, 15), (3, 16), (4, 40), (5, 41), (6, 1000)] {
            w.insert(h, due).unwrap();
        }
        assert_eq!(w.overflow.len(), 4);
        let mut seen = Vec::new();
        for now in 0..=1000 {
            let fired = drain(&mut w, now);
            for h in fired {
                seen.push((now, h));
            }
        }
        assert_eq!(
            seen,
            vec![(3, 1), (15, 2), (16, 3), (40, 4), (41, 5), (1000, 6)]
        );
    }

    #[test]
    fn tiny_wheel_matches_a_sorted_list_under_jumps() {
        // A deterministic pseudo-random walk checked against a plain model.
        let mut w = Wheel::with_geometry(0, TickSource::new(1), 2, 2);
        let mut model: Vec<(i64, i64)> = Vec::new();
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut now = 0_i64;
        for step in 0..5_000 {
            let r = next();
            match r % 4 {
                0 | 1 => {
                    let handle = (next() % 50) as i64;
                    let due = now + (next() % 70) as i64;
                    model.retain(|&(_, h)| h != handle);
                    match w.insert(handle, due) {
                        Ok(_) => model.push((due, handle)),
                        Err(InsertError::Expired) => assert!(due <= now, "step {step}"),
                    }
                }
                2 => {
                    let handle = (next() % 50) as i64;
                    let had = model.iter().any(|&(_, h)| h == handle);
                    model.retain(|&(_, h)| h != handle);
                    assert_eq!(w.cancel(handle), had, "step {step}");
                }
                _ => {
                    now += (next() % 40) as i64;
                    let mut due: Vec<(i64, i64)> =
                        model.iter().copied().filter(|&(d, _)| d <= now).collect();
                    due.sort_unstable();
                    model.retain(|&(d, _)| d > now);
                    let expect: Vec<i64> = due.into_iter().map(|(_, h)| h).collect();
                    assert_eq!(drain(&mut w, now), expect, "step {step} now {now}");
                }
            }
            assert_eq!(w.len(), model.len(), "step {step}");
        }
    }

    #[test]
    fn advancing_backwards_is_a_no_op() {
        let mut w = Wheel::new(10_000);
        w.insert(1, 20_000).unwrap();
        assert!(drain(&mut w, 5_000).is_empty());
        assert_eq!(w.elapsed_tick(), 1_000);
        assert_eq!(drain(&mut w, 20_000), vec![1]);
    }

    #[test]
    fn slab_entries_are_reused() {
        let mut w = Wheel::new(0);
        for round in 0..10 {
            for h in 0..100 {
                w.insert(h, (round + 1) * 1_000).unwrap();
            }
            assert_eq!(drain(&mut w, (round + 1) * 1_000).len(), 100);
        }
        assert_eq!(w.entries.len(), 100);
    }
}
