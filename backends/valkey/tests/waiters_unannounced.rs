//! `wait` finds what no announcement answered, or what one announced before anyone waited:
//! a Python worker's unannounced result, a result carried by its announcement or kept for a
//! later wait, one too large to announce, and re-reads kept to the safety net under load.

mod common;

use std::time::Duration;

use common::ok;
use common::waiting::{announce, claim, notification_only_store, store_unannounced, Parked};
use ferriq::store::{ResultStatus, ResultStore};
use ferriq::wire::TaskId;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test]
async fn a_first_wait_that_reads_nothing_first_still_finds_an_unannounced_result() {
    // The first wait for a task this client enqueued sleeps without reading; a Python worker
    // announces nothing, so the first re-read must find what it stored, well before the
    // deadline.
    let store = common::store_at(&common::url(), &common::prefix(), |b| {
        b.recheck_interval(Duration::from_millis(100))
    })
    .await;
    let id = TaskId::random();
    store.reply_channel_for(&id).expect("a reply channel");
    let raw = common::raw_client(&common::url()).await;
    store_unannounced(&raw, &store, &id, json!(5)).await;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        store.wait(&id, Duration::from_secs(30)),
    )
    .await
    .expect("the first re-read finds it")
    .unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(5))));
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}

#[tokio::test]
async fn a_waiter_takes_the_result_its_announcement_carries() {
    // The announcement of a stored result carries it: the waiter answers without reading it
    // back. Here nothing is stored at all, so only the announcement can answer.
    let Parked {
        id,
        waiter,
        raw,
        channel,
        ..
    } = Parked::wait(Duration::from_secs(60)).await;
    announce(&raw, &channel, &id, json!(7)).await;
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the announcement answers the wait")
        .unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(7))));
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}

#[tokio::test]
async fn a_completion_announced_before_anyone_waits_is_kept_for_the_wait() {
    // A client that enqueues a batch and then waits for each task finds most completions
    // announced already: they are kept for the first wait, which reads nothing back. Nothing
    // is stored here, so only the kept announcement can answer.
    let Parked {
        store,
        id: marker,
        waiter,
        raw,
        channel,
    } = Parked::wait(Duration::from_secs(3600)).await;
    let id = TaskId::random();
    let reply = store.reply_channel_for(&id).expect("a reply channel");
    announce(&raw, &reply, &id, json!(9)).await;
    // The subscriber reads its messages in the order published: once the marker's waiter is
    // answered, the announcement before it was read too.
    announce(&raw, &channel, &marker, json!(1)).await;
    let r = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the marker's announcement answers its wait")
        .unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(1))));
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        store.wait(&id, Duration::from_secs(30)),
    )
    .await
    .expect("the kept announcement answers the wait")
    .unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(9))));
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}

#[tokio::test]
async fn a_result_too_large_to_announce_is_read_back_whole() {
    // Over 8 KiB the announcement names the task only; the waiter reads the stored result.
    let store = notification_only_store().await;
    let channel = format!("{}:test-large", store.prefix());
    let (subscriber, mut messages) = common::listen(&common::url(), &channel).await;
    let id = TaskId::random();
    let token = claim(&store, &id).await;
    let large = ok(json!("x".repeat(10_000)));
    store
        .complete(&id, token, Some(&large), Some(&channel))
        .await
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), messages.recv())
        .await
        .expect("the completion is announced")
        .unwrap();
    assert_eq!(msg.value.as_string().unwrap(), id.as_str(), "the id alone");
    let r = store.wait(&id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(r, ResultStatus::Ready(large));
    fred::prelude::ClientLike::quit(&subscriber).await.unwrap();
}

#[tokio::test]
async fn while_completions_flow_a_wait_expecting_one_rereads_only_as_the_safety_net() {
    // Quick re-reads find what a Python worker stored (it announces nothing); while
    // completions keep reaching this client, a wait expecting one leaves its re-read to
    // `recheck_interval`: under a backlog thousands of waits would otherwise re-read every
    // few hundred milliseconds, and the backlog would feed itself.
    let recheck = Duration::from_millis(1500);
    let store = common::store_at(&common::url(), &common::prefix(), |b| {
        b.recheck_interval(recheck)
    })
    .await;
    let raw = common::raw_client(&common::url()).await;
    // Nothing announced to this client yet: the first re-read (after 100 ms) finds it.
    let quiet = TaskId::random();
    store.reply_channel_for(&quiet).expect("a reply channel");
    store_unannounced(&raw, &store, &quiet, json!(1)).await;
    let start = Instant::now();
    let r = store.wait(&quiet, Duration::from_secs(30)).await.unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(1))));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no announcements: found by the quick re-read, took {:?}",
        start.elapsed()
    );

    // Completions of other tasks keep coming to this client's reply channel.
    let channel = store.reply_channel().expect("a reply channel");
    let flowing = tokio::spawn({
        let (raw, channel) = (raw.clone(), channel.clone());
        async move {
            loop {
                announce(&raw, &channel, &TaskId::random(), json!(0)).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    // One this client waits for: answered only once the dispatcher has taken it, so
    // completions are known to flow when the next wait begins.
    let seen = TaskId::random();
    store.reply_channel_for(&seen).expect("a reply channel");
    let waiting = {
        let (store, id) = (store.clone(), seen.clone());
        tokio::spawn(async move { store.wait(&id, Duration::from_secs(30)).await.unwrap() })
    };
    while !waiting.is_finished() {
        announce(&raw, &channel, &seen, json!(2)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(waiting.await.unwrap(), ResultStatus::Ready(ok(json!(2))));

    let unannounced = TaskId::random();
    store
        .reply_channel_for(&unannounced)
        .expect("a reply channel");
    store_unannounced(&raw, &store, &unannounced, json!(3)).await;
    let start = Instant::now();
    let r = store
        .wait(&unannounced, Duration::from_secs(30))
        .await
        .unwrap();
    let took = start.elapsed();
    assert_eq!(
        r,
        ResultStatus::Ready(ok(json!(3))),
        "the safety net found it"
    );
    assert!(
        took >= Duration::from_secs(1) && took < recheck * 3,
        "found by the re-read at recheck_interval ({recheck:?}), not at 100 ms: took {took:?}"
    );

    // A wait shorter than `recheck_interval` whose announcement never comes still reads once
    // at its deadline: it returns what was stored, late, not Pending.
    let short = TaskId::random();
    store.reply_channel_for(&short).expect("a reply channel");
    store_unannounced(&raw, &store, &short, json!(4)).await;
    let timeout = Duration::from_millis(700);
    let start = Instant::now();
    let r = store.wait(&short, timeout).await.unwrap();
    assert_eq!(r, ResultStatus::Ready(ok(json!(4))), "read at the deadline");
    assert!(start.elapsed() < timeout + Duration::from_secs(1));
    flowing.abort();
    fred::prelude::ClientLike::quit(&raw).await.unwrap();
}
