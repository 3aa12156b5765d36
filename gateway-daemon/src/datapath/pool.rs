//! Where the Maglev tables lie in their pool (`berth_maglev`, one array of backend ids),
//! pure: regions handed out and given back, never the maps themselves.
//!
//! A service's table is a region of `maglev_size(backends)` entries. A new table is
//! written into free space before the service points at it, so switching is one atomic
//! update of the service; the region it replaces is given back. Regions are handed out
//! next-fit (as `ids::IdPool` hands out ids): the search for room starts where the last
//! region ended, so a region just given back is not reused at once (a CPU may still be
//! reading it through a service it looked up before the switch); adjacent free regions
//! merge, so tables of every size class share the space.
//!
//! How big the pool is (`Limits::maglev_pool_entries`): no table takes more than
//! `MAGLEV_POOL_ENTRIES_PER_BACKEND` entries per backend, so the tables of any state
//! within `--max-backends` fit, with one largest table's room beside them for the
//! switch of the service being changed.

use std::collections::BTreeMap;

use super::{DatapathError, Resource, Result};

/// A region of the pool: first entry and number of entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Region {
    pub(super) start: u32,
    pub(super) len: u32,
}

impl Region {
    /// No region: a service without a table.
    pub(super) const EMPTY: Region = Region { start: 0, len: 0 };

    fn end(self) -> u32 {
        self.start + self.len
    }
}

/// The free regions of the pool and where the next search starts.
pub(super) struct TablePool {
    capacity: u32,
    /// Free regions by first entry; never adjacent (merged when given back).
    free: BTreeMap<u32, u32>,
    cursor: u32,
}

impl TablePool {
    /// An empty pool of `capacity` entries.
    pub(super) fn new(capacity: u32) -> Self {
        let mut pool = TablePool {
            capacity,
            free: BTreeMap::new(),
            cursor: 0,
        };
        pool.clear();
        pool
    }

    /// Entries free.
    #[cfg(test)]
    pub(super) fn free_entries(&self) -> u64 {
        self.free.values().map(|&l| u64::from(l)).sum()
    }

    /// A region of `len` entries: the first free one that fits at or after the cursor,
    /// else the first from the start.
    pub(super) fn alloc(&mut self, len: u32) -> Result<Region> {
        let fits = |(&start, &free_len): (&u32, &u32)| (free_len >= len).then_some(start);
        // The free region the cursor lies in (freed space merged before it) is used
        // from the cursor on.
        let at_cursor = self
            .free
            .range(..self.cursor)
            .next_back()
            .filter(|(&start, &free_len)| start + free_len >= self.cursor.saturating_add(len))
            .map(|_| self.cursor);
        let start = at_cursor
            .or_else(|| self.free.range(self.cursor..).find_map(fits))
            .or_else(|| self.free.range(..self.cursor).find_map(fits))
            .ok_or(DatapathError::Capacity {
                what: Resource::MaglevEntries,
                limit: self.capacity,
            })?;
        let region = Region { start, len };
        self.take(region);
        self.cursor = region.end();
        Ok(region)
    }

    /// Marks a region found in use (an adopted service's table). False, and nothing
    /// marked, if any of it is outside the pool or already in use.
    pub(super) fn mark(&mut self, region: Region) -> bool {
        let holder = self.free.range(..=region.start).next_back();
        match holder {
            Some((&start, &len)) if region.end() <= start + len && region.len > 0 => {
                self.take(region);
                self.cursor = self.cursor.max(region.end());
                true
            }
            _ => false,
        }
    }

    /// Gives a region back (merged with free neighbours).
    pub(super) fn free(&mut self, region: Region) {
        if region.len == 0 || region.end() > self.capacity {
            return;
        }
        let mut start = region.start;
        let mut end = region.end();
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(l) = self.free.remove(&end) {
            end += l;
        }
        self.free.insert(start, end - start);
    }

    /// Everything free; the cursor stays, so what was in use is not reused at once.
    pub(super) fn clear(&mut self) {
        self.free.clear();
        if self.capacity > 0 {
            self.free.insert(0, self.capacity);
        }
    }

    /// Removes `region`, which lies inside one free region, from the free regions.
    fn take(&mut self, region: Region) {
        let Some((&start, &len)) = self.free.range(..=region.start).next_back() else {
            return;
        };
        self.free.remove(&start);
        if region.start > start {
            self.free.insert(start, region.start - start);
        }
        let end = start + len;
        if end > region.end() {
            self.free.insert(region.end(), end - region.end());
        }
    }
}

#[cfg(test)]
mod tests {
    use gateway_common::{maglev_size, MAGLEV_MAX_SIZE, MAGLEV_POOL_ENTRIES_PER_BACKEND};

    use super::*;

    fn region(start: u32, len: u32) -> Region {
        Region { start, len }
    }

    #[test]
    fn a_region_given_back_is_not_reused_while_other_room_is_free() {
        let mut pool = TablePool::new(1000);
        let a = pool.alloc(101).expect("room");
        pool.free(a);
        let b = pool.alloc(101).expect("room");
        assert_ne!(a, b, "the region a CPU may still read is handed out again");
        assert_eq!(b.start, 101);
    }

    #[test]
    fn freed_neighbours_merge_so_a_larger_table_fits_where_small_ones_were() {
        let mut pool = TablePool::new(404);
        let small: Vec<Region> = (0..4).map(|_| pool.alloc(101).expect("room")).collect();
        assert!(pool.alloc(1).is_err(), "the pool is full");
        for r in [small[1], small[3], small[0], small[2]] {
            pool.free(r);
        }
        assert_eq!(pool.free_entries(), 404);
        assert_eq!(pool.alloc(404).expect("merged room"), region(0, 404));
    }

    #[test]
    fn a_full_pool_refuses_with_a_capacity_error() {
        let mut pool = TablePool::new(300);
        pool.alloc(211).expect("room");
        let err = pool.alloc(101).expect_err("89 entries left");
        assert!(
            matches!(err, DatapathError::Capacity { limit: 300, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn adopted_regions_are_kept_and_overlapping_or_outside_ones_refused() {
        let mut pool = TablePool::new(1000);
        assert!(pool.mark(region(500, 101)));
        assert!(!pool.mark(region(550, 101)), "overlaps an adopted table");
        assert!(!pool.mark(region(950, 101)), "beyond the pool");
        assert!(!pool.mark(region(0, 0)), "empty");
        assert_eq!(pool.free_entries(), 899);
        // New tables come after the adopted one, then wrap to the room before it.
        assert_eq!(pool.alloc(211).expect("room").start, 601);
        assert_eq!(pool.alloc(211).expect("room").start, 0);
    }

    #[test]
    fn no_table_takes_more_than_the_pool_sizes_per_backend() {
        // What the pool size rests on: any state within --max-backends fits.
        for n in 1..=2 * MAGLEV_MAX_SIZE {
            assert!(
                maglev_size(n) <= MAGLEV_POOL_ENTRIES_PER_BACKEND * n,
                "{n} backends: {} entries",
                maglev_size(n)
            );
        }
    }

    #[test]
    fn tables_of_a_full_pool_are_replaced_one_by_one_in_the_spare_room() {
        // Every service of a pool sized for 64 backends changes from 1 to 4 backends and
        // back, one after the other, as `apply` does (new table first, old given back).
        let backends = 64u32;
        let capacity = MAGLEV_POOL_ENTRIES_PER_BACKEND * backends + MAGLEV_MAX_SIZE;
        let mut pool = TablePool::new(capacity);
        let mut tables: Vec<Region> = (0..backends)
            .map(|_| pool.alloc(maglev_size(1)).expect("room"))
            .collect();
        for per_service in [4, 1, 2, 64, 1, 3] {
            let services = (backends / per_service) as usize;
            let old = std::mem::take(&mut tables);
            for i in 0..services.max(old.len()) {
                if i < services {
                    let room = pool.alloc(maglev_size(per_service));
                    tables.push(room.unwrap_or_else(|e| panic!("{per_service}: {e}")));
                }
                if let Some(&r) = old.get(i) {
                    pool.free(r);
                }
            }
        }
        assert_eq!(tables.len(), 21);
    }
}
