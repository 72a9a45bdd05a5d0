//! A concurrency slot once taken (`limits`): renewed with its run's claim heartbeats, and
//! freed when the run ends — apart, or with the run's result (`gate`).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ferriq::store::StoreError;
use ferriq::wire::TaskId;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::argv::{flag, micros};
use crate::claims::Core;
use crate::limiter_keys::LimiterKeys;
use crate::limits::single;
use crate::ValkeyStore;

/// Per slot, KEYS: held slots, statistics; ARGV (after the lease µs): task id. Extends the
/// run's slot. A slot missing while the limiter has no statistics either was lost with the
/// store's data (a restart): it is taken again, so the runs still going count against the limit
/// from their next heartbeat. (With statistics, it was released or ran out: left alone. A
/// limiter's statistics are written by each worker's first release of it, so only a renewal
/// racing a release in the few releases after a restart can take a finished run's slot again:
/// it then frees itself within a lease, a slot fewer meanwhile, never one more.)
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_ = string.format('%d', now + tonumber(ARGV[1]))
local ttl = math.floor(tonumber(ARGV[1]) / 1000) + 3600000
for i = 0, #KEYS / 2 - 1 do
  local held, stats, id = KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[i + 2]
  if redis.call('ZSCORE', held, id) then
    redis.call('ZADD', held, until_, id)
  elseif redis.call('HEXISTS', stats, 'avg') == 0 then
    -- Taken again after a loss: the set may be new, and gets its time to live (as ACQUIRE's).
    redis.call('ZADD', held, until_, id)
    redis.call('PEXPIRE', held, ttl)
  end
end
return 1
"#,
    )
});

/// Per slot, KEYS: held slots, statistics; ARGV: task id, how long its run held the slot µs,
/// note ('1': write the statistics whatever the sample says). Frees the slot and folds the
/// time into the average (one release in four; see `RELEASE_STEPS`).
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{RELEASE_STEPS}{}",
        r#"
for i = 0, #KEYS / 2 - 1 do
  free_slot(KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[3 * i + 1], tonumber(ARGV[3 * i + 2]),
    ARGV[3 * i + 3])
end
return {}
"#
    ))
});

/// One slot's freeing: `free_slot(held, stats, id, ran µs, note)`.
pub(crate) const RELEASE_STEPS: &str = r#"
-- The average is read and folded from one release in four (picked by the task id's last
-- byte: random ids end in any of the 16 hex digits alike), and whenever the worker asks
-- (`note`: its first release of the limiter, then once every few seconds). It only times
-- waiting tasks' returns; its presence tells a slot released from one lost with the store's
-- data (see RENEW), which each worker's first release sees to.
local function free_slot(held, stats, id, ran, note)
  local sampled = note == '1' or (string.byte(id, -1) or 0) % 4 == 0
  if redis.call('ZREM', held, id) == 1 and sampled then
    -- A slot freed by a copy that never ran (ran 0) says nothing of how long runs take; it
    -- still marks the limiter as used, at the default estimate.
    local avg = redis.call('HGET', stats, 'avg')
    if avg then
      if ran > 0 then
        redis.call('HSET', stats, 'avg', string.format('%d', tonumber(avg) * 0.8 + ran * 0.2))
      end
    else
      redis.call('HSET', stats, 'avg', string.format('%d', ran > 0 and ran or 1000000))
      -- A limiter used once is forgotten like any other (an hour past its last use).
      redis.call('PEXPIRE', stats, 3600000)
    end
  end
end
"#;

/// One slot to free: the limiter's keys, the task, how long it held it, whether to write the
/// statistics whatever the sample says.
pub(crate) struct ReleaseCall {
    keys: Arc<LimiterKeys>,
    id: TaskId,
    held: Duration,
    note: bool,
}

impl Core {
    /// Frees slots, in one script run.
    pub(crate) async fn release_many(
        &self,
        calls: Vec<ReleaseCall>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let n = calls.len();
        let build = || {
            let mut keys = Vec::with_capacity(n * 2);
            let mut argv = Vec::with_capacity(n * 3);
            for c in &calls {
                keys.push(c.keys.keys[0].clone());
                keys.push(c.keys.keys[2].clone());
                argv.push(Value::from(c.id.as_str()));
                argv.push(micros(c.held));
                argv.push(flag(c.note));
            }
            (keys, argv)
        };
        self.many(&RELEASE, build).await?;
        Ok((0..n).map(|_| Ok(())).collect())
    }
}

impl ValkeyStore {
    pub(crate) async fn release(
        &self,
        limiter: &str,
        id: &TaskId,
        held: Duration,
    ) -> Result<(), StoreError> {
        let keys = self.slot_keys(limiter);
        let call = ReleaseCall {
            note: keys.note_due(),
            keys,
            id: id.clone(),
            held,
        };
        match self.flow_batchers() {
            Some(b) => b.releases.call(call).await,
            None => single(self.core().release_many(vec![call]).await),
        }
    }

    /// Renews slots: one script run on a single server, one per slot in a cluster.
    pub(crate) async fn renew(
        &self,
        slots: &[(String, TaskId)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let call = |slots: &[(String, TaskId)]| {
            let mut keys = Vec::with_capacity(slots.len() * 2);
            let mut argv = vec![micros(lease)];
            for (limiter, id) in slots {
                let slot = self.slot_keys(limiter);
                keys.push(slot.keys[0].clone());
                keys.push(slot.keys[2].clone());
                argv.push(Value::from(id.as_str()));
            }
            self.core()
                .many(&RENEW, move || (keys.clone(), argv.clone()))
        };
        if self.flow_batchers().is_some() {
            call(slots).await?;
        } else {
            for renewed in futures_util::future::join_all(slots.chunks(1).map(call)).await {
                renewed?;
            }
        }
        Ok(())
    }
}
