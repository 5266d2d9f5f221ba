//! Eviction thresholds as upstream's KubeletConfiguration has them, and
//! their validation.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::quantity;

/// What the eviction manager watches, as upstream's eviction signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A threshold's quantity: absolute, or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(u64),
    Percent(f64),
}

impl ThresholdValue {
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// Soft thresholds act once met for this long; hard ones (None) at once.
    pub grace: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    pub thresholds: Vec<Threshold>,
    /// The longest grace a soft eviction gives a pod (0: the pod's own).
    pub max_pod_grace: Duration,
    /// How long a pressure condition stays on after its signal clears.
    pub transition_period: Duration,
    /// evictionMinimumReclaim: once crossed, a signal must come back this
    /// far above its threshold before it counts as clear.
    pub min_reclaim: Vec<(Signal, ThresholdValue)>,
}

impl Eviction {
    /// The minimum reclaim of `signal`'s thresholds, in its unit.
    pub fn min_reclaim(&self, signal: Signal, capacity: u64) -> u64 {
        self.min_reclaim
            .iter()
            .find(|(s, _)| *s == signal)
            .map_or(0, |(_, v)| v.of(capacity))
    }
}

impl Default for Eviction {
    /// Upstream's Linux defaults.
    fn default() -> Self {
        let hard = |signal, value| Threshold {
            signal,
            value,
            grace: None,
        };
        Eviction {
            thresholds: vec![
                hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 << 20)),
                hard(Signal::NodefsAvailable, ThresholdValue::Percent(10.0)),
                hard(Signal::NodefsInodesFree, ThresholdValue::Percent(5.0)),
                hard(Signal::ImagefsAvailable, ThresholdValue::Percent(15.0)),
            ],
            max_pod_grace: Duration::ZERO,
            transition_period: Duration::from_secs(300),
            min_reclaim: Vec::new(),
        }
    }
}

impl Eviction {
    /// The hard threshold on `signal`, in units of `capacity`.
    pub fn hard(&self, signal: Signal, capacity: u64) -> Option<u64> {
        self.thresholds
            .iter()
            .find(|t| t.signal == signal && t.grace.is_none())
            .map(|t| t.value.of(capacity))
    }
}

/// evictionHard / evictionSoft (with its grace periods) as upstream
/// validates them: known signals, quantities or percentages, and a grace
/// period for every soft threshold.
pub(super) fn thresholds(
    map: &BTreeMap<String, String>,
    graces: Option<&BTreeMap<String, String>>,
) -> Result<Vec<Threshold>, String> {
    let field = if graces.is_some() {
        "evictionSoft"
    } else {
        "evictionHard"
    };
    map.iter()
        .map(|(name, text)| {
            let signal = Signal::parse(name)
                .ok_or_else(|| format!("{field}: unknown eviction signal {name:?}"))?;
            let value = threshold_value(field, name, text)?;
            let grace = match graces {
                None => None,
                Some(graces) => {
                    let grace = graces.get(name).ok_or_else(|| {
                        format!("evictionSoftGracePeriod: {name} has a soft threshold but no grace period")
                    })?;
                    Some(
                        quantity::parse_duration(grace)
                            .map_err(|e| format!("evictionSoftGracePeriod.{name}: {e}"))?,
                    )
                }
            };
            Ok(Threshold {
                signal,
                value,
                grace,
            })
        })
        .collect()
}

/// A quantity, or a percentage of the capacity.
fn threshold_value(field: &str, name: &str, text: &str) -> Result<ThresholdValue, String> {
    match text.trim().strip_suffix('%') {
        Some(percent) => percent
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| (0.0..=100.0).contains(p))
            .map(ThresholdValue::Percent)
            .ok_or_else(|| format!("{field}.{name}: {text:?} is not a percentage")),
        None => Ok(ThresholdValue::Quantity(
            quantity::parse_bytes(text).map_err(|e| format!("{field}.{name}: {e}"))?,
        )),
    }
}

/// evictionMinimumReclaim: known signals, quantities or percentages.
pub(super) fn min_reclaim(
    map: &BTreeMap<String, String>,
) -> Result<Vec<(Signal, ThresholdValue)>, String> {
    let field = "evictionMinimumReclaim";
    map.iter()
        .map(|(name, text)| {
            let signal = Signal::parse(name)
                .ok_or_else(|| format!("{field}: unknown eviction signal {name:?}"))?;
            Ok((signal, threshold_value(field, name, text)?))
        })
        .collect()
}
