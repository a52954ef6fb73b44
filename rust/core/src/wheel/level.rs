//! One level of the timing wheel.

/// The index that means "no entry" in the slab-linked slot lists.
pub(crate) const NIL: u32 = u32::MAX;

/// Most slots a level can have: the occupied bitmap is `[u64; 8]`.
pub(crate) const MAX_SLOTS: usize = 512;

/// One level, `depth` 0 at the bottom: `1 << bits` slots, each a doubly linked list of slab indices.
///
/// Which slots hold entries is kept in an occupied bitmap of `[u64; 8]`
/// (512 slots / 64 bits a word), so finding the next occupied slot is a few
/// `trailing_zeros` over eight words rather than a scan of 512 heads.
///
/// A slot at level `l` spans `1 << (bits * l)` ticks and the whole level
/// spans `1 << (bits * (l + 1))` ticks. Every entry at a level lies in the
/// same level-sized block as the wheel's `elapsed` tick, at or after its slot.
#[derive(Debug)]
pub(crate) struct Level {
    depth: u32,
    bits: u32,
    occupied: [u64; 8],
    pub(crate) heads: Vec<u32>,
}

impl Level {
    pub(crate) fn new(depth: u32, bits: u32) -> Self {
        let slots = 1_usize << bits;
        debug_assert!(slots <= MAX_SLOTS, "{slots} slots exceed the bitmap");
        Self {
            depth,
            bits,
            occupied: [0; 8],
            heads: vec![NIL; slots],
        }
    }

    /// Ticks covered by one slot of this level.
    pub(crate) fn slot_range(&self) -> u64 {
        1 << (self.bits * self.depth)
    }

    /// Ticks covered by the whole level.
    pub(crate) fn level_range(&self) -> u64 {
        1 << (self.bits * (self.depth + 1))
    }

    /// The slot of this level that `tick` falls in.
    pub(crate) fn slot_for(&self, tick: u64) -> usize {
        ((tick >> (self.bits * self.depth)) & ((1 << self.bits) - 1)) as usize
    }

    pub(crate) fn set_occupied(&mut self, slot: usize) {
        self.occupied[slot / 64] |= 1 << (slot % 64);
    }

    pub(crate) fn clear_occupied(&mut self, slot: usize) {
        self.occupied[slot / 64] &= !(1 << (slot % 64));
    }

    /// The start tick of the first occupied slot at or after `elapsed`'s
    /// slot, in `elapsed`'s block; `None` when the level is empty.
    pub(crate) fn next_expiration(&self, elapsed: u64) -> Option<u64> {
        let slot = self.first_occupied_from(self.slot_for(elapsed))?;
        let block_start = elapsed & !(self.level_range() - 1);
        Some(block_start + slot as u64 * self.slot_range())
    }

    fn first_occupied_from(&self, from: usize) -> Option<usize> {
        let words = self.heads.len().div_ceil(64);
        let mut word = from / 64;
        let mut bits = self.occupied[word] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word >= words {
                return None;
            }
            bits = self.occupied[word];
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ranges_follow_the_level_table() {
        let l0 = Level::new(0, 9);
        let l1 = Level::new(1, 9);
        let l2 = Level::new(2, 9);
        assert_eq!((l0.slot_range(), l0.level_range()), (1, 512));
        assert_eq!((l1.slot_range(), l1.level_range()), (512, 262_144));
        assert_eq!((l2.slot_range(), l2.level_range()), (262_144, 134_217_728));
    }

    #[test]
    fn slot_for_masks_the_level_bits() {
        let l1 = Level::new(1, 9);
        assert_eq!(l1.slot_for(511), 0);
        assert_eq!(l1.slot_for(512), 1);
        assert_eq!(l1.slot_for(262_144 + 1024), 2);
    }

    #[test]
    fn next_expiration_searches_every_word() {
        let mut l0 = Level::new(0, 9);
        assert_eq!(l0.next_expiration(0), None);
        for slot in [0, 63, 64, 200, 511] {
            l0.set_occupied(slot);
            assert_eq!(l0.next_expiration(0), Some(slot as u64));
            l0.clear_occupied(slot);
        }
        l0.set_occupied(300);
        assert_eq!(l0.next_expiration(1024 + 5), Some(1024 + 300));
        assert_eq!(l0.next_expiration(1024 + 301), None);
        l0.clear_occupied(300);
        assert_eq!(l0.occupied, [0; 8]);
    }

    #[test]
    fn tiny_levels_use_part_of_one_word() {
        let mut l1 = Level::new(1, 2); // 4 slots of 4 ticks, 16-tick block
        l1.set_occupied(3);
        assert_eq!(l1.next_expiration(16 + 5), Some(16 + 12));
    }
}
