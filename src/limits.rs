//! Limits at run time: how much of each rate and concurrency limit is in use, per key, and
//! limits changed without a redeploy. The `ferriq limits` command is built on it.
//!
//! A limit set here wins over what the task declares and over the `ferriq_rate` /
//! `ferriq_concurrency` labels a producer set. It is kept in the store, and every worker
//! applies it within [`OVERRIDES_REFRESH`](crate::store::OVERRIDES_REFRESH) (it reads them
//! that often, off the path of each delivery, so a decision still costs one store round
//! trip). A limit set for a task applies to each of its keys (one limiter per key, each with
//! that limit); one set for a key (`set(task, Some(key), …)`) to that key alone, over the
//! task's. A limit set for a task that declares none limits it from then on, as one limiter.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use ferriq::store::LimitOverride;
//! use ferriq::task::Rate;
//! let env = ferriq::testing::TestEnv::new();
//! let limits = env.client.limits();
//! let tenant_b = LimitOverride::default().rate(Rate::parse("100/s").unwrap());
//! limits.set("api.call", Some("tenant-b"), tenant_b).await.unwrap();
//! let set = limits.overrides().await.unwrap();
//! assert_eq!(set[0].key.as_deref(), Some("tenant-b"));
//! assert!(limits.reset("api.call", Some("tenant-b")).await.unwrap());
//! # }
//! ```

use crate::client::Client;
use crate::store::{LimitOverride, LimiterKind, StoreError};

/// One limiter as operators see it: what it limits, the limit applied and how much is used.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterView {
    /// The task it limits.
    pub task: String,
    /// The key's value, for a per-key limiter.
    pub key: Option<String>,
    /// Rate or concurrency.
    pub kind: LimiterKind,
    /// The limit the workers applied last (`50/s`, or `4` slots).
    pub limit: String,
    /// Whether that limit was set at run time (else declared by the task or a label).
    pub overridden: bool,
    /// Rate: starts in the last period. Concurrency: runs holding a slot now.
    pub used: u64,
    /// Tasks handed back that wait for their turn or a slot.
    pub waiting: u64,
    /// How long ago a worker last used it, in seconds.
    pub idle_s: f64,
}

/// A limit set at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OverrideView {
    /// The task.
    pub task: String,
    /// The key's value, when set for one key.
    pub key: Option<String>,
    /// What was set.
    pub limits: LimitOverride,
}

/// Limits in use and limits set at run time, from [`Client::limits`].
#[derive(Debug, Clone)]
pub struct Limits {
    client: Client,
}

impl Client {
    /// The limits in use, and limits changed at run time.
    pub fn limits(&self) -> Limits {
        Limits {
            client: self.clone(),
        }
    }
}

/// A limiter's name: the task's name, or the task's name, a newline and the key's value.
fn target(task: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{task}\n{key}"),
        None => task.to_owned(),
    }
}

fn split(limiter: &str) -> (String, Option<String>) {
    match limiter.split_once('\n') {
        Some((task, key)) => (task.to_owned(), Some(key.to_owned())),
        None => (limiter.to_owned(), None),
    }
}

impl Limits {
    /// Every limiter a worker used in the last day, with its use now, by task and key.
    pub async fn list(&self) -> Result<Vec<LimiterView>, StoreError> {
        let store = self.client.store();
        let overrides = store.limit_overrides().await?;
        let now = self.client.clock().now_unix();
        let mut out: Vec<LimiterView> = store
            .limiters()
            .await?
            .into_iter()
            .map(|u| {
                let (task, key) = split(&u.seen.limiter);
                let set = |target: &str| {
                    overrides.iter().any(|(t, o)| {
                        t == target
                            && match u.seen.kind {
                                LimiterKind::Rate => o.rate.is_some(),
                                _ => o.concurrency.is_some(),
                            }
                    })
                };
                LimiterView {
                    overridden: set(&u.seen.limiter) || set(&task),
                    task,
                    key,
                    kind: u.seen.kind,
                    limit: u.seen.limit,
                    used: u.used,
                    waiting: u.waiting,
                    idle_s: (now - u.last_seen).max(0.0),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.task, &a.key, a.kind.as_str()).cmp(&(&b.task, &b.key, b.kind.as_str()))
        });
        Ok(out)
    }

    /// The limits set at run time.
    pub async fn overrides(&self) -> Result<Vec<OverrideView>, StoreError> {
        let mut out: Vec<OverrideView> = self
            .client
            .store()
            .limit_overrides()
            .await?
            .into_iter()
            .map(|(limiter, limits)| {
                let (task, key) = split(&limiter);
                OverrideView { task, key, limits }
            })
            .collect();
        out.sort_by(|a, b| (&a.task, &a.key).cmp(&(&b.task, &b.key)));
        Ok(out)
    }

    /// Sets the limits of `task` (of its `key` alone, when given) over the declared ones;
    /// workers apply them within [`OVERRIDES_REFRESH`](crate::store::OVERRIDES_REFRESH).
    /// Replaces what was set before for the same target.
    pub async fn set(
        &self,
        task: &str,
        key: Option<&str>,
        limits: LimitOverride,
    ) -> Result<(), StoreError> {
        if limits == LimitOverride::default() {
            return Err(StoreError::Config(
                "set a rate or a concurrency (or reset the target to the declared limits)".into(),
            ));
        }
        if task.is_empty() || task.contains('\n') || key.is_some_and(|k| k.contains('\n')) {
            return Err(StoreError::Config(
                "a task name or key may not be empty or hold a newline".into(),
            ));
        }
        self.client
            .store()
            .set_limit_override(&target(task, key), Some(limits))
            .await?;
        Ok(())
    }

    /// Goes back to the declared limits for `task` (or its `key`): whether a limit was set.
    pub async fn reset(&self, task: &str, key: Option<&str>) -> Result<bool, StoreError> {
        self.client
            .store()
            .set_limit_override(&target(task, key), None)
            .await
    }
}
