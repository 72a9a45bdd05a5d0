//! Reading new entries: `XREADGROUP … BLOCK` on a connection of its own, in a task of its own,
//! so a receive that is dropped while it waits (a worker that drains) loses nothing: what the
//! read brings is kept for the next receive, and it has its lease either way.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Client, ClientLike};
use fred::types::Value;
use tokio::task::JoinHandle;

use super::lane::Lane;
use super::shared::{Entry, Shared};

/// What one read brought: entries of each lane, or the error.
pub(crate) type ReadResult = Result<Vec<(Arc<Lane>, Entry)>, fred::error::Error>;

/// The read in flight, if any (one at a time: its connection blocks).
#[derive(Default)]
pub(crate) struct Reads {
    in_flight: tokio::sync::Mutex<Option<JoinHandle<ReadResult>>>,
    /// Entries a read brought beyond what its receive asked for (`COUNT` applies per stream),
    /// leased already: the next receive takes them first.
    surplus: std::sync::Mutex<Vec<(Arc<Lane>, Entry)>>,
    /// The lane the next read starts with (on a cluster, one lane per read).
    next_lane: std::sync::atomic::AtomicUsize,
    /// When lapsed leases and due delayed messages are looked for next (`None`: now), and
    /// when the next is due (a delayed message, a lease's end): a blocking read ends then.
    next_reclaim: std::sync::Mutex<Reclaim>,
    /// Told when something falls due sooner than a waiting receive knew (this process handed
    /// a delivery back, or another one announced it): the receive stops waiting and looks.
    sooner: tokio::sync::Notify,
}

/// When the next look for lapsed leases and due messages may be, and when one is due.
#[derive(Default, Clone, Copy)]
struct Reclaim {
    earliest: Option<tokio::time::Instant>,
    due: Option<tokio::time::Instant>,
    /// The soonest due time told (`due_in`) since the last look began: that look's script may
    /// have run before it was set, so the look's own answer must not replace it.
    told_since_look: Option<tokio::time::Instant>,
}

/// How often a receive looks for lapsed leases and due delayed messages, unless the last look
/// found as many as it could take (then the next receive looks again). Looking at every
/// receive cost a round trip each; this is well within the second a takeover (lease + 1 s)
/// and a due time may be late by.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);

impl Reads {
    /// Entries already read and not handed out — the surplus of the last read, or a read that
    /// finished while no receive waited for it — up to `max`, without waiting. Taken before
    /// anything else, so they are handed out while their lease still runs.
    pub(crate) async fn take_ready(&self, max: usize) -> ReadResult {
        let mut slot = self.in_flight.lock().await;
        if slot.as_ref().is_some_and(JoinHandle::is_finished) {
            let handle = slot.take().expect("a finished read");
            let entries = joined(handle.await)?;
            self.lock_surplus().extend(entries);
        }
        drop(slot);
        let mut surplus = self.lock_surplus();
        let n = surplus.len().min(max);
        Ok(surplus.drain(..n).collect())
    }

    /// Whether this receive looks for lapsed leases and due delayed messages now; if so, the
    /// look begins (what is told due from now on is kept past its answer, see `reclaimed`).
    pub(crate) fn begin_look(&self) -> bool {
        let mut next = self.next_reclaim.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        let due = next.earliest.is_none_or(|at| now >= at) || next.due.is_some_and(|at| now >= at);
        if due {
            next.told_since_look = None;
        }
        due
    }

    fn reclaim(&self) -> Reclaim {
        *self.next_reclaim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A look for lapsed leases is done; `full`: it took as many as it could, so more may wait;
    /// `next`: how long until a delayed message is due or a lease ends.
    pub(crate) fn reclaimed(&self, full: bool, next: Option<Duration>) {
        let now = tokio::time::Instant::now();
        let mut reclaim = self.next_reclaim.lock().unwrap_or_else(|p| p.into_inner());
        // A hand-back or an announcement told while the look ran may be missing from its
        // answer (its script ran first): replacing it would leave that message to the end of
        // the next wait, up to two seconds late.
        let due = match (next.map(|after| now + after), reclaim.told_since_look) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        *reclaim = Reclaim {
            earliest: (!full).then(|| now + RECLAIM_EVERY),
            due,
            told_since_look: None,
        };
    }

    /// Something falls due after `after` (a hand-back, a delayed message): a look for it is
    /// due then, and a receive waiting past it stops waiting then. Without this, a hand-back this process made waited
    /// for the next look — up to a receive's whole wait late (a task waiting for a
    /// concurrency slot came back up to a second after the slot was free).
    pub(crate) fn due_in(&self, after: Duration) {
        let at = tokio::time::Instant::now() + after;
        let mut next = self.next_reclaim.lock().unwrap_or_else(|p| p.into_inner());
        if next.told_since_look.is_none_or(|told| at < told) {
            next.told_since_look = Some(at);
        }
        if next.due.is_none_or(|due| at < due) {
            next.due = Some(at);
            drop(next);
            self.sooner.notify_waiters();
        }
    }

    /// The lanes in the order this receive reads them: each in turn goes first, so a busy
    /// lane does not keep the others waiting.
    pub(crate) fn lanes_in_turn(&self, lanes: &[Arc<Lane>]) -> Vec<Arc<Lane>> {
        let first = self
            .next_lane
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % lanes.len();
        lanes[first..]
            .iter()
            .chain(&lanes[..first])
            .cloned()
            .collect()
    }

    fn lock_surplus(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<Lane>, Entry)>> {
        self.surplus.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New entries, up to `max`, waiting up to `wait`: `None` when the wait ended first, or
    /// something fell due in it (the caller looks for it). A read still going then is kept
    /// for the next call.
    pub(crate) async fn read(
        &self,
        shared: &Arc<Shared>,
        max: usize,
        wait: Duration,
    ) -> Result<Option<Vec<(Arc<Lane>, Entry)>>, fred::error::Error> {
        let mut slot = self.in_flight.lock().await;
        if slot.is_none() {
            let lanes = if shared.clustered {
                let i = self
                    .next_lane
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                vec![Arc::clone(&shared.lanes[i % shared.lanes.len()])]
            } else {
                shared.lanes.clone()
            };
            // A server-side block of at most 2 s, and none past the next due delayed message
            // or lease end: those are looked for by a receive, so a block would hold them back.
            let until_due = self
                .reclaim()
                .due
                .map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
            let block = wait
                .min(Duration::from_secs(2))
                .min(until_due.unwrap_or(Duration::MAX));
            *slot = Some(tokio::spawn(read_once(
                Arc::clone(shared),
                lanes,
                max,
                block,
            )));
        }
        let handle = slot.as_mut().expect("a read in flight");
        // Returns early when something falls due in the wait: the caller looks for it. The
        // read goes on, kept for the next call.
        let sooner = self.sooner.notified();
        let until_due = self.reclaim().due.map_or(wait, |at| {
            at.saturating_duration_since(tokio::time::Instant::now())
        });
        tokio::select! {
            biased;
            done = handle => {
                *slot = None;
                let mut entries = joined(done)?;
                if entries.len() > max {
                    self.lock_surplus().extend(entries.split_off(max));
                }
                Ok(Some(entries))
            }
            _ = sooner => Ok(None),
            _ = tokio::time::sleep(wait.min(until_due)) => Ok(None),
        }
    }

    /// What a read in flight brings, waited for up to `limit` (at a worker's stop: handed back
    /// by the caller).
    pub(crate) async fn take_in_flight(&self, limit: Duration) -> Vec<(Arc<Lane>, Entry)> {
        let mut out: Vec<_> = self.lock_surplus().drain(..).collect();
        let mut slot = self.in_flight.lock().await;
        let Some(handle) = slot.take() else {
            return out;
        };
        if let Ok(Ok(Ok(entries))) = tokio::time::timeout(limit, handle).await {
            out.extend(entries);
        }
        out
    }
}

/// A read task's outcome, its panic or abort turned into an error.
fn joined(done: Result<ReadResult, tokio::task::JoinError>) -> ReadResult {
    done.unwrap_or_else(|e| {
        Err(fred::error::Error::new(
            fred::error::ErrorKind::Unknown,
            format!("the read task failed: {e}"),
        ))
    })
}

/// One `XREADGROUP` over `lanes`, then the lease of every entry it brought.
async fn read_once(
    shared: Arc<Shared>,
    lanes: Vec<Arc<Lane>>,
    max: usize,
    block: Duration,
) -> ReadResult {
    let mut args: Vec<Value> = vec![
        "GROUP".into(),
        shared.group.as_str().into(),
        shared.consumer.as_str().into(),
        "COUNT".into(),
        (max.max(1) as i64).into(),
        "BLOCK".into(),
        (block.as_millis().max(1) as i64).into(),
        "STREAMS".into(),
    ];
    args.extend(lanes.iter().map(|l| Value::from(&*l.stream)));
    args.extend(lanes.iter().map(|_| Value::from(">")));
    // Routed by the first stream (on a cluster a read names one lane).
    let command = super::lane::on_key("XREADGROUP", &lanes[0].stream, true);
    // The block is the server's wait, not a slow server: the command's own timeout covers it.
    let options = fred::types::config::Options {
        timeout: Some(block + Duration::from_secs(5)),
        ..Default::default()
    };
    let reply: Value = shared
        .reader
        .with_options(&options)
        .custom(command, args)
        .await?;
    let mut out = Vec::new();
    for (stream, entries) in streams_of(reply) {
        let Some(lane) = lanes.iter().find(|l| *l.stream == *stream) else {
            continue;
        };
        let read: Vec<Entry> = entries.into_iter().filter_map(|e| entry_of(e, 1)).collect();
        if read.is_empty() {
            continue;
        }
        shared.give_leases(lane, &read).await?;
        out.extend(read.into_iter().map(|e| (Arc::clone(lane), e)));
    }
    Ok(out)
}

/// `[[stream, [entry…]]…]` (or a map of stream → entries).
fn streams_of(reply: Value) -> Vec<(String, Vec<Value>)> {
    match reply {
        Value::Null => Vec::new(),
        Value::Map(_) => {
            let flat = reply.into_array();
            flat.chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some((k.as_string()?, v.clone().into_array())),
                    _ => None,
                })
                .collect()
        }
        other => other
            .into_array()
            .into_iter()
            .filter_map(|s| {
                let mut pair = s.into_array().into_iter();
                let name = pair.next()?.as_string()?;
                Some((name, pair.next()?.into_array()))
            })
            .collect(),
    }
}

/// `[id, [field, value, …]]` → an entry, delivered `count` times.
pub(crate) fn entry_of(raw: Value, count: u32) -> Option<Entry> {
    let mut parts = raw.into_array().into_iter();
    let id = parts.next()?.as_string()?;
    let fields = parts.next()?.into_array();
    let data = fields
        .chunks(2)
        .find(|kv| kv.first().and_then(|k| k.as_str()).as_deref() == Some("data"))
        .and_then(|kv| kv.get(1))
        .and_then(|v| v.as_bytes())
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    Some(Entry { id, data, count })
}

/// Connects the reader's own client (its reads block its connection).
pub(crate) async fn connect_reader(
    client: &Client,
) -> Result<fred::types::ConnectHandle, fred::error::Error> {
    client.init().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A due time told while a look runs outlives the look's answer, which may predate it.
    #[tokio::test(start_paused = true)]
    async fn what_is_told_due_during_a_look_is_not_replaced_by_its_answer() {
        let reads = Reads::default();
        let start = tokio::time::Instant::now();
        assert!(reads.begin_look());
        // The look's script ran; then another process announced a message due in 300 ms;
        // then the look's answer (nothing due) comes back.
        reads.due_in(Duration::from_millis(300));
        reads.reclaimed(false, None);
        let at_300 = start + Duration::from_millis(300);
        assert_eq!(reads.reclaim().due, Some(at_300));
        // An answer with something sooner keeps the sooner.
        reads.due_in(Duration::from_millis(300));
        reads.reclaimed(false, Some(Duration::from_millis(100)));
        assert_eq!(
            reads.reclaim().due,
            Some(start + Duration::from_millis(100))
        );
        // Told before a look began: that look sees it, and its answer stands.
        tokio::time::advance(Duration::from_millis(150)).await;
        reads.due_in(Duration::from_millis(500));
        assert!(reads.begin_look());
        reads.reclaimed(false, None);
        assert_eq!(reads.reclaim().due, None);
    }
}
