use std::sync::Arc;
use std::time::Duration;

use ferriq::store::{ClaimOutcome, CompleteOutcome, Gated, RateDecision, SlotDecision, StoreError};
use ferriq::wire::TaskId;
use fred::clients::SubscriberClient;
use fred::prelude::ClientLike;
use fred::types::ConnectHandle;
use tokio::task::JoinHandle;

use crate::batch::Batcher;
use crate::claims::{ClaimCall, CompleteCall, Core};
use crate::error::store_error;
use crate::gate::{CompleteFreeingCall, GatedCall};
use crate::limiter_keys::KeyCache;
use crate::limits::{AdmitCall, SlotCall};
use crate::scripts;
use crate::slots::ReleaseCall;
use crate::waiters::Waiters;
use crate::ValkeyStoreBuilder;

mod connect;
mod traits;

/// Claims and results on Valkey/Redis: implements both
/// [`ClaimStore`](ferriq::store::ClaimStore) and [`ResultStore`](ferriq::store::ResultStore)
/// over one connection pool, plus one subscriber connection for waiters. Cheap to clone.
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
    /// Concurrent result reads (waits re-reading under a backlog), one `MGET` per round trip.
    reads: Option<Batcher<String, Option<String>>>,
    /// Concurrent limiter decisions, likewise.
    flow: Option<FlowBatchers>,
    flow_keys: KeyCache,
    background: Vec<JoinHandle<()>>,
    /// The tasks driving each connection (fred's routers): awaited by `close`, aborted by a
    /// drop without it.
    routers: std::sync::Mutex<Vec<ConnectHandle>>,
    /// Set once `close` has run.
    closed: tokio::sync::OnceCell<()>,
}

/// Concurrent limiter decisions, gathered into one script run per round trip.
pub(crate) struct FlowBatchers {
    pub(crate) admits: Batcher<AdmitCall, RateDecision>,
    pub(crate) acquires: Batcher<SlotCall, SlotDecision>,
    pub(crate) releases: Batcher<ReleaseCall, ()>,
    /// Claims behind a rate limit (`crate::gate`).
    pub(crate) admit_claims: Batcher<GatedCall, Gated>,
    /// Claims behind a concurrency limit.
    pub(crate) acquire_claims: Batcher<GatedCall, Gated>,
    /// Results written with their runs' slots freed.
    pub(crate) complete_freeings: Batcher<CompleteFreeingCall, CompleteOutcome>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
        // Dropped without `close`: the connections end with their tasks, silently. (A QUIT
        // sent from a task spawned here raced the runtime's shutdown at the end of `main`, and
        // fred logged "Fatal error sending QUIT command to router" when it lost.)
        for router in self
            .routers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            router.abort();
        }
    }
}

impl Inner {
    /// Closes everything in order: ferriq's own tasks first (nothing sends a command after
    /// its connection's QUIT, which fred would log), then one QUIT per connection, then each
    /// connection's task to its end, bounded (a connection stuck reconnecting is cut).
    async fn shut(&self) {
        for task in &self.background {
            task.abort();
        }
        // Bounded: a lone call runs its batch inside its caller's future, which may never be
        // polled again (a wait dropped half-way).
        let settle = self.core.settings.command_timeout + Duration::from_secs(1);
        if let (Some(claims), Some(completes), Some(reads)) =
            (&self.claims, &self.completes, &self.reads)
        {
            let quiet = async {
                tokio::join!(claims.quiesce(), completes.quiesce(), reads.quiesce());
                if let Some(flow) = &self.flow {
                    tokio::join!(
                        flow.admits.quiesce(),
                        flow.acquires.quiesce(),
                        flow.releases.quiesce(),
                        flow.admit_claims.quiesce(),
                        flow.acquire_claims.quiesce(),
                        flow.complete_freeings.quiesce()
                    );
                }
            };
            let _ = tokio::time::timeout(settle, quiet).await;
        }
        let _ = tokio::join!(self.subscriber.quit(), self.core.pool.quit());
        let limit = self.core.settings.connect_timeout + Duration::from_secs(1);
        let routers = std::mem::take(&mut *self.routers.lock().unwrap_or_else(|p| p.into_inner()));
        let ends = routers.into_iter().map(|mut router| async move {
            if tokio::time::timeout(limit, &mut router).await.is_err() {
                router.abort();
            }
        });
        futures_util::future::join_all(ends).await;
        tracing::debug!("valkey store closed");
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

    pub(crate) fn core(&self) -> &Core {
        &self.inner.core
    }

    pub(crate) fn flow_keys(&self) -> &KeyCache {
        &self.inner.flow_keys
    }

    pub(crate) fn flow_batchers(&self) -> Option<&FlowBatchers> {
        self.inner.flow.as_ref()
    }

    /// Wakes this process's waiters of `id` (a write they would otherwise learn of by the
    /// announcement, a round trip later).
    pub(crate) fn wake_local(&self, id: &TaskId) {
        self.inner.waiters.wake(id.as_str());
    }

    /// Closes the connections and waits until nothing of the store runs in the background, so
    /// a process ends without warnings (they also close, without a QUIT, when the last clone
    /// is dropped). Shared by every clone; calls after it fail. Idempotent.
    pub async fn close(&self) {
        self.inner.closed.get_or_init(|| self.inner.shut()).await;
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
                (Vec::<String>::new(), vec![c.clone(), pattern.clone()])
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
        let v = scripts::call(&self.inner.core.pool, script, || {
            (Vec::<String>::new(), Vec::<String>::new())
        })
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
