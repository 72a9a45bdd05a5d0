//! The flow suite: rate limiters, concurrency slots and limits set at run time, as the worker
//! relies on them from every [`FlowStore`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{
    LimitOverride, LimiterKind, LimiterSeen, Rate, RateDecision, SlotDecision, Store,
};
use crate::wire::TaskId;

/// Runs every flow check, each on a store from `new_store` (on a shared server, a key prefix
/// of its own is enough: every check uses limiter names of its own). Panics naming the check
/// and the rule it found broken. Takes about four seconds: slot leases and turns run out in real time.
///
/// [`FlowStore`]: crate::store::FlowStore
pub async fn flow_suite<F, Fut>(new_store: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    a_rate_admits_its_limit_per_window_and_no_more(new_store().await).await;
    a_slot_no_longer_renewed_frees_itself_within_its_lease(new_store().await).await;
    no_waiter_is_told_to_wait_past_the_first_lease_end(new_store().await).await;
    a_waiter_that_never_comes_back_keeps_no_slot(new_store().await).await;
    limits_set_at_run_time_are_kept_and_listed_with_their_use(new_store().await).await;
    super::gate::a_claim_past_a_limit_is_the_limit_then_the_claim(new_store().await).await;
    super::gate::a_recorded_failure_frees_its_runs_slot(new_store().await).await;
}

/// A limiter name no other check (or earlier run on a shared server) uses.
pub(super) fn limiter(check: &str) -> String {
    format!("conformance.{check}.{}", TaskId::random())
}

async fn a_rate_admits_its_limit_per_window_and_no_more(store: Arc<dyn Store>) {
    let check = "a_rate_admits_its_limit_per_window_and_no_more";
    let name = limiter(check);
    let rate = Rate::new(3, Duration::from_secs(60));
    for n in 0..3 {
        assert_eq!(
            store
                .admit_rate(&name, &TaskId::random(), rate)
                .await
                .expect("admit_rate"),
            RateDecision::Run,
            "conformance {check}: start {n} of 3 is within the limit"
        );
    }
    match store
        .admit_rate(&name, &TaskId::random(), rate)
        .await
        .expect("admit_rate")
    {
        RateDecision::Wait(wait) => assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(61),
            "conformance {check}: the fourth start waits for the window, not {wait:?}"
        ),
        other => {
            panic!("conformance {check}: a fourth start in the window must wait, got {other:?}")
        }
    }
}

async fn a_slot_no_longer_renewed_frees_itself_within_its_lease(store: Arc<dyn Store>) {
    let check = "a_slot_no_longer_renewed_frees_itself_within_its_lease";
    let name = limiter(check);
    let (dead, next) = (TaskId::random(), TaskId::random());
    let lease = Duration::from_secs(1);
    let acquire = |id: TaskId| {
        let (store, name) = (Arc::clone(&store), name.clone());
        async move { store.acquire_slot(&name, &id, 1, lease).await }
    };
    assert_eq!(
        acquire(dead.clone()).await.expect("acquire_slot"),
        SlotDecision::Held
    );
    assert_eq!(
        acquire(dead.clone()).await.expect("acquire_slot"),
        SlotDecision::AlreadyHeld,
        "conformance {check}: a task asking again for the slot it holds keeps it, and is told so"
    );
    // The same with slots to spare (a store may take a free slot by a shorter way).
    let roomy = format!("{name}.roomy");
    for (ask, told) in [(1, SlotDecision::Held), (2, SlotDecision::AlreadyHeld)] {
        assert_eq!(
            store
                .acquire_slot(&roomy, &dead, 2, lease)
                .await
                .expect("acquire_slot"),
            told,
            "conformance {check}: ask {ask} of a task for one of two free slots"
        );
    }
    assert!(
        matches!(
            acquire(next.clone()).await.expect("acquire_slot"),
            SlotDecision::Wait(_)
        ),
        "conformance {check}: a held slot makes the next one wait"
    );
    // Renewed once, then no longer (its worker died): free within the lease.
    store
        .renew_slots(&[(name.clone(), dead.clone())], lease)
        .await
        .expect("renew_slots");
    let freed_by = Instant::now() + lease + Duration::from_millis(500);
    let broken =
        format!("conformance {check}: a slot no longer renewed was not freed within its lease");
    held_by(&store, &name, &next, lease, freed_by, &broken).await;
    store
        .release_slot(&name, &next, Duration::from_millis(100))
        .await
        .expect("release_slot");
    assert_eq!(
        acquire(dead.clone()).await.expect("acquire_slot"),
        SlotDecision::Held,
        "conformance {check}: a released slot is free at once"
    );
}

async fn no_waiter_is_told_to_wait_past_the_first_lease_end(store: Arc<dyn Store>) {
    let check = "no_waiter_is_told_to_wait_past_the_first_lease_end";
    let name = limiter(check);
    let lease = Duration::from_secs(1);
    assert_eq!(
        store
            .acquire_slot(&name, &TaskId::random(), 1, lease)
            .await
            .expect("acquire_slot"),
        SlotDecision::Held
    );
    // Four waiting behind one slot: the last one's turn would come after four average runs,
    // but the holder's lease ends in a second — if its worker died, the slot is free then,
    // and a waiter must be back by then to take it.
    for n in 0..4 {
        match store
            .acquire_slot(&name, &TaskId::random(), 1, lease)
            .await
            .expect("acquire_slot")
        {
            SlotDecision::Wait(wait) => assert!(
                wait <= Duration::from_millis(1100),
                "conformance {check}: waiter {n} told to wait {wait:?}, past the lease's end"
            ),
            other => panic!("conformance {check}: one slot, held: waiter {n} got {other:?}"),
        }
    }
}

async fn a_waiter_that_never_comes_back_keeps_no_slot(store: Arc<dyn Store>) {
    let check = "a_waiter_that_never_comes_back_keeps_no_slot";
    let name = limiter(check);
    let lease = Duration::from_secs(1);
    let (holder, gone, next) = (TaskId::random(), TaskId::random(), TaskId::random());
    let acquire = |id: TaskId| {
        let (store, name) = (Arc::clone(&store), name.clone());
        async move { store.acquire_slot(&name, &id, 1, lease).await }
    };
    assert_eq!(
        acquire(holder.clone()).await.expect("acquire_slot"),
        SlotDecision::Held
    );
    let turn = match acquire(gone).await.expect("acquire_slot") {
        SlotDecision::Wait(wait) => Instant::now() + wait,
        other => panic!("conformance {check}: one slot, held: a waiter got {other:?}"),
    };
    store
        .release_slot(&name, &holder, Duration::from_millis(100))
        .await
        .expect("release_slot");
    // The waiter's turn comes and it never asks again (its message was purged): the free
    // slot is kept for it a while, then taken by the next.
    tokio::time::sleep_until(turn + Duration::from_millis(20)).await;
    let first = acquire(next.clone()).await.expect("acquire_slot");
    if Instant::now() < turn + Duration::from_millis(500) {
        assert!(
            matches!(first, SlotDecision::Wait(_)),
            "conformance {check}: a free slot is kept for the waiter whose turn it is, got {first:?}"
        );
    }
    let freed_by = turn + Duration::from_secs(3);
    let broken =
        format!("conformance {check}: a slot stayed kept for a waiter that never came back");
    held_by(&store, &name, &next, lease, freed_by, &broken).await;
}

/// Asks for the one slot of limiter `name` for `id` every 50 ms until it is held; panics with
/// `broken` when it is not by `by`.
async fn held_by(
    store: &Arc<dyn Store>,
    name: &str,
    id: &TaskId,
    lease: Duration,
    by: Instant,
    broken: &str,
) {
    loop {
        match store
            .acquire_slot(name, id, 1, lease)
            .await
            .expect("acquire_slot")
        {
            SlotDecision::Held => return,
            _ => assert!(Instant::now() < by, "{broken}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn limits_set_at_run_time_are_kept_and_listed_with_their_use(store: Arc<dyn Store>) {
    let check = "limits_set_at_run_time_are_kept_and_listed_with_their_use";
    let name = format!("{}\nacme", limiter(check));
    let rate = Rate::new(3, Duration::from_secs(60));
    let set = LimitOverride::default().rate(rate).concurrency(2);
    assert!(
        !store
            .set_limit_override(&name, Some(set))
            .await
            .expect("set_limit_override"),
        "conformance {check}: a first override replaces nothing"
    );
    assert!(
        store
            .set_limit_override(&name, Some(set))
            .await
            .expect("set_limit_override"),
        "conformance {check}: setting it again replaces it"
    );
    let overrides = store.limit_overrides().await.expect("limit_overrides");
    assert!(
        overrides.contains(&(name.clone(), set)),
        "conformance {check}: the override is listed"
    );
    // Two starts of three in the window; one slot of one held and one task waiting.
    for _ in 0..2 {
        store
            .admit_rate(&name, &TaskId::random(), rate)
            .await
            .expect("admit_rate");
    }
    for _ in 0..2 {
        store
            .acquire_slot(&name, &TaskId::random(), 1, Duration::from_secs(30))
            .await
            .expect("acquire_slot");
    }
    store
        .note_limiters(&[
            LimiterSeen {
                kind: LimiterKind::Rate,
                limiter: name.clone(),
                limit: "3/m".into(),
            },
            LimiterSeen {
                kind: LimiterKind::Concurrency,
                limiter: name.clone(),
                limit: "1".into(),
            },
        ])
        .await
        .expect("note_limiters");
    let mut listed: Vec<_> = store
        .limiters()
        .await
        .expect("limiters")
        .into_iter()
        .filter(|u| u.seen.limiter == name)
        .collect();
    listed.sort_by_key(|u| u.seen.kind.as_str());
    let counts: Vec<_> = listed
        .iter()
        .map(|u| (u.seen.kind, u.seen.limit.as_str(), u.used, u.waiting))
        .collect();
    assert_eq!(
        counts,
        vec![
            (LimiterKind::Concurrency, "1", 1, 1),
            (LimiterKind::Rate, "3/m", 2, 0)
        ],
        "conformance {check}: each limiter listed with what is used and waiting"
    );
    assert!(
        store
            .set_limit_override(&name, None)
            .await
            .expect("set_limit_override"),
        "conformance {check}: removing an override says it was there"
    );
    assert!(
        !store
            .limit_overrides()
            .await
            .expect("limit_overrides")
            .iter()
            .any(|(n, _)| *n == name),
        "conformance {check}: a removed override is not listed"
    );
}
