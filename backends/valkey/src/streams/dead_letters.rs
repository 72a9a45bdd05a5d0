//! The operators' dead-letter queue of a Streams lane: the lane's dead-letter stream, read
//! oldest first. Letters an operator takes are held (for a few minutes at most, so an
//! operator that dies lets go) until returned, redriven or dropped; a redrive sends the body
//! back and removes the letter in one script.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::{BrokerError, DeliveryHandle};
use ferriq::dead_letters::{DeadLetterQueue, DeadMessage};
use fred::prelude::ClientLike;
use fred::types::Value;

use super::lane::Lane;
use super::shared::unavailable;
use super::StreamBroker;

/// How long an operator's take holds dead letters from other operators.
const HOLD: Duration = Duration::from_secs(300);

/// A dead letter's handle: its entry in its lane's dead-letter stream.
struct DeadHeld {
    broker: u64,
    lane: Arc<Lane>,
    id: String,
}

impl StreamBroker {
    fn dead_held<'a>(&self, held: &'a DeadMessage) -> Result<&'a DeadHeld, BrokerError> {
        match held.handle.downcast_ref::<DeadHeld>() {
            Some(h) if h.broker == self.shared.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }
}

/// `[id, [field, value…]]` of the dead-letter stream → a dead letter.
fn dead_message(broker: u64, lane: &Arc<Lane>, raw: Value) -> Option<DeadMessage> {
    let mut parts = raw.into_array().into_iter();
    let id = parts.next()?.as_string()?;
    let fields = parts.next()?.into_array();
    let field = |name: &str| {
        fields
            .chunks(2)
            .find(|kv| kv.first().and_then(|k| k.as_str()).as_deref() == Some(name))
            .and_then(|kv| kv.get(1))
    };
    let text = |name: &str| field(name).and_then(Value::as_string);
    let body = field("data")
        .and_then(Value::as_bytes)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    Some(DeadMessage::new(
        id.clone(),
        &*lane.stream,
        text("reason").filter(|r| !r.is_empty()),
        text("detail").unwrap_or_default(),
        text("task_name").filter(|n| !n.is_empty()),
        text("attempts").and_then(|a| a.parse().ok()).unwrap_or(0),
        text("dead_at").and_then(|a| a.parse().ok()),
        body,
        DeliveryHandle::new(DeadHeld {
            broker,
            lane: Arc::clone(lane),
            id,
        }),
    ))
}

#[async_trait]
impl DeadLetterQueue for StreamBroker {
    async fn take_dead(&self, lane: &str, max: usize) -> Result<Vec<DeadMessage>, BrokerError> {
        let shared = &self.shared;
        let lane = shared.lane_for(Some(lane)).await?;
        let reply = shared
            .call(
                &shared.scripts.take_dead,
                vec![lane.dead.clone(), lane.dead_held.clone()],
                vec![(max as i64).into(), (HOLD.as_millis() as i64).into()],
            )
            .await
            .map_err(unavailable)?;
        Ok(reply
            .into_array()
            .into_iter()
            .filter_map(|e| dead_message(shared.id, &lane, e))
            .collect())
    }

    async fn return_dead(&self, held: Vec<DeadMessage>) -> Result<(), BrokerError> {
        for m in &held {
            let h = self.dead_held(m)?;
            self.shared
                .call(
                    &self.shared.scripts.return_dead,
                    vec![h.lane.dead_held.clone()],
                    vec![h.id.as_str().into()],
                )
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn redrive_dead(&self, held: &DeadMessage, body: Vec<u8>) -> Result<(), BrokerError> {
        let h = self.dead_held(held)?;
        self.shared
            .call(
                &self.shared.scripts.redrive_dead,
                vec![
                    h.lane.stream.to_string(),
                    h.lane.dead.clone(),
                    h.lane.dead_held.clone(),
                ],
                vec![h.id.as_str().into(), Value::Bytes(body.into())],
            )
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn drop_dead(&self, held: &DeadMessage) -> Result<(), BrokerError> {
        let h = self.dead_held(held)?;
        self.shared
            .call(
                &self.shared.scripts.drop_dead,
                vec![h.lane.dead.clone(), h.lane.dead_held.clone()],
                vec![h.id.as_str().into()],
            )
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn dead_count(&self, lane: &str) -> Result<u64, BrokerError> {
        let lane = self.shared.lane_for(Some(lane)).await?;
        let len: i64 = self
            .shared
            .pool
            .next()
            .custom(
                super::lane::on_key("XLEN", &lane.dead, false),
                vec![Value::from(lane.dead.as_str())],
            )
            .await
            .map_err(unavailable)?;
        Ok(len.max(0) as u64)
    }
}
