//! Ids of map slots: services (slot and generation), backends.

use gateway_common::ServiceId;

use super::{DatapathError, Limit, Resource, Result};

/// Service ids: a slot from a pool, with the next generation of that slot, so that no
/// two services (over the datapath's life, restarts included) get the same id.
pub(super) struct ServiceIds {
    slots: IdPool,
    /// Per slot, the highest generation handed out or found in the maps.
    generations: Vec<u16>,
}

impl ServiceIds {
    pub(super) fn new(capacity: u32) -> Self {
        ServiceIds {
            slots: IdPool::new(Resource::Of(Limit::Services), capacity),
            generations: vec![0; capacity as usize],
        }
    }

    pub(super) fn alloc(&mut self) -> Result<ServiceId> {
        let slot = self.slots.alloc()?;
        let generation = match self.generations.get_mut(slot as usize) {
            Some(g) => {
                // Wraps after `GENERATIONS` (4096) services in one slot; a conntrack
                // entry that old is long gone.
                *g = (*g + 1) % ServiceId::GENERATIONS as u16;
                *g
            }
            None => 0,
        };
        Ok(ServiceId::new(slot, generation))
    }

    /// Marks the id of an installed service (adopted maps).
    pub(super) fn mark(&mut self, id: ServiceId) {
        self.slots.mark(id.slot());
        self.saw(id);
    }

    /// Notes an id found in the maps (in use or not), so that it is not handed out again.
    pub(super) fn saw(&mut self, id: ServiceId) {
        if let Some(g) = self.generations.get_mut(id.slot() as usize) {
            *g = (*g).max(id.generation());
        }
    }

    pub(super) fn free(&mut self, id: ServiceId) {
        self.slots.free(id.slot());
    }

    /// Frees every slot; generations are kept.
    pub(super) fn clear(&mut self) {
        self.slots.clear();
    }
}

/// The ids of one kind of map slot (services, backends) in use. Handed
/// out next-fit, so that a freed id is not reused at once: a CPU may still be reading
/// the slot through a lookup made just before it was freed.
pub(super) struct IdPool {
    what: Resource,
    used: Vec<bool>,
    /// How many of `used` are true.
    in_use: usize,
    cursor: u32,
}

impl IdPool {
    pub(super) fn new(what: Resource, capacity: u32) -> Self {
        IdPool {
            what,
            used: vec![false; capacity as usize],
            in_use: 0,
            cursor: 0,
        }
    }

    pub(super) fn alloc(&mut self) -> Result<u32> {
        let cap = self.used.len() as u32;
        let id = (0..cap)
            .map(|i| (self.cursor + i) % cap)
            .find(|&id| !self.used[id as usize])
            .ok_or(DatapathError::Capacity {
                what: self.what,
                limit: cap,
            })?;
        self.used[id as usize] = true;
        self.in_use += 1;
        self.cursor = (id + 1) % cap;
        Ok(id)
    }

    /// Marks an id found in use (adopted maps); new ids come after the highest.
    pub(super) fn mark(&mut self, id: u32) {
        if let Some(u) = self.used.get_mut(id as usize) {
            self.in_use += usize::from(!*u);
            *u = true;
            self.cursor = self.cursor.max(id + 1);
        }
    }

    pub(super) fn free(&mut self, id: u32) {
        if let Some(u) = self.used.get_mut(id as usize) {
            self.in_use -= usize::from(*u);
            *u = false;
        }
    }

    pub(super) fn clear(&mut self) {
        self.used.fill(false);
        self.in_use = 0;
    }

    /// How many ids are free.
    pub(super) fn free_count(&self) -> usize {
        self.used.len() - self.in_use
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_slot_given_again_comes_with_a_new_generation() {
        let mut ids = ServiceIds::new(1);
        let first = ids.alloc().expect("a free slot");
        ids.free(first);
        let second = ids.alloc().expect("a free slot");
        assert_eq!(first.slot(), second.slot());
        assert_ne!(first, second);
    }

    #[test]
    fn a_service_id_seen_in_the_maps_is_never_handed_out() {
        // As after a restart: conntrack entries name generation 7 of slot 0, whose
        // service is gone.
        let mut ids = ServiceIds::new(1);
        ids.saw(ServiceId::new(0, 7));
        assert_eq!(ids.alloc().expect("a free slot"), ServiceId::new(0, 8));
    }

    #[test]
    fn a_service_id_has_twenty_slot_bits_and_its_generation_wraps() {
        let last = ServiceId::SLOTS - 1;
        assert_eq!(ServiceId::SLOTS, 1 << 20);
        let id = ServiceId::new(last, 4095);
        assert_eq!((id.slot(), id.generation()), (last, 4095));
        // The highest slot's generations wrap without touching the slot.
        let mut ids = ServiceIds::new(1);
        ids.saw(ServiceId::new(0, 4095));
        let wrapped = ids.alloc().expect("a free slot");
        assert_eq!((wrapped.slot(), wrapped.generation()), (0, 0));
        assert_eq!(ServiceId::new(last, 4096), ServiceId::new(last, 0));
    }

    #[test]
    fn an_id_a_16_bit_build_wrote_is_never_handed_out() {
        // Generation 1 of slot 3 under 16 slot bits reads as slot 65539, generation 0:
        // beyond a datapath of 65536 services, so never handed out; slot 3's own ids
        // are untouched.
        let old = ServiceId::new(3 | (1 << 16), 0);
        let mut ids = ServiceIds::new(1 << 16);
        ids.saw(old);
        for _ in 0..(1 << 16) {
            assert_ne!(ids.alloc().expect("a free slot"), old);
        }
    }
}
