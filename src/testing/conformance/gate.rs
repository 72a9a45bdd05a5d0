//! The flow suite's check of claims behind a limit
//! ([`FlowStore::claim_past_limit`](crate::store::FlowStore::claim_past_limit)): a store that
//! answers the limit and the claim at once decides exactly as the two calls in turn would, and
//! one that writes a result with its run's slot freed does both.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{
    ClaimAsk, ClaimOutcome, CompleteOutcome, FailureRecord, Gated, HeldSlot, LimitGate, Rate,
    ResultStatus, SlotDecision, Store, Token,
};
use crate::wire::{Labels, TaskId, TaskResult};

const LEASE: Duration = Duration::from_secs(30);

fn ask(worker: &str) -> ClaimAsk<'_> {
    ClaimAsk {
        worker,
        lease: LEASE,
        deadline_at: None,
    }
}

/// A task never claimed: its first plain claim runs it as its first start.
async fn never_claimed(store: &Arc<dyn Store>, id: &TaskId, broken: &str) {
    match store.claim(id, "conformance-check", LEASE, None).await {
        Ok(ClaimOutcome::Run { starts: 0, .. }) => {}
        other => panic!("{broken}: {other:?}"),
    }
}

pub(super) async fn a_claim_past_a_limit_is_the_limit_then_the_claim(store: Arc<dyn Store>) {
    let check = "a_claim_past_a_limit_is_the_limit_then_the_claim";
    let name = super::flow::limiter(check);
    let rate = Rate::new(2, Duration::from_secs(60));
    let gate = LimitGate::Rate {
        limiter: &name,
        rate,
    };
    let (first, second, third) = (TaskId::random(), TaskId::random(), TaskId::random());
    let Some(answer) = store.claim_past_limit(gate, &first, ask("w1")).await else {
        // This store answers them apart: the worker asks each, checked by the other checks.
        return;
    };
    assert!(
        matches!(
            answer.expect("claim_past_limit"),
            Gated::Claimed(ClaimOutcome::Run { starts: 0, .. })
        ),
        "conformance {check}: a start within the rate is counted and the task claimed"
    );
    // A task another worker holds: its start counts, and the claim says so.
    let held = store
        .claim_past_limit(gate, &first, ask("w2"))
        .await
        .expect("claim_past_limit answered once, so always")
        .expect("claim_past_limit");
    assert!(
        matches!(held, Gated::Claimed(ClaimOutcome::Defer { .. })),
        "conformance {check}: a task held by another worker is deferred, got {held:?}"
    );
    match store.claim_past_limit(gate, &second, ask("w1")).await {
        Some(Ok(Gated::Wait(wait))) => assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(61),
            "conformance {check}: a third start in the window waits for it, not {wait:?}"
        ),
        other => panic!(
            "conformance {check}: a third start of a 2/min rate must wait (the deferred claim \
             counted its start), got {other:?}"
        ),
    }
    never_claimed(
        &store,
        &second,
        &format!("conformance {check}: a task over its rate must not be claimed"),
    )
    .await;

    let name = super::flow::limiter(check);
    let gate = LimitGate::Slot {
        limiter: &name,
        limit: 1,
        lease: LEASE,
    };
    let claimed = store
        .claim_past_limit(gate, &third, ask("w1"))
        .await
        .expect("claim_past_limit answered once, so always")
        .expect("claim_past_limit");
    let Gated::Claimed(ClaimOutcome::Run { token, .. }) = claimed else {
        panic!("conformance {check}: a free slot is taken and the task claimed, got {claimed:?}")
    };
    let other = TaskId::random();
    assert!(
        matches!(
            store.acquire_slot(&name, &other, 1, LEASE).await,
            Ok(SlotDecision::Wait(_))
        ),
        "conformance {check}: the slot a claim past the limit took is held"
    );
    let later = TaskId::random();
    match store.claim_past_limit(gate, &later, ask("w1")).await {
        Some(Ok(Gated::Wait(_))) => {}
        other => panic!("conformance {check}: every slot taken must wait, got {other:?}"),
    }
    never_claimed(
        &store,
        &later,
        &format!("conformance {check}: a task waiting for a slot must not be claimed"),
    )
    .await;
    // A copy of the running task: its slot is the task's already, and the store says so
    // (the copy, deferred, must leave it to the run).
    match store.claim_past_limit(gate, &third, ask("w2")).await {
        Some(Ok(Gated::ClaimedInHeldSlot(ClaimOutcome::Defer { .. }))) => {}
        other => panic!(
            "conformance {check}: a copy of a task holding its slot is told the slot was held \
             already, then deferred, got {other:?}"
        ),
    }

    // The run ends: its result written and its slot freed, together where the store can.
    let result = TaskResult::success(serde_json::json!(1), 0.1, Labels::default());
    let slot = HeldSlot {
        limiter: &name,
        held: Duration::from_millis(100),
    };
    // A write fenced off frees nothing: the task's slot is its claim holder's.
    let stale = Token(token.0.wrapping_add(1));
    if let Some(written) = store
        .complete_freeing_slot(&third, stale, Some(&result), None, slot)
        .await
    {
        assert_eq!(
            written.expect("complete_freeing_slot"),
            CompleteOutcome::Stale,
            "conformance {check}: a write under a token not current is fenced off"
        );
        assert!(
            matches!(
                store.acquire_slot(&name, &TaskId::random(), 1, LEASE).await,
                Ok(SlotDecision::Wait(_))
            ),
            "conformance {check}: a write fenced off must not free the slot of the run \
             holding the claim"
        );
    }
    let Some(written) = store
        .complete_freeing_slot(&third, token, Some(&result), None, slot)
        .await
    else {
        return;
    };
    assert_eq!(
        written.expect("complete_freeing_slot"),
        CompleteOutcome::Stored,
        "conformance {check}: the run's result is written"
    );
    assert!(
        matches!(store.get(&third).await, Ok(ResultStatus::Ready(_))),
        "conformance {check}: the result written with the slot freed is read back"
    );
    free_at_once(
        &store,
        &name,
        &format!("{check}: the slot freed with the result"),
    )
    .await;
}

/// Panics with `what` unless the one slot of limiter `name` is free now, for a task not told
/// to come back later (those waiting keep their turns).
async fn free_at_once(store: &Arc<dyn Store>, name: &str, what: &str) {
    assert_eq!(
        store
            .acquire_slot(name, &TaskId::random(), 1, LEASE)
            .await
            .ok(),
        Some(SlotDecision::Held),
        "conformance {what} is free at once"
    );
}

pub(super) async fn a_recorded_failure_frees_its_runs_slot(store: Arc<dyn Store>) {
    let check = "a_recorded_failure_frees_its_runs_slot";
    let name = super::flow::limiter(check);
    let (id, other) = (TaskId::random(), TaskId::random());
    assert_eq!(
        store.acquire_slot(&name, &id, 1, LEASE).await.ok(),
        Some(SlotDecision::Held)
    );
    let Ok(ClaimOutcome::Run { token, .. }) = store.claim(&id, "w1", LEASE, None).await else {
        panic!("conformance {check}: a new task is claimed");
    };
    let slot = HeldSlot::new(&name, Duration::from_millis(100));
    let stale = Token(token.0.wrapping_add(1));
    let Some(recorded) = store.record_failure_freeing_slot(&id, stale, slot).await else {
        // This store does them apart: the worker records, then frees.
        return;
    };
    assert_eq!(
        recorded.expect("record_failure_freeing_slot"),
        FailureRecord::Stale,
        "conformance {check}: a failure under a token not current is not recorded"
    );
    assert!(
        matches!(
            store.acquire_slot(&name, &other, 1, LEASE).await,
            Ok(SlotDecision::Wait(_))
        ),
        "conformance {check}: a stale failure must not free the slot of the run holding the \
         claim"
    );
    let recorded = store
        .record_failure_freeing_slot(&id, token, slot)
        .await
        .expect("record_failure_freeing_slot answered once, so always");
    assert_eq!(
        recorded.expect("record_failure_freeing_slot"),
        FailureRecord::Recorded { failures: 1 },
        "conformance {check}: the failed attempt is counted"
    );
    // Its slot is free at once (`other` keeps its turn), and its claim is given back.
    free_at_once(
        &store,
        &name,
        &format!("{check}: the slot freed with the failure"),
    )
    .await;
    assert!(
        matches!(
            store.claim(&id, "w2", LEASE, None).await,
            Ok(ClaimOutcome::Run { .. })
        ),
        "conformance {check}: a recorded failure gives the claim back"
    );
}
