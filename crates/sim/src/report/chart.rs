//! What a plot is, before it is drawn: a [`Chart`] with its axes ([`Scale`], [`Unit`]), its
//! [`Series`] (a line, intervals, a box of [`BoxStats`]) and its event lanes ([`Marks`]).
//!
//! Plain data: the run's and the sweep's charts are built as these, and `draw.rs` draws them.

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

/// How an axis maps values.
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Logarithmic (values above 0), ticks at powers of ten.
    Log,
    /// Named categories: value `i` is the `i`-th name.
    Categories(Vec<String>),
}

/// What an axis' values are, for its tick labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain number.
    Plain,
    /// Nanoseconds, labelled `ns`, `µs`, `ms` or `s`.
    Ns,
    /// A share from 0 to 1, labelled as a percentage.
    Percent,
}

/// A box plot's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct BoxStats {
    /// Lower whisker (the lowest value within 1.5 × IQR of the box).
    pub low: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Upper whisker.
    pub high: f64,
    /// Values drawn as dots: every value of a small set, else the outliers (the most extreme
    /// [`MAX_DOTS`]).
    pub dots: Vec<f64>,
}

/// The most dots one box draws.
pub const MAX_DOTS: usize = 200;

/// A set of values at most this large is drawn dot by dot beside its box.
pub const ALL_DOTS: usize = 64;

impl BoxStats {
    /// The figures of `values` (any order); `None` for none.
    pub fn of(values: &[f64]) -> Option<BoxStats> {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return None;
        }
        let q = |p: f64| {
            let x = p * (v.len() - 1) as f64;
            let (i, f) = (x.floor() as usize, x.fract());
            v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * f
        };
        let (q1, median, q3) = (q(0.25), q(0.5), q(0.75));
        let iqr = q3 - q1;
        let (lo_fence, hi_fence) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
        let low = v.iter().copied().find(|&x| x >= lo_fence).unwrap_or(q1);
        let high = v.iter().rev().copied().find(|&x| x <= hi_fence).unwrap_or(q3);
        let dots = if v.len() <= ALL_DOTS {
            v.clone()
        } else {
            let mut out: Vec<f64> = v.iter().copied().filter(|&x| x < lo_fence || x > hi_fence).collect();
            // The most extreme first, then back in value order.
            out.sort_by(|a, b| (b - median).abs().total_cmp(&(a - median).abs()).then(a.total_cmp(b)));
            out.truncate(MAX_DOTS);
            out.sort_by(f64::total_cmp);
            out
        };
        Some(BoxStats { low, q1, median, q3, high, dots })
    }
}

/// What a series draws.
#[derive(Clone, Debug)]
pub enum Shape {
    /// A line through the points (x, y).
    Line(Vec<(f64, f64)>),
    /// Points (x, mean, low, high): a dot with an error bar from low to high; joined by a
    /// line when `join` (a numeric axis; never between categories).
    Interval {
        /// The points.
        points: Vec<(f64, f64, f64, f64)>,
        /// Join the means.
        join: bool,
    },
    /// A box plot at x.
    Box {
        /// Where (a category's index).
        x: f64,
        /// Its figures.
        stats: BoxStats,
    },
}

/// One series of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend entry (empty: none).
    pub name: String,
    /// Colour.
    pub color: Rgb,
    /// What it draws.
    pub shape: Shape,
}

/// One kind of event on a time plot: a lane of ticks above the data.
#[derive(Clone, Debug)]
pub struct Marks {
    /// The kind (`hang`, `tdr`, …).
    pub kind: String,
    /// Colour.
    pub color: Rgb,
    /// When (x values).
    pub at: Vec<f64>,
}

/// A chart.
#[derive(Clone, Debug)]
pub struct Chart {
    /// File stem (and the figure's id in the page).
    pub file: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x: String,
    /// Y axis label.
    pub y: String,
    /// X scale.
    pub x_scale: Scale,
    /// X values' unit.
    pub x_unit: Unit,
    /// A linear axis' ticks, where they are the values drawn (a sweep's axis values): the
    /// axis is then padded so no point sits on its edge.
    pub x_ticks: Option<Vec<f64>>,
    /// Y values' unit.
    pub y_unit: Unit,
    /// The y axis' top, where fixed (a share's 1, the slots an engine has).
    pub y_top: Option<f64>,
    /// Series, in legend order.
    pub series: Vec<Series>,
    /// Event lanes, in legend order.
    pub marks: Vec<Marks>,
    /// Lines of small print under the legend.
    pub notes: Vec<String>,
}
