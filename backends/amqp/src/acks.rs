//! Acks of one consumer channel, written together when they come together.
//!
//! RabbitMQ turns every `basic.ack` on a quorum queue into a Raft command: one ack frame per
//! message cost the broker about a fifth of its CPU per message more than acking every fourth
//! delivery with `multiple` (BENCHMARKS.md, "This release"). A worker's completions come in bursts (the
//! store answers a batch of result writes at once), so the acks asked for in one scheduler pass
//! are written together: the longest run of the channel's oldest unsettled deliveries that are
//! all being acked goes out as one `multiple` ack, the rest one by one.
//!
//! A `multiple` ack settles *every* unacked delivery up to its tag on the channel, so the book
//! knows every delivery its channel handed out (noted as the consumer yields it, before the
//! worker sees it) and a delivery leaves the book only once its own ack or nack frame is queued
//! on the connection. A delivery being released (nack) or held by a slow run stays in the
//! book and stops the run there: nothing is ever acked that was not asked to be.
//!
//! Beside the book, one delivery settled alone and bounded in time ([`settle`]): a release put
//! back at once, a dead letter's ack.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use lapin::options::BasicAckOptions;
use lapin::Channel;

/// The book of one consumer channel.
pub(crate) struct AckBook {
    channel: Arc<Channel>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Tags the channel handed out and not yet settled on the wire, ascending.
    unsettled: BTreeSet<u64>,
    /// Acks asked for and not yet written.
    asked: Vec<u64>,
    /// A caller is about to write the asked acks.
    flush_due: bool,
}

/// One ack frame: `multiple` settles every unsettled tag up to `tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckFrame {
    pub(crate) tag: u64,
    pub(crate) multiple: bool,
}

impl AckBook {
    pub(crate) fn new(channel: Arc<Channel>) -> Self {
        AckBook {
            channel,
            state: Mutex::default(),
        }
    }

    /// The consumer channel the book acks on.
    pub(crate) fn channel(&self) -> &Arc<Channel> {
        &self.channel
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A delivery the channel handed out: unsettled until its ack or nack is written.
    pub(crate) fn delivered(&self, tag: u64) {
        self.lock().unsettled.insert(tag);
    }

    /// A delivery settled another way (a nack through lapin's `Acker`), once that frame is
    /// queued: later `multiple` acks may cover its tag again.
    pub(crate) fn settled_elsewhere(&self, tag: u64) {
        self.lock().unsettled.remove(&tag);
    }

    /// Acks `tag` (a delivery of this channel, asked once). The first call of a burst yields
    /// once, so the other tasks ready to run ask theirs, then queues every asked frame on the
    /// connection before it returns; the others return at once, their frames queued by that
    /// first call (dropped while it yields, it still queues them). A frame the closed channel
    /// refuses is not retried: the broker redelivers its message, and the claims answer the
    /// copy as a duplicate.
    pub(crate) async fn ack(&self, tag: u64) {
        let first = {
            let mut state = self.lock();
            state.asked.push(tag);
            !std::mem::replace(&mut state.flush_due, true)
        };
        if !first {
            // The first of the burst writes this one too.
            return;
        }
        let flush = FlushOnDrop(self);
        tokio::task::yield_now().await;
        drop(flush);
    }

    /// Writes every asked ack, in the order planned, under the lock: two bursts' frames must
    /// not cross (a `multiple` ack written after a later one that covered its tag would name a
    /// tag RabbitMQ no longer knows, and it closes the channel for that).
    fn flush(&self) {
        let mut state = self.lock();
        state.flush_due = false;
        let State {
            unsettled, asked, ..
        } = &mut *state;
        for frame in plan(unsettled, asked) {
            let write = self.channel.basic_ack(
                frame.tag,
                BasicAckOptions {
                    multiple: frame.multiple,
                },
            );
            // lapin queues the frame on the first poll; what is left to wait for is the
            // socket write, which nobody needs (a lost ack means a redelivery, which the
            // claims answer as a duplicate). A closed channel refuses at once: its
            // deliveries are redelivered anyway.
            let mut write = std::pin::pin!(write);
            let mut cx = Context::from_waker(std::task::Waker::noop());
            if let Poll::Ready(Err(e)) = write.as_mut().poll(&mut cx) {
                tracing::debug!(error = %e, tag = frame.tag, "ack not written: the channel is closed");
            }
        }
    }
}

struct FlushOnDrop<'a>(&'a AckBook);

impl Drop for FlushOnDrop<'_> {
    fn drop(&mut self) {
        self.0.flush();
    }
}

/// The frames that ack every tag of `asked`, taking them out of `unsettled` (and emptying
/// `asked`): one `multiple` ack for the longest run of the oldest unsettled tags that are all
/// asked (when it is longer than one), then one ack per other asked tag, ascending.
pub(crate) fn plan(unsettled: &mut BTreeSet<u64>, asked: &mut Vec<u64>) -> Vec<AckFrame> {
    asked.sort_unstable();
    asked.dedup();
    let mut run = 0;
    for (held, want) in unsettled.iter().zip(asked.iter()) {
        if held != want {
            break;
        }
        run += 1;
    }
    let mut frames = Vec::with_capacity(asked.len() - run + 1);
    let singles = if run > 1 {
        frames.push(AckFrame {
            tag: asked[run - 1],
            multiple: true,
        });
        &asked[run..]
    } else {
        &asked[..]
    };
    frames.extend(singles.iter().map(|&tag| AckFrame {
        tag,
        multiple: false,
    }));
    for tag in asked.drain(..) {
        unsettled.remove(&tag);
    }
    frames
}

/// Longest wait for a nack (or an operator's ack through an `Acker`) to be handed to the
/// connection. lapin resolves it once the frame is queued; a connection that dies at that
/// moment may never resolve it, and a worker must not wait forever on a settlement (the broker
/// redelivers what was not acked). Workers' acks go through the channel's `AckBook`.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Acks (`None`) or nacks with `requeue` a delivery, bounded in time. `Ok(false)`: the acker
/// was spent or its channel is gone.
pub(crate) async fn settle(
    acker: &lapin::Acker,
    nack_requeue: Option<bool>,
) -> Result<bool, String> {
    let op = async {
        match nack_requeue {
            None => acker.ack(lapin::options::BasicAckOptions::default()).await,
            Some(requeue) => {
                acker
                    .nack(lapin::options::BasicNackOptions {
                        requeue,
                        multiple: false,
                    })
                    .await
            }
        }
    };
    match tokio::time::timeout(SETTLE_TIMEOUT, op).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {SETTLE_TIMEOUT:?}")),
    }
}

/// Puts a delivery back in its queue at once; whether its nack was handed to the connection.
pub(crate) async fn requeue(acker: &lapin::Acker) -> bool {
    matches!(settle(acker, Some(true)).await, Ok(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(unsettled: &[u64], asked: &[u64]) -> (Vec<(u64, bool)>, Vec<u64>) {
        let mut unsettled: BTreeSet<u64> = unsettled.iter().copied().collect();
        let mut asked = asked.to_vec();
        let planned = plan(&mut unsettled, &mut asked);
        assert!(asked.is_empty());
        (
            planned.iter().map(|f| (f.tag, f.multiple)).collect(),
            unsettled.into_iter().collect(),
        )
    }

    #[test]
    fn the_oldest_run_goes_as_one_multiple_ack() {
        let (f, left) = frames(&[3, 4, 5, 6, 9], &[5, 3, 4]);
        assert_eq!(f, vec![(5, true)]);
        assert_eq!(left, vec![6, 9]);
    }

    #[test]
    fn a_delivery_still_held_stops_the_run_and_the_rest_go_one_by_one() {
        // 4 is running (or being released): nothing may cover it.
        let (f, left) = frames(&[3, 4, 5, 6], &[3, 5, 6]);
        assert_eq!(f, vec![(3, false), (5, false), (6, false)]);
        assert_eq!(left, vec![4]);
        let (f, left) = frames(&[1, 2, 3, 4, 5, 6], &[1, 2, 5, 6]);
        assert_eq!(f, vec![(2, true), (5, false), (6, false)]);
        assert_eq!(left, vec![3, 4]);
    }

    #[test]
    fn a_lone_ack_is_a_plain_one() {
        assert_eq!(frames(&[7, 8], &[7]).0, vec![(7, false)]);
        assert_eq!(frames(&[7, 8], &[8]).0, vec![(8, false)]);
    }

    #[test]
    fn a_tag_the_book_never_saw_is_acked_alone_and_covers_nothing() {
        let (f, left) = frames(&[5, 6], &[2]);
        assert_eq!(f, vec![(2, false)]);
        assert_eq!(left, vec![5, 6]);
    }

    /// Whatever the order of asks, every asked tag is settled exactly once and no tag that was
    /// not asked is ever covered.
    #[test]
    fn random_bursts_settle_exactly_what_was_asked() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(15);
        for _ in 0..500 {
            let mut unsettled: BTreeSet<u64> = (1..=64).collect();
            let mut tags: Vec<u64> = (1..=64).collect();
            tags.shuffle(&mut rng);
            // Some deliveries are never acked (released or still running).
            let kept: BTreeSet<u64> = tags.iter().copied().filter(|t| t % 7 == 0).collect();
            let mut acked = BTreeSet::new();
            let mut asked: Vec<u64> = tags.into_iter().filter(|t| !kept.contains(t)).collect();
            while !asked.is_empty() {
                let n = rng.random_range(1..=asked.len().min(9));
                let mut burst: Vec<u64> = asked.drain(..n).collect();
                let before = unsettled.clone();
                for f in plan(&mut unsettled, &mut burst) {
                    let covered: Vec<u64> = if f.multiple {
                        before.range(..=f.tag).copied().collect()
                    } else {
                        vec![f.tag]
                    };
                    for t in covered {
                        if before.contains(&t) {
                            assert!(!kept.contains(&t), "{t} was covered without being asked");
                            assert!(acked.insert(t), "{t} was settled twice");
                        }
                    }
                }
            }
            assert_eq!(acked.len(), 64 - kept.len());
            assert_eq!(unsettled, kept);
        }
    }
}
