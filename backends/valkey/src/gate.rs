//! Claims behind a limit, on a single server: the limiter's steps and the claim's in one
//! script run, so a limit that does not bind costs its steps in the server, not a round trip
//! of its own and a wake-up of the worker (`FlowStore::claim_past_limit`); and a run's result
//! written with its concurrency slot freed (`FlowStore::complete_freeing_slot`). In a cluster
//! the limiter's keys and the task's sit in different slots, and the worker asks them apart.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ferriq::store::{CompleteOutcome, FailureRecord, Gated, StoreError, Token};
use ferriq::wire::TaskId;
use fred::types::scripts::Script;
use fred::types::{Key, Value};

use crate::argv::{flag, int, micros};
use crate::claims::{
    failure_record, parse_claim, parse_complete, unexpected, ClaimCall, CompleteCall, Core,
};
use crate::error::store_error;
use crate::limiter_keys::LimiterKeys;
use crate::limits::{acquire_steps, ADMIT_STEPS, GRACE_US, LIMITER_HEAD};
use crate::scripts::{self, ANNOUNCE, CLAIM_STEPS, COMPLETE_STEPS, PRELUDE, RECORD_FAILURE_STEPS};
use crate::slots::RELEASE_STEPS;

/// Per call, KEYS: the limiter's three keys (as `ADMIT` or `ACQUIRE` take them), then the
/// task's claim and result; ARGV (after the grace µs and the claim's time to live ms): task
/// id, limit, period or lease µs, renew (as `ADMIT`'s), worker, claim lease ms, deadline.
/// Returns per call `limit µs` (over the limit: nothing claimed), else the claim's answer (as
/// `CLAIM`'s), after `kept ` when the task held its slot already. `GATE` is `admit` or
/// `acquire`.
const GATED_LOOP: &str = r#"
local claim_ttl = ARGV[2]
local function gated(k, a)
  local d = GATE(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1], tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), ARGV[a + 4])
  if d[1] == 'wait' then return string.format('limit %d', d[2]) end
  local c = claim(KEYS[k + 4], KEYS[k + 5], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], claim_ttl, now)
  if d[1] == 'kept' then return 'kept ' .. c end
  return c
end
local out = {}
for i = 0, #KEYS / 5 - 1 do
  local ok, res = pcall(gated, 5 * i, 2 + 7 * i)
  if ok then out[i + 1] = res else out[i + 1] = 'err ' .. err_text(res) end
end
return out
"#;

fn gated_script(steps: &str, gate: &str) -> Script {
    let body = GATED_LOOP.replace("GATE(", &format!("{gate}("));
    Script::from_lua(format!("{PRELUDE}{LIMITER_HEAD}{steps}{CLAIM_STEPS}{body}"))
}

/// A rate decision, and the claim when it says run.
static ADMIT_CLAIM: LazyLock<Script> = LazyLock::new(|| gated_script(ADMIT_STEPS, "admit"));

/// A concurrency decision, and the claim when the slot is held.
static ACQUIRE_CLAIM: LazyLock<Script> =
    LazyLock::new(|| gated_script(&acquire_steps(), "acquire"));

/// Per call, KEYS: the task's claim and result, then its limiter's held slots and statistics;
/// ARGV (after the result's and the claim's time to live ms): token, store, result JSON,
/// channel, task id (as `COMPLETE` takes them), then how long the run held its slot µs and
/// note (as `RELEASE`'s).
/// Returns per call the completion's answer; the slot is freed unless the write failed or
/// was fenced off (`stale`: the task's claim, and its slot, are another run's now), as the
/// worker would free it apart.
const COMPLETE_FREEING_LOOP: &str = r#"
local out = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = 4 * i, 3 + 7 * i
  local ok, res = pcall(complete, KEYS[k + 1], KEYS[k + 2], ARGV[a], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2])
  if ok then out[i + 1] = res else out[i + 1] = 'err ' .. err_text(res) end
  if ok and res ~= 'stale' then
    pcall(free_slot, KEYS[k + 3], KEYS[k + 4], ARGV[a + 4], tonumber(ARGV[a + 5]), ARGV[a + 6])
  end
end
"#;

/// A result written and the run's slot freed.
static COMPLETE_FREEING: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{PRELUDE}{COMPLETE_STEPS}{RELEASE_STEPS}{COMPLETE_FREEING_LOOP}{ANNOUNCE}return out\n"
    ))
});

/// KEYS: the task's claim, its limiter's held slots and statistics. ARGV: token, claim time
/// to live ms, task id, how long the run held its slot µs, note (as `RELEASE`'s). Returns
/// `record_failure`'s answer; the slot is freed when the failure is recorded (not for a
/// stale token: the claim, and the task's slot, are another run's).
const RECORD_FAILURE_FREEING: &str = r#"
local n = record_failure(KEYS[1], ARGV[1], ARGV[2])
if n >= 0 then pcall(free_slot, KEYS[2], KEYS[3], ARGV[3], tonumber(ARGV[4]), ARGV[5]) end
return n
"#;

/// A failed attempt recorded and the run's slot freed.
static RECORD_FAILURE_FREEING_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(format!(
        "{PRELUDE}{RECORD_FAILURE_STEPS}{RELEASE_STEPS}{RECORD_FAILURE_FREEING}"
    ))
});

/// A completion, and the slot its run held: the limiter's keys, how long the run held it and
/// whether to write the limiter's statistics whatever the sample says.
pub(crate) struct CompleteFreeingCall {
    pub(crate) complete: CompleteCall,
    pub(crate) slot: Arc<LimiterKeys>,
    pub(crate) held: Duration,
    pub(crate) note: bool,
}

/// Which limiter a gated claim passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateKind {
    Rate,
    Slot,
}

/// One claim behind a limit: the limiter's keys and whether to renew them, its limit and its
/// period (rate) or lease (slot), and the claim.
pub(crate) struct GatedCall {
    pub(crate) limiter: Arc<LimiterKeys>,
    pub(crate) renew: bool,
    pub(crate) limit: u32,
    pub(crate) span: Duration,
    pub(crate) claim: ClaimCall,
}

impl Core {
    /// Gated claims of one kind, in one script run; one call's error does not fail the others.
    pub(crate) async fn gated_many(
        &self,
        kind: GateKind,
        calls: Vec<GatedCall>,
    ) -> Result<Vec<Result<Gated, StoreError>>, StoreError> {
        let script = match kind {
            GateKind::Rate => &*ADMIT_CLAIM,
            GateKind::Slot => &*ACQUIRE_CLAIM,
        };
        let build = || {
            let mut keys = Vec::with_capacity(calls.len() * 5);
            let mut argv = Vec::with_capacity(2 + calls.len() * 7);
            argv.push(int(GRACE_US));
            argv.push(self.claim_ttl());
            for c in &calls {
                keys.extend(c.limiter.keys.iter().cloned());
                keys.push(Key::from(self.keys.claim(&c.claim.id)));
                keys.push(Key::from(self.keys.result(&c.claim.id)));
                argv.push(Value::from(c.claim.id.as_str()));
                argv.push(int(c.limit));
                argv.push(micros(c.span));
                argv.push(flag(c.renew));
                c.claim.push_args(&mut argv);
            }
            (keys, argv)
        };
        let reply = scripts::call(&self.pool, script, build)
            .await
            .map_err(store_error)?
            .into_array();
        Ok(reply.into_iter().map(parse_gated).collect())
    }

    /// A failed attempt recorded (its claim given back) and its run's slot of `slot` freed,
    /// held for `held` (`note`: write the limiter's statistics whatever the sample says).
    /// Failures are rare: one script run each, not batched.
    pub(crate) async fn record_failure_freeing(
        &self,
        id: &TaskId,
        token: Token,
        slot: &LimiterKeys,
        held: Duration,
        note: bool,
    ) -> Result<FailureRecord, StoreError> {
        let build = || {
            let keys = vec![
                Key::from(self.keys.claim(id)),
                slot.keys[0].clone(),
                slot.keys[2].clone(),
            ];
            let argv = vec![
                int(token.0),
                self.claim_ttl(),
                Value::from(id.as_str()),
                micros(held),
                flag(note),
            ];
            (keys, argv)
        };
        let answer = scripts::call(&self.pool, &RECORD_FAILURE_FREEING_SCRIPT, build)
            .await
            .map_err(store_error)?;
        failure_record(answer)
    }

    /// Completions freeing their runs' slots, in one script run; one call's error does not
    /// fail the others.
    pub(crate) async fn complete_freeing_many(
        &self,
        calls: Vec<CompleteFreeingCall>,
    ) -> Result<Vec<Result<CompleteOutcome, StoreError>>, StoreError> {
        let build = || {
            let mut keys = Vec::with_capacity(calls.len() * 4);
            let mut argv = self.complete_ttls();
            argv.reserve(calls.len() * 7);
            for c in &calls {
                keys.push(Key::from(self.keys.claim(&c.complete.id)));
                keys.push(Key::from(self.keys.result(&c.complete.id)));
                keys.push(c.slot.keys[0].clone());
                keys.push(c.slot.keys[2].clone());
                Self::complete_args(&c.complete, &mut argv);
                argv.push(micros(c.held));
                argv.push(flag(c.note));
            }
            (keys, argv)
        };
        let reply = scripts::call(&self.pool, &COMPLETE_FREEING, build)
            .await
            .map_err(store_error)?
            .into_array();
        Ok(reply.into_iter().map(parse_complete).collect())
    }
}

/// One gated claim's answer (`GATED_LOOP`'s).
fn parse_gated(answer: Value) -> Result<Gated, StoreError> {
    let Some(text) = answer.as_str() else {
        return Err(unexpected("gated claim", answer));
    };
    if let Some(us) = text.strip_prefix("limit ") {
        return match us.parse::<u64>() {
            Ok(us) => Ok(Gated::Wait(Duration::from_micros(us))),
            // A guessed wait of nothing would hand the task straight back: a hot loop.
            Err(_) => Err(unexpected("gated claim", text)),
        };
    }
    match text.strip_prefix("kept ") {
        Some(claim) => parse_claim(claim).map(Gated::ClaimedInHeldSlot),
        None => parse_claim(&text).map(Gated::Claimed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferriq::store::ClaimOutcome;

    #[test]
    fn a_gated_claims_answer_is_read_from_its_words() {
        let read = |text: &str| parse_gated(Value::from(text));
        assert_eq!(
            read("limit 250000").unwrap(),
            Gated::Wait(Duration::from_micros(250_000))
        );
        assert_eq!(
            read("kept done").unwrap(),
            Gated::ClaimedInHeldSlot(ClaimOutcome::Done)
        );
        assert_eq!(
            read("run 1733600000123456 0 0 0 0").unwrap(),
            Gated::Claimed(ClaimOutcome::Run {
                token: Token(1_733_600_000_123_456),
                failures: 0,
                starts: 0,
                takeovers: 0,
                took_over: false,
            })
        );
        assert!(read("kept err WRONGTYPE Operation").is_err());
        assert!(read("limit soon").is_err());
        assert!(read("limit").is_err());
        assert!(read("").is_err());
        assert!(parse_gated(Value::Integer(1)).is_err());
    }
}
