//! Deleting a lane: its queue, dead-letter queue and delay tiers. Every process that lists a
//! lane declares its queues, so a mistyped lane leaves a set of durable queues behind.

use ferriq::broker::BrokerError;
use lapin::options::QueueDeleteOptions;
use tokio::time::Instant;

use crate::{AmqpBroker, AmqpBrokerBuilder};

impl AmqpBroker {
    /// The queues of `lane`: the lane, its dead-letter queue, its delay tiers (as this
    /// broker's configuration names them).
    fn lane_queues(&self, lane: &str) -> Vec<String> {
        let config = &self.shared.config;
        let mut queues = vec![lane.to_owned(), AmqpBrokerBuilder::dead_letter_queue(lane)];
        queues.extend(
            config
                .delay_tiers
                .iter()
                .map(|t| AmqpBrokerBuilder::delay_queue(lane, *t)),
        );
        queues
    }

    /// Deletes `lane`'s queues; the messages they held. Without `force`, a lane whose queues
    /// hold messages or have consumers is refused and nothing is deleted.
    pub(crate) async fn delete_lane_queues(
        &self,
        lane: &str,
        force: bool,
    ) -> Result<u64, BrokerError> {
        let mut found = Vec::new();
        let (mut messages, mut consumers) = (0, 0);
        for queue in self.lane_queues(lane) {
            if let Some((ready, consuming)) = self.declare_passive(&queue).await? {
                messages += ready;
                consumers += consuming;
                found.push(queue);
            }
        }
        if found.is_empty() {
            return Err(BrokerError::NotFound(format!(
                "lane {lane:?} has no queues on this RabbitMQ (virtual host): nothing to delete"
            )));
        }
        if !force && (messages > 0 || consumers > 0) {
            return Err(BrokerError::Rejected(format!(
                "lane {lane:?} holds {messages} message(s) and has {consumers} consumer(s): \
                 nothing was deleted (stop its workers first; --force deletes the messages too)"
            )));
        }
        let session = self
            .live_session(Instant::now() + std::time::Duration::from_secs(5))
            .await?;
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::Unavailable(e.to_string()))?;
        // Quorum queues refuse the if-empty and if-unused flags (a hard connection error), so
        // the count above is the check: a message published to the lane between the two is
        // deleted with it (the command says to stop its producers first). The delay tiers go
        // first: a delayed message expiring into a deleted lane would be dropped.
        let mut deleted = 0;
        for queue in found.iter().rev() {
            deleted += u64::from(
                channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .map_err(|e| BrokerError::Unavailable(format!("deleting {queue}: {e}")))?,
            );
        }
        let _ = channel.close(200, "lane deleted".into()).await;
        self.shared
            .known_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|q| !found.contains(q));
        tracing::info!(
            lane,
            queues = found.len(),
            messages = deleted,
            "lane deleted"
        );
        Ok(deleted)
    }
}
