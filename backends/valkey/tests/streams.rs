//! The Streams broker on the shared Redis: the conformance kit's broker suite (a stream of its
//! own per check), and what is its own — reclaim by lease, acked entries deleted, delays.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{Broker, ConsumerSettings, OutgoingMessage};
use ferriq::testing::conformance;
use ferriq::wire::TaskMessage;
use ferriq_valkey::StreamBroker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_keeps_the_broker_contract() {
    conformance::broker_suite(|| async {
        let queue = format!("{}.q", common::prefix());
        Arc::new(common::stream_broker(&queue).await) as Arc<dyn Broker>
    })
    .await;
}

fn message() -> (ferriq::wire::TaskId, OutgoingMessage) {
    let msg = TaskMessage::new("streams.test");
    let out = OutgoingMessage::from_message(&msg).expect("a message serialises");
    (msg.task_id, out)
}

fn task_of(d: &ferriq::broker::Delivery) -> Option<ferriq::wire::TaskId> {
    TaskMessage::peek_task_id(&d.body)
}

/// Two workers on one stream, leases of 1 s: the entry whose holder heartbeats stays with it
/// for three leases; the one it stopped heartbeating (as if its worker died) goes to the other
/// worker within its lease + 1 s, and the first worker's late ack of it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeated_entry_stays_and_a_dead_ones_is_taken_over_within_its_lease() {
    let queue = format!("{}.lease", common::prefix());
    let lease = Duration::from_secs(1);
    let (a, b) = (
        common::stream_broker(&queue).await,
        common::stream_broker(&queue).await,
    );
    for x in [&a, &b] {
        x.prepare_consumer(&ConsumerSettings::new(2, lease));
    }
    let ((kept_id, kept), (dead_id, dead)) = (message(), message());
    a.publish(vec![kept, dead]).await.unwrap();
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A received {}",
            held.len()
        );
        held.extend(
            a.receive(2 - held.len(), Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    let kept_d = held
        .iter()
        .find(|d| task_of(d) == Some(kept_id.clone()))
        .unwrap();
    let dead_d = held
        .iter()
        .find(|d| task_of(d) == Some(dead_id.clone()))
        .unwrap();
    let taken_from = tokio::time::Instant::now();
    let mut taken_after = None;
    while taken_from.elapsed() < lease * 3 {
        let statuses = a
            .extend(std::slice::from_ref(&kept_d.handle), lease)
            .await
            .unwrap();
        assert_eq!(statuses, [ferriq::broker::LeaseStatus::Kept]);
        for d in b.receive(2, Duration::from_millis(250)).await.unwrap() {
            assert_eq!(
                task_of(&d),
                Some(dead_id.clone()),
                "a heartbeated entry was taken"
            );
            assert_eq!(d.receive_count, 2, "its second delivery");
            taken_after.get_or_insert(taken_from.elapsed());
            b.ack(&d.handle).await.unwrap();
        }
    }
    let taken_after = taken_after.expect("the dead worker's entry was never taken over");
    assert!(
        taken_after <= lease + Duration::from_secs(1),
        "taken over after {taken_after:?}"
    );
    assert!(matches!(
        a.ack(&dead_d.handle).await,
        Err(ferriq::broker::BrokerError::DeliveryLost)
    ));
    a.ack(&kept_d.handle).await.unwrap();
    // Both acked: the stream holds nothing.
    let depth = a.depth().await.unwrap();
    assert_eq!((depth.ready, depth.in_flight, depth.delayed), (0, 0, 0));
}

/// A delayed message waits in the delayed set, not in the stream, and comes on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_waits_until_due() {
    let queue = format!("{}.delay", common::prefix());
    let b = common::stream_broker(&queue).await;
    let (id, mut out) = message();
    out.delay = Some(Duration::from_secs(2));
    let sent = tokio::time::Instant::now();
    b.publish(vec![out]).await.unwrap();
    assert_eq!(b.depth().await.unwrap().delayed, 1);
    loop {
        let got = b.receive(1, Duration::from_millis(200)).await.unwrap();
        if let Some(d) = got.first() {
            assert_eq!(task_of(d), Some(id.clone()));
            let after = sent.elapsed();
            assert!(
                after >= Duration::from_millis(1900) && after < Duration::from_secs(4),
                "delivered after {after:?}"
            );
            b.ack(&d.handle).await.unwrap();
            break;
        }
        assert!(sent.elapsed() < Duration::from_secs(5), "never delivered");
    }
    assert_eq!(b.depth().await.unwrap().delayed, 0);
}

/// Without `appendonly`, or with a policy that evicts any key when full, connecting is refused
/// unless allowed, and the error says how; otherwise the broker connects.
#[tokio::test]
async fn a_server_that_can_lose_queued_tasks_is_refused_unless_allowed() {
    let server = common::PrivateRedis::start().await;
    let connect = || {
        StreamBroker::builder(server.url())
            .queues(["volatile"])
            .connect()
    };
    let err = connect()
        .await
        .expect_err("a private server starts with appendonly no");
    let text = err.to_string();
    assert!(text.contains("appendonly yes"), "{text}");
    assert!(text.contains("FERRIQ_BROKER_VOLATILE"), "{text}");
    assert!(!text.contains("ferriq-valkey"), "{text}");
    common::redis_cli(server.port, &["CONFIG", "SET", "appendonly", "yes"]);
    connect()
        .await
        .expect("a server with appendonly yes is taken");

    // Full, it would evict any key (a stream with queued tasks among them): refused too.
    common::redis_cli(server.port, &["CONFIG", "SET", "maxmemory", "1gb"]);
    common::redis_cli(
        server.port,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let text = connect()
        .await
        .expect_err("an allkeys policy with maxmemory is refused")
        .to_string();
    assert!(text.contains("allkeys-lru"), "{text}");
    assert!(text.contains("noeviction"), "{text}");
    StreamBroker::builder(server.url())
        .queues(["volatile"])
        .allow_volatile(true)
        .connect()
        .await
        .expect("accepted when told");
    // Policies that evict only keys with an expiry leave the broker's keys alone.
    common::redis_cli(
        server.port,
        &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"],
    );
    connect().await.expect("volatile-lru is taken");
}

/// Two lanes with one hash tag (one cluster slot) keep their own delayed messages, and a
/// receive never hands out more than it asked for, though a read over two lanes brings up to
/// that many of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_sharing_a_hash_tag_keep_their_own_messages() {
    let tag = common::prefix();
    let (high, low) = (format!("{{{tag}}}:high"), format!("{{{tag}}}:low"));
    let b = StreamBroker::builder(common::url())
        .queues([high.as_str(), low.as_str()])
        .allow_volatile(true)
        .connect()
        .await
        .expect("connect the Streams broker");
    let mut sent = std::collections::HashMap::new();
    let mut batch = Vec::new();
    for (lane, delayed) in [(&high, false), (&low, false), (&low, true)] {
        for _ in 0..3 {
            let (id, mut out) = message();
            out.queue = Some(lane.clone());
            if delayed {
                out.delay = Some(Duration::from_millis(1500));
            }
            sent.insert(id, lane.clone());
            batch.push(out);
        }
    }
    b.publish(batch).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    while got < sent.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{got} of {} received",
            sent.len()
        );
        let ds = b.receive(1, Duration::from_millis(300)).await.unwrap();
        assert!(ds.len() <= 1, "asked for one, got {}", ds.len());
        for d in ds {
            let id = task_of(&d).unwrap();
            assert_eq!(
                Some(&*d.queue),
                sent.get(&id).map(String::as_str),
                "received from its own lane"
            );
            b.ack(&d.handle).await.unwrap();
            got += 1;
        }
    }
}

/// A worker's consumer counts as consuming while it reads, and leaves the group when it stops
/// holding nothing — but never while it holds an entry (its entries would be lost with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_workers_consumer_leaves_the_group_unless_it_holds_entries() {
    let queue = format!("{}.consumers", common::prefix());
    let (a, b) = (
        common::stream_broker(&queue).await,
        common::stream_broker(&queue).await,
    );
    assert_eq!(a.consumer_count(None).await, Some((queue.clone(), 0)));
    let (_, first) = message();
    let (_, second) = message();
    a.publish(vec![first, second]).await.unwrap();
    let got_a = loop {
        let got = a.receive(1, Duration::from_secs(1)).await.unwrap();
        if let Some(d) = got.into_iter().next() {
            break d;
        }
    };
    let got_b = loop {
        let got = b.receive(1, Duration::from_secs(1)).await.unwrap();
        if let Some(d) = got.into_iter().next() {
            break d;
        }
    };
    assert_eq!(a.consumer_count(None).await, Some((queue.clone(), 2)));
    a.ack(&got_a.handle).await.unwrap();
    a.stop_receiving().await;
    b.stop_receiving().await;
    // A held nothing and left; B holds its entry and stays, and can still settle it.
    assert_eq!(a.consumer_count(None).await, Some((queue.clone(), 1)));
    b.ack(&got_b.handle).await.unwrap();
}

/// Acks made at once go out in few script runs (on a private server, to count them): each
/// held entry's ack succeeds and deletes it, and a handle acked twice at once is acked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_made_at_once_go_out_together_and_each_answers_for_its_entry() {
    let server = common::PrivateRedis::start().await;
    let broker = Arc::new(
        StreamBroker::builder(server.url())
            .queues(["acks"])
            .allow_volatile(true)
            .connect()
            .await
            .unwrap(),
    );
    broker.prepare_consumer(&ConsumerSettings::new(500, Duration::from_secs(30)));
    let n = 300;
    broker
        .publish((0..n).map(|_| message().1).collect())
        .await
        .unwrap();
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "received {}",
            held.len()
        );
        held.extend(
            broker
                .receive(n - held.len(), Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    let evalsha = || {
        let stats = common::redis_cli(server.port, &["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse::<u64>().unwrap())
    };
    let before = evalsha();
    let twice = &held[0].handle;
    let acks = held
        .iter()
        .map(|d| &d.handle)
        .chain([twice])
        .map(|h| broker.ack(h));
    let answers = futures_util::future::join_all(acks).await;
    let runs = evalsha() - before;
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(ferriq::broker::BrokerError::DeliveryLost)))
        .count();
    assert!(answers
        .iter()
        .all(|a| a.is_ok() || matches!(a, Err(ferriq::broker::BrokerError::DeliveryLost))));
    assert_eq!(refused, 1, "the handle acked twice is acked once");
    assert!(runs < 30, "{} acks took {runs} script runs", n + 1);
    let depth = broker.depth().await.unwrap();
    assert_eq!((depth.ready, depth.in_flight), (0, 0));
    assert_eq!(
        common::redis_cli(server.port, &["XLEN", "acks"]).trim(),
        "0",
        "acked entries are deleted"
    );
}

/// An idle worker's receive waits a while (a second by the worker's default; 4 s here, so
/// that "at the end of the wait" and "when due" are far apart on a loaded machine), but a
/// delayed message comes when due, not at the end of the wait it fell into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_comes_when_due_even_while_the_receive_waits() {
    let queue = format!("{}.due", common::prefix());
    let b = common::stream_broker(&queue).await;
    let (id, mut out) = message();
    out.delay = Some(Duration::from_millis(1500));
    let sent = tokio::time::Instant::now();
    b.publish(vec![out]).await.unwrap();
    loop {
        let got = b.receive(1, Duration::from_secs(4)).await.unwrap();
        if let Some(d) = got.first() {
            assert_eq!(task_of(d), Some(id.clone()));
            let after = sent.elapsed();
            assert!(
                after >= Duration::from_millis(1400) && after < Duration::from_secs(3),
                "delivered after {after:?} (due after 1.5 s; the wait ended at 4 s)"
            );
            b.ack(&d.handle).await.unwrap();
            break;
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "never delivered");
    }
}

/// What another process makes due soon — a hand-back, a short delay — comes when due, not at
/// the end of the wait this worker's receive fell into: it is announced on the lane's wake-up
/// channel, and the waiting receive returns to look for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_another_process_makes_due_soon_comes_when_due() {
    let queue = format!("{}.wake", common::prefix());
    let (worker, other) = (
        common::stream_broker(&queue).await,
        common::stream_broker(&queue).await,
    );
    let (handed_back, out) = message();
    other.publish(vec![out]).await.unwrap();
    let held = loop {
        if let Some(d) = other
            .receive(1, Duration::from_secs(1))
            .await
            .unwrap()
            .pop()
        {
            break d;
        }
    };
    // The worker receives with long waits (5 s) and records when each message came.
    let (tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let receiving = {
        let worker = worker.clone();
        tokio::spawn(async move {
            loop {
                for d in worker.receive(1, Duration::from_secs(5)).await.unwrap() {
                    worker.ack(&d.handle).await.unwrap();
                    let _ = tx.send((task_of(&d), tokio::time::Instant::now()));
                }
            }
        })
    };
    // Once it has the first message, its receives have looked for due messages and wait
    // (the next look is due at the end of the blocking read, 2 s on).
    let (first, out) = message();
    other.publish(vec![out]).await.unwrap();
    let (id, _) = tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .expect("the first message never came")
        .unwrap();
    assert_eq!(id, Some(first));
    // Both listen on the lane's wake-up channel (each started listening at its first receive).
    let raw = common::raw_client(&common::url()).await;
    let channel = format!("{{{queue}}}:ferriq:due");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while common::subscribers(&raw, &channel).await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody listens on {channel}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let soon = Duration::from_millis(300);
    let late = Duration::from_millis(1200);
    let released = tokio::time::Instant::now();
    other.release(&held.handle, soon).await.unwrap();
    let window = (soon, late);
    next_arrival(&mut arrived, handed_back, released, window, "hand-back").await;
    let (delayed, mut out) = message();
    out.delay = Some(soon);
    let sent = tokio::time::Instant::now();
    other.publish(vec![out]).await.unwrap();
    let window = (soon - Duration::from_millis(20), late);
    next_arrival(&mut arrived, delayed, sent, window, "delayed message").await;
    receiving.abort();
    worker.close().await;
    other.close().await;
    let _ = fred::prelude::ClientLike::quit(&raw).await;
}

/// The next arrival the receiving loop reports: it must be `want`, within `window` after `from`.
async fn next_arrival(
    arrived: &mut tokio::sync::mpsc::UnboundedReceiver<(
        Option<ferriq::wire::TaskId>,
        tokio::time::Instant,
    )>,
    want: ferriq::wire::TaskId,
    from: tokio::time::Instant,
    (earliest, late): (Duration, Duration),
    what: &str,
) {
    let (id, at) = tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .unwrap_or_else(|_| panic!("the {what} never came"))
        .unwrap();
    assert_eq!(id, Some(want), "{what}");
    let after = at - from;
    assert!(
        after >= earliest && after < late,
        "another process's {what} came {after:?} after it (due within {earliest:?}..{late:?})"
    );
}
