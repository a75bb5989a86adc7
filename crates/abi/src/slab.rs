//! A slab with generation-checked keys: the one table type of the kernel's per-process objects
//! and the firmware's queue table.
//!
//! Each entry has a generation that moves on when its value is removed, so a [`Key`] to a
//! removed value is *stale* even after the entry is reused: a recycled slot never answers to
//! an old key. Lookups never panic: a stale or unknown key is a [`Miss`], which each owner
//! turns into its own typed error (the kernel's `BadHandle`, the firmware's `StaleQueue`).
//!
//! Invariants: a key is handed out by [`Slab::insert`] only; generations start at 1, so a key
//! with generation 0 never names anything; removing a value frees its entry for reuse.

/// Names one value of a [`Slab`]: its entry and the entry's generation when it was inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    index: u32,
    generation: u32,
}

impl Key {
    /// A key from its parts (for handles that carry them, and tests of stale keys).
    pub const fn from_parts(index: u32, generation: u32) -> Key {
        Key { index, generation }
    }
    /// The entry index.
    pub const fn index(self) -> u32 {
        self.index
    }
    /// The generation.
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

/// A hasher for tables keyed by slab [`Key`]s (or ids wrapping them, or other numbers a trusted
/// party hands out): keys no client chooses, so a multiplicative mix (FxHash's) is enough and
/// costs a few instructions where SipHash costs a hundred.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A hash map with [`KeyHasher`]. The hasher has no seed, so the same inserts and removes give
/// the same iteration order in every run, where std's default `RandomState` draws a seed per
/// map (the simulated crates refuse std's maps through their `clippy.toml`).
pub type KeyMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Why a key names nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// Its value was removed (the entry may hold a newer one).
    Stale,
    /// It never named a value.
    Unknown,
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// Values addressed by [`Key`]. See the module docs.
pub struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { entries: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    /// An empty slab.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts a value and returns its key.
    pub fn insert(&mut self, value: T) -> Key {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry { generation: 0, value: None });
                (self.entries.len() - 1) as u32
            }
        };
        let e = &mut self.entries[index as usize];
        // Generation 0 is never handed out; a wrap after 2^32 reuses of one entry skips it.
        e.generation = e.generation.wrapping_add(1).max(1);
        e.value = Some(value);
        self.len += 1;
        Key { index, generation: e.generation }
    }

    fn check(&self, key: Key) -> Result<usize, Miss> {
        match self.entries.get(key.index as usize) {
            Some(e) if e.generation == key.generation && e.value.is_some() => Ok(key.index as usize),
            Some(e) if e.generation >= key.generation && key.generation != 0 => Err(Miss::Stale),
            _ => Err(Miss::Unknown),
        }
    }

    /// The value `key` names.
    pub fn get(&self, key: Key) -> Result<&T, Miss> {
        let i = self.check(key)?;
        self.entries[i].value.as_ref().ok_or(Miss::Unknown)
    }

    /// The value `key` names, mutably.
    pub fn get_mut(&mut self, key: Key) -> Result<&mut T, Miss> {
        let i = self.check(key)?;
        self.entries[i].value.as_mut().ok_or(Miss::Unknown)
    }

    /// Whether `key` names a value.
    pub fn contains(&self, key: Key) -> bool {
        self.check(key).is_ok()
    }

    /// Removes the value; `key` becomes stale.
    pub fn remove(&mut self, key: Key) -> Result<T, Miss> {
        let i = self.check(key)?;
        let v = self.entries[i].value.take().ok_or(Miss::Unknown)?;
        self.free.push(i as u32);
        self.len -= 1;
        Ok(v)
    }

    /// Live keys and values, in entry order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.value.as_ref().map(|v| (Key { index: i as u32, generation: e.generation }, v)))
    }

    /// Live keys and values, mutably, in entry order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Key, &mut T)> {
        self.entries
            .iter_mut()
            .enumerate()
            .filter_map(|(i, e)| e.value.as_mut().map(|v| (Key { index: i as u32, generation: e.generation }, v)))
    }

    /// Live keys, in entry order.
    pub fn keys(&self) -> Vec<Key> {
        self.iter().map(|(k, _)| k).collect()
    }

    /// Live values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_entry_never_answers_to_an_old_key() {
        let mut s = Slab::new();
        let a = s.insert("a");
        assert_eq!(s.get(a), Ok(&"a"));
        assert_eq!(s.remove(a), Ok("a"));
        let b = s.insert("b");
        assert_eq!(b.index(), a.index(), "entry reused");
        assert_eq!(s.get(a), Err(Miss::Stale));
        assert_eq!(s.remove(a), Err(Miss::Stale));
        assert_eq!(s.get(Key::from_parts(7, 1)), Err(Miss::Unknown));
        assert_eq!(s.get(Key::from_parts(b.index(), 0)), Err(Miss::Unknown), "generation 0 names nothing");
        assert_eq!(s.keys(), vec![b]);
        assert_eq!(s.len(), 1);
    }
}
