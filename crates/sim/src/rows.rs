//! The command buffers `latency.csv` lists: every one while they fit in `latency_rows`, then
//! an even sample over the whole run.
//!
//! Rows are kept in completion order. When the buffer is full, every other row is dropped in
//! place and the stride doubles, so at any time the rows are exactly the command buffers whose
//! index (among those that gave a latency sample, from 0) is a multiple of the stride: evenly
//! spread from the run's start to its end, never only its start. The memory never exceeds the
//! limit, and rows already written are not copied elsewhere (a run of millions of command
//! buffers touches a few megabytes, not hundreds; first touches of memory are what a large
//! buffer costs the event loop). Deterministic: the same completions give the same rows.
//!
//! Invariants: `rows.len() <= limit`; `stride` is a power of two; `rows[j]` is the command
//! buffer of index `j * stride`.

/// A bounded, evenly spaced list of rows (a run's are [`crate::run::Span`]s).
#[derive(Clone, Debug)]
pub struct Rows<T> {
    rows: Vec<T>,
    limit: usize,
    stride: u64,
    seen: u64,
}

impl<T> Rows<T> {
    /// At most `limit` rows (0 keeps none).
    pub fn new(limit: usize) -> Rows<T> {
        // Reserved up front (address space; pages are touched as rows arrive), at most a
        // million rows' worth.
        Rows { rows: Vec::with_capacity(limit.min(1 << 20)), limit, stride: 1, seen: 0 }
    }

    /// The next command buffer.
    pub fn push(&mut self, s: T) {
        let index = self.seen;
        self.seen += 1;
        if self.limit == 0 || index & (self.stride - 1) != 0 {
            return;
        }
        if self.rows.len() == self.limit {
            // Keep the rows at even positions: indices that are multiples of twice the stride.
            let mut k = 0;
            self.rows.retain(|_| {
                k += 1;
                k % 2 == 1
            });
            self.stride *= 2;
            if index & (self.stride - 1) != 0 {
                return;
            }
        }
        self.rows.push(s);
    }

    /// The rows, in completion order.
    pub fn rows(&self) -> &[T] {
        &self.rows
    }

    /// One row per this many command buffers (1: every one).
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Command buffers seen but not listed.
    pub fn omitted(&self) -> u64 {
        self.seen - self.rows.len() as u64
    }
}

impl<T> Default for Rows<T> {
    /// Keeps none (and holds the invariants: a derived default's stride would be 0).
    fn default() -> Rows<T> {
        Rows::new(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Span;

    fn span(i: u64) -> Span {
        Span::new(0, i + 1, i, i, i, 0)
    }

    #[test]
    fn every_row_fits_until_the_limit_then_an_even_sample_remains() {
        let mut r = Rows::new(4);
        for i in 0..4 {
            r.push(span(i));
        }
        assert_eq!((r.rows().len(), r.stride(), r.omitted()), (4, 1, 0));
        for i in 4..11 {
            r.push(span(i));
        }
        // 11 seen, stride 4: indices 0, 4, 8.
        assert_eq!(r.stride(), 4);
        assert_eq!(r.rows().iter().map(|s| s.submit).collect::<Vec<_>>(), [0, 4, 8]);
        assert_eq!(r.omitted(), 8);
        for n in [1usize, 3, 5, 16] {
            let mut r = Rows::new(n);
            for i in 0..1_000 {
                r.push(span(i));
                assert!(r.rows().len() <= n);
                assert!(r.rows().iter().enumerate().all(|(j, s)| s.submit == j as u64 * r.stride()));
            }
            assert!(r.rows().len() > n / 2, "{n}: {}", r.rows().len());
        }
        let mut none = Rows::new(0);
        none.push(span(0));
        assert_eq!((none.rows().len(), none.omitted()), (0, 1));
        let mut default = Rows::default();
        default.push(span(0));
        assert_eq!((default.rows().len(), default.stride(), default.omitted()), (0, 1, 1));
    }
}
