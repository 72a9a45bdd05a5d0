//! The store's dead-letter index, as operators use it: a page of it, and its rebuild from the
//! queue.

use super::{Ops, OpsError, Progress, BATCH};
use crate::dead_letters::DeadFilter;
use crate::store::{DeadEntry, DeadPage};

impl Ops {
    /// A page of `lane`'s dead letters from the store's index ([`DeadEntry`]), newest first,
    /// with how many match: one store read however many are parked. `None` when the store
    /// keeps no index ([`Ops::dead_letters_matching`] reads the queue instead).
    pub async fn dead_index(
        &self,
        lane: &str,
        filter: &DeadFilter,
        offset: usize,
        limit: usize,
    ) -> Result<Option<DeadPage>, OpsError> {
        let now_ms = self.client.clock().now_unix_ms();
        Ok(self
            .client
            .store()
            .dead_index(lane, filter, now_ms, offset, limit)
            .await?)
    }

    /// Rebuilds `lane`'s dead-letter index from its queue: every dead letter is looked at (and
    /// put back as it was) and indexed; what the index held that is no longer parked goes.
    /// For letters parked before the index existed, by the broker itself (SQS's
    /// `maxReceiveCount`), or by a worker that stopped between parking and indexing.
    /// `progress` hears after each batch; the count indexed is returned.
    pub async fn reindex_dead(
        &self,
        lane: &str,
        mut progress: impl FnMut(Progress),
    ) -> Result<u64, OpsError> {
        let dlq = self.dlq()?;
        let store = self.client.store();
        store.clear_dead_index(lane).await?;
        let mut held = Vec::new();
        let mut indexed = 0u64;
        let outcome: Result<(), OpsError> = async {
            loop {
                let batch = dlq.take_dead(lane, BATCH).await?;
                if batch.is_empty() {
                    return Ok(());
                }
                let entries: Vec<DeadEntry> = batch
                    .iter()
                    .filter(|m| m.lane == lane)
                    .map(DeadEntry::of)
                    .collect();
                store.index_dead(&entries).await?;
                indexed += entries.len() as u64;
                held.extend(batch);
                progress(Progress {
                    seen: held.len() as u64,
                    done: indexed,
                });
            }
        }
        .await;
        dlq.return_dead(held).await?;
        outcome.map(|()| indexed)
    }
}
