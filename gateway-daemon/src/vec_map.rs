//! A small ordered map in one sorted vector: for the many maps of one entry or a few
//! (a service's backends, an endpoint's services), where a `BTreeMap` takes a node of
//! several hundred bytes for a single entry.

/// An ordered map kept as one vector sorted by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VecMap<K, V>(Vec<(K, V)>);

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        VecMap(Vec::new())
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// Sets the value of `key`.
    pub fn insert(&mut self, key: K, value: V) {
        match self.find(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        Some(self.0.remove(i).1)
    }

    /// Adds an entry in any order: [`VecMap::settle`] must follow before any other use.
    pub fn push_unordered(&mut self, key: K, value: V) {
        self.0.push((key, value));
    }

    /// Orders the entries pushed by key, merging those of one key by `merge` (in the
    /// order pushed), and gives back spare room.
    pub fn settle_with(&mut self, merge: impl Fn(&mut V, V)) {
        self.0.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(K, V)> = Vec::with_capacity(self.0.len());
        for (k, v) in self.0.drain(..) {
            match out.last_mut() {
                Some(last) if last.0 == k => merge(&mut last.1, v),
                _ => out.push((k, v)),
            }
        }
        out.shrink_to_fit();
        self.0 = out;
    }

    /// [`VecMap::settle_with`] keeping the last value of a key pushed twice, as
    /// [`VecMap::insert`] keeps it.
    pub fn settle(&mut self) {
        self.settle_with(|last, v| *last = v);
    }

    /// Gives back spare room.
    pub fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }

    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// The value of `key`, to change.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        Some(&mut self.0[i].1)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_ok()
    }

    /// How many entries of keys before `key` there are.
    pub fn rank(&self, key: &K) -> usize {
        self.0.partition_point(|(k, _)| k < key)
    }
}

impl<K, V> VecMap<K, V> {
    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    /// A key given twice keeps its last value, as in a map.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = VecMap(iter.into_iter().collect());
        map.settle();
        map
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vec_map_keeps_what_a_btree_map_keeps_in_its_order() {
        let mut map: VecMap<u32, u32> = VecMap::default();
        let mut tree = std::collections::BTreeMap::new();
        for (k, v) in [(5, 1), (1, 2), (9, 3), (5, 4), (3, 5), (1, 6)] {
            map.insert(k, v);
            tree.insert(k, v);
        }
        map.remove(&9);
        tree.remove(&9);
        assert_eq!(
            map.iter().collect::<Vec<_>>(),
            tree.iter().collect::<Vec<_>>()
        );
        assert_eq!(map.rank(&4), 2);
        assert_eq!(map.get(&5), Some(&4));
        assert!(!map.contains_key(&9));
    }

    #[test]
    fn settling_orders_and_merges_keys_pushed_twice() {
        let mut map: VecMap<u32, u32> = VecMap::default();
        for (k, v) in [(5, 1), (1, 2), (5, 3)] {
            map.push_unordered(k, v);
        }
        map.settle_with(|w, v| *w += v);
        assert_eq!(map.iter().collect::<Vec<_>>(), [(&1, &2), (&5, &4)]);
        let last: VecMap<u32, u32> = [(5, 1), (1, 2), (5, 3)].into_iter().collect();
        assert_eq!(last.iter().collect::<Vec<_>>(), [(&1, &2), (&5, &3)]);
    }
}
