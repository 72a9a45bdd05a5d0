use super::*;
use std::future::Future;

#[test]
fn the_ids_announced_here_are_bounded_and_forget_the_oldest() {
    let waiters = Waiters::default();
    for i in 0..=RecentIds::CAPACITY {
        waiters.announced_here(&format!("task-{i}"));
    }
    assert!(
        !waiters.is_announced_here("task-0"),
        "the oldest is forgotten"
    );
    assert!(waiters.is_announced_here("task-1"));
    assert!(waiters.is_announced_here(&format!("task-{}", RecentIds::CAPACITY)));
    assert!(!waiters.is_announced_here("never-enqueued"));
    // Noting an id again does not make room for another.
    waiters.announced_here("task-1");
    let recent = waiters.announced_here.lock().unwrap();
    assert_eq!(recent.order.len(), RecentIds::CAPACITY);
    assert_eq!(recent.set.len(), RecentIds::CAPACITY);
}

#[test]
fn an_announcement_before_the_wait_is_kept_for_it_within_bounds() {
    let waiters = Arc::new(Waiters::default());
    let keep = |id: &str, result: Option<&str>| {
        waiters.announced_here(id);
        waiters.wake_with(id, result);
    };
    keep("a1", Some("{\"r\":1}"));
    keep("b2", None);
    // A later id-only announcement (a duplicate's) keeps the result the first carried.
    waiters.wake_with("a1", None);
    // Not enqueued here: nobody here will wait for it.
    waiters.wake_with("elsewhere", None);
    assert!(!waiters.lock_early().announced.contains_key("elsewhere"));
    let a = waiters.register("a1");
    assert_eq!(a.announced_result().as_deref(), Some("{\"r\":1}"));
    assert!(a.was_announced());
    let b = waiters.register("b2");
    assert!(b.was_announced() && b.announced_result().is_none());
    waiters.announced_here("c3");
    let c = waiters.register("c3");
    assert!(!c.was_announced());
    // Taken by the first waiter: a second registration finds nothing kept.
    drop(a);
    assert!(!waiters.register("a1").was_announced());
    {
        let early = waiters.lock_early();
        assert_eq!((early.announced.len(), early.bytes), (0, 0));
    }
    // A task whose first wait began (and ended) is not kept for anyone.
    waiters.announced_here("d4");
    assert!(waiters.first_wait_here("d4"));
    waiters.wake_with("d4", Some("{}"));
    assert!(!waiters.lock_early().announced.contains_key("d4"));
}

#[test]
fn kept_announcements_stay_within_count_bytes_and_their_places() {
    let mut early = Early::default();
    // An id-only entry that later gets its result is bounded too.
    early.keep("grows", None);
    let big = "x".repeat(Early::MAX_BYTES / 4);
    for i in 0..3 {
        early.keep(&format!("big-{i}"), Some(&big));
    }
    early.keep("grows", Some(&big));
    assert!(early.bytes <= Early::MAX_BYTES, "{}", early.bytes);
    assert!(
        !early.announced.contains_key("grows"),
        "the oldest went first"
    );
    // Taken, then kept again: its stale place reaching the front leaves the new entry.
    early.keep("again", Some("1"));
    assert!(early.take("again").is_some());
    early.keep("again", Some("2"));
    for i in 0..Early::CAPACITY - 1 {
        early.keep(&format!("t-{i}"), None);
    }
    assert_eq!(
        early.announced.get("again").and_then(|(_, r)| r.as_deref()),
        Some("2"),
        "a stale place evicted the entry kept since"
    );
    for i in 0..=Early::CAPACITY {
        early.keep(&format!("u-{i}"), None);
    }
    assert!(early.announced.len() <= Early::CAPACITY);
    assert!(early.order.len() <= Early::CAPACITY);
    assert!(!early.announced.contains_key("again"));
    assert!(early
        .announced
        .contains_key(&format!("u-{}", Early::CAPACITY)));
    let live: usize = early
        .announced
        .iter()
        .map(|(k, (_, r))| k.len() + r.as_ref().map_or(0, |r| r.len()))
        .sum();
    assert_eq!(live, early.bytes, "the byte count matches what is kept");
}

/// A client that enqueues more tasks than `early` keeps, then waits for each in turn:
/// the waits whose announcement `early` forgot read at once instead of sleeping until a
/// re-read (100 ms each: hours for a backlog of 100,000).
#[test]
fn a_first_wait_whose_announcement_was_forgotten_reads_at_once() {
    let waiters = Arc::new(Waiters::default());
    let result = "r".repeat(200);
    let n = Early::MAX_BYTES / result.len() + 10;
    for i in 0..n {
        let id = format!("t-{i}");
        waiters.announced_here(&id);
        waiters.wake_with(&id, Some(&result));
    }
    // The oldest was forgotten by `early`: its wait must read.
    let guard = waiters.register("t-0");
    assert!(
        !guard.was_announced(),
        "still kept: the test needs more tasks"
    );
    assert!(
        !waiters.first_wait_here("t-0"),
        "a first wait whose announcement was forgotten would sleep instead of reading"
    );
    // The newest is still kept: its wait answers from it without reading.
    let last = format!("t-{}", n - 1);
    let kept = waiters.register(&last);
    assert_eq!(kept.announced_result().as_deref(), Some(result.as_str()));
    // A task not yet announced: its first wait sleeps until the announcement.
    waiters.announced_here("pending");
    assert!(waiters.first_wait_here("pending"));
}

#[test]
fn announcements_flow_only_while_they_keep_coming() {
    let waiters = Waiters::default();
    assert!(!waiters.announcements_flowing(), "none came yet");
    waiters.note_announcement();
    assert!(waiters.announcements_flowing());
    // The last one came over a second ago.
    let waiters = Waiters {
        epoch: std::time::Instant::now()
            .checked_sub(std::time::Duration::from_millis(1500))
            .expect("the clock is past 1.5 s"),
        last_announcement_ms: AtomicU64::new(1),
        ..Waiters::default()
    };
    assert!(!waiters.announcements_flowing());
}

#[test]
fn only_the_first_wait_for_a_task_enqueued_here_skips_its_read() {
    let waiters = Waiters::default();
    waiters.announced_here("mine");
    assert!(waiters.first_wait_here("mine"));
    assert!(
        !waiters.first_wait_here("mine"),
        "the first took the announcement"
    );
    assert!(!waiters.first_wait_here("elsewhere"));
}

#[test]
fn one_message_wakes_every_task_it_names() {
    let waiters = Arc::new(Waiters::default());
    let (a, b, c) = (
        waiters.register("a1"),
        waiters.register("b2"),
        waiters.register("c3"),
    );
    let (wa, wb, wc) = (
        a.notify.notified(),
        b.notify.notified(),
        c.notify.notified(),
    );
    tokio::pin!(wa, wb, wc);
    for w in [wa.as_mut(), wb.as_mut(), wc.as_mut()] {
        w.enable();
    }
    announced("a1 c3").for_each(|(id, result)| waiters.wake_with(id, result));
    let poll = |f: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>| {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    };
    assert!(poll(wa.as_mut()));
    assert!(!poll(wb.as_mut()));
    assert!(poll(wc.as_mut()));
    assert_eq!(announced("x").collect::<Vec<_>>(), [("x", None)]);
    assert_eq!(announced("").count(), 0);
    assert!(a.announced_result().is_none());
}

#[test]
fn results_carried_by_an_announcement_reach_their_waiters() {
    let waiters = Arc::new(Waiters::default());
    let (a, b) = (waiters.register("a1"), waiters.register("b2"));
    let json = r#"{"is_err":false,"return_value":"two words\tand a tab"}"#;
    let payload = format!("a1\t{json}\nb2");
    assert_eq!(
        announced(&payload).collect::<Vec<_>>(),
        [("a1", Some(json)), ("b2", None)]
    );
    announced(&payload).for_each(|(id, result)| waiters.wake_with(id, result));
    assert_eq!(a.announced_result().as_deref(), Some(json));
    assert!(b.announced_result().is_none());
}
