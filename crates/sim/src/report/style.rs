//! How the plots and tables look: the colours every plot keeps (a priority's, a class's, an
//! engine's, an event kind's, an ordered series'), and numbers in words (`12.5 µs`,
//! `1,234,567`, three significant digits).
//!
//! Invariant: no class colour is a priority's, so a plot that shows both never confuses them.

use super::chart::Rgb;

/// Each priority's colour, in priority order.
pub const PRIORITY_COLORS: [(&str, Rgb); 5] = [
    ("low", (127, 127, 127)),
    ("normal", (31, 119, 180)),
    ("medium", (44, 160, 44)),
    ("high", (255, 127, 14)),
    ("realtime", (214, 39, 40)),
];

/// A priority's colour (by its lower-case name), the same in every plot.
pub fn priority_color(priority: &str) -> Rgb {
    PRIORITY_COLORS.iter().find(|p| p.0 == priority).map_or((0, 0, 0), |p| p.1)
}

/// A priority's place in [`PRIORITY_COLORS`] (lowest first; unknown last).
pub(super) fn priority_rank(priority: &str) -> usize {
    PRIORITY_COLORS.iter().position(|p| p.0 == priority).unwrap_or(PRIORITY_COLORS.len())
}

/// Class colours: none of them a priority's.
pub(super) const CLASS_COLORS: [Rgb; 10] = [
    (148, 103, 189),
    (23, 190, 207),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (57, 59, 121),
    (0, 109, 91),
    (173, 73, 74),
    (140, 109, 49),
    (123, 65, 115),
];

/// A class's colour (by its group's index in the scenario), the same in every plot.
pub fn class_color(group: usize) -> Rgb {
    CLASS_COLORS[group % CLASS_COLORS.len()]
}

/// An engine's colour (by its id).
pub fn engine_color(engine: usize) -> Rgb {
    [(40, 40, 40), (0, 150, 136), (121, 85, 72), (63, 81, 181)][engine % 4]
}

/// Event kinds in the order their lanes are listed, each with its colour.
pub(super) const MARK_COLORS: [(&str, Rgb); 16] = [
    ("warm-up end", (0, 0, 0)),
    ("window end", (0, 0, 0)),
    ("kill", (178, 24, 43)),
    ("hang", (230, 85, 13)),
    ("tdr", (202, 0, 32)),
    ("reset", (117, 107, 177)),
    ("fault", (255, 0, 255)),
    ("device error", (128, 0, 0)),
    ("device lost", (128, 0, 0)),
    ("adapter lost", (128, 0, 0)),
    ("suspend", (49, 130, 189)),
    ("resume", (107, 174, 214)),
    ("d3 request", (35, 139, 69)),
    ("d3", (116, 196, 118)),
    ("victimized", (140, 81, 10)),
    ("preempted", (150, 150, 150)),
];

/// A sequential palette for ordered series (a sweep's other axes): dark to light.
pub(super) const ORDERED: [Rgb; 8] = [
    (68, 1, 84),
    (72, 40, 120),
    (62, 74, 137),
    (49, 104, 142),
    (38, 130, 142),
    (31, 158, 137),
    (53, 183, 121),
    (109, 205, 89),
];

/// The colour of series `k` of `n` in order: spread over a dark-to-light palette (viridis).
pub fn ordered_color(k: usize, n: usize) -> Rgb {
    if n <= 1 {
        return ORDERED[3];
    }
    ORDERED[(k * (ORDERED.len() - 1) / (n - 1)).min(ORDERED.len() - 1)]
}

/// `x` with at most 3 significant digits, trailing zeros dropped (`1`, `2.5`, `12.3`, `450`).
pub fn num3(x: f64) -> String {
    let a = x.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// Nanoseconds in the unit that reads best: `850 ns`, `12.5 µs`, `4.2 ms`, `1.5 s`.
pub fn format_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{} ns", num3(ns))
    } else if a < 1e6 {
        format!("{} µs", num3(ns / 1e3))
    } else if a < 1e9 {
        format!("{} ms", num3(ns / 1e6))
    } else {
        format!("{} s", num3(ns / 1e9))
    }
}

/// A whole number with thousands separators (`1,234,567`).
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A priority's lower-case name.
pub fn priority_name(p: abi::Priority) -> String {
    format!("{p:?}").to_lowercase()
}
