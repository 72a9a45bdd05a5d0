//! Claims and results: one Lua script call each (claim, heartbeat, complete, release…), argument
//! building and reply parsing.

use std::time::Duration;

use ferriq::store::{ClaimLease, ClaimOutcome, CompleteOutcome, FailureRecord, StoreError, Token};
use ferriq::wire::{TaskId, TaskResult};
use fred::bytes_utils::Str;
use fred::prelude::Pool;
use fred::types::Value;

use crate::argv::{int, millis, static_text, WorkerText};
use crate::error::store_error;
use crate::keys::Keys;
use crate::scripts::{self, Scripts};
use crate::ValkeyStoreBuilder;

/// A claim call.
pub(crate) struct ClaimCall {
    pub(crate) id: TaskId,
    pub(crate) worker: Str,
    pub(crate) lease: Duration,
    pub(crate) deadline_at: Option<f64>,
}

impl ClaimCall {
    /// The claim's arguments, as `CLAIM_STEPS` takes them: worker, lease ms, deadline (unix
    /// seconds, or '').
    pub(crate) fn push_args(&self, args: &mut Vec<Value>) {
        args.push(Value::String(self.worker.clone()));
        args.push(millis(self.lease));
        args.push(match self.deadline_at.filter(|d| d.is_finite()) {
            Some(d) => Value::from(format!("{d:.3}")),
            None => static_text(""),
        });
    }
}

/// A complete call.
pub(crate) struct CompleteCall {
    pub(crate) id: TaskId,
    pub(crate) token: Token,
    /// The result JSON; `None` stores nothing (`store_result = false`). Shared: the call's
    /// arguments are built again after a `NOSCRIPT`.
    pub(crate) result: Option<Str>,
    pub(crate) channel: Str,
}

/// What every operation needs: the pool, the scripts, the key layout and the settings.
pub(crate) struct Core {
    pub(crate) pool: Pool,
    pub(crate) scripts: Scripts,
    pub(crate) keys: Keys,
    pub(crate) settings: ValkeyStoreBuilder,
    /// The id of the worker whose claims this store makes, shared by every claim's arguments.
    pub(crate) worker: WorkerText,
}

pub(crate) fn unexpected(op: &str, v: impl std::fmt::Debug) -> StoreError {
    StoreError::Unavailable(format!("unexpected {op} reply from valkey: {v:?}"))
}

impl Core {
    pub(crate) fn claim_ttl(&self) -> Value {
        millis(self.settings.claim_ttl)
    }

    fn result_ttl(&self) -> Value {
        self.settings.result_ttl.map_or(Value::Integer(0), millis)
    }

    /// A claim's call for `worker`.
    pub(crate) fn claim_call(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> ClaimCall {
        ClaimCall {
            id: id.clone(),
            worker: self.worker.get(worker),
            lease,
            deadline_at,
        }
    }

    /// A plain string value (a result or a claim record), if any.
    pub(crate) async fn read(&self, key: String) -> Result<Option<String>, StoreError> {
        use fred::prelude::KeysInterface;
        // Boxed: fred's futures are kilobytes large (see `scripts::call`).
        Box::pin(self.pool.get(key)).await.map_err(store_error)
    }

    /// Reads many keys in one `MGET` (the store batches reads only on a single server). Each
    /// reply is converted on its own: one value that is not text (a result a Python writer
    /// pickled) is that read's error, not its batch's; it is read again alone, so it fails
    /// exactly as a lone read does.
    pub(crate) async fn read_many(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<Result<Option<String>, StoreError>>, StoreError> {
        use fred::prelude::KeysInterface;
        if let [key] = keys.as_slice() {
            return Ok(vec![self.read(key.clone()).await]);
        }
        let values: Vec<fred::types::Value> = Box::pin(self.pool.mget(keys.clone()))
            .await
            .map_err(store_error)?;
        let mut out = Vec::with_capacity(values.len());
        for (key, value) in keys.into_iter().zip(values) {
            out.push(match value {
                fred::types::Value::Null => Ok(None),
                value => match value.into_string() {
                    Some(text) => Ok(Some(text)),
                    None => self.read(key).await,
                },
            });
        }
        Ok(out)
    }

    /// Claims every call in one script run; one call's error does not fail the others.
    pub(crate) async fn claim_many(
        &self,
        calls: Vec<ClaimCall>,
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let build = || {
            let mut keys = Vec::with_capacity(calls.len() * 2);
            let mut args = Vec::with_capacity(1 + calls.len() * 3);
            args.push(self.claim_ttl());
            for c in &calls {
                keys.push(self.keys.claim(&c.id));
                keys.push(self.keys.result(&c.id));
                c.push_args(&mut args);
            }
            (keys, args)
        };
        let reply: Vec<Value> = scripts::call(&self.pool, &self.scripts.claim, build)
            .await
            .map_err(store_error)?
            .into_array();
        Ok(reply
            .into_iter()
            .map(|r| match r.as_str() {
                Some(answer) => parse_claim(&answer),
                None => Err(unexpected("claim", r)),
            })
            .collect())
    }

    /// Completes every call in one script run; one call's error does not fail the others.
    pub(crate) async fn complete_many(
        &self,
        calls: Vec<CompleteCall>,
    ) -> Result<Vec<Result<CompleteOutcome, StoreError>>, StoreError> {
        let build = || {
            let mut keys = Vec::with_capacity(calls.len() * 2);
            let mut args = self.complete_ttls();
            args.reserve(calls.len() * 5);
            for c in &calls {
                keys.push(self.keys.claim(&c.id));
                keys.push(self.keys.result(&c.id));
                Self::complete_args(c, &mut args);
            }
            (keys, args)
        };
        let reply: Vec<Value> = scripts::call(&self.pool, &self.scripts.complete, build)
            .await
            .map_err(store_error)?
            .into_array();
        Ok(reply.into_iter().map(parse_complete).collect())
    }

    /// A completion's arguments after the two ttls: token, store ('1'/'0'), result JSON,
    /// channel, task id.
    pub(crate) fn complete_args(c: &CompleteCall, args: &mut Vec<Value>) {
        args.push(int(c.token.0));
        match &c.result {
            Some(json) => {
                args.push(static_text("1"));
                args.push(Value::String(json.clone()));
            }
            None => {
                args.push(static_text("0"));
                args.push(static_text(""));
            }
        }
        args.push(Value::String(c.channel.clone()));
        args.push(Value::from(c.id.as_str()));
    }

    /// What every completion script starts its arguments with: the result's and the claim's
    /// time to live.
    pub(crate) fn complete_ttls(&self) -> Vec<Value> {
        vec![self.result_ttl(), self.claim_ttl()]
    }

    /// Extends the leases of claims that share a cluster slot (or any claims off-cluster).
    pub(crate) async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        let build = || {
            let keys: Vec<String> = claims.iter().map(|(id, _)| self.keys.claim(id)).collect();
            let mut args = vec![millis(lease), self.claim_ttl()];
            args.extend(claims.iter().map(|(_, t)| int(t.0)));
            (keys, args)
        };
        let v = scripts::call(&self.pool, &self.scripts.heartbeat, build)
            .await
            .map_err(store_error)?;
        let kept: Vec<i64> = v.convert().map_err(store_error)?;
        if kept.len() != claims.len() {
            return Err(unexpected("heartbeat", kept));
        }
        Ok(kept
            .into_iter()
            .map(|k| match k {
                1 => ClaimLease::Kept,
                2 => ClaimLease::Revoked,
                _ => ClaimLease::Lost,
            })
            .collect())
    }

    /// Releases the claim; `interrupted` counts the run with the takeovers.
    pub(crate) async fn release(
        &self,
        id: &TaskId,
        token: Token,
        interrupted: bool,
    ) -> Result<bool, StoreError> {
        let v = scripts::call(&self.pool, &self.scripts.release, || {
            (
                vec![self.keys.claim(id)],
                vec![
                    int(token.0),
                    self.claim_ttl(),
                    static_text(if interrupted { "1" } else { "0" }),
                ],
            )
        })
        .await
        .map_err(store_error)?;
        Ok(v.as_i64() == Some(1))
    }

    pub(crate) async fn record_failure(
        &self,
        id: &TaskId,
        token: Token,
    ) -> Result<FailureRecord, StoreError> {
        let v = scripts::call(&self.pool, &self.scripts.record_failure, || {
            (
                vec![self.keys.claim(id)],
                vec![int(token.0), self.claim_ttl()],
            )
        })
        .await
        .map_err(store_error)?;
        failure_record(v)
    }

    pub(crate) async fn revoke(
        &self,
        id: &TaskId,
        result: &TaskResult,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(result).map_err(|e| StoreError::Corrupt {
            task_id: id.to_string(),
            reason: e.to_string(),
        })?;
        let json = Str::from(json);
        let build = || {
            let args = vec![
                Value::String(json.clone()),
                self.result_ttl(),
                self.claim_ttl(),
                Value::from(self.keys.done_channel(id)),
                Value::from(id.as_str()),
            ];
            (vec![self.keys.claim(id), self.keys.result(id)], args)
        };
        let v = scripts::call(&self.pool, &self.scripts.revoke, build)
            .await
            .map_err(store_error)?;
        Ok(v.as_i64() == Some(1))
    }
}

/// One completion's answer (`COMPLETE`'s).
pub(crate) fn parse_complete(v: Value) -> Result<CompleteOutcome, StoreError> {
    // `as_str` borrows a reply's text (`as_string` would copy it for the comparison).
    match v.as_str().as_deref() {
        Some("stored") => Ok(CompleteOutcome::Stored),
        Some("already") => Ok(CompleteOutcome::AlreadyStored),
        Some("stale") => Ok(CompleteOutcome::Stale),
        Some("revoked") => Ok(CompleteOutcome::Revoked),
        Some(other) if other.starts_with("err") => Err(StoreError::Unavailable(format!(
            "valkey failed this completion: {other}"
        ))),
        _ => Err(unexpected("complete", v)),
    }
}

/// One claim's answer (`CLAIM`'s): its kind, then its numbers, apart by spaces.
pub(crate) fn parse_claim(answer: &str) -> Result<ClaimOutcome, StoreError> {
    let (kind, rest) = answer.split_once(' ').unwrap_or((answer, ""));
    if kind == "err" {
        return Err(StoreError::Unavailable(format!(
            "valkey failed this claim: {rest}"
        )));
    }
    // Every number the scripts send is read, and a word missing, unreadable or extra makes the
    // whole answer an error: a guessed token or count would fence or retry the wrong run.
    let numbers = claim_numbers(rest);
    let numbers = numbers.as_ref().map(|(n, read)| &n[..*read]);
    let count = |n: u64| u32::try_from(n).ok();
    let outcome = match (kind, numbers) {
        ("run", Some(&[token, failures, starts, takeovers, took_over])) if took_over <= 1 => {
            count(failures)
                .zip(count(starts))
                .zip(count(takeovers))
                .map(|((failures, starts), takeovers)| ClaimOutcome::Run {
                    token: Token(token),
                    failures,
                    starts,
                    takeovers,
                    took_over: took_over == 1,
                })
        }
        ("expired", Some(&[token])) => Some(ClaimOutcome::Expired {
            token: Token(token),
        }),
        ("defer", Some(&[us])) => Some(ClaimOutcome::Defer {
            retry_after: Duration::from_micros(us),
        }),
        ("done", Some(&[])) => Some(ClaimOutcome::Done),
        ("revoked", Some(&[])) => Some(ClaimOutcome::Revoked),
        _ => None,
    };
    outcome.ok_or_else(|| unexpected("claim", answer))
}

/// A claim answer's numbers and how many there are; `None` when one is unreadable or there
/// are more than five (the most an answer has). An array, not a vector: this is every claim's
/// path.
fn claim_numbers(words: &str) -> Option<([u64; 5], usize)> {
    let mut numbers = [0u64; 5];
    let mut read = 0;
    for word in words.split_terminator(' ') {
        *numbers.get_mut(read)? = word.parse().ok()?;
        read += 1;
    }
    Some((numbers, read))
}

/// `record_failure`'s answer: the failure count, or -1 for a stale token.
pub(crate) fn failure_record(v: Value) -> Result<FailureRecord, StoreError> {
    Ok(match v.as_i64() {
        Some(n) if n >= 0 => FailureRecord::Recorded {
            failures: n.min(i64::from(u32::MAX)) as u32,
        },
        Some(_) => FailureRecord::Stale,
        None => return Err(unexpected("record_failure", v)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_answer_is_read_from_its_words() {
        // Tokens are server µs: sixteen digits, past what a double prints exactly by default.
        let run = parse_claim("run 1733600000123456 2 3 1 1").unwrap();
        assert_eq!(
            run,
            ClaimOutcome::Run {
                token: Token(1_733_600_000_123_456),
                failures: 2,
                starts: 3,
                takeovers: 1,
                took_over: true,
            }
        );
        assert_eq!(
            parse_claim("expired 7").unwrap(),
            ClaimOutcome::Expired { token: Token(7) }
        );
        assert_eq!(
            parse_claim("defer 1500").unwrap(),
            ClaimOutcome::Defer {
                retry_after: Duration::from_micros(1500)
            }
        );
        assert_eq!(parse_claim("done").unwrap(), ClaimOutcome::Done);
        assert_eq!(parse_claim("revoked").unwrap(), ClaimOutcome::Revoked);
        let err = parse_claim("err user_script:1: bad thing").unwrap_err();
        assert!(
            err.to_string().contains("user_script:1: bad thing"),
            "{err}"
        );
        // A run without its token, or a kind nobody sends, is an error, not a guess.
        assert!(parse_claim("run").is_err());
        assert!(parse_claim("maybe 1").is_err());
        // Nor is a number missing, unreadable, out of range or one too many.
        for bad in [
            "run 7 0 0 0",
            "run 7 0 x 0 0",
            "run 7 0 0 0 2",
            "run 7 0 0 4294967296 0",
            "run 7 0 0 0 0 9",
            "expired",
            "expired -3",
            "defer",
            "defer soon",
            "done 1",
        ] {
            assert!(parse_claim(bad).is_err(), "{bad} was read as an answer");
        }
    }
}
