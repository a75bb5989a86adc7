//! Deserializing `&'static str` fields (the field names and reasons that typed errors carry)
//! without changing their type: each distinct string is leaked once into a bounded interner.
//!
//! The error types of `abi` and this crate name their fields with `&'static str`, which is
//! free to create and compare in-process. Across the daemon socket (crate `wire`) those
//! strings arrive as owned text. Rather than change the field types everywhere (and every
//! site that builds an error), a received string is looked up in a process-wide table and
//! leaked the first time it is seen; later receptions of the same text reuse that leak. The
//! set of such strings is the finite set of literals in the program, so the table stays
//! small. A peer sending endless distinct strings could grow it, so it is capped:
//! [`MAX_ENTRIES`] strings of at most [`MAX_LEN`] bytes; beyond that the text is replaced by
//! [`UNKNOWN`]. Only clients deserialize errors (the daemon never does), so the cap bounds
//! what a misbehaving daemon can make a client leak.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Distinct strings the interner keeps at most.
pub const MAX_ENTRIES: usize = 4096;
/// Longest string interned; longer ones read as [`UNKNOWN`].
pub const MAX_LEN: usize = 256;
/// What a string reads as once the table is full or when it is too long.
pub const UNKNOWN: &str = "<unknown>";

static TABLE: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// The `'static` copy of `s` (interned), or [`UNKNOWN`] past the caps.
pub fn intern(s: &str) -> &'static str {
    if s.len() > MAX_LEN {
        return UNKNOWN;
    }
    let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    let table = table.get_or_insert_with(HashSet::new);
    if let Some(&hit) = table.get(s) {
        return hit;
    }
    if table.len() >= MAX_ENTRIES {
        return UNKNOWN;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    table.insert(leaked);
    leaked
}

/// `#[serde(deserialize_with = "...")]` for a `&'static str` field.
pub fn de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let s: std::borrow::Cow<'de, str> = serde::Deserialize::deserialize(d)?;
    Ok(intern(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_reuses_one_leak_and_caps_length() {
        let a = intern("ring_bytes");
        let b = intern(&String::from("ring_bytes"));
        assert!(std::ptr::eq(a, b));
        assert_eq!(intern(&"x".repeat(MAX_LEN + 1)), UNKNOWN);
    }
}
