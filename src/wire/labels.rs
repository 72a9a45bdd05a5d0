use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::label_map::{LabelMap, Name};
use super::label_value::{type_code, LabelValue, RawLabel};
use super::TaskId;

/// A message's labels, with typed accessors for the labels that have meaning (design §3).
///
/// ```
/// use ferriq::wire::Labels;
/// let mut labels = Labels::new();
/// labels.insert("timeout", 2.5);
/// labels.insert("max_retries", 5);
/// assert_eq!(labels.timeout(), Some(std::time::Duration::from_millis(2500)));
/// assert_eq!(labels.max_retries(), Some(5));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Labels(
    // Shared, copied on write: a run's context and its message hold the same labels without
    // a copy of every name and value per delivery.
    Arc<LabelMap>,
);

impl Default for Labels {
    /// No labels: one shared empty set, so a result or message without labels allocates
    /// nothing for them (the first insert makes a set of its own).
    fn default() -> Self {
        static EMPTY: std::sync::LazyLock<Arc<LabelMap>> =
            std::sync::LazyLock::new(|| Arc::new(LabelMap::default()));
        Labels(Arc::clone(&EMPTY))
    }
}

/// `name` as a [`Name`]: the names ferriq and taskiq write on every message are not copied
/// for each message read or built.
fn name_of(name: impl AsRef<str> + Into<String>) -> Name {
    match known(name.as_ref()) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(name.into()),
    }
}

/// The well-known name `name` is, if it is one.
fn known(name: &str) -> Option<&'static str> {
    use names::*;
    let known = match name {
        TIMEOUT => TIMEOUT,
        MAX_RETRIES => MAX_RETRIES,
        RETRY_ON_ERROR => RETRY_ON_ERROR,
        RETRIES => RETRIES,
        DELAY => DELAY,
        PRIORITY => PRIORITY,
        QUEUE_NAME => QUEUE_NAME,
        DEADLINE_AT => DEADLINE_AT,
        DUE_AT => DUE_AT,
        ENQUEUED_AT => ENQUEUED_AT,
        WIRE => WIRE,
        REPLY_TO => REPLY_TO,
        GROUP => GROUP,
        GROUP_INDEX => GROUP_INDEX,
        CHAIN => CHAIN,
        CHAIN_STEP => CHAIN_STEP,
        SCHEDULE => SCHEDULE,
        TICK => TICK,
        GROUP_RESULTS => GROUP_RESULTS,
        RATE => RATE,
        RATE_KEY => RATE_KEY,
        CONCURRENCY => CONCURRENCY,
        CONCURRENCY_KEY => CONCURRENCY_KEY,
        DEDUP_KEY => DEDUP_KEY,
        DEDUP_FOR => DEDUP_FOR,
        DEDUP_MODE => DEDUP_MODE,
        DEBOUNCE_SEQ => DEBOUNCE_SEQ,
        _ => return None,
    };
    Some(known)
}

/// Well-known label names.
pub mod names {
    pub const TIMEOUT: &str = "timeout";
    pub const MAX_RETRIES: &str = "max_retries";
    pub const RETRY_ON_ERROR: &str = "retry_on_error";
    pub const RETRIES: &str = "_retries";
    pub const DELAY: &str = "delay";
    pub const X_DELAY: &str = "x_delay";
    pub const PRIORITY: &str = "priority";
    pub const QUEUE_NAME: &str = "queue_name";
    pub const QUEUE: &str = "queue";
    pub const DEADLINE_AT: &str = "deadline_at";
    pub const DUE_AT: &str = "due_at";
    /// When the client sent the message (unix seconds): queue-wait metrics.
    pub const ENQUEUED_AT: &str = "ferriq_enqueued_at";
    pub const WIRE: &str = "ferriq_wire";
    pub const REPLY_TO: &str = "reply_to";
    pub const GROUP: &str = "ferriq_group";
    pub const GROUP_INDEX: &str = "ferriq_group_index";
    pub const GROUP_RESULTS: &str = "ferriq_group_results";
    pub const CHAIN: &str = "ferriq_chain";
    pub const CHAIN_STEP: &str = "ferriq_chain_step";
    pub const SCHEDULE: &str = "ferriq_schedule";
    /// A rate limit for this message's task (`50/s`), over the task's own `rate` option.
    pub const RATE: &str = "ferriq_rate";
    /// The key of the rate limit (one limiter per value), over the task's `rate_key`.
    pub const RATE_KEY: &str = "ferriq_rate_key";
    /// Most runs at once for this message's task (a whole number), over its `concurrency`.
    pub const CONCURRENCY: &str = "ferriq_concurrency";
    /// The key of the concurrency limit (one limiter per value), over `concurrency_key`.
    pub const CONCURRENCY_KEY: &str = "ferriq_concurrency_key";
    /// The deduplication key an enqueue reserved (`unique_for`): its task's id stays the
    /// answer to every enqueue of the key while the reservation lasts.
    pub const DEDUP_KEY: &str = "ferriq_dedup_key";
    /// How long the reservation lasts at most (seconds).
    pub const DEDUP_FOR: &str = "ferriq_dedup_for";
    /// `active` (the default: released when the task's outcome is stored) or `window` (kept
    /// for the whole `ferriq_dedup_for`).
    pub const DEDUP_MODE: &str = "ferriq_dedup_mode";
    /// A debounced task's copy: its place among its key's enqueues (absent: the first).
    pub const DEBOUNCE_SEQ: &str = "ferriq_debounce_seq";
    pub const TICK: &str = "ferriq_tick";
}

/// Longest timeout a label may ask for; larger values are clamped.
const MAX_TIMEOUT_SECS: f64 = 14.0 * 24.0 * 3600.0;

/// Longest delay a message may carry (365 days); larger values are clamped.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

fn secs(v: f64, max: f64) -> Option<Duration> {
    (v.is_finite() && v >= 0.0).then(|| Duration::from_secs_f64(v.min(max)))
}

impl Labels {
    /// Labels from `pairs` (see [`LabelMap::fill`]), built in their shared block.
    fn of(pairs: impl IntoIterator<Item = (Name, LabelValue)>) -> Self {
        let mut pairs = pairs.into_iter().peekable();
        if pairs.peek().is_none() {
            return Labels::default();
        }
        let mut map = Arc::new(LabelMap::default());
        // Not shared yet: filled where it is, not copied.
        Arc::make_mut(&mut map).fill(pairs);
        Labels(map)
    }

    /// No labels.
    pub fn new() -> Self {
        Labels::default()
    }

    /// Sets a label, replacing any earlier value.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<LabelValue>) {
        Arc::make_mut(&mut self.0).insert(name_of(name.into()), value.into());
    }

    /// [`insert`](Self::insert) for one of the [`names`]: its name is not copied.
    pub(crate) fn insert_named(&mut self, name: &'static str, value: impl Into<LabelValue>) {
        Arc::make_mut(&mut self.0).insert(Cow::Borrowed(name), value.into());
    }

    /// Removes a label.
    pub fn remove(&mut self, name: &str) -> Option<LabelValue> {
        if !self.0.contains_key(name) {
            return None;
        }
        Arc::make_mut(&mut self.0).remove(name)
    }

    /// A label's value.
    #[inline]
    pub fn get(&self, name: &str) -> Option<&LabelValue> {
        self.0.get(name)
    }

    /// Every label, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LabelValue)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `timeout`: the run's time limit.
    pub fn timeout(&self) -> Option<Duration> {
        self.get(names::TIMEOUT)?
            .as_f64()
            .and_then(|v| secs(v, MAX_TIMEOUT_SECS))
    }

    /// `max_retries`: total attempts, taskiq's meaning.
    pub fn max_retries(&self) -> Option<u32> {
        let n = self.get(names::MAX_RETRIES)?.as_i64()?;
        Some(n.clamp(1, i64::from(u32::MAX)) as u32)
    }

    /// `retry_on_error`: whether a failing run may be retried.
    pub fn retry_on_error(&self) -> Option<bool> {
        self.get(names::RETRY_ON_ERROR)?.as_bool()
    }

    /// `_retries`: failed attempts before this message, set by taskiq's retry middlewares when
    /// they re-send a task.
    pub fn retries(&self) -> Option<u32> {
        let n = self.get(names::RETRIES)?.as_i64()?;
        Some(n.clamp(0, i64::from(u32::MAX)) as u32)
    }

    /// `delay` (or `x_delay`): how long the producer asked the task to wait, taskiq's label.
    /// It is relative to a send time the message does not carry, so workers go by
    /// [`Labels::due_at`]; a message with `delay` and no `due_at` was delayed by its producer's
    /// broker already and runs at once.
    pub fn delay(&self) -> Option<Duration> {
        let v = self
            .get(names::DELAY)
            .or_else(|| self.get(names::X_DELAY))?;
        v.as_f64().and_then(|v| secs(v, MAX_DELAY.as_secs_f64()))
    }

    /// `due_at`: unix seconds before which the task must not start (set by ferriq producers
    /// for delayed tasks).
    pub fn due_at(&self) -> Option<f64> {
        self.get(names::DUE_AT)?.as_f64().filter(|f| f.is_finite())
    }

    /// `ferriq_enqueued_at` (or taskiq's OpenTelemetry middleware's `_taskiq_queue_time`):
    /// when the client sent it (unix seconds).
    pub fn enqueued_at(&self) -> Option<f64> {
        self.get(names::ENQUEUED_AT)
            .or_else(|| self.get("_taskiq_queue_time"))?
            .as_f64()
            .filter(|f| f.is_finite())
    }

    /// `priority`, clamped to 0–255.
    pub fn priority(&self) -> Option<u8> {
        Some(self.get(names::PRIORITY)?.as_i64()?.clamp(0, 255) as u8)
    }

    /// `queue_name` (or `queue`): the queue/lane the message is routed to.
    pub fn queue_name(&self) -> Option<&str> {
        self.get(names::QUEUE_NAME)
            .or_else(|| self.get(names::QUEUE))?
            .as_str()
    }

    /// `deadline_at`: unix seconds after which the task must not start.
    pub fn deadline_at(&self) -> Option<f64> {
        self.get(names::DEADLINE_AT)?
            .as_f64()
            .filter(|f| f.is_finite())
    }

    /// `ferriq_wire`: the wire version the producer wrote; absent means 1.
    pub fn wire_version(&self) -> u32 {
        self.get(names::WIRE)
            .and_then(LabelValue::as_i64)
            .map(|v| v.clamp(0, i64::from(u32::MAX)) as u32)
            .unwrap_or(1)
    }

    /// `reply_to`: the notification channel of the client waiting for this task.
    pub fn reply_to(&self) -> Option<&str> {
        self.get(names::REPLY_TO)?.as_str()
    }

    /// `ferriq_group` and `ferriq_group_index`: the group this message is member `index` of.
    pub fn group_member(&self) -> Option<(TaskId, u32)> {
        let id = TaskId::parse(self.get(names::GROUP)?.as_str()?).ok()?;
        let index = self.get(names::GROUP_INDEX)?.as_i64()?;
        Some((id, u32::try_from(index).ok()?))
    }

    /// `ferriq_group_results`: the group whose members' outcomes this (chord callback) task
    /// reads.
    pub fn group_results_of(&self) -> Option<TaskId> {
        TaskId::parse(self.get(names::GROUP_RESULTS)?.as_str()?).ok()
    }

    /// `ferriq_chain` and `ferriq_chain_step`: the chain this message is step `index` of.
    pub fn chain_step(&self) -> Option<(TaskId, u32)> {
        let id = TaskId::parse(self.get(names::CHAIN)?.as_str()?).ok()?;
        let index = self.get(names::CHAIN_STEP)?.as_i64()?;
        Some((id, u32::try_from(index).ok()?))
    }

    /// Reads `labels` and `labels_types` as taskiq writes them (a name written twice keeps
    /// its last value and its last type, as a JSON object read into a map does).
    pub(crate) fn from_wire<'a, N, V, K>(
        labels: impl IntoIterator<Item = (N, V)>,
        types: &[(K, Value)],
    ) -> Self
    where
        N: AsRef<str> + Into<String>,
        V: Into<RawLabel<'a>>,
        K: AsRef<str>,
    {
        // Messages carry a handful of labels: a scan beats building a map, but a body with
        // thousands must not cost a scan per label.
        let indexed = (types.len() > 16).then(|| {
            let mut index = BTreeMap::new();
            for (k, v) in types {
                index.insert(k.as_ref(), v);
            }
            index
        });
        let code_of = |name: &str| {
            let raw = match &indexed {
                Some(index) => index.get(name).copied(),
                None => types
                    .iter()
                    .rev()
                    .find(|(k, _)| k.as_ref() == name)
                    .map(|(_, v)| v),
            };
            raw.and_then(type_code)
        };
        let labels = labels.into_iter().map(|(name, raw)| {
            let code = code_of(name.as_ref());
            (name_of(name), LabelValue::from_typed(raw.into(), code))
        });
        Labels::of(labels)
    }

    /// Labels from plain JSON values, as a result carries them (the inverse of
    /// [`to_json_map`](Self::to_json_map)).
    ///
    /// ```
    /// let map = serde_json::json!({"ferriq_chain": "0123456789abcdef0123456789abcdef", "ferriq_chain_step": 2});
    /// let labels = ferriq::wire::Labels::from_json_map(map.as_object().unwrap());
    /// assert_eq!(labels.chain_step().map(|(_, step)| step), Some(2));
    /// ```
    pub fn from_json_map(map: &Map<String, Value>) -> Self {
        Self::from_plain(map.clone())
    }

    /// [`from_json_map`](Self::from_json_map), taking the map.
    pub(crate) fn from_plain(map: Map<String, Value>) -> Self {
        let none: &[(String, Value)] = &[];
        Self::from_wire(map, none)
    }

    /// Sets `queue_name`: the lane a message goes to (taskiq's routing label).
    pub fn set_queue_name(&mut self, queue: impl Into<String>) {
        self.insert_named(names::QUEUE_NAME, queue.into());
    }

    /// The labels as plain JSON values, as taskiq copies them into a result.
    pub fn to_json_map(&self) -> Map<String, Value> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_json()))
            .collect()
    }
}

impl<K: Into<String>, V: Into<LabelValue>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Labels::of(iter.into_iter().map(|(k, v)| (name_of(k.into()), v.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_labels_share_one_set_and_an_insert_makes_its_own() {
        let (mut a, b) = (Labels::new(), Labels::default());
        assert!(Arc::ptr_eq(&a.0, &b.0));
        a.insert("x", 1);
        assert!(!Arc::ptr_eq(&a.0, &b.0));
        assert!(b.is_empty() && Labels::new().is_empty());
        assert_eq!(a.get("x"), Some(&LabelValue::Int(1)));
        // Read empty, or emptied by reading: the shared set again.
        assert!(Arc::ptr_eq(&Labels::from_json_map(&Map::new()).0, &b.0));
        a.remove("x");
        assert_eq!(a, b);
    }

    #[test]
    fn a_well_known_name_is_itself_and_any_other_is_copied() {
        use names::*;
        for name in [
            TIMEOUT,
            MAX_RETRIES,
            RETRY_ON_ERROR,
            RETRIES,
            DELAY,
            PRIORITY,
            QUEUE_NAME,
            DEADLINE_AT,
            DUE_AT,
            ENQUEUED_AT,
            WIRE,
            REPLY_TO,
            GROUP,
            GROUP_INDEX,
            CHAIN,
            CHAIN_STEP,
            SCHEDULE,
            TICK,
            GROUP_RESULTS,
            RATE,
            RATE_KEY,
            CONCURRENCY,
            CONCURRENCY_KEY,
            DEDUP_KEY,
            DEDUP_FOR,
            DEDUP_MODE,
            DEBOUNCE_SEQ,
        ] {
            assert_eq!(known(name), Some(name));
            assert!(matches!(name_of(name.to_owned()), Cow::Borrowed(n) if n == name));
        }
        assert_eq!(known("tenant"), None);
        assert!(matches!(name_of("tenant"), Cow::Owned(n) if n == "tenant"));
        // Read from the wire, both kinds are found by name and written back alike.
        let labels = Labels::from_wire(
            vec![
                ("reply_to", Value::from("ch")),
                ("tenant", Value::from("acme")),
            ],
            &[("reply_to", Value::from(3)), ("tenant", Value::from(3))],
        );
        assert_eq!(labels.reply_to(), Some("ch"));
        assert_eq!(
            labels.get("tenant").and_then(LabelValue::as_str),
            Some("acme")
        );
        assert_eq!(
            labels.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            ["reply_to", "tenant"]
        );
    }
}
