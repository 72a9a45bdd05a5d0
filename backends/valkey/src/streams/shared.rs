//! What a broker's clones share — the connections, the scripts, the lanes — and the calls
//! every operation is made of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{BrokerError, Delivery, DeliveryHandle};
use ferriq::store::StoreError;
use fred::prelude::{Client, Pool};
use fred::types::scripts::Script;
use fred::types::Value;

use super::config::create_group;
use super::lane::Lane;
use super::scripts::StreamScripts;
use crate::batch::Batcher;

/// An entry as read: its id, its `data` field, and how many times it was delivered.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) data: Vec<u8>,
    pub(crate) count: u32,
}

/// What a delivery's handle holds: the entry, and the delivery count that fences it (a copy
/// taken over by another receive has a higher count).
pub(crate) struct Held {
    pub(crate) broker: u64,
    pub(crate) lane: Arc<Lane>,
    pub(crate) id: String,
    pub(crate) count: u32,
}

/// Acks of one lane (entry id, delivery count → whether it was held), gathered into one
/// script run while another is on the wire.
pub(crate) type Acker = Batcher<(String, u32), bool>;

/// At most this many acks in one script run.
const MAX_ACKS: usize = 256;

/// `lane`'s acker: a lone ack goes out from its caller's task, acks made while two are on the
/// wire go out together.
pub(crate) fn acker(
    pool: &Pool,
    script: &Script,
    lane: &Arc<Lane>,
    group: &str,
    consumer: &str,
) -> Acker {
    let (pool, script, lane) = (pool.clone(), script.clone(), Arc::clone(lane));
    let (group, consumer) = (Value::from(group), Value::from(consumer));
    let (acker, _task) = Batcher::spawn(MAX_ACKS, 2, move |calls: Vec<(String, u32)>| {
        let (pool, script) = (pool.clone(), script.clone());
        let keys = vec![lane.stream.to_string(), lane.leases.clone()];
        let mut args = Vec::with_capacity(2 + 2 * calls.len());
        args.extend([group.clone(), consumer.clone()]);
        for (id, count) in calls {
            args.extend([Value::from(id), Value::from(i64::from(count))]);
        }
        async move {
            let reply = crate::scripts::call(&pool, &script, || (keys.clone(), args.clone()))
                .await
                .map_err(|e| StoreError::Unavailable(format!("{:?}: {}", e.kind(), e.details())))?;
            Ok(reply
                .into_array()
                .into_iter()
                .map(|held| Ok(held.as_i64() == Some(1)))
                .collect())
        }
    });
    acker
}

pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) pool: Pool,
    pub(crate) reader: Client,
    pub(crate) scripts: StreamScripts,
    pub(crate) lanes: Vec<Arc<Lane>>,
    /// One per lane, in the same order.
    pub(crate) ackers: Vec<Acker>,
    /// Streams only sent to (a `queue_name` label naming no lane), with their group made.
    pub(crate) others: tokio::sync::Mutex<std::collections::HashMap<String, Arc<Lane>>>,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) clustered: bool,
    pub(crate) lease_ms: AtomicU64,
    pub(crate) url: String,
}

/// The entries a script took, as `{id, data, delivery count}` each.
fn entries_taken(reply: Value) -> Vec<Entry> {
    reply
        .into_array()
        .into_iter()
        .filter_map(|e| {
            let mut p = e.into_array().into_iter();
            let id = p.next()?.as_string()?;
            let data = p.next()?.as_bytes().map(<[u8]>::to_vec).unwrap_or_default();
            let count = p
                .next()?
                .as_i64()
                .unwrap_or(1)
                .clamp(1, i64::from(u32::MAX)) as u32;
            Some(Entry { id, data, count })
        })
        .collect()
}

/// Who a script error or a lost connection hurts: the caller retries or the message comes
/// back by itself.
pub(crate) fn unavailable(e: fred::error::Error) -> BrokerError {
    BrokerError::Unavailable(format!("{:?}: {}", e.kind(), e.details()))
}

impl Shared {
    /// Calls `script` on one lane's keys, loading it again after `NOSCRIPT`.
    pub(crate) async fn call(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        // The store's call, which loads the script again after `NOSCRIPT`. The values are
        // cheap to clone (bodies are shared bytes).
        crate::scripts::call(&self.pool, script, || (keys.clone(), args.clone())).await
    }

    pub(crate) fn lease(&self) -> i64 {
        self.lease_ms.load(Ordering::Relaxed) as i64
    }

    /// Gives entries just read their lease.
    pub(crate) async fn give_leases(
        &self,
        lane: &Lane,
        entries: &[Entry],
    ) -> Result<(), fred::error::Error> {
        let mut args: Vec<Value> = vec![self.lease().into()];
        args.extend(entries.iter().map(|e| Value::from(e.id.as_str())));
        self.call(
            &self.scripts.lease,
            vec![lane.stream.to_string(), lane.leases.clone()],
            args,
        )
        .await
        .map(drop)
    }

    /// Entries of `lane` whose lease ran out (and due delayed messages, added first).
    /// Removes the lane's consumers that hold nothing and have not read for an hour, and
    /// `mine` (this broker's own consumer) when it holds nothing; how many went.
    pub(crate) async fn prune(&self, lane: &Lane, mine: bool) -> Result<i64, fred::error::Error> {
        let reply = self
            .call(
                &self.scripts.prune,
                vec![lane.stream.to_string()],
                vec![
                    self.group.as_str().into(),
                    3_600_000i64.into(),
                    if mine { self.consumer.as_str() } else { "" }.into(),
                ],
            )
            .await?;
        Ok(reply.as_i64().unwrap_or(0))
    }

    /// New entries of `lane`, up to `max`, read without waiting and leased in the same
    /// script run.
    pub(crate) async fn read_now(
        &self,
        lane: &Lane,
        max: usize,
    ) -> Result<Vec<Entry>, fred::error::Error> {
        let reply = self
            .call(
                &self.scripts.read,
                vec![lane.stream.to_string(), lane.leases.clone()],
                vec![
                    self.group.as_str().into(),
                    self.consumer.as_str().into(),
                    (max as i64).into(),
                    self.lease().into(),
                ],
            )
            .await?;
        Ok(entries_taken(reply))
    }

    /// Due delayed messages into the stream, then up to `max` entries whose lease ran out
    /// (see the script), and how long until the next is due or the next lease ends.
    pub(crate) async fn reclaim(
        &self,
        lane: &Arc<Lane>,
        max: usize,
    ) -> Result<(Vec<Entry>, Option<Duration>), fred::error::Error> {
        let lease = self.lease();
        let reply = self
            .call(
                &self.scripts.reclaim,
                vec![
                    lane.stream.to_string(),
                    lane.leases.clone(),
                    lane.delayed.clone(),
                ],
                vec![
                    self.group.as_str().into(),
                    self.consumer.as_str().into(),
                    lease.into(),
                    (max as i64).into(),
                    // Pending with no lease at all: a reader that died between its read and
                    // its lease. Two leases: no live reader takes that long.
                    (2 * lease).into(),
                ],
            )
            .await;
        let reply = match reply {
            // The stream or its group went (deleted, or evicted under memory pressure): made
            // again, and nothing to take this time.
            Err(e) if e.details().contains("NOGROUP") => {
                tracing::warn!(lane = %lane.stream, "the lane's stream or consumer group was missing: made again");
                create_group(self.pool.next(), &lane.stream, &self.group).await?;
                return Ok((Vec::new(), None));
            }
            other => other?,
        };
        let mut parts = reply.into_array().into_iter();
        let taken = parts.next().map(entries_taken).unwrap_or_default();
        let next = parts
            .next()
            .and_then(|ms| ms.as_i64())
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        Ok((taken, next))
    }

    /// The lane a message goes to: a lane, or another stream by name (its group made once).
    pub(crate) async fn lane_for(&self, name: Option<&str>) -> Result<Arc<Lane>, BrokerError> {
        let Some(name) = name else {
            return Ok(Arc::clone(&self.lanes[0]));
        };
        if let Some(lane) = self.lanes.iter().find(|l| &*l.stream == name) {
            return Ok(Arc::clone(lane));
        }
        let mut others = self.others.lock().await;
        if let Some(lane) = others.get(name) {
            return Ok(Arc::clone(lane));
        }
        let lane = Arc::new(Lane::new(name).map_err(BrokerError::Config)?);
        create_group(self.pool.next(), &lane.stream, &self.group)
            .await
            .map_err(unavailable)?;
        others.insert(name.to_owned(), Arc::clone(&lane));
        Ok(lane)
    }

    pub(crate) fn held<'a>(&self, handle: &'a DeliveryHandle) -> Result<&'a Held, BrokerError> {
        match handle.downcast_ref::<Held>() {
            Some(h) if h.broker == self.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    pub(crate) fn delivery(&self, lane: &Arc<Lane>, entry: Entry) -> Delivery {
        let task_id = ferriq::wire::TaskMessage::peek_task_id(&entry.data);
        Delivery::new(
            entry.data,
            task_id,
            entry.count,
            Arc::clone(&lane.stream),
            DeliveryHandle::new(Held {
                broker: self.id,
                lane: Arc::clone(lane),
                id: entry.id,
                count: entry.count,
            }),
        )
    }

    /// Acks a held entry (deleting it): `DeliveryLost` when it is not held any more.
    pub(crate) async fn ack(&self, held: &Held) -> Result<(), BrokerError> {
        let Some(at) = self.lanes.iter().position(|l| Arc::ptr_eq(l, &held.lane)) else {
            return Err(BrokerError::ForeignHandle);
        };
        match self.ackers[at].call((held.id.clone(), held.count)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(BrokerError::DeliveryLost),
            Err(StoreError::Unavailable(why)) => Err(BrokerError::Unavailable(why)),
            Err(e) => Err(BrokerError::Unavailable(e.to_string())),
        }
    }

    /// A held entry settled by `script` with `extra` arguments; `DeliveryLost` when it is not
    /// held any more.
    pub(crate) async fn settle(
        &self,
        script: &Script,
        held: &Held,
        keys: Vec<String>,
        extra: Vec<Value>,
    ) -> Result<(), BrokerError> {
        let mut args: Vec<Value> = vec![
            self.group.as_str().into(),
            self.consumer.as_str().into(),
            held.id.as_str().into(),
            i64::from(held.count).into(),
        ];
        args.extend(extra);
        let reply = self.call(script, keys, args).await.map_err(unavailable)?;
        match reply.as_i64() {
            Some(1) => Ok(()),
            _ => Err(BrokerError::DeliveryLost),
        }
    }
}
