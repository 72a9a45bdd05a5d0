//! Deliveries received together: a panic while settling one of them must end that delivery
//! only, not the others received with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::{
    Broker, BrokerError, DeadLetter, Delivery, DeliveryHandle, Health, LeaseStatus,
    OutgoingMessage, QueueDepth,
};
use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, Worker};

#[ferriq::task(name = "dispatch.echo")]
async fn echo(n: u64) -> u64 {
    n
}

/// Panics on its first ack: a defect in the settling path, after the result was stored.
struct PanicsOnFirstAck {
    inner: MemoryBroker,
    panicked: AtomicBool,
}

#[async_trait]
impl Broker for PanicsOnFirstAck {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        self.inner.publish(batch).await
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        self.inner.receive(max, wait).await
    }
    async fn ack(&self, d: &DeliveryHandle) -> Result<(), BrokerError> {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("injected: the first ack panics");
        }
        self.inner.ack(d).await
    }
    async fn release(&self, d: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        self.inner.release(d, after).await
    }
    async fn extend(
        &self,
        d: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        self.inner.extend(d, lease).await
    }
    async fn dead_letter(&self, d: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        self.inner.dead_letter(d, why).await
    }
    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        self.inner.depth().await
    }
    async fn health(&self) -> Health {
        self.inner.health().await
    }
}

// A current-thread runtime: every delivery of a receive lands in one group.
#[tokio::test]
async fn a_panic_settling_one_delivery_leaves_the_rest_of_its_group_to_finish() {
    const TASKS: u64 = 20;
    // Longer than the test waits: a delivery dropped unsettled would not come back in time.
    let memory = MemoryBroker::with_visibility(Duration::from_secs(60));
    let broker = Arc::new(PanicsOnFirstAck {
        inner: memory.clone(),
        panicked: AtomicBool::new(false),
    });
    let store = Arc::new(MemoryStore::new());
    let client = Client::new(broker.clone(), store.clone());
    // Queued before the worker starts, so its first receive takes them all at once.
    let handles = client
        .enqueue_batch((0..TASKS).map(echo::call))
        .await
        .unwrap();
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(broker.clone())
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[echo::NAME])
                    .unwrap(),
            )
            .concurrency(TASKS as usize)
            .build()
            .unwrap(),
    );
    for (n, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(10)).await.unwrap(), n as u64);
    }
    // Every delivery is settled well within its visibility: the others of the group, and the
    // one whose ack panicked, released by the worker and acked as a duplicate when it came
    // back (its result was stored before the ack).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while memory.stats().acked < TASKS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} deliveries settled: the panic took its group down, or its own \
             delivery was left unsettled",
            memory.stats().acked,
            TASKS
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(broker.panicked.load(Ordering::SeqCst), "the fault fired");
    assert_eq!(
        memory.stats().received,
        TASKS + 1,
        "received in one go, then the released one again"
    );
    assert_eq!(
        worker.worker.stats().in_flight,
        0,
        "no run left in the table"
    );
    // The worker carries on.
    let after = echo::kiq(&client, 99).await.unwrap();
    assert_eq!(after.wait(Duration::from_secs(10)).await.unwrap(), 99);
    worker.stop().await;
}
