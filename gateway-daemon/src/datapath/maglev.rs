//! Weighted Maglev lookup tables (Eisenbud et al., NSDI 2016), pure.
//!
//! Each backend walks its own permutation of the table, derived from its address
//! alone, so a table depends only on the set of backends and their weights (not on
//! their order) and changing one backend moves few entries. Weights are honoured by
//! giving a backend of weight `w` a turn in `w` out of every `max weight` rounds.

use std::net::{IpAddr, SocketAddr};

/// One candidate backend of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The backend's address (of either family); it seeds the permutation.
    pub endpoint: SocketAddr,
    /// Share of the table; 0 takes no entries.
    pub weight: u16,
}

/// Builds a table of `size` entries (a prime) whose values index into `candidates`.
/// Returns `None` when no candidate has a positive weight.
pub fn table(candidates: &[Candidate], size: u32) -> Option<Vec<u32>> {
    let size = u64::from(size);
    let mut active: Vec<(usize, &Candidate)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.weight > 0)
        .collect();
    // Turns are taken in endpoint order (then weight, for an endpoint listed twice), so
    // the caller's order does not matter: gateways behind one ECMP route build the
    // same table from the same backends, however each learnt them.
    active.sort_by_key(|(_, c)| (c.endpoint, c.weight));
    let max_weight = u64::from(active.iter().map(|(_, c)| c.weight).max()?);
    if size == 1 {
        // One entry (one backend taking new flows): no permutation to walk.
        return Some(vec![active[0].0 as u32]);
    }

    struct Walker {
        index: u32,
        weight: u64,
        offset: u64,
        skip: u64,
        next: u64,
        credit: u64,
    }
    let mut walkers: Vec<Walker> = active
        .iter()
        .map(|&(index, c)| {
            let seed = endpoint_key(&c.endpoint);
            Walker {
                index: index as u32,
                weight: u64::from(c.weight),
                offset: fnv1a(&seed, 0x5bd1_e995) % size,
                skip: fnv1a(&seed, 0x1b87_3593) % (size - 1) + 1,
                next: 0,
                credit: 0,
            }
        })
        .collect();

    let mut entries: Vec<Option<u32>> = vec![None; size as usize];
    let mut filled = 0u64;
    loop {
        for w in &mut walkers {
            w.credit += w.weight;
            if w.credit < max_weight {
                continue;
            }
            w.credit -= max_weight;
            let mut slot = (w.offset + w.next * w.skip) % size;
            while entries[slot as usize].is_some() {
                w.next += 1;
                slot = (w.offset + w.next * w.skip) % size;
            }
            entries[slot as usize] = Some(w.index);
            w.next += 1;
            filled += 1;
            if filled == size {
                return Some(entries.into_iter().map(|e| e.unwrap_or_default()).collect());
            }
        }
    }
}

/// The bytes a backend's permutation is derived from: its address (4 or 16 bytes) and
/// port, network order (an IPv4 backend's seed, and so its tables, as before IPv6).
fn endpoint_key(endpoint: &SocketAddr) -> Vec<u8> {
    let mut key = match endpoint.ip() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    key.extend_from_slice(&endpoint.port().to_be_bytes());
    key
}

/// FNV-1a over `bytes`, seeded; stable across releases (unlike `std`'s hasher).
fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV's low bits are weak for short inputs; finish with a multiply-xorshift.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    use gateway_common::{maglev_size, MAGLEV_SIZES};

    /// The table size of a service of four backends, for the tests of properties that
    /// hold at any size.
    const M: u32 = maglev_size(4);

    fn backend(last: u8, weight: u16) -> Candidate {
        Candidate {
            endpoint: SocketAddr::new([10, 0, 0, last].into(), 80),
            weight,
        }
    }

    fn shares(table: &[u32], n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for &e in table {
            counts[e as usize] += 1;
        }
        counts
    }

    #[test]
    fn equal_weights_share_the_table_evenly_at_every_size() {
        let c: Vec<_> = (1..=4).map(|i| backend(i, 1)).collect();
        for size in MAGLEV_SIZES {
            let t = table(&c, size).unwrap();
            for share in shares(&t, 4) {
                assert!(
                    share.abs_diff(size as usize / 4) <= 1,
                    "size {size}: share {share}"
                );
            }
        }
    }

    #[test]
    fn shares_follow_weights_at_every_size() {
        let c = [backend(1, 1), backend(2, 3), backend(3, 0)];
        for size in MAGLEV_SIZES {
            let t = table(&c, size).unwrap();
            let s = shares(&t, 3);
            assert_eq!(s[2], 0, "size {size}: weight 0 gets no entries");
            assert!(
                s[1].abs_diff(3 * s[0]) <= 3,
                "size {size}: 1:3 split, got {s:?}"
            );
        }
    }

    /// Entries by which backend `i`'s share of `t` differs from its weight's exact share.
    fn worst_error(c: &[Candidate], t: &[u32]) -> f64 {
        let total: f64 = c.iter().map(|c| f64::from(c.weight)).sum();
        let s = shares(t, c.len());
        c.iter()
            .zip(&s)
            .map(|(c, &got)| (got as f64 - t.len() as f64 * f64::from(c.weight) / total).abs())
            .fold(0.0, f64::max)
    }

    /// The bound the sizes rest on (`gateway_common::MAGLEV_SIZES`): a backend's share
    /// is off its weight's by less than two entries, at every size and however unequal
    /// the weights (a backend takes its turns in proportion to its weight, and the
    /// table fills mid-round). With at least 100 entries per backend, that is within
    /// 2 % of an equal share; a weight whose share is below an entry may get none.
    #[test]
    fn every_backend_is_within_two_entries_of_its_weights_share() {
        let heavy_and_light = [backend(1, 1000), backend(2, 1)];
        let mixed: Vec<_> = (1..=10).map(|i| backend(i, u16::from(i) * 7)).collect();
        for c in [&heavy_and_light[..], &mixed] {
            for size in MAGLEV_SIZES {
                let t = table(c, size).unwrap();
                let err = worst_error(c, &t);
                assert!(err < 2.0, "size {size}: off by {err} entries");
            }
        }
        // 1:1000 at the size two backends get: the light one's exact share is under an
        // entry (211 / 1001); it gets at most one, the heavy one the rest.
        let t = table(&heavy_and_light, maglev_size(2)).unwrap();
        assert!(shares(&t, 2)[1] <= 1, "{:?}", shares(&t, 2));
    }

    #[test]
    fn many_backends_share_the_largest_table_within_two_entries() {
        // 700 backends: past 100 entries per backend, the table stops growing (65521).
        let c: Vec<_> = (0..700u32)
            .map(|i| Candidate {
                endpoint: SocketAddr::new([10, 1, (i >> 8) as u8, i as u8].into(), 80),
                weight: 1 + (i % 3) as u16,
            })
            .collect();
        let size = maglev_size(700);
        assert_eq!(size, gateway_common::MAGLEV_MAX_SIZE);
        let t = table(&c, size).unwrap();
        let err = worst_error(&c, &t);
        assert!(err < 2.0, "off by {err} entries");
    }

    #[test]
    fn no_active_backend_gives_no_table() {
        assert_eq!(table(&[backend(1, 0)], M), None);
        assert_eq!(table(&[], M), None);
    }

    #[test]
    fn one_backend_taking_new_flows_has_a_table_of_one_entry() {
        // A draining backend (weight 0) beside it takes no entry.
        let c = [backend(1, 0), backend(2, 3)];
        let size = maglev_size(1);
        assert_eq!(size, 1);
        assert_eq!(table(&c, size), Some(vec![1]));
    }

    #[test]
    fn table_does_not_depend_on_candidate_order() {
        let a = [backend(1, 1), backend(2, 2), backend(3, 1)];
        let b = [a[2], a[0], a[1]];
        let ta: Vec<_> = table(&a, M)
            .unwrap()
            .iter()
            .map(|&i| a[i as usize].endpoint)
            .collect();
        let tb: Vec<_> = table(&b, M)
            .unwrap()
            .iter()
            .map(|&i| b[i as usize].endpoint)
            .collect();
        assert_eq!(ta, tb);
    }

    #[test]
    fn table_does_not_depend_on_the_order_of_an_endpoint_listed_twice() {
        let twice = backend(2, 1);
        let a = [backend(1, 1), twice, Candidate { weight: 3, ..twice }];
        let b = [a[2], a[0], a[1]];
        let endpoints_and_weights = |c: &[Candidate]| -> Vec<(SocketAddr, u16)> {
            table(c, M)
                .unwrap()
                .iter()
                .map(|&i| (c[i as usize].endpoint, c[i as usize].weight))
                .collect()
        };
        assert_eq!(endpoints_and_weights(&a), endpoints_and_weights(&b));
    }

    #[test]
    fn ipv6_backends_share_a_table_as_ipv4_ones_do() {
        let c: Vec<_> = (1..=4u16)
            .map(|i| Candidate {
                endpoint: SocketAddr::new(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]), 80),
                weight: 1,
            })
            .collect();
        let t = table(&c, M).unwrap();
        for share in shares(&t, 4) {
            assert!(share.abs_diff(M as usize / 4) <= 1, "share {share}");
        }
    }

    #[test]
    fn removing_a_backend_moves_little_else() {
        let before: Vec<_> = (1..=5).map(|i| backend(i, 1)).collect();
        let after = &before[..4];
        let tb = table(&before, M).unwrap();
        let ta = table(after, M).unwrap();
        let moved = tb
            .iter()
            .zip(&ta)
            .filter(|(b, a)| {
                **b != 4 && before[**b as usize].endpoint != after[**a as usize].endpoint
            })
            .count();
        // Entries of surviving backends that changed owner: Maglev keeps this small.
        assert!(
            moved < M as usize / 20,
            "{moved} entries of surviving backends moved"
        );
    }
}
