//! A broker on Valkey/Redis Streams, compatible with taskiq-redis's `RedisStreamBroker`:
//! messages are entries of the lane's stream (`XADD <queue> * data <taskiq JSON>`), read by
//! the consumer group `taskiq`, so Python producers and workers share the queues.
//!
//! Unlike taskiq-redis, a delivery is reclaimed by **lease**, not by idle time: a worker that
//! heartbeats keeps its entry however long the run takes; a dead worker's entries are taken
//! over by the next receive of any worker once their lease runs out; there is no lock to leak.
//! Acked entries are deleted (`XACK` + `XDEL`), so a stream holds only what is queued or
//! running. Delays wait in a sorted set until due; dead letters go to a stream of their own.
//! Keys of one lane share its hash tag (`{<queue>}:ferriq:…` beside the stream `<queue>`), so
//! every script runs on one node of a cluster.

mod config;
mod dead_letters;
mod lane;
mod read;
mod scripts;
mod shared;
mod wake;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::{
    Broker, BrokerError, ConsumerSettings, DeadLetter, Delivery, DeliveryHandle, Health,
    LeaseStatus, OutgoingMessage, QueueDepth,
};
use fred::prelude::ClientLike;
use fred::types::Value;

pub use config::StreamBrokerBuilder;
use lane::Lane;
use read::Reads;
use shared::{unavailable, Held, Shared};

/// A broker on Valkey/Redis Streams (see the module docs). Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), ferriq_valkey::ValkeyError> {
/// let broker = ferriq_valkey::StreamBroker::builder("redis://127.0.0.1:6379")
///     .queues(["taskiq"])
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StreamBroker {
    shared: Arc<Shared>,
    reads: Arc<Reads>,
    wakes: Arc<wake::Wakes>,
}

impl std::fmt::Debug for StreamBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBroker")
            .field("url", &self.shared.url)
            .field("lanes", &self.lanes())
            .field("group", &self.shared.group)
            .finish_non_exhaustive()
    }
}

impl StreamBroker {
    /// What a receive takes without waiting: what a read brought before, then (when a look is
    /// due) lapsed leases and due messages, then new entries.
    async fn receive_now(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let shared = &self.shared;
        let delivery = |(lane, e): (Arc<Lane>, shared::Entry)| shared.delivery(&lane, e);
        let ready = self.reads.take_ready(max).await.map_err(unavailable)?;
        if !ready.is_empty() {
            return Ok(ready.into_iter().map(delivery).collect());
        }
        let mut out = Vec::new();
        if self.reads.begin_look() {
            let mut next: Option<Duration> = None;
            for lane in &shared.lanes {
                if out.len() >= max {
                    break;
                }
                match shared.reclaim(lane, max - out.len()).await {
                    Ok((taken, lane_next)) => {
                        out.extend(taken.into_iter().map(|e| shared.delivery(lane, e)));
                        next = match (next, lane_next) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                    // What earlier lanes gave is handed out, not left to its lease.
                    Err(_) if !out.is_empty() => break,
                    Err(e) => return Err(unavailable(e)),
                }
            }
            self.reads.reclaimed(out.len() >= max, next);
            if !out.is_empty() {
                return Ok(out);
            }
        }
        // New entries without waiting, read and leased in one script run per lane: under load
        // there are always some, and a receive is one round trip.
        for lane in self.reads.lanes_in_turn(&shared.lanes) {
            if out.len() >= max {
                break;
            }
            match shared.read_now(&lane, max - out.len()).await {
                Ok(read) => out.extend(read.into_iter().map(|e| shared.delivery(&lane, e))),
                // What earlier lanes gave is handed out; with nothing, the blocking read
                // meets the same fault and reports it.
                Err(_) => break,
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Broker for StreamBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        // Per lane: the script's arguments, and whether a delay in them is due soon.
        let mut by_lane: Vec<(Arc<Lane>, Vec<Value>, bool)> = Vec::new();
        for msg in batch {
            let lane = self.shared.lane_for(msg.queue.as_deref()).await?;
            let delay = msg.delay.map_or(0, |d| d.as_millis() as i64);
            // The nonce keeps two delayed copies of one body apart in the delayed set.
            let nonce = if delay > 0 {
                Value::from(uuid::Uuid::new_v4().simple().to_string())
            } else {
                Value::from_static_str("")
            };
            let args = [Value::from(delay), nonce, Value::Bytes(msg.body.into())];
            let soon = delay > 0 && delay < wake::ANNOUNCE_WITHIN_MS;
            match by_lane.iter_mut().find(|(l, _, _)| Arc::ptr_eq(l, &lane)) {
                Some((_, all, any_soon)) => {
                    all.extend(args);
                    *any_soon |= soon;
                }
                None => by_lane.push((lane, args.to_vec(), soon)),
            }
        }
        for (lane, args, soon) in by_lane {
            let mut keys = vec![lane.stream.to_string(), lane.delayed.clone()];
            if soon {
                keys.push(lane.due.clone());
            }
            self.shared
                .call(&self.shared.scripts.publish, keys, args)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        let max = max.max(1);
        self.wakes.start(
            self.shared.lanes.iter().map(|l| l.due.clone()).collect(),
            Arc::downgrade(&self.reads),
        );
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let got = self.receive_now(max).await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !got.is_empty() || left.is_zero() {
                return Ok(got);
            }
            // Only an empty stream waits, on the reader's connection — until new entries
            // come, or something falls due (then the loop looks for it), or the wait ends.
            if let Some(read) = self
                .reads
                .read(&self.shared, max, left)
                .await
                .map_err(unavailable)?
            {
                if !read.is_empty() {
                    let shared = &self.shared;
                    return Ok(read
                        .into_iter()
                        .map(|(l, e)| shared.delivery(&l, e))
                        .collect());
                }
            }
        }
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let held = self.shared.held(delivery)?;
        self.shared.ack(held).await
    }

    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        let held = self.shared.held(delivery)?;
        let mut keys = vec![held.lane.stream.to_string(), held.lane.leases.clone()];
        let ms = after.as_millis().min(i64::MAX as u128) as i64;
        if ms < wake::ANNOUNCE_WITHIN_MS {
            keys.push(held.lane.due.clone());
        }
        let after_ms = Value::from(ms);
        self.shared
            .settle(&self.shared.scripts.release, held, keys, vec![after_ms])
            .await?;
        self.reads.due_in(after);
        Ok(())
    }

    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        let mut statuses = vec![LeaseStatus::Lost; deliveries.len()];
        // One script per lane: every key of a call in one slot.
        let mut by_lane: Vec<(Arc<Lane>, Vec<usize>)> = Vec::new();
        for (i, handle) in deliveries.iter().enumerate() {
            let Ok(held) = self.shared.held(handle) else {
                continue;
            };
            match by_lane.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &held.lane)) {
                Some((_, at)) => at.push(i),
                None => by_lane.push((Arc::clone(&held.lane), vec![i])),
            }
        }
        for (lane, at) in by_lane {
            let mut args: Vec<Value> = vec![
                self.shared.group.as_str().into(),
                self.shared.consumer.as_str().into(),
                (lease.as_millis() as i64).into(),
            ];
            for &i in &at {
                let held = self.shared.held(&deliveries[i])?;
                args.push(held.id.as_str().into());
                args.push(i64::from(held.count).into());
            }
            let reply = self
                .shared
                .call(
                    &self.shared.scripts.extend,
                    vec![lane.stream.to_string(), lane.leases.clone()],
                    args,
                )
                .await
                .map_err(unavailable)?;
            for (&i, kept) in at.iter().zip(reply.into_array()) {
                if kept.as_i64() == Some(1) {
                    statuses[i] = LeaseStatus::Kept;
                }
            }
        }
        Ok(statuses)
    }

    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        let held = self.shared.held(&delivery.handle)?;
        let keys = vec![
            held.lane.stream.to_string(),
            held.lane.leases.clone(),
            held.lane.dead.clone(),
        ];
        let extra = vec![
            Value::Bytes(delivery.body.clone()),
            Value::from(why.reason.as_str()),
            Value::from(why.detail.as_str()),
            Value::from(why.task_name.clone().unwrap_or_default()),
            Value::from(i64::from(why.attempts)),
        ];
        self.shared
            .settle(&self.shared.scripts.park, held, keys, extra)
            .await
    }

    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        let mut total = QueueDepth::new(0, 0, 0);
        for (_, d) in self.queue_depths().await? {
            total = QueueDepth::new(
                total.ready + d.ready,
                total.in_flight + d.in_flight,
                total.delayed + d.delayed,
            );
        }
        Ok(total)
    }

    async fn health(&self) -> Health {
        match self.shared.pool.next().ping::<Value>(None).await {
            Ok(_) => Health::Healthy,
            Err(e) => Health::Unhealthy(format!("{:?}: {}", e.kind(), e.details())),
        }
    }

    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let client = self.shared.pool.next();
        let mut out = Vec::new();
        for lane in &self.shared.lanes {
            let len: i64 = client
                .custom(
                    lane::on_key("XLEN", &lane.stream, false),
                    vec![Value::from(&*lane.stream)],
                )
                .await
                .map_err(unavailable)?;
            let pending: Value = client
                .custom(
                    lane::on_key("XPENDING", &lane.stream, false),
                    vec![
                        Value::from(&*lane.stream),
                        Value::from(self.shared.group.as_str()),
                    ],
                )
                .await
                .map_err(unavailable)?;
            let pending = pending
                .into_array()
                .first()
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let delayed: i64 = client
                .custom(
                    lane::on_key("ZCARD", &lane.delayed, false),
                    vec![Value::from(lane.delayed.as_str())],
                )
                .await
                .map_err(unavailable)?;
            let ready = (len - pending).max(0) as u64;
            out.push((
                lane.stream.to_string(),
                QueueDepth::new(ready, pending.max(0) as u64, delayed.max(0) as u64),
            ));
        }
        Ok(out)
    }

    async fn close(&self) {
        self.wakes.stop().await;
        let _ = self.shared.reader.quit().await;
        let _ = self.shared.pool.quit().await;
    }

    fn dead_letters(&self) -> Option<&dyn ferriq::dead_letters::DeadLetterQueue> {
        Some(self)
    }

    fn lanes(&self) -> Vec<String> {
        self.shared
            .lanes
            .iter()
            .map(|l| l.stream.to_string())
            .collect()
    }

    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        self.shared.lease_ms.store(
            consumer.lease.as_millis().max(1000) as u64,
            Ordering::Relaxed,
        );
    }

    async fn consumer_count(&self, queue: Option<&str>) -> Option<(String, u64)> {
        let lane = self.shared.lane_for(queue).await.ok()?;
        // Reading within the last 10 s: a worker's reads block 2 s at most.
        let reply = self
            .shared
            .call(
                &self.shared.scripts.active_consumers,
                vec![lane.stream.to_string()],
                vec![self.shared.group.as_str().into(), 10_000i64.into()],
            )
            .await
            .ok()?;
        Some((lane.stream.to_string(), reply.as_i64()?.max(0) as u64))
    }

    async fn stop_receiving(&self) {
        // A read still blocked may bring entries: they go back at once, for another worker.
        for (lane, entry) in self.reads.take_in_flight(Duration::from_secs(3)).await {
            let held = Held {
                broker: self.shared.id,
                lane: Arc::clone(&lane),
                id: entry.id,
                count: entry.count,
            };
            let keys = vec![
                lane.stream.to_string(),
                lane.leases.clone(),
                lane.due.clone(),
            ];
            let _ = self
                .shared
                .settle(
                    &self.shared.scripts.release,
                    &held,
                    keys,
                    vec![Value::from(0i64)],
                )
                .await;
        }
        // This worker's consumer, holding nothing now, leaves the group.
        for lane in &self.shared.lanes {
            let _ = self.shared.prune(lane, true).await;
        }
    }
}
