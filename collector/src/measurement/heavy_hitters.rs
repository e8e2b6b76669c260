//! The values of a dimension seen most often in a day (contract v5 §2), in bounded memory: the
//! machinery of [`super::dimensions::DistinctValues`], which owns one [`Sketch`], shared, and
//! one [`TopValues`] per (site, name) pair, and forgets them all when the day changes.
//!
//! The rule, per pair and UTC day: at most [`MAX_DISTINCT`] values are kept, each with the
//! number of times it was seen; a value not kept is counted in the [`Sketch`] and takes the
//! place of the least-seen kept one only when its count there is strictly greater (a variant
//! of Space-Saving, Metwally, Agrawal and El Abbadi, "Efficient computation of frequent and
//! top-k elements in data streams", 2005, whose newcomer must outcount the least-seen kept
//! value rather than always replace it). A flood of values each seen once cannot hold the
//! places against values seen twice or more, whenever the flood came. Once
//! [`MAX_ADMITTED_PER_DAY`] values were let in per pair and day, a newcomer must be seen more
//! than twice as often as the least-seen kept value: the values stored stay few whatever the
//! churn (each doubling of the least count lets in at most [`MAX_DISTINCT`] more), and a flood
//! that spent the admissions on values seen a few times each cannot freeze the places against
//! real values seen thousands of times (found by an adversarial review of issue 52: 5,500
//! sightings, 100 values seen once, 100 twice, ..., 100 ten times, froze them for the day).

use std::collections::HashMap;

/// Most values a collector keeps at once per site, name and UTC day (contract v4 §2, v5 §2):
/// those seen most often that day; a value not kept is stored as
/// [`super::dimensions::OTHER`], and takes the place of the least-seen kept one only by being
/// seen strictly more often (see [`super::dimensions::DistinctValues`]).
pub const MAX_DISTINCT: usize = 100;
/// Values let in (kept) per site, name and UTC day, replacements included, before the bar
/// rises: ten times [`MAX_DISTINCT`]. Beyond it a newcomer must be seen more than twice as
/// often as the least-seen kept value ([`TopValues::see`]), so each further admission comes
/// with the least count doubled for at most [`MAX_DISTINCT`] of them: with counts below 2^32,
/// at most 32 × 100 more, so at most 4,200 distinct values stored per site, name and day
/// (plus the rare value whose 64-bit hash equals a kept one's), never unbounded.
pub const MAX_ADMITTED_PER_DAY: usize = 10 * MAX_DISTINCT;

/// Cells per row of the [`Sketch`]: 2^16.
const SKETCH_WIDTH: usize = 1 << 16;
/// Rows of the [`Sketch`]: a key's estimate is the least of its cell in each.
const SKETCH_ROWS: usize = 2;

/// Counts of the values not kept, shared by every (site, name) pair of the day: a count-min
/// sketch (Cormode and Muthukrishnan, 2005) of 2 rows × 2^16 `u32` cells, 512 KiB, allocated at
/// the first value counted and whatever the traffic never more, keyed by a hash of (site,
/// name, value). Conservative update: a sighting raises only the cells below the new estimate.
/// An estimate is never below the key's true count since the last [`Sketch::clear`]; it is
/// above it only by the sightings of keys sharing both its cells (a few in 2^32 for two keys
/// on a day of ordinary traffic; every cell rises by about n / 2^16 after n distinct keys).
#[derive(Debug, Default)]
pub(super) struct Sketch {
    /// Row 0 then row 1; empty until the first count.
    cells: Vec<u32>,
}

impl Sketch {
    /// The cells of `key`, one per row: its low 16 bits in row 0, the next 16 in row 1 (the
    /// key comes from a random per-process hash, so the two halves are independent).
    fn cells_of(key: u64) -> [usize; SKETCH_ROWS] {
        [
            usize::from(key as u16),
            SKETCH_WIDTH + usize::from((key >> 16) as u16),
        ]
    }

    /// Counts one sighting of `key`; returns its estimate after it (at least 1).
    pub(super) fn add_one(&mut self, key: u64) -> u32 {
        if self.cells.is_empty() {
            self.cells = vec![0; SKETCH_ROWS * SKETCH_WIDTH];
        }
        let at = Self::cells_of(key);
        let least = at.iter().map(|&i| self.cells[i]).min().unwrap_or(0);
        let estimate = least.saturating_add(1);
        for i in at {
            self.cells[i] = self.cells[i].max(estimate);
        }
        estimate
    }

    /// Raises `key`'s estimate to at least `count` (a kept value's count, given back when it
    /// loses its place, so that it returns by being seen again rather than from nothing).
    pub(super) fn raise(&mut self, key: u64, count: u32) {
        if self.cells.is_empty() {
            self.cells = vec![0; SKETCH_ROWS * SKETCH_WIDTH];
        }
        for i in Self::cells_of(key) {
            self.cells[i] = self.cells[i].max(count);
        }
    }

    /// Forgets every count (the day changed); keeps the cells allocated.
    pub(super) fn clear(&mut self) {
        self.cells.fill(0);
    }
}

/// The values kept for one (site, name) pair in one day: at most [`MAX_DISTINCT`], each as
/// its 64-bit hash with its count of sightings (about 2 KiB at 100 values, with the map's
/// overhead), and how many were let in that day (at most [`MAX_ADMITTED_PER_DAY`]).
#[derive(Debug, Default)]
pub(super) struct TopValues {
    /// Hash of a kept value → times seen that day (its estimate when it came in, plus one a
    /// sighting since).
    counts: HashMap<u64, u32>,
    /// Values let in this day, replacements included.
    admitted: usize,
}

impl TopValues {
    /// One sighting of the value whose hash is `value`: whether it is stored as itself (else
    /// as `(other)`). A kept value counts one more. Another is counted in `sketch` (under
    /// `key(value)`: its key there) and let in while fewer than [`MAX_DISTINCT`] are kept, or
    /// in place of the least-seen kept one when its estimate is strictly greater than that
    /// one's count (the evicted value's count goes back into `sketch`), or, once
    /// [`MAX_ADMITTED_PER_DAY`] were let in, strictly greater than twice that count.
    pub(super) fn see(
        &mut self,
        value: u64,
        sketch: &mut Sketch,
        key: impl Fn(u64) -> u64,
    ) -> bool {
        if let Some(count) = self.counts.get_mut(&value) {
            *count = count.saturating_add(1);
            return true;
        }
        let estimate = sketch.add_one(key(value));
        if self.counts.len() >= MAX_DISTINCT {
            let Some((least, least_count)) = self.least_seen() else {
                return false;
            };
            let bar = if self.admitted >= MAX_ADMITTED_PER_DAY {
                least_count.saturating_mul(2)
            } else {
                least_count
            };
            if estimate <= bar {
                return false;
            }
            self.counts.remove(&least);
            sketch.raise(key(least), least_count);
        }
        self.counts.insert(value, estimate);
        self.admitted += 1;
        true
    }

    /// The kept value seen least often and its count (any one of them on a tie); a scan of
    /// at most [`MAX_DISTINCT`] entries.
    fn least_seen(&self) -> Option<(u64, u32)> {
        self.counts
            .iter()
            .min_by_key(|(_, count)| **count)
            .map(|(v, c)| (*v, *c))
    }

    /// Values kept now (at most [`MAX_DISTINCT`]).
    #[cfg(test)]
    pub(super) fn kept(&self) -> usize {
        self.counts.len()
    }

    /// Values let in this day.
    #[cfg(test)]
    pub(super) fn admitted(&self) -> usize {
        self.admitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sketch_never_underestimates_and_gives_back_raised_counts() {
        let mut s = Sketch::default();
        let hasher = std::hash::RandomState::new();
        let keys: Vec<u64> = (0..5_000u64)
            .map(|i| std::hash::BuildHasher::hash_one(&hasher, i))
            .collect();
        for (n, &k) in keys.iter().enumerate() {
            for _ in 0..=n % 3 {
                s.add_one(k);
            }
        }
        for (n, &k) in keys.iter().enumerate() {
            let truth = (n % 3 + 1) as u32;
            assert!(s.add_one(k) > truth, "never below the true count");
        }
        s.raise(keys[0], 40);
        assert!(s.add_one(keys[0]) > 40);
        s.clear();
        assert_eq!(s.add_one(keys[0]), 1, "a new day starts from nothing");
    }
}
