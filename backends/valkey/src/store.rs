use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::Health;
use ferriq::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ResultStatus,
    ResultStore, StoreError, Token,
};
use ferriq::wire::{TaskId, TaskResult};
use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, PubsubInterface};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::batch::Batcher;
use crate::error::store_error;
use crate::keys::Keys;
use crate::ops::{ClaimCall, CompleteCall, Core};
use crate::scripts::{self, Scripts};
use crate::waiters::{confirm_subscribed, spawn_dispatcher, Waiters};
use crate::{ValkeyError, ValkeyStoreBuilder};

/// Claims and results on Valkey/Redis: implements both [`ClaimStore`] and [`ResultStore`] over
/// one connection pool, plus one subscriber connection for waiters. Cheap to clone.
#[derive(Clone)]
pub struct ValkeyStore {
    inner: Arc<Inner>,
}

struct Inner {
    core: Arc<Core>,
    subscriber: SubscriberClient,
    waiters: Arc<Waiters>,
    reply_channel: String,
    clustered: bool,
    /// Concurrent claims and completes, gathered into one script run per round trip (off
    /// in a cluster, where one script may only touch one slot).
    claims: Option<Batcher<ClaimCall, ClaimOutcome>>,
    completes: Option<Batcher<CompleteCall, CompleteOutcome>>,
    background: Vec<JoinHandle<()>>,
}

/// Calls gathered into one script run at most.
const MAX_BATCH: usize = 64;

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
        // Close the connections in the background when a runtime is still there.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (pool, subscriber) = (self.core.pool.clone(), self.subscriber.clone());
            rt.spawn(async move {
                let _ = subscriber.quit().await;
                let _ = pool.quit().await;
            });
        }
    }
}

/// A claim as stored, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimState {
    /// No claim record.
    Absent,
    /// Running under `token` (its lease may have run out).
    Running {
        /// The current fencing token.
        token: u64,
        /// Failed attempts so far.
        failures: u32,
        /// The holder's worker id.
        holder: String,
    },
    /// Released (after a failure or a drain); will run again on its next delivery.
    Released {
        /// Failed attempts so far.
        failures: u32,
    },
    /// Finished; duplicates are acked.
    Done,
    /// Revoked.
    Revoked,
}

impl ValkeyStore {
    /// A builder for the store at `url`.
    pub fn builder(url: impl Into<ferriq::SecretUrl>) -> ValkeyStoreBuilder {
        ValkeyStoreBuilder::new(url)
    }

    pub(crate) async fn connect(settings: ValkeyStoreBuilder) -> Result<Self, ValkeyError> {
        let builder = settings.fred_builder()?;
        let url = settings.url.redacted();
        let failed = |e: fred::error::Error| ValkeyError::Connect {
            url: url.clone(),
            reason: format!("{:?}: {}", e.kind(), e.details()),
        };
        let pool = builder.build_pool(settings.pool_size).map_err(failed)?;
        let subscriber = builder.build_subscriber_client().map_err(failed)?;
        let (waiters, leaves) = Waiters::new(subscriber.clone());
        let waiters = Arc::new(waiters);
        let keys = Keys::new(&settings.prefix);
        let reply_channel = keys.reply_channel();
        let scripts = Scripts::new();
        let limit = settings.connect_timeout.saturating_mul(2) + Duration::from_secs(1);
        let mut background = Vec::new();
        let setup = async {
            pool.init().await?;
            subscriber.init().await?;
            scripts.load(pool.next()).await?;
            scripts::check_server(pool.next())
                .await
                .map_err(|e| fred::error::Error::new(fred::error::ErrorKind::Config, e))?;
            // The dispatcher listens for reconnects before the first subscription and
            // resubscribes itself, so a drop right after it is covered too. (Not fred's
            // `manage_subscriptions`: its `resubscribe_all` sends an empty PSUBSCRIBE, whose
            // error then answers the next command, our confirming PING.)
            background.push(spawn_dispatcher(&subscriber, Arc::clone(&waiters), leaves));
            subscriber.subscribe(reply_channel.as_str()).await?;
            confirm_subscribed(&subscriber).await?;
            Ok::<_, fred::error::Error>(())
        };
        let outcome = match tokio::time::timeout(limit, setup).await {
            Ok(r) => r.map_err(failed),
            Err(_) => Err(ValkeyError::Connect {
                url: url.clone(),
                reason: format!("no answer within {limit:?}"),
            }),
        };
        if let Err(e) = outcome {
            // Nothing may keep reconnecting in the background for a store that was never made.
            for task in &background {
                task.abort();
            }
            let _ = subscriber.quit().await;
            let _ = pool.quit().await;
            return Err(e);
        }
        let clustered = pool.next().is_clustered();
        tracing::info!(url = %url, prefix = %settings.prefix, "valkey store connected");
        let parallel = settings.pool_size;
        let core = Arc::new(Core {
            pool,
            scripts,
            keys,
            settings,
        });
        let (claims, completes) = if clustered {
            (None, None)
        } else {
            let c = Arc::clone(&core);
            let (claims, claim_task) = Batcher::spawn(MAX_BATCH, parallel, move |calls| {
                let c = Arc::clone(&c);
                async move { c.claim_many(calls).await }
            });
            let c = Arc::clone(&core);
            let (completes, complete_task) = Batcher::spawn(MAX_BATCH, parallel, move |calls| {
                let c = Arc::clone(&c);
                async move { c.complete_many(calls).await }
            });
            background.push(claim_task);
            background.push(complete_task);
            (Some(claims), Some(completes))
        };
        Ok(ValkeyStore {
            inner: Arc::new(Inner {
                core,
                subscriber,
                waiters,
                reply_channel,
                clustered,
                claims,
                completes,
                background,
            }),
        })
    }

    pub(crate) fn core(&self) -> &Core {
        &self.inner.core
    }

    /// Wakes this process's waiters of `id` (a write they would otherwise learn of by the
    /// announcement, a round trip later).
    pub(crate) fn wake_local(&self, id: &TaskId) {
        self.inner.waiters.wake(id.as_str());
    }

    /// Closes the connections now (they also close when the last clone is dropped).
    pub async fn close(&self) {
        let _ = self.inner.subscriber.quit().await;
        let _ = self.inner.core.pool.quit().await;
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.core.settings.prefix
    }

    /// The key a task's result is stored at.
    pub fn result_key(&self, id: &TaskId) -> String {
        self.inner.core.keys.result(id)
    }

    /// Whether the store answers, for readiness probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.inner
            .core
            .pool
            .next()
            .ping::<String>(None)
            .await
            .map(|_| ())
            .map_err(store_error)
    }

    /// A task's claim as stored.
    pub async fn claim_state(&self, id: &TaskId) -> Result<ClaimState, StoreError> {
        let Some(raw) = self.inner.core.read(self.inner.core.keys.claim(id)).await? else {
            return Ok(ClaimState::Absent);
        };
        let record = parse_record(&raw).ok_or_else(|| StoreError::Corrupt {
            task_id: id.to_string(),
            reason: format!("claim record {raw:?} is not in ferriq's format"),
        })?;
        let (state, token, failures, holder) =
            (record.state, record.token, record.failures, record.holder);
        Ok(match state {
            'r' => ClaimState::Running {
                token,
                failures,
                holder,
            },
            'd' => ClaimState::Done,
            'v' => ClaimState::Revoked,
            'x' => ClaimState::Released { failures },
            _ => {
                return Err(StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("claim record {raw:?} is not in ferriq's format"),
                })
            }
        })
    }

    /// Deletes every key under this store's prefix (results and claims), in batches; for
    /// tests and benchmarks on shared servers. Returns how many keys were deleted.
    pub async fn purge_prefix(&self) -> Result<u64, StoreError> {
        let script = fred::types::scripts::Script::from_lua(
            "local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', 1000) \
             if #r[2] > 0 then redis.call('UNLINK', unpack(r[2])) end \
             return {r[1], #r[2]}",
        );
        let pattern = format!("{}:*", self.inner.core.settings.prefix);
        let (mut cursor, mut deleted) = ("0".to_owned(), 0u64);
        loop {
            let c = cursor.clone();
            let v = scripts::call(&self.inner.core.pool, &script, || {
                (vec![], vec![c.clone(), pattern.clone()])
            })
            .await
            .map_err(store_error)?;
            let (next, n): (String, u64) = v.convert().map_err(store_error)?;
            deleted += n;
            if next == "0" {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Fault injection for tests: ends the lease of a running claim now, as if its holder had
    /// stopped heartbeating long ago (the holder itself is not told). `false` when the claim
    /// is not running.
    #[doc(hidden)]
    pub async fn expire_lease(&self, id: &TaskId) -> Result<bool, StoreError> {
        use fred::interfaces::LuaInterface;
        // The record is `state token lease …`: zero the lease of an `r` (running) record.
        let hit: i64 = self
            .inner
            .core
            .pool
            .eval(
                "local raw = redis.call('GET', KEYS[1]) \
                 if raw and string.sub(raw, 1, 2) == 'r ' then \
                 local s, t, l, rest = string.match(raw, '^(%a) (%d+) (%d+) (.*)$') \
                 redis.call('SET', KEYS[1], s .. ' ' .. t .. ' 0 ' .. rest, 'KEEPTTL') \
                 return 1 end return 0",
                vec![self.inner.core.keys.claim(id)],
                Vec::<String>::new(),
            )
            .await
            .map_err(store_error)?;
        Ok(hit == 1)
    }

    /// Runs the trivial script `return 1` by SHA: the raw EVALSHA baseline for benchmarks.
    #[doc(hidden)]
    pub async fn raw_evalsha(
        &self,
        script: &fred::types::scripts::Script,
    ) -> Result<i64, StoreError> {
        let v = scripts::call(&self.inner.core.pool, script, || (vec![], vec![]))
            .await
            .map_err(store_error)?;
        Ok(v.as_i64().unwrap_or(0))
    }

    /// The trivial script for [`ValkeyStore::raw_evalsha`].
    #[doc(hidden)]
    pub fn trivial_script() -> fred::types::scripts::Script {
        fred::types::scripts::Script::from_lua(scripts::TRIVIAL)
    }
}

#[async_trait]
impl ClaimStore for ValkeyStore {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        let call = ClaimCall {
            id: id.clone(),
            worker: worker.to_owned(),
            lease,
            deadline_at,
        };
        match &self.inner.claims {
            Some(batcher) => batcher.call(call).await,
            None => single(self.inner.core.claim_many(vec![call]).await),
        }
    }

    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let core = &self.inner.core;
        if !self.inner.clustered {
            return core.heartbeat(claims, lease).await;
        }
        // In a cluster a script's keys must share a slot: one call per slot, all at once (a
        // worker's claims spread over every slot). Any failed slot fails the call, as off
        // cluster: the worker then treats the store as unreachable for this beat.
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, (id, _)) in claims.iter().enumerate() {
            let slot = fred::util::redis_keyslot(core.keys.claim(id).as_bytes());
            by_slot.entry(slot).or_default().push(i);
        }
        let calls = by_slot.values().map(|indexes| async move {
            let group: Vec<_> = indexes.iter().map(|i| claims[*i].clone()).collect();
            core.heartbeat(&group, lease)
                .await
                .map(|kept| (indexes, kept))
        });
        let mut kept = vec![ClaimLease::Lost; claims.len()];
        for answer in futures_util::future::join_all(calls).await {
            let (indexes, group_kept) = answer?;
            for (i, k) in indexes.iter().zip(group_kept) {
                kept[*i] = k;
            }
        }
        Ok(kept)
    }

    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.core.release(id, token, false).await
    }

    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.core.release(id, token, true).await
    }

    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.inner.core.record_failure(id, token).await
    }

    async fn health(&self) -> Health {
        let client = self.inner.core.pool.next();
        let limit = self.inner.core.settings.command_timeout;
        match tokio::time::timeout(limit, client.ping::<fred::types::Value>(None)).await {
            Ok(Ok(_)) => Health::Healthy,
            Ok(Err(e)) => Health::Unhealthy(format!("Valkey/Redis: {}", e.details())),
            Err(_) => {
                Health::Unhealthy(format!("Valkey/Redis did not answer PING within {limit:?}"))
            }
        }
    }
}

/// The one answer of a one-call batch.
fn single<T>(answers: Result<Vec<Result<T, StoreError>>, StoreError>) -> Result<T, StoreError> {
    answers?
        .pop()
        .unwrap_or_else(|| Err(StoreError::Unavailable("valkey answered no result".into())))
}

#[async_trait]
impl ResultStore for ValkeyStore {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        let result =
            result
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("result cannot be written as JSON: {e}"),
                })?;
        let channel = reply_to
            .map(str::to_owned)
            .unwrap_or_else(|| self.inner.core.keys.done_channel(id));
        let call = CompleteCall {
            id: id.clone(),
            token,
            result,
            channel,
        };
        match &self.inner.completes {
            Some(batcher) => batcher.call(call).await,
            None => single(self.inner.core.complete_many(vec![call]).await),
        }
    }

    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        match self
            .inner
            .core
            .read(self.inner.core.keys.result(id))
            .await?
        {
            None => Ok(ResultStatus::Pending),
            Some(raw) => serde_json::from_str(&raw)
                .map(ResultStatus::Ready)
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!(
                        "not a taskiq JSON result ({e}); a Python writer must use JSONSerializer"
                    ),
                }),
        }
    }

    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        let guard = self.inner.waiters.register(id.as_str());
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        // Completions announced on this process's reply channel wake the waiter at once. A
        // task enqueued without a reply_to (by a Python producer) is announced on its own
        // channel: a wait still unanswered after the first re-read subscribes there too, so
        // only waits longer than that pay a subscription. A task another ferriq process
        // enqueued is announced on that process's channel: re-reads find it (the safety net).
        let mut recheck = Duration::from_millis(100).min(self.inner.core.settings.recheck_interval);
        // A task this process enqueued carries its reply channel: a worker announces it there,
        // never on the task's channel (a Python worker announces nowhere), so no subscription.
        let mut on_task_channel = self.inner.waiters.is_announced_here(id.as_str());
        loop {
            // Listen before reading, so a completion in between is not missed.
            let notified = guard.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The completion announced here carried the stored result: no read needed.
            if let Some(json) = guard.announced_result() {
                if let Ok(result) = serde_json::from_str(&json) {
                    return Ok(ResultStatus::Ready(result));
                }
            }
            match self.get(id).await {
                Ok(ResultStatus::Ready(r)) => return Ok(ResultStatus::Ready(r)),
                Ok(_) => {}
                // A blip of the store is not the end of a long wait: keep trying.
                Err(StoreError::Unavailable(e)) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "result read failed while waiting; retrying");
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(ResultStatus::Pending);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline.min(now + recheck)) => {
                    recheck = (recheck * 2).min(self.inner.core.settings.recheck_interval);
                    // Not for a wait about to end anyway: no subscription churn for short polls.
                    if !on_task_channel && Instant::now() + recheck < deadline {
                        on_task_channel = true;
                        let channel = self.inner.core.keys.done_channel(id);
                        // Bounded by the next re-read (which is before the deadline): a stalled
                        // subscriber connection must not hold the wait, and the loop reads right
                        // after, so a completion meanwhile is not missed.
                        let _ = tokio::time::timeout(recheck, guard.listen_on_task_channel(channel)).await;
                    }
                }
            }
        }
    }

    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        let revoked = self.inner.core.revoke(id, result).await?;
        if revoked {
            self.inner.waiters.wake(id.as_str());
        }
        Ok(revoked)
    }

    fn reply_channel(&self) -> Option<String> {
        Some(self.inner.reply_channel.clone())
    }

    fn reply_channel_for(&self, id: &TaskId) -> Option<String> {
        self.inner.waiters.announced_here(id.as_str());
        Some(self.inner.reply_channel.clone())
    }
}

impl std::fmt::Debug for ValkeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValkeyStore")
            .field("url", &self.inner.core.settings.url)
            .field("prefix", &self.inner.core.settings.prefix)
            .finish_non_exhaustive()
    }
}

/// A claim record read on the client side.
pub(crate) struct Record {
    pub(crate) state: char,
    pub(crate) token: u64,
    pub(crate) lease_us: u64,
    pub(crate) started_us: u64,
    pub(crate) failures: u32,
    pub(crate) starts: u32,
    pub(crate) takeovers: u32,
    pub(crate) holder: String,
}

/// `state token lease_until started failures starts takeovers holder` (see the scripts), or
/// the form before `started` was kept.
pub(crate) fn parse_record(raw: &str) -> Option<Record> {
    let parts: Vec<&str> = raw.splitn(8, ' ').collect();
    let num = |s: &str| s.parse::<u64>().ok();
    let state = parts.first()?.chars().next()?;
    let current = parts.len() == 8 && parts[2..7].iter().all(|p| num(p).is_some());
    let (started, rest) = if current {
        (num(parts[3])?, &parts[4..])
    } else {
        let legacy: Vec<&str> = raw.splitn(7, ' ').collect();
        if legacy.len() < 6 {
            return None;
        }
        return Some(Record {
            state,
            token: num(legacy[1])?,
            lease_us: num(legacy[2])?,
            started_us: 0,
            failures: num(legacy[3])? as u32,
            starts: num(legacy[4])? as u32,
            takeovers: num(legacy[5])? as u32,
            holder: legacy.get(6).copied().unwrap_or_default().to_owned(),
        });
    };
    Some(Record {
        state,
        token: num(parts[1])?,
        lease_us: num(parts[2])?,
        started_us: started,
        failures: num(rest[0])? as u32,
        starts: num(rest[1])? as u32,
        takeovers: num(rest[2])? as u32,
        holder: rest.get(3).copied().unwrap_or_default().to_owned(),
    })
}
