//! The one registry every part registers its metrics into, and [`Counters`]: a counter
//! family whose one label is a closed set ([`Label`]), so that a label value is a type,
//! not a string, and every value has a series from the start.

use std::marker::PhantomData;
use std::sync::Arc;

use parking_lot::Mutex;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, TextEncoder,
};

/// A label value from a closed set.
pub trait Label: Copy + 'static {
    /// Every value, in the order they are exported.
    const ALL: &'static [Self];
    /// The value as exported.
    fn label(self) -> &'static str;
}

/// Defines an enum whose variants are a closed label set, each with its exported value.
macro_rules! label_set {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name { $($(#[$vmeta])* $variant,)* }

        impl $crate::stats::Label for $name {
            const ALL: &'static [Self] = &[$($name::$variant),*];
            fn label(self) -> &'static str {
                match self { $($name::$variant => $label),* }
            }
        }
    };
}
pub(crate) use label_set;

/// Where metrics are registered and rendered from; each is named `prefix_router_<short>`.
#[derive(Clone, Default)]
pub struct Registry {
    inner: prometheus::Registry,
    names: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    /// A registry of its own (each router, and each test, has one).
    pub fn new() -> Self {
        Registry::default()
    }

    fn add<C: Collector + Clone + 'static>(&self, collector: C) -> C {
        // Names are static and each is defined once, so registering cannot collide.
        let names = collector.desc().into_iter().map(|d| d.fq_name.clone());
        self.names.lock().extend(names);
        if let Err(e) = self.inner.register(Box::new(collector.clone())) {
            log::error!("metric registration failed: {e}");
        }
        collector
    }

    /// A counter.
    pub fn counter(&self, short: &str, help: &str) -> IntCounter {
        self.add(IntCounter::with_opts(opts(short, help)).unwrap_or_else(|_| invalid()))
    }

    /// A counter family with labels whose values are open (backends, models).
    pub fn counter_vec(&self, short: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(opts(short, help), labels).unwrap_or_else(|_| invalid()))
    }

    /// A counter family over the closed label set `L`, named `label`.
    pub fn counters<L: Label>(&self, short: &str, help: &str, label: &str) -> Counters<L> {
        let family = self.counter_vec(short, help, &[label]);
        for value in L::ALL {
            family.with_label_values(&[value.label()]);
        }
        Counters(family, PhantomData)
    }

    /// A gauge.
    pub fn gauge(&self, short: &str, help: &str) -> IntGauge {
        self.add(IntGauge::with_opts(opts(short, help)).unwrap_or_else(|_| invalid()))
    }

    /// A gauge family.
    pub fn gauge_vec(&self, short: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(opts(short, help), labels).unwrap_or_else(|_| invalid()))
    }

    /// A histogram of seconds (5 ms to 300 s).
    pub fn seconds(&self, short: &str, help: &str) -> Histogram {
        self.add(Histogram::with_opts(seconds(short, help)).unwrap_or_else(|_| invalid()))
    }

    /// A histogram of seconds by backend.
    pub fn seconds_by_backend(&self, short: &str, help: &str) -> HistogramVec {
        self.seconds_by(short, help, "backend")
    }

    /// A histogram of seconds by `label`.
    pub fn seconds_by(&self, short: &str, help: &str, label: &str) -> HistogramVec {
        let family = HistogramVec::new(seconds(short, help), &[label]);
        self.add(family.unwrap_or_else(|_| invalid()))
    }

    /// A histogram over `buckets`.
    pub fn histogram(&self, short: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let opts = HistogramOpts::new(format!("prefix_router_{short}"), help).buckets(buckets);
        self.add(Histogram::with_opts(opts).unwrap_or_else(|_| invalid()))
    }

    /// The names of every registered metric family.
    pub fn names(&self) -> Vec<String> {
        self.names.lock().clone()
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 << 10);
        if let Err(e) = TextEncoder::new().encode(&self.inner.gather(), &mut out) {
            log::error!("metrics encoding failed: {e}");
        }
        out
    }
}

/// A counter family with one label over the closed set `L`.
#[derive(Clone)]
pub struct Counters<L>(IntCounterVec, PhantomData<L>);

impl<L: Label> Counters<L> {
    /// The counter of `value`.
    pub fn of(&self, value: L) -> IntCounter {
        self.0.with_label_values(&[value.label()])
    }

    /// Counts one of `value`.
    pub fn inc(&self, value: L) {
        self.of(value).inc();
    }

    /// Counts `n` of `value`.
    pub fn inc_by(&self, value: L, n: u64) {
        self.of(value).inc_by(n);
    }
}

/// Definitions here are static and valid; constructors fail only on invalid names.
fn invalid<T>() -> T {
    panic!("invalid static metric definition")
}

fn opts(short: &str, help: &str) -> Opts {
    Opts::new(format!("prefix_router_{short}"), help)
}

fn seconds(short: &str, help: &str) -> HistogramOpts {
    let buckets = vec![
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    HistogramOpts::new(format!("prefix_router_{short}"), help).buckets(buckets)
}
