//! The memory broker's dead-letter queue, for operators: take, return, redrive, drop.

use async_trait::async_trait;

use super::MemoryBroker;
use crate::broker::{Broker, BrokerError, DeliveryHandle, OutgoingMessage};
use crate::dead_letters::{DeadLetterQueue, DeadMessage};
use crate::wire::TaskId;

/// A held dead letter: its broker and parking id.
#[derive(Debug)]
struct DeadHandle {
    broker: u64,
    id: u64,
}

impl MemoryBroker {
    fn dead_id(&self, held: &DeadMessage) -> Result<u64, BrokerError> {
        match held.handle.downcast_ref::<DeadHandle>() {
            Some(h) if h.broker == self.shared.id => Ok(h.id),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    /// Removes a held dead letter; `false` when it is no longer there.
    fn remove_dead(&self, id: u64) -> bool {
        let mut state = self.lock();
        let before = state.dead.len();
        state.dead.retain(|d| d.id != id);
        state.dead.len() < before
    }
}

#[async_trait]
impl DeadLetterQueue for MemoryBroker {
    async fn take_dead(&self, lane: &str, max: usize) -> Result<Vec<DeadMessage>, BrokerError> {
        let mut state = self.lock();
        let mut out = Vec::new();
        for d in state.dead.iter_mut().filter(|d| d.queue == lane && !d.held) {
            if out.len() >= max {
                break;
            }
            d.held = true;
            out.push(DeadMessage::new(
                d.id.to_string(),
                d.queue.clone(),
                Some(d.why.reason.as_str().to_owned()),
                d.why.detail.clone(),
                d.why.task_name.clone(),
                d.why.attempts,
                Some(d.dead_at_ms),
                d.body.clone(),
                DeliveryHandle::new(DeadHandle {
                    broker: self.shared.id,
                    id: d.id,
                }),
            ));
        }
        Ok(out)
    }

    async fn return_dead(&self, held: Vec<DeadMessage>) -> Result<(), BrokerError> {
        let ids = held
            .iter()
            .map(|h| self.dead_id(h))
            .collect::<Result<Vec<_>, _>>()?;
        let mut state = self.lock();
        for d in state.dead.iter_mut().filter(|d| ids.contains(&d.id)) {
            d.held = false;
        }
        Ok(())
    }

    async fn redrive_dead(&self, held: &DeadMessage, body: Vec<u8>) -> Result<(), BrokerError> {
        let id = self.dead_id(held)?;
        let mut copy = OutgoingMessage::raw(body);
        copy.task_id = held.task_id.clone().unwrap_or_else(TaskId::random);
        copy.task_name = held.task_name.as_deref().unwrap_or_default().into();
        copy.queue = Some(held.lane.clone());
        self.publish(vec![copy]).await?;
        if !self.remove_dead(id) {
            return Err(BrokerError::DeliveryLost);
        }
        Ok(())
    }

    async fn drop_dead(&self, held: &DeadMessage) -> Result<(), BrokerError> {
        let id = self.dead_id(held)?;
        if !self.remove_dead(id) {
            return Err(BrokerError::DeliveryLost);
        }
        Ok(())
    }

    async fn dead_count(&self, lane: &str) -> Result<u64, BrokerError> {
        Ok(self.lock().dead.iter().filter(|d| d.queue == lane).count() as u64)
    }
}
