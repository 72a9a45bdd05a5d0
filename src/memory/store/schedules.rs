//! The memory store's schedules: run-time schedules, the last tick per schedule and the
//! leader lease, on tokio's clock.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryStore;
use crate::store::schedule_spec::ScheduleSpec;
use crate::store::{ScheduleStore, StoreError};

/// Schedules as the memory store keeps them.
#[derive(Default)]
pub(crate) struct MemSchedules {
    specs: BTreeMap<String, ScheduleSpec>,
    /// Sends announced, until when.
    sending: HashMap<String, Instant>,
    /// Per schedule: the latest tick handled, the latest sent.
    ticks: HashMap<String, (i64, Option<i64>)>,
    leader: Option<(String, Instant)>,
    paused: std::collections::BTreeSet<String>,
    declared: Vec<ScheduleSpec>,
}

#[async_trait]
impl ScheduleStore for MemoryStore {
    async fn put_schedule(&self, spec: &ScheduleSpec) -> Result<(), StoreError> {
        self.lock()
            .schedules
            .specs
            .insert(spec.id.clone(), spec.clone());
        Ok(())
    }

    async fn remove_schedule(&self, id: &str, sending_limit: Duration) -> Result<bool, StoreError> {
        let removed = self.lock().schedules.specs.remove(id).is_some();
        let deadline = Instant::now() + sending_limit;
        loop {
            let sending = self
                .lock()
                .schedules
                .sending
                .get(id)
                .is_some_and(|until| *until > Instant::now());
            if !sending || Instant::now() >= deadline {
                return Ok(removed);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn schedules(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
        Ok(self.lock().schedules.specs.values().cloned().collect())
    }

    async fn begin_sending(&self, id: &str, limit: Duration) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if !state.schedules.specs.contains_key(id) {
            return Ok(false);
        }
        state
            .schedules
            .sending
            .insert(id.to_owned(), Instant::now() + limit);
        Ok(true)
    }

    async fn end_sending(&self, id: &str) -> Result<(), StoreError> {
        self.lock().schedules.sending.remove(id);
        Ok(())
    }

    async fn last_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock().schedules.ticks.get(id).map(|t| t.0))
    }

    async fn last_sent_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock().schedules.ticks.get(id).and_then(|t| t.1))
    }

    async fn record_tick(&self, id: &str, tick: i64, sent: bool) -> Result<(), StoreError> {
        let mut state = self.lock();
        let (handled, last_sent) = state
            .schedules
            .ticks
            .entry(id.to_owned())
            .or_insert((tick, None));
        *handled = (*handled).max(tick);
        if sent {
            *last_sent = Some(last_sent.map_or(tick, |s| s.max(tick)));
        }
        Ok(())
    }

    async fn lead(&self, scheduler: &str, lease: Duration) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let leader = &mut state.schedules.leader;
        match leader {
            Some((holder, until)) if *until > now && holder != scheduler => Ok(false),
            _ => {
                *leader = Some((scheduler.to_owned(), now + lease));
                Ok(true)
            }
        }
    }

    async fn leader(&self) -> Result<Option<String>, StoreError> {
        let now = Instant::now();
        Ok(self
            .lock()
            .schedules
            .leader
            .as_ref()
            .filter(|(_, until)| *until > now)
            .map(|(holder, _)| holder.clone()))
    }

    async fn set_paused(&self, id: &str, paused: bool) -> Result<(), StoreError> {
        let set = &mut self.lock().schedules.paused;
        if paused {
            set.insert(id.to_owned());
        } else {
            set.remove(id);
        }
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.lock().schedules.paused.iter().cloned().collect())
    }

    async fn put_declared(&self, specs: &[ScheduleSpec]) -> Result<(), StoreError> {
        self.lock().schedules.declared = specs.to_vec();
        Ok(())
    }

    async fn declared(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
        Ok(self.lock().schedules.declared.clone())
    }
}
